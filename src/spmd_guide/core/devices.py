"""Get the devices a chapter needs: accelerators where present, else CPU mock devices.

JAX fixes the number of CPU devices when its backends start (the first
operation, or the first ``jax.devices()`` call). So ``ensure_devices`` must run
before anything else touches JAX; afterwards it can only check, and it says how
to fix a mismatch.
"""

from __future__ import annotations

import math
import numbers
import os
import platform as _platform
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from spmd_guide.core import checks, compile_cache


def _request_cpu_devices(n: int) -> bool:
    """Ask JAX for ``n`` CPU devices, and for the CPU alone where no accelerator can be
    present (:func:`_cpu_unless_accelerator`).

    False if the backends already started with another count.
    """
    _cpu_unless_accelerator()
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        return False
    return True


def _accelerator_possible() -> bool:
    """Whether this host may have an accelerator JAX should start: a TPU chip on its PCI bus
    (what JAX itself checks, ``/sys/bus/pci``), or a JAX plugin (CUDA, ROCm, ...) installed.

    ``libtpu`` alone is not enough: Part XIV installs it to compile for TPU slices without
    a TPU, and a JAX that tries to start a TPU on a host without one prints warnings."""
    import importlib.metadata
    import importlib.util

    from jax._src import hardware_utils

    try:
        if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
            return True
    except OSError:  # no /sys to read (macOS): JAX's own check reads nothing either
        pass
    if importlib.util.find_spec("jax_plugins") is not None:
        return True
    return bool(importlib.metadata.entry_points(group="jax_plugins"))


def _cpu_unless_accelerator() -> None:
    """Start JAX on its CPU backend alone when no platform was chosen and no accelerator can
    be present: JAX would otherwise try every backend it finds (a ``libtpu`` installed for
    compiling, not running), print their start-up failures, and take the TPU's lock file.
    A platform the caller chose (``JAX_PLATFORMS``, ``jax.config``) is left alone."""
    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized() or _accelerator_possible():
        return
    jax.config.update("jax_platforms", "cpu")


def ensure_devices(n: int = 8) -> list[jax.Device]:
    """Return ``n`` devices: accelerators if present, else CPU mock devices.

    Call it first, before any other JAX operation. On a GPU or TPU host it
    returns the first ``n`` accelerators; on a CPU-only host it makes JAX
    create ``n`` CPU devices that share the host's cores (good for learning
    and testing layouts, not for measuring speedups).

    ``n`` is any positive integer (NumPy integers too) up to
    ``checks.MAX_DEVICES``. The request is made with the ``jax_num_cpu_devices``
    option, which (on JAX 0.10 and 0.12 alike) takes precedence over an
    ``XLA_FLAGS=--xla_force_host_platform_device_count`` setting.

    If the environment variable ``SPMD_COMPILE_CACHE`` names a folder, JAX keeps
    the programs it compiles there and loads them in later runs
    (:mod:`spmd_guide.core.compile_cache`; the book's build and tests set it).

    Raises ``ValueError`` for a bad ``n`` and ``RuntimeError`` when the devices
    cannot be had: fewer accelerators than ``n``, or JAX already started with a
    different number of CPU devices.
    """
    n = checks.count("ensure_devices(n)", n, maximum=checks.MAX_DEVICES)
    compile_cache.from_environment()
    requested = _request_cpu_devices(n)
    devices = jax.devices()
    platform = devices[0].platform
    if platform != "cpu":  # GPU, TPU or another accelerator plugin
        if len(devices) < n:
            raise RuntimeError(
                f"This host has {len(devices)} {platform.upper()} device(s),"
                f" but this code needs {n}. To use {n} CPU mock devices"
                " instead, restart Python with the environment variable"
                " JAX_PLATFORMS=cpu set (`JAX_PLATFORMS=cpu jupyter lab`)."
            )
        return devices[:n]
    if len(devices) != n:
        why = ("JAX's backends had already started" if not requested else
               "another setting decided the count")
        raise RuntimeError(
            f"JAX is running with {len(devices)} CPU device(s), but this code"
            f" needs {n}: {why}. The CPU device count is fixed when JAX"
            f" starts, so call spmd_guide.ensure_devices({n}) before any"
            " other JAX operation -- in a notebook, restart the kernel and"
            " run it in the first cell."
        )
    return devices


@dataclass(frozen=True)
class Environment:
    """What the code runs on: enough to read any timing or memory figure."""

    jax_version: str
    jaxlib_version: str
    backend: str
    device_kind: str
    device_count: int
    process_count: int
    mock_devices: bool
    host_cores: int
    python: str

    @property
    def hardware(self) -> str:
        """The devices in words, for a sentence that says where a number came from:
        ``"8 x cpu (CPU mock devices sharing 2 host cores)"`` or ``"8 x H100"``."""
        devices = f"{self.device_count} x {self.device_kind}"
        if self.mock_devices:
            devices += f" (CPU mock devices sharing {self.host_cores} host cores)"
        return devices

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a two-column table."""
        devices = self.hardware
        return [
            ("JAX", self.jax_version),
            ("jaxlib", self.jaxlib_version),
            ("Python", self.python),
            ("backend", self.backend),
            ("devices", devices),
            ("processes", str(self.process_count)),
        ]

    def __str__(self) -> str:
        return "\n".join(f"{label:>9}: {value}" for label, value in self.rows())


def environment_summary() -> Environment:
    """One call that says which JAX, backend and devices this run uses."""
    import jaxlib

    devices = jax.devices()
    backend = devices[0].platform
    return Environment(
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        backend=backend,
        device_kind=devices[0].device_kind,
        device_count=len(devices),
        process_count=jax.process_count(),
        mock_devices=backend == "cpu" and len(devices) > 1,
        host_cores=os.cpu_count() or 1,
        python=_platform.python_version(),
    )


_AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _device_list(devices: object) -> list[jax.Device]:
    """``devices`` (a list, tuple or array of distinct ``jax.Device``) as a list."""
    if isinstance(devices, (str, bytes, Mesh)) or not isinstance(
            devices, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"devices must be a list of jax.Device such as jax.devices()[:4], got "
            f"{checks.value_text(devices)}.")
    listed = list(np.ravel(np.asarray(devices, dtype=object)))
    if not all(isinstance(d, jax.Device) for d in listed):
        raise checks.InputTypeError(
            f"devices must hold jax.Device objects (from jax.devices()), got "
            f"{checks.value_text(devices)}.")
    checks.distinct_devices("devices", listed)
    return listed


def build_mesh(shape: object, names: object, *, devices: object = None,
               axis_types: str = "auto") -> Mesh:
    """The book's one mesh builder: ``jax.make_mesh`` on the first ``prod(shape)`` devices.

    ``axis_types`` is ``"auto"`` (the compiler propagates shardings; what most chapters
    use) or ``"explicit"`` (shardings are part of the types, ``jax.make_mesh``'s default
    since JAX 0.9). ``devices`` defaults to ``jax.devices()``.
    """
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    shape = checks.counts("mesh shape", shape)
    names = checks.axis_names("mesh axis names", names, shape)
    kind = checks.one_of("axis_types", axis_types, _AXIS_TYPES)
    available = list(jax.devices()) if devices is None else _device_list(devices)
    size = math.prod(shape)
    if size > len(available):
        raise checks.InputError(
            f"a {shape} mesh needs {size} devices, but {len(available)} were given; call "
            f"spmd_guide.ensure_devices({size}) first.")
    return jax.make_mesh(shape, names, axis_types=(_AXIS_TYPES[kind],) * len(shape),
                         devices=available[:size])
