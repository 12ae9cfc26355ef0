"""Rooflines: predict a step's time from counts in the compiled program and published rates.

A step takes at least the largest of three times, each a count divided by a hardware rate:

* **compute**: the program's FLOPs over the chip's peak dense bf16 FLOP/s;
* **memory**: the bytes the program reads and writes in HBM over the HBM bandwidth;
* **communication**: the bytes one device sends to others over the interconnect bandwidth.

The counts come from the compiled program (XLA's cost analysis for FLOPs and bytes accessed,
:func:`spmd_guide.core.hlo.communication_bytes` for the ring-model bytes sent); the rates come from
``chips.toml`` beside this module, each with the page it was published on. The closed forms
the Part derives (arithmetic intensity, critical batch sizes) are small functions here too, so
the pages and the tests use the same arithmetic.

Every result is a **prediction** from peak rates, never a measurement. Arguments are checked
with :mod:`spmd_guide.core.checks` before anything is computed: NaN and infinite numbers are
refused, NumPy scalars and arrays are taken wherever Python numbers and lists are, and chip
names are matched as whole strings.
"""

from __future__ import annotations

import math
import os
import tomllib
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from spmd_guide.core import checks, hlo

CHIPS_FILE = Path(__file__).with_name("chips.toml")

#: Numeric fields of a chip: name -> unit (SI), for tables and checks.
UNITS = {
    "peak_flops_bf16": "FLOP/s",
    "hbm_bytes": "B",
    "hbm_bandwidth": "B/s",
    "interconnect_bandwidth": "B/s",
    "network_bandwidth": "B/s",
}
BOUNDS = ("compute", "memory", "communication")
LINKS = ("interconnect", "network")
RING_KINDS = ("all-gather", "reduce-scatter", "all-reduce")


def choice(name: str, value: Any, options: Iterable[str]) -> str:
    """``value`` if it is one of the strings ``options``, compared as a whole string (a
    NumPy string too); anything else, a list or an array of names included, is refused."""
    options = tuple(options)
    if not isinstance(value, str):
        raise checks.InputTypeError(
            f"{name} must be one name (a string) such as {options[0]!r}, got {value!r} "
            f"({type(value).__name__}); choose one of {', '.join(map(repr, options))}.")
    return str(checks.one_of(name, str(value), options))


