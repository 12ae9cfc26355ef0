"""A TPU slice you do not have: its devices, and a mesh over them (Part XIV, tpu/compiling).

With ``libtpu`` installed, ``jax.experimental.topologies.get_topology_desc`` describes a TPU
slice by name (``"v5e:2x4"``: the generation, then the chips along each axis of the slice)
and hands back *compile-only* devices: ``jax.jit`` compiles for them with XLA:TPU, the real
TPU compiler, and the program can be read (HLO, memory, cost) but never run. Nothing here
needs a TPU, and JAX itself keeps running on the CPU (``ensure_devices`` starts it there).

``libtpu`` has a wheel for Linux on x86_64 only; elsewhere :func:`unavailable` says why, and
the pages show the last kept result instead (:mod:`spmd_guide.tpu.kept`).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import platform
import re
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh

from spmd_guide.core import checks, compile_cache

__all__ = ["GENERATIONS", "CHIP_KEYS", "chip_key", "compile_only", "topology_devices", "tpu_mesh",
           "unavailable"]

#: The generations XLA:TPU compiles for by these names, with the chips per slice axis they
#: take (2-D slices for the "e" chips, 3-D tori for the others) and an example.
GENERATIONS: dict[str, str] = {
    "v3": "v3:2x2 (2 cores per chip: 8 devices)",
    "v4": "v4:2x2x2",
    "v5e": "v5e:2x4",
    "v5p": "v5p:2x2x2",
    "v6e": "v6e:2x4",
}

#: ``device_kind`` of a compile-only TPU device -> its entry in ``rooflines/chips.toml``.
CHIP_KEYS: dict[str, str] = {
    "TPU v4": "tpu-v4", "TPU v5 lite": "tpu-v5e", "TPU v5": "tpu-v5p",
    "TPU v5p": "tpu-v5p", "TPU v6 lite": "tpu-v6e",
}

# v4 and v5p chips hold two TensorCores; "megacore" makes them one device, which is what
# jax.make_mesh (mesh_utils) requires of TPUs after v3 and what a v4/v5p host gives JAX.
_MEGACORE = {"v4", "v5p"}
_NAME = re.compile(r"^(v\d+[a-z]?):(\d+(?:x\d+){1,2})$")


def unavailable() -> str:
    """``""`` when this machine can compile for TPU slices; else why not, in one sentence."""
    if importlib.util.find_spec("libtpu") is not None:
        return ""
    system = f"{platform.system()} on {platform.machine()}"
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
        return (f"the TPU compiler (libtpu) is not installed on this {system} machine: "
                "pip install -e '.[book]' installs it.")
    return (f"the TPU compiler is not available on this platform ({system}): libtpu is "
            "published for Linux on x86_64 only.")


def _quiet_libtpu() -> None:
    """Tell libtpu, before it starts, that this host has no TPU to look for: without these
    it prints warnings about the accelerator type and worker names it cannot find, and it
    takes a lock file that a second process would then fail on. Only on a host without
    TPU chips; a variable the user set wins."""
    from jax._src import hardware_utils

    try:
        if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
            return
    except OSError:
        pass
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _check_name(topology: Any) -> tuple[str, str]:
    forms = "; ".join(GENERATIONS.values())
    if not isinstance(topology, str):
        raise checks.InputTypeError(
            f"topology must be a TPU slice's name (a string) such as 'v5e:2x4', got "
            f"{checks.value_text(topology)}; known forms: {forms}.")
    match = _NAME.match(topology.strip())
    if not match or match.group(1) not in GENERATIONS:
        raise checks.InputError(
            f"unknown TPU topology {topology!r}: a name is '<generation>:<chips per axis>', "
            f"for generations {', '.join(GENERATIONS)}; known forms: {forms}.")
    return match.group(1), topology.strip()


def topology_devices(topology: str) -> list[jax.Device]:
    """The compile-only devices of the TPU slice ``topology`` (``"v5e:2x4"``), one per chip
    (per core on v3), in the order ``get_topology_desc`` gives them.

    Raises ``InputError`` with libtpu's reason for a slice it cannot describe and
    ``RuntimeError`` where the TPU compiler is not available (:func:`unavailable`)."""
    generation, name = _check_name(topology)
    why = unavailable()
    if why:
        raise RuntimeError(f"cannot describe TPU slice {name!r}: {why}")
    return list(_devices(generation, name))


@functools.cache
def _devices(generation: str, name: str) -> tuple[jax.Device, ...]:
    from jax.experimental import topologies

    _quiet_libtpu()
    options = {"chip_config_name": "megacore"} if generation in _MEGACORE else {}
    try:
        description = topologies.get_topology_desc(topology_name=name, platform="tpu",
                                                   **options)
    except jax.errors.JaxRuntimeError as error:
        forms = "; ".join(GENERATIONS.values())
        reason = str(error).split(": ", 1)[-1]
        raise checks.InputError(
            f"libtpu cannot describe the slice {name!r}: {reason} (slices this book "
            f"compiles for: {forms})."
        ) from None
    return tuple(description.devices)


def chip_key(devices: Sequence[jax.Device] | Mesh) -> str:
    """The ``rooflines/chips.toml`` key of the chips of ``devices`` (or a mesh's):
    ``"tpu-v5e"`` for a v5e slice."""
    items = list(devices.devices.flat) if isinstance(devices, Mesh) else list(devices)
    kinds = {getattr(d, "device_kind", None) for d in items}
    if len(kinds) != 1 or next(iter(kinds)) not in CHIP_KEYS:
        raise checks.InputError(
            f"expected devices of one TPU generation ({', '.join(CHIP_KEYS)}), got kinds "
            f"{sorted(map(str, kinds))}.")
    return CHIP_KEYS[kinds.pop()]


def tpu_mesh(topology: str, axis_shapes: Sequence[int], axis_names: Sequence[str], *,
             axis_types: Sequence[AxisType] | None = None) -> Mesh:
    """A mesh over every device of the TPU slice ``topology``, laid out as ``jax.make_mesh``
    lays out that slice (JAX's own chip order for it, which does not always put neighbouring
    mesh positions on neighbouring chips: see meshes.tpu_slices), with
    ``jax.make_mesh``'s default axis types (Explicit) unless ``axis_types`` says otherwise.

    ``axis_shapes`` must multiply to the slice's device count, and ``axis_names`` give one
    distinct string per axis; both are checked before anything is built."""
    shape = checks.counts("axis_shapes", axis_shapes)
    names = checks.axis_names("axis_names", axis_names, shape)
    types = None
    if axis_types is not None:
        if isinstance(axis_types, (str, AxisType)) or not isinstance(axis_types, (tuple, list)):
            raise checks.InputTypeError(
                f"axis_types must be a tuple of jax.sharding.AxisType, one per axis, got "
                f"{checks.value_text(axis_types)}.")
        types = tuple(axis_types)
        if len(types) != len(shape) or not all(isinstance(t, AxisType) for t in types):
            raise checks.InputError(
                f"axis_types must give one jax.sharding.AxisType per axis of {shape}, got "
                f"{checks.value_text(types)}.")
    devices = topology_devices(topology)
    if math.prod(shape) != len(devices):
        raise checks.InputError(
            f"axis_shapes {shape} hold {math.prod(shape)} devices, but the slice {topology!r} "
            f"has {len(devices)}: their product must be the slice's device count.")
    return jax.make_mesh(shape, names, devices=devices,
                         **({"axis_types": types} if types is not None else {}))


def compile_only(lowered: jax.stages.Lowered,
                 options: dict | None = None) -> jax.stages.Compiled:
    """``lowered.compile(options)`` with JAX's persistent compile cache off: a program for
    compile-only TPU devices can be written to the cache but not loaded back (JAX 0.12 warns
    "PjRtCompiler must be constructed with a Client"), so the cache would only cost time
    and print that warning on the page."""
    with compile_cache.disabled():
        return lowered.compile(options or None)
