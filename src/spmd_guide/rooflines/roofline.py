"""Rooflines: predict a step's time from counts in the compiled program and published rates.

A step takes at least the largest of three times, each a count divided by a hardware rate:

* **compute**: the program's FLOPs over the chip's peak dense bf16 FLOP/s;
* **memory**: the bytes the program reads and writes in HBM over the HBM bandwidth;
* **communication**: the bytes one device sends to others over the interconnect bandwidth,
  each collective priced on the topology of its device group (on a TPU slice, an axis
  without a wraparound link is a line: twice a ring's time; :func:`comm_seconds`).

:func:`counts` also counts the program's float-to-float ``convert`` ops: a bfloat16 training
step gains them on XLA:CPU and the cost analysis counts their bytes, which the
:class:`Estimate` says (``converts``, ``note``).

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
from jax.sharding import Mesh, NamedSharding

from spmd_guide.core import checks, hlo
from spmd_guide.core.hlo_text import parse_module, program_text, reachable
from spmd_guide.rooflines.formulas import matmul_intensity as matmul_intensity
from spmd_guide.rooflines.hardware import CHIPS as CHIPS
from spmd_guide.rooflines.hardware import (
    KNOWN_KEYS,
    LINKS,
    Chip,
    choice,
    get_chip,
    layout_factor,
    topology_factor,
)

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
    #: ``convert`` ops in the program (:attr:`Counts.converts`): bytes the cost analysis
    #: counts for conversions between dtypes, which :attr:`note` explains.
    converts: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.chip, str) or not self.chip:
            raise checks.InputTypeError(f"chip must be a chip's key, got {self.chip!r}.")
        if self.chip not in KNOWN_KEYS:
            raise checks.InputError(
                f"chip {self.chip!r} is no chip's key; the chips file has {sorted(CHIPS)}.")
        _amounts(self, ("flops", "bytes_accessed", "comm_bytes", "compute_s", "memory_s",
                        "comm_s"))
        object.__setattr__(self, "converts", checks.count("converts", self.converts, minimum=0))

    @property
    def note(self) -> str:
        """What the counts leave to the reader: ``""`` for a program without conversions;
        otherwise how many ``convert`` ops it holds and that their bytes are counted (a
        bfloat16 training step on XLA:CPU gains them; price its float32 twin with
        ``byte_scale=0.5`` instead, or pass ``byte_scale=1`` for bytes already bf16)."""
        if not self.converts:
            return ""
        return (f"the program converts between floating dtypes {self.converts} time(s) "
                "(convert ops, as a bfloat16 training step on XLA:CPU does); XLA's cost "
                "analysis counts their bytes too, so memory_s overstates the bfloat16 "
                "program. Price its float32 twin with byte_scale=0.5 instead.")

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
    #: Bytes sent by the length of the device group each collective runs over
    #: (``{4: ..., 2: ...}``): for an all-reduce, all-gather, reduce-scatter or all-to-all,
    #: the length of the mesh axis (or axes) it runs along; for a collective-permute, the
    #: largest connected set of its source-target pairs, which need not be an axis.
    sent_by_group: Mapping[int, float] = field(default_factory=dict, hash=False)
    #: Devices the program runs on (0: not known), the slice its groups are part of.
    devices: int = 0
    #: ``convert`` ops from one floating dtype to another (bf16 <-> f32) in the program, in
    #: every computation it calls (fusions included): what a bfloat16 training step gains.
    converts: int = 0
    #: The shape of the mesh the program's inputs are laid out on (``()``: not known); its
    #: flat device list is what the replica groups' positions index.
    mesh_shape: tuple[int, ...] = ()
    #: Bytes sent by the replica groups of each collective that has them (every kind but
    #: collective-permute): ``{((0, 2, 4, 6), (1, 3, 5, 7)): ...}``, positions in the mesh's
    #: device list, so that each group can be priced by the chips it lands on.
    sent_by_groups: Mapping[tuple[tuple[int, ...], ...], float] = field(
        default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _amounts(self, ("flops", "bytes_accessed", "comm_bytes"))
        if not isinstance(self.sent_by_kind, Mapping):
            raise checks.InputTypeError(
                f"sent_by_kind must map collective kinds to bytes, got {self.sent_by_kind!r}.")
        kinds = {checks.one_of("collective kind", k, hlo.KINDS):
                 checks.real(f"sent_by_kind[{k!r}]", v, minimum=0)
                 for k, v in self.sent_by_kind.items()}
        if kinds and not math.isclose(sum(kinds.values()), self.comm_bytes, rel_tol=1e-9,
                                      abs_tol=1):
            raise checks.InputError(
                f"sent_by_kind sums to {sum(kinds.values()):.6g} bytes, but comm_bytes is "
                f"{self.comm_bytes:.6g}: the bytes of each kind must add up to the total.")
        object.__setattr__(self, "sent_by_kind", types.MappingProxyType(kinds))
        devices = checks.count("devices", self.devices, minimum=0, maximum=checks.MAX_DEVICES)
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "converts", checks.count("converts", self.converts, minimum=0))
        if not isinstance(self.sent_by_group, Mapping):
            raise checks.InputTypeError(
                f"sent_by_group must map group sizes to bytes, got {self.sent_by_group!r}.")
        groups = {checks.count("a group size of sent_by_group", g, maximum=devices or None):
                  checks.real(f"sent_by_group[{g!r}]", v, minimum=0)
                  for g, v in self.sent_by_group.items()}
        if groups and not devices:
            raise checks.InputError("sent_by_group needs devices= (the slice its groups are in).")
        if sum(groups.values()) > self.comm_bytes * (1 + 1e-9) + 1:
            raise checks.InputError(
                f"sent_by_group sums to {sum(groups.values()):.6g} bytes, more than comm_bytes "
                f"{self.comm_bytes:.6g}.")
        object.__setattr__(self, "sent_by_group", types.MappingProxyType(groups))
        shape = checks.counts("mesh_shape", self.mesh_shape, min_length=0)
        if shape and math.prod(shape) != devices:
            raise checks.InputError(
                f"mesh_shape={shape} holds {math.prod(shape)} devices, but devices={devices}.")
        object.__setattr__(self, "mesh_shape", shape)
        if not isinstance(self.sent_by_groups, Mapping):
            raise checks.InputTypeError(
                f"sent_by_groups must map replica groups to bytes, got {self.sent_by_groups!r}.")
        if self.sent_by_groups and not shape:
            raise checks.InputError("sent_by_groups needs mesh_shape= (what its positions index).")
        by_groups = {}
        for key, value in self.sent_by_groups.items():
            if isinstance(key, (str, bytes)) or not isinstance(key, Sequence) or not key:
                raise checks.InputTypeError(
                    f"a key of sent_by_groups must be a tuple of device groups, got {key!r}.")
            key = tuple(checks.counts("a group of sent_by_groups", g, minimum=0) for g in key)
            if max(map(max, key)) >= devices:
                raise checks.InputError(
                    f"sent_by_groups names position {max(map(max, key))}; the program has "
                    f"{devices} devices.")
            by_groups[key] = checks.real(f"sent_by_groups[{key!r}]", value, minimum=0)
            length = len(key[0])
            if groups.get(length, 0.0) * (1 + 1e-9) + 1 < by_groups[key]:
                raise checks.InputError(
                    f"sent_by_groups[{key!r}] is more than sent_by_group[{length}].")
        object.__setattr__(self, "sent_by_groups", types.MappingProxyType(by_groups))


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
    text = compiled.as_text()
    ops = hlo.collectives_in_text(text)
    module = parse_module(program_text(text))
    by_kind: dict[str, float] = {}
    by_group: dict[int, float] = {}
    by_groups: dict[tuple[tuple[int, ...], ...], float] = {}
    shape = _mesh_shape(compiled)
    for op in ops:
        by_kind[op.kind] = by_kind.get(op.kind, 0.0) + op.bytes_sent
        by_group[op.group_size] = by_group.get(op.group_size, 0.0) + op.bytes_sent
        if shape and op.kind != "collective-permute" and op.bytes_sent:
            groups = op.groups or (tuple(range(math.prod(shape))),)
            by_groups[groups] = by_groups.get(groups, 0.0) + op.bytes_sent
    converts = sum(_float_converts(module.computations[name]) for name in reachable(module))
    devices = module.num_partitions * module.replica_count
    return Counts(flops=float(cost.get("flops", 0.0)),
                  bytes_accessed=float(cost.get("bytes accessed", 0.0)),
                  comm_bytes=float(sum(op.bytes_sent for op in ops)), sent_by_kind=by_kind,
                  sent_by_group={g: b for g, b in by_group.items() if b},
                  devices=devices, converts=converts,
                  mesh_shape=shape if math.prod(shape) == devices else (),
                  sent_by_groups=by_groups if math.prod(shape) == devices else {})


def _mesh_shape(compiled: Any) -> tuple[int, ...]:
    """The axis sizes of the one mesh the compiled program's inputs are laid out on (a
    jitted program's replica groups index that mesh's device list); ``()`` when its inputs
    name no mesh, or more than one."""
    try:
        shardings = jax.tree.leaves(compiled.input_shardings)
    except (AttributeError, NotImplementedError):  # a program without input shardings
        return ()
    shapes = {tuple(s.mesh.axis_sizes) for s in shardings if isinstance(s, NamedSharding)}
    return shapes.pop() if len(shapes) == 1 else ()


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("f", "bf")) and dtype != "f"


def _float_converts(instructions: Sequence[Any]) -> int:
    """``convert`` ops of one computation from one floating dtype to another (bf16 <-> f32):
    the conversions a mixed-precision program gains; int <-> float converts do not count."""
    table = {i.name: i for i in instructions}
    found = 0
    for i in instructions:
        if i.opcode != "convert" or not i.operands or i.operands[0] not in table:
            continue
        source = table[i.operands[0]].result
        if (len(i.result) == 1 and len(source) == 1 and _is_float(i.result[0].dtype)
                and _is_float(source[0].dtype) and i.result[0].dtype != source[0].dtype):
            found += 1
    return found


def comm_seconds(work: Counts, chip: str | Chip, *, byte_scale: float = 1.0,
                 link: str = "interconnect", topology: bool = True) -> float:
    """Seconds ``work``'s bytes take over ``link``: each collective's bytes over the link
    bandwidth, times its topology's factor. Where the chips of its groups are known (a TPU
    slice of :data:`spmd_guide.meshes.tpu_slices.SLICES`, and the mesh the program runs on),
    each group is priced by what its chips form, laid out as ``jax.make_mesh`` lays them
    (:func:`~spmd_guide.rooflines.hardware.layout_factor`): a ring 1, a line or a scattered
    group 2. Otherwise by its length (:func:`~spmd_guide.rooflines.hardware.topology_factor`):
    a TPU axis without a wraparound link in the program's slice runs on a line.
    ``topology=False`` prices every byte at the ring's rate; so does the network, and so do
    bytes whose group is not known."""
    if not isinstance(work, Counts):
        raise checks.InputTypeError(
            f"work must be a Counts (from roofline.counts), got {type(work).__name__}.")
    spec = get_chip(chip)
    scale = checks.real("byte_scale", byte_scale, positive=True)
    rate = spec.link_bandwidth(link)
    if not checks.flag("topology", topology) or link == "network":
        return work.comm_bytes * scale / rate
    by_length = dict(work.sent_by_group)
    lines = 0.0
    for groups, sent in work.sent_by_groups.items():
        factor = layout_factor(spec, work.mesh_shape, groups)
        if factor is not None:  # priced by the chips the groups land on
            lines += sent * factor
            by_length[len(groups[0])] -= sent
    grouped = sum(work.sent_by_group.values())
    lines += sum(sent * topology_factor(spec, group, slice_chips=work.devices)
                 for group, sent in by_length.items() if sent > 0)
    return (max(work.comm_bytes - grouped, 0.0) + lines) * scale / rate


def estimate(work: Counts, chip: str | Chip, *, byte_scale: float = 1.0,
             link: str = "interconnect", topology: bool = True) -> Estimate:
    """Price ``work`` on ``chip``: a prediction at peak rates. ``byte_scale`` multiplies the
    bytes (0.5 prices a float32 program as its bfloat16 twin); ``link`` is
    ``"interconnect"`` (ICI/NVLink) or ``"network"`` (DCN/InfiniBand, across slices or
    nodes). Communication is priced per device group (:func:`comm_seconds`): on a TPU an
    axis without a wraparound link is a line; ``topology=False`` prices every axis as a
    ring."""
    if not isinstance(work, Counts):
        raise checks.InputTypeError(
            f"work must be a Counts (from roofline.counts), got {type(work).__name__}.")
    spec = get_chip(chip)
    scale = checks.real("byte_scale", byte_scale, positive=True)
    return Estimate(chip=spec.key, flops=work.flops, bytes_accessed=work.bytes_accessed * scale,
                    comm_bytes=work.comm_bytes * scale,
                    compute_s=work.flops / spec.peak_flops_bf16,
                    memory_s=work.bytes_accessed * scale / spec.hbm_bandwidth,
                    comm_s=comm_seconds(work, spec, byte_scale=scale, link=link,
                                        topology=topology),
                    converts=work.converts)


def predict(fn: Callable[..., Any], *args: Any, chip: str | Chip, byte_scale: float = 1.0,
            link: str = "interconnect", topology: bool = True) -> Estimate:
    """The roofline prediction for ``fn`` on ``args`` for one device of ``chip``: the
    compiled program's counts (:func:`counts`) priced at the chip's rates (:func:`estimate`).
    The options are checked before anything is compiled. A program with ``convert`` ops (a
    bfloat16 training step on XLA:CPU) says so in the estimate's ``converts`` and ``note``."""
    spec = get_chip(chip)
    checks.real("byte_scale", byte_scale, positive=True)
    choice("link", link, LINKS)
    checks.flag("topology", topology)
    return estimate(counts(fn, *args), spec, byte_scale=byte_scale, link=link,
                    topology=topology)