@dataclass(frozen=True)
class Chip:
    """One accelerator's published rates (SI units) and where they were published."""

    key: str
    name: str
    peak_flops_bf16: float
    hbm_bytes: float
    hbm_bandwidth: float
    interconnect_bandwidth: float
    interconnect: str
    network_bandwidth: float
    network: str
    source: str
    read_via: str
    date_read: str
    #: For each rate of :data:`UNITS`, the published figure it comes from and the arithmetic.
    cite: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in ("key", "name", "interconnect", "network", "source", "read_via",
                     "date_read"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise checks.InputError(
                    f"chip {self.key!r}: {name} must be a non-empty string (every number "
                    f"needs its source), got {value!r}.")
        for name, unit in UNITS.items():
            value = checks.real(f"chip {self.key!r}: {name} (in {unit})", getattr(self, name),
                                positive=True)
            object.__setattr__(self, name, value)
        if not isinstance(self.cite, Mapping):
            raise checks.InputTypeError(
                f"chip {self.key!r}: cite must map each rate to its source, got {self.cite!r}.")
        missing = sorted(set(UNITS) - set(self.cite))
        unknown = sorted(set(self.cite) - set(UNITS))
        empty = sorted(k for k, v in self.cite.items() if not isinstance(v, str) or not v.strip())
        if missing or unknown or empty:
            raise checks.InputError(
                f"chip {self.key!r}: cite needs one non-empty source per rate; missing "
                f"{missing}, unknown {unknown}, empty {empty}; the rates are {sorted(UNITS)}.")
        object.__setattr__(self, "cite", types.MappingProxyType(dict(self.cite)))

    @property
    def ridge(self) -> float:
        """FLOPs per HBM byte at which compute time equals memory time (the roofline's knee)."""
        return self.peak_flops_bf16 / self.hbm_bandwidth

    @property
    def comm_ridge(self) -> float:
        """FLOPs per byte sent at which compute time equals interconnect time."""
        return self.peak_flops_bf16 / self.interconnect_bandwidth

    def row(self) -> dict[str, Any]:
        """A table row: the rates in engineering units, and the source."""
        return {
            "chip": self.key,
            "bf16 TFLOP/s": f"{self.peak_flops_bf16 / 1e12:g}",
            "HBM GB": f"{self.hbm_bytes / 1e9:.3g}",
            "HBM TB/s": f"{self.hbm_bandwidth / 1e12:g}",
            "ring GB/s": f"{self.interconnect_bandwidth / 1e9:g}",
            "network GB/s": f"{self.network_bandwidth / 1e9:g}",
        }

    def citations(self) -> list[dict[str, str]]:
        """Table rows: each rate of this chip, its SI value and where it was published."""
        return [{"chip": self.key, "rate": name, "value": f"{getattr(self, name):.4g} {unit}",
                 "source": self.cite[name]} for name, unit in UNITS.items()]


def load_chips(path: str | os.PathLike[str] = CHIPS_FILE) -> dict[str, Chip]:
    """The chips of a TOML file like ``chips.toml``; refuses unknown or missing fields, a
    rate that is not a positive number (a string such as ``"16 GB"`` included), and an entry
    without a source, or without a citation for each of its rates."""
    if not isinstance(path, (str, os.PathLike)):
        raise checks.InputTypeError(f"path must be a file path, got {path!r}.")
    if not os.path.isfile(path):
        raise checks.InputError(
            f"path {str(path)!r} is not a file; pass a TOML file like {str(CHIPS_FILE)!r}.")
    with open(path, "rb") as file:
        table = tomllib.load(file).get("chip", {})
    wanted = {f.name for f in fields(Chip)} - {"key"}
    chips = {}
    for key, entry in table.items():
        unknown = set(entry) - wanted
        missing = wanted - set(entry)
        if unknown or missing:
            raise checks.InputError(
                f"chip {key!r} in {path}: unknown fields {sorted(unknown)}, missing fields "
                f"{sorted(missing)}; the fields are {sorted(wanted)}.")
        chips[key] = Chip(key=key, **entry)
    if not chips:
        raise checks.InputError(f"{path} lists no [chip.<key>] tables.")
    return chips


CHIPS: dict[str, Chip] = load_chips()


def get_chip(chip: str | Chip, *, name: str = "chip") -> Chip:
    """``chip`` itself, or the entry of :data:`CHIPS` its whole name names."""
    if isinstance(chip, Chip):
        return chip
    if not isinstance(chip, str):
        raise checks.InputTypeError(f"{name} must be a key of CHIPS such as 'tpu-v5e' or a "
                                    f"Chip, got {chip!r} ({type(chip).__name__}).")
    return CHIPS[choice(name, chip, CHIPS)]


def get_chips(chips: str | Chip | Iterable[str | Chip], *, name: str = "chips") -> list[Chip]:
    """A list of chips from one chip (a name or a :class:`Chip`) or several, in order and
    without repeats. A single name is one chip, never its letters."""
    if isinstance(chips, (str, Chip)):
        return [get_chip(chips, name=name)]
    if isinstance(chips, Mapping) or not isinstance(chips, (Sequence, np.ndarray, Iterable)):
        raise checks.InputTypeError(
            f"{name} must be a chip name such as 'h100-sxm' or a sequence of them, got "
            f"{chips!r}.")
    found = {c.key: c for c in (get_chip(item, name=f"an entry of {name}")
                                for item in list(np.asarray(chips, dtype=object).ravel()
                                                 if isinstance(chips, np.ndarray) else chips))}
    if not found:
        raise checks.InputError(f"{name} is empty; name at least one chip of {sorted(CHIPS)}.")
    return list(found.values())


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


def _rate(spec: Chip, link: Any) -> float:
    return (spec.network_bandwidth if choice("link", link, LINKS) == "network"
            else spec.interconnect_bandwidth)


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
    rate = _rate(spec, link)
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


# --------------------------------------------------------------------------- closed forms


def _width(name: str, value: Any) -> int:
    return checks.count(name, value)


def _bytes(value: Any) -> float:
    return checks.real("bytes_per_element", value, positive=True)


def matmul_intensity(m: int, k: int, n: int, *, bytes_per_element: float = 2) -> float:
    """FLOPs per byte of ``[m, k] @ [k, n]``: 2mkn / (bytes x (mk + kn + mn)), reading both
    inputs and writing the output once."""
    m, k, n = _width("m", m), _width("k", k), _width("n", n)
    return 2 * m * k * n / (_bytes(bytes_per_element) * (m * k + k * n + m * n))


def critical_batch(chip: str | Chip, *, d: int | None = None, f: int | None = None,
                   bytes_per_element: float = 2) -> float:
    """The batch ``B`` at which ``x[B, d] @ W[d, f]`` stops being memory-bound on ``chip``.

    Without ``d`` and ``f`` this is the limit for wide weights, ``bytes x ridge / 2``; with
    them it solves matmul_intensity(B, d, f) = ridge exactly (``inf`` if no batch is enough).
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    ridge = spec.ridge
    if d is None and f is None:
        return size * ridge / 2
    if d is None or f is None:
        raise checks.InputError("pass both d and f (the weight's shape), or neither.")
    d, f = _width("d", d), _width("f", f)
    denominator = 2 * d * f - size * ridge * (d + f)
    return size * ridge * d * f / denominator if denominator > 0 else math.inf


def ring_time(buffer_bytes: float, n: int, chip: str | Chip, *, kind: str = "all-gather",
              link: str = "interconnect") -> float:
    """Seconds for a ring collective over ``n`` chips on a buffer of ``buffer_bytes`` (the
    full, gathered size): the ring model's bytes sent (:func:`spmd_guide.core.hlo.ring_bytes`)
    over the chip's link bandwidth.

    On a TPU, ``interconnect_bandwidth`` is the two links of one torus axis, which a ring
    uses only when the axis wraps around: a full axis of 16 on v5e/v6e, an axis that is a
    multiple of 4 on v4/v5p. A shorter axis is a line, not a ring, and takes up to twice this
    time (the scaling book, "How to Scale Your Model", ch. 2-3). On a GPU the NVSwitch joins
    every GPU of a node, so the figure holds for any ``n`` up to 8.
    """
    spec = get_chip(chip)
    kind = choice("kind", kind, RING_KINDS)
    size = checks.real("buffer_bytes", buffer_bytes, minimum=0)
    n = checks.count("n", n)
    rate = _rate(spec, link)
    factor = (n - 1) / n * (2 if kind == "all-reduce" else 1)
    return factor * size / rate


def _share(n: Any) -> float:
    """(n-1)/n for ``n`` devices, 1 for ``n=None`` (the large-n limit)."""
    return 1.0 if n is None else (checks.count("n", n, minimum=2) - 1) / n


def dp_critical_batch(chip: str | Chip, *, n: int | None = None, bytes_per_element: float = 2,
                      link: str = "interconnect", group: int | None = None) -> float:
    """Examples (tokens) per chip at which data parallelism's gradient all-reduce takes no
    longer than the backward pass it can hide behind.

    The backward pass does 4 FLOPs per parameter per example (two matmuls per weight); the
    all-reduce sends 2 (n-1)/n bytes_per_element per parameter. Equal when
    B = bytes x (n-1)/n x FLOP/s / (2 x link bandwidth). ``n=None`` is the large-n limit.

    ``link="network"`` prices the all-reduce between ``n`` nodes or slices. Every library
    reduces inside a node or slice first (a reduce-scatter over its fast links), so each of
    the ``group`` chips there sends only its 1/``group`` share of the gradient over its own
    network share: B = bytes x (n-1)/n x FLOP/s / (2 x network bandwidth x group). ``group``
    is required there (8 for an 8-GPU node; the slice's chip count for a TPU slice): a flat
    ring over the network would charge each chip ``group`` times too much. The reduction
    inside the group still runs on the fast links; the step hides both when B is above this
    and the fast links' threshold (``n=group``).
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    share = _share(n)
    rate = _rate(spec, link)
    if link == "network":
        if group is None:
            raise checks.InputError(
                "link='network' needs group=: how many chips reduce over their fast links "
                "before the network (8 for an 8-GPU node, the chips of a TPU slice).")
        per_chip = checks.count("group", group)
    elif group is not None:
        raise checks.InputError(
            f"group={group!r} applies to link='network' only (the chips of a node or slice "
            "that reduce before the network).")
    else:
        per_chip = 1
    return size * share * spec.peak_flops_bf16 / (2 * rate * per_chip)


def fsdp_critical_batch(chip: str | Chip, *, n: int | None = None, gathers: int = 1,
                        bytes_per_element: float = 2, phase: str | None = None) -> float:
    """Examples per chip at which FSDP's weight traffic hides behind the compute of the
    phase it must land in.

    The forward pass all-gathers every weight before its layer runs: (n-1)/n bytes per
    parameter against 2 FLOPs per parameter per example. The backward pass reduce-scatters
    every gradient and, with ``gathers=2``, all-gathers the weights again: ``gathers``
    (n-1)/n bytes per parameter against 4 FLOPs. Slack in one phase cannot pay for the
    other (the forward's gathers must land before its matmuls; the next step's weights exist
    only after this step's update), so the threshold is the larger of the two phases':
    ``phase="forward"`` or ``"backward"`` returns one of them. For 1 or 2 gathers the
    forward's decides, and it equals data parallelism's (:func:`dp_critical_batch`).
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    gathers = checks.count("gathers", gathers, maximum=2)
    share = _share(n)
    base = size * share * spec.peak_flops_bf16 / spec.interconnect_bandwidth
    phases = {"forward": base / 2, "backward": gathers * base / 4}
    if phase is None:
        return max(phases.values())
    return phases[choice("phase", phase, phases)]


def tp_min_width(chip: str | Chip, n: int, *, bytes_per_element: float = 2) -> float:
    """The smallest weight width ``f`` for which an ``n``-way tensor-parallel matmul
    ``x[B, d] @ W[d, f/n]`` that all-gathers its ``[B, d]`` input stays compute-bound:
    2 B d f / n FLOPs against (n-1)/n B d bytes sent gives f >= bytes (n-1) FLOP/s / (2 W)."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    n = checks.count("n", n, minimum=2)
    return size * (n - 1) * spec.comm_ridge / 2


def tp_max_ways(chip: str | Chip, width: int, *, bytes_per_element: float = 2) -> int:
    """The most chips a weight of ``width`` columns can be split over before the all-gather
    outlasts the matmul (the inverse of :func:`tp_min_width`); at least 1."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    width = _width("width", width)
    return max(1, math.floor(1 + 2 * width / (size * spec.comm_ridge)))


def overlapped_time(compute_s: float, comm_s: float, *, ways: int | None = None) -> float:
    """Seconds for ``compute_s`` of compute and ``comm_s`` of communication run together.

    ``ways=None``: two streams that can be cut as finely as needed, ``max(compute, comm)``.
    ``ways=n``: the ring collective matmul of Part III (``allgather_overlapped``): n block
    matmuls of compute/n each and n-1 block transfers of comm/(n-1) each, transfer s beside
    matmul s-1, the last matmul alone:
    (n-1) max(compute/n, comm/(n-1)) + compute/n = max(compute, comm + compute/n).
    """
    c = checks.real("compute_s", compute_s, minimum=0)
    m = checks.real("comm_s", comm_s, minimum=0)
    if ways is None:
        return max(c, m)
    n = checks.count("ways", ways, minimum=2)
    return max(c, m + c / n)


def overlap_speedup(compute_s: float, comm_s: float, *, ways: int | None = None) -> float:
    """How much faster a step gets when its communication overlaps its compute instead of
    following it: (compute + comm) / :func:`overlapped_time`. At most 2 for two finely cut
    streams (when the two are equal); at most (2n-1)/n for a ring of ``ways=n`` (1.75 for 4),
    reached when comm = (n-1)/n x compute, because the last block's matmul has nothing left
    to overlap."""
    c = checks.real("compute_s", compute_s, minimum=0)
    m = checks.real("comm_s", comm_s, minimum=0)
    if c == 0 and m == 0:
        raise checks.InputError("compute_s and comm_s are both 0; there is nothing to overlap.")
    return (c + m) / overlapped_time(c, m, ways=ways)


def ring_matmul_balance_rows(ways: int, chip: str | Chip, *,
                             bytes_per_element: float = 2) -> float:
    """Rows ``m`` at which the overlapped all-gather matmul ``[m, k] @ [k, n]`` on a ring of
    ``ways`` chips gains most (:func:`overlap_speedup` with ``ways``): where one block's
    matmul, 2 m k n / ways^2 FLOPs, takes as long as one block's transfer, k n / ways
    elements; k and n cancel: m = ways x bytes/2 x FLOP/s / link bandwidth."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    ways = checks.count("ways", ways, minimum=2)
    return ways * size / 2 * spec.comm_ridge


def collective_matmul_times(m: int, k: int, n: int, ways: int, chip: str | Chip, *,
                            bytes_per_element: float = 2) -> tuple[float, float]:
    """(compute, communication) seconds of the all-gather collective matmul of Part III:
    each of ``ways`` chips multiplies its ``m / ways`` rows of ``[m, k]`` by the ``[k, n]``
    right-hand side, whose row blocks are all-gathered around the ring."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    m, k, n, ways = _width("m", m), _width("k", k), _width("n", n), checks.count("ways", ways)
    compute = 2 * m * k * n / ways / spec.peak_flops_bf16
    comm = (ways - 1) / ways * k * n * size / spec.interconnect_bandwidth
    return compute, comm


def mlp_matmul_flops(layer_sizes: list[int] | tuple[int, ...], batch: int, *,
                     with_gradient: bool = False) -> int:
    """The matmul FLOPs of the Part IV MLP on ``batch`` examples: 2 B n_i n_(i+1) per layer
    forward; with the gradient, twice that again for the weight gradients and the input
    gradients of every layer but the first (nothing asks for dL/dx)."""
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batch = checks.count("batch", batch)
    pairs = list(zip(sizes[:-1], sizes[1:], strict=True))
    forward = sum(2 * batch * a * b for a, b in pairs)
    if not checks.flag("with_gradient", with_gradient):
        return forward
    return 2 * forward + sum(2 * batch * a * b for a, b in pairs[1:])


def mlp_elementwise_flops(layer_sizes: list[int] | tuple[int, ...], batch: int) -> int:
    """The forward pass's element-wise FLOPs: a bias add per output, a ReLU per hidden
    output, and the loss's subtract, square and sum per output feature."""
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batch = checks.count("batch", batch)
    return batch * (sum(sizes[1:]) + sum(sizes[1:-1]) + 3 * sizes[-1])
