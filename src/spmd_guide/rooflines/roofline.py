"""Rooflines: predict a step's time from counts in the compiled program and published rates.

A step takes at least the largest of three times, each a count divided by a hardware rate:

* **compute**: the program's FLOPs over the chip's peak dense bf16 FLOP/s;
* **memory**: the bytes the program reads and writes in HBM over the HBM bandwidth;
* **communication**: the bytes one device sends to others over the interconnect bandwidth.

The counts come from the compiled program (XLA's cost analysis for FLOPs and bytes accessed,
:func:`spmd_guide.core.hlo.communication_bytes` for the ring-model bytes sent); the rates come from
:mod:`spmd_guide.rooflines.hardware` (``chips.toml``, each rate with the page it was published
on). The closed forms the Part derives by hand (arithmetic intensity, critical batch sizes) are
in :mod:`spmd_guide.rooflines.formulas`. Pages: rooflines/rooflines and rooflines/parallelism;
rooflines/transformer and serving/prefill_decode price their programs through :func:`counts`
and :func:`estimate` too.

Every result is a **prediction** from peak rates, never a measurement. Arguments are checked
with :mod:`spmd_guide.core.checks` before anything is computed: NaN and infinite numbers are
refused, NumPy scalars and arrays are taken wherever Python numbers and lists are, and chip
names are matched as whole strings.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from spmd_guide.core import checks, hlo
from spmd_guide.rooflines.formulas import matmul_intensity as matmul_intensity
from spmd_guide.rooflines.hardware import CHIPS as CHIPS
from spmd_guide.rooflines.hardware import LINKS, Chip, choice, get_chip

# CHIPS and matmul_intensity are re-exported: the public contract (DESIGN.md) names them
# roofline.CHIPS and roofline.matmul_intensity beside predict. They live in hardware and
# formulas, and the package's own code imports them from there.

BOUNDS = ("compute", "memory", "communication")


def as_devices(devices: Any, *, name: str = "devices") -> tuple[jax.Device, ...]:
    """The devices a compile runs on: ``None`` (all of ``jax.devices()``), a sequence or
    array of ``jax.Device``, or a :class:`~jax.sharding.Mesh` (its devices, whatever its
    axis types: Auto or Explicit)."""
    if devices is None:
        return tuple(jax.devices())
    if isinstance(devices, Mesh):
        devices = devices.devices
    if isinstance(devices, np.ndarray):
        devices = list(devices.ravel())
    if isinstance(devices, (str, bytes, Mapping)) or not isinstance(devices, Iterable):
        raise checks.InputTypeError(
            f"{name} must be a list of jax devices (jax.devices()[:8]) or a Mesh, got "
            f"{devices!r}.")
    items = tuple(devices)
    bad = [d for d in items if not isinstance(d, jax.Device)]
    if bad:
        raise checks.InputTypeError(
            f"{name} must hold jax.Device objects (from jax.devices()), got {bad[0]!r}.")
    if not items:
        raise checks.InputError(f"{name} is empty; pass at least one device.")
    if len(set(items)) != len(items):
        raise checks.InputError(f"{name} lists a device more than once: {items!r}.")
    return items


# --------------------------------------------------------------------------- the estimate


def _amounts(owner: Any, names: Sequence[str]) -> None:
    """Each field of ``names`` a finite number >= 0 (NaN refused), stored as a float."""
    for name in names:
        object.__setattr__(owner, name, checks.real(name, getattr(owner, name), minimum=0))


@dataclass(frozen=True)
class Estimate:
    """A **prediction**: counts of one compiled program and the three times they would take
    on ``chip`` at its published peak rates (:func:`estimate` builds one)."""

    chip: str
    flops: float
    bytes_accessed: float
    comm_bytes: float
    compute_s: float
    memory_s: float
    comm_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.chip, str) or not self.chip:
            raise checks.InputTypeError(f"chip must be a chip's key, got {self.chip!r}.")
        _amounts(self, ("flops", "bytes_accessed", "comm_bytes", "compute_s", "memory_s",
                        "comm_s"))

    @property
    def bound(self) -> str:
        """``"compute"``, ``"memory"`` or ``"communication"``: the largest of the three times."""
        times = (self.compute_s, self.memory_s, self.comm_s)
        return BOUNDS[times.index(max(times))]

    @property
    def step_s(self) -> float:
        """The roofline's lower bound on the step: everything overlapped, the slowest wins.

        A loose floor: it takes the largest of three *whole-program* totals. A program whose
        phases are bound by different resources (a memory-bound phase, then a compute-bound
        one) cannot overlap them perfectly, and the sum over phases of each phase's largest
        time is a tighter floor."""
        return max(self.compute_s, self.memory_s, self.comm_s)

    @property
    def intensity(self) -> float:
        """FLOPs per byte accessed."""
        return self.flops / self.bytes_accessed if self.bytes_accessed else math.inf


@dataclass(frozen=True)
class Counts:
    """What one device of a compiled program does: FLOPs, HBM bytes, bytes sent (ring
    model), and the bytes sent by collective kind (``{"all-reduce": ...}``, the kinds the
    program holds)."""

    flops: float
    bytes_accessed: float
    comm_bytes: float
    sent_by_kind: Mapping[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _amounts(self, ("flops", "bytes_accessed", "comm_bytes"))
        if not isinstance(self.sent_by_kind, Mapping):
            raise checks.InputTypeError(
                f"sent_by_kind must map collective kinds to bytes, got {self.sent_by_kind!r}.")
        kinds = {checks.one_of("collective kind", k, hlo.KINDS):
                 checks.real(f"sent_by_kind[{k!r}]", v, minimum=0)
                 for k, v in self.sent_by_kind.items()}
        object.__setattr__(self, "sent_by_kind", types.MappingProxyType(kinds))


def counts(fn: Callable[..., Any], *args: Any) -> Counts:
    """FLOPs and bytes accessed (XLA's cost analysis of the per-device program) and bytes one
    device sends (ring model, in total and by collective kind) of ``fn`` compiled on
    ``args`` (arrays or ``jax.ShapeDtypeStruct``s, laid out on Auto or Explicit mesh axes
    alike). ``fn`` may also be a lowered or compiled program, then ``args`` are empty. Only
    the shapes, dtypes and shardings of ``args`` matter: their values (NaN included) are
    never read."""
    if not isinstance(fn, (jax.stages.Lowered, jax.stages.Compiled)):
        checks.function("fn", fn)
    compiled = hlo.compile(fn, *args)  # compiled once; every question asks this program
    cost = compiled.cost_analysis()
    ops = hlo.collectives_in_text(compiled.as_text())
    by_kind: dict[str, float] = {}
    for op in ops:
        by_kind[op.kind] = by_kind.get(op.kind, 0.0) + op.bytes_sent
    return Counts(flops=float(cost.get("flops", 0.0)),
                  bytes_accessed=float(cost.get("bytes accessed", 0.0)),
                  comm_bytes=float(sum(op.bytes_sent for op in ops)), sent_by_kind=by_kind)


def estimate(work: Counts, chip: str | Chip, *, byte_scale: float = 1.0,
             link: str = "interconnect") -> Estimate:
    """Price ``work`` on ``chip``: a prediction at peak rates. ``byte_scale`` multiplies the
    bytes (0.5 prices a float32 program as its bfloat16 twin); ``link`` is
    ``"interconnect"`` (ICI/NVLink) or ``"network"`` (DCN/InfiniBand, across slices or
    nodes)."""
    if not isinstance(work, Counts):
        raise checks.InputTypeError(
            f"work must be a Counts (from roofline.counts), got {type(work).__name__}.")
    spec = get_chip(chip)
    scale = checks.real("byte_scale", byte_scale, positive=True)
    rate = spec.link_bandwidth(link)
    return Estimate(chip=spec.key, flops=work.flops, bytes_accessed=work.bytes_accessed * scale,
                    comm_bytes=work.comm_bytes * scale,
                    compute_s=work.flops / spec.peak_flops_bf16,
                    memory_s=work.bytes_accessed * scale / spec.hbm_bandwidth,
                    comm_s=work.comm_bytes * scale / rate)


def predict(fn: Callable[..., Any], *args: Any, chip: str | Chip, byte_scale: float = 1.0,
            link: str = "interconnect") -> Estimate:
    """The roofline prediction for ``fn`` on ``args`` for one device of ``chip``: the
    compiled program's counts (:func:`counts`) priced at the chip's rates (:func:`estimate`).
    The options are checked before anything is compiled."""
    spec = get_chip(chip)
    checks.real("byte_scale", byte_scale, positive=True)
    choice("link", link, LINKS)
    return estimate(counts(fn, *args), spec, byte_scale=byte_scale, link=link)
