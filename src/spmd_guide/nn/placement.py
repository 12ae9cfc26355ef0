"""Placing the MLP on a mesh: the checks and small conversions every strategy of
:mod:`spmd_guide.nn.strategies` shares.

* :func:`device_list` -- the devices a strategy's mesh is built from, checked;
* :func:`check_split` -- each sharded dimension splits evenly over its mesh axes;
* :func:`check_device_count` -- a 2-D mesh's device count divides by its fixed axis;
* :func:`trimmed` -- a PartitionSpec spelled as a compiled program spells it;
* :func:`auto_twin` -- a mesh of Explicit axes as the same mesh with Auto axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks


def device_list(devices: Sequence[jax.Device] | None) -> list[jax.Device]:
    """``devices`` as a list (default: ``jax.devices()``), refusing what is not a sequence of
    ``jax.Device`` (a string, a count, a mesh) with a message that shows the fix."""
    if devices is None:
        return list(jax.devices())
    if isinstance(devices, Mesh):
        raise checks.InputTypeError(
            "devices must be a list of devices, got a Mesh; pass list(mesh.devices.flat), or "
            "jax.devices()[:k].")
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"devices must be a list of jax.Device such as jax.devices()[:4], got "
            f"{devices!r:.60}.")
    listed = list(np.ravel(np.asarray(devices, dtype=object))) if isinstance(
        devices, np.ndarray) else list(devices)
    bad = next((d for d in listed if not isinstance(d, jax.Device)), None)
    if bad is not None:
        raise checks.InputTypeError(
            f"devices must hold jax.Device objects (from jax.devices()), got {bad!r:.60}.")
    if not listed:
        raise checks.InputError("devices must hold at least one device, got an empty list.")
    checks.distinct_devices("devices", listed)
    return listed


def trimmed(spec: P) -> P:
    """``spec`` without trailing ``None`` entries (``P('model', None)`` is ``P('model')``)."""
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def auto_twin(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis Auto: the same devices and names (``mesh`` itself if so)."""
    checks.mesh("mesh", mesh)
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)


def check_split(
    strategy: str, what: str, shape: tuple[int, ...], spec: P, mesh: Mesh, meanings: tuple[str, ...]
) -> None:
    """The even-split check (:func:`spmd_guide.core.checks.divisible`) for each dimension that
    ``spec`` shards; ``meanings`` names each dimension for the message."""
    for size, entry, meaning in zip(shape, spec, meanings, strict=False):
        axes = checks.spec_axes(entry)
        if not axes:
            continue
        parts = math.prod(mesh.shape[a] for a in axes)
        over = " x ".join(f"{a!r} (size {mesh.shape[a]})" for a in axes)
        checks.divisible(f"strategy {strategy!r}: the {meaning} of {what} {tuple(shape)}",
                         size, parts, why=f"over mesh axis {over}")


def check_device_count(strategy: str, n_devices: int, divisor: int, axis: str) -> None:
    """``n_devices`` must divide by the size ``divisor`` of the fixed mesh axis ``axis``."""
    if n_devices % divisor:
        raise checks.InputError(
            f"strategy {strategy!r} needs a device count divisible by its {axis!r} axis size "
            f"{divisor}, got {n_devices} devices; pass a multiple of {divisor} devices.")
