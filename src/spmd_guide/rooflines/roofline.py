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
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

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
            "HBM GB": f"{self.hbm_bytes / 1e9:g}",
            "HBM TB/s": f"{self.hbm_bandwidth / 1e12:g}",
            "link GB/s": f"{self.interconnect_bandwidth / 1e9:g}",
            "network GB/s": f"{self.network_bandwidth / 1e9:g}",
        }


def load_chips(path: str | Path = CHIPS_FILE) -> dict[str, Chip]:
    """The chips of a TOML file like ``chips.toml``; refuses unknown or missing fields, a
    number that is not a positive float, and an entry without a source."""
    with open(path, "rb") as file:
        table = tomllib.load(file).get("chip", {})
    wanted = {f.name for f in fields(Chip)} - {"key"}
    chips = {}
    for key, entry in table.items():
        unknown = set(entry) - wanted
        missing = wanted - set(entry)
        if unknown or missing:
            raise ValueError(f"chip {key!r} in {path}: unknown fields {sorted(unknown)}, "
                             f"missing fields {sorted(missing)}; the fields are {sorted(wanted)}.")
        for name in UNITS:
            value = entry[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"chip {key!r}: {name} must be a positive number in "
                                 f"{UNITS[name]}, got {value!r}.")
        for name in ("source", "read_via", "date_read"):
            if not str(entry[name]).strip():
                raise ValueError(f"chip {key!r}: {name} is empty; every number needs its source.")
        chips[key] = Chip(key=key, **{k: (float(v) if k in UNITS else str(v))
                                      for k, v in entry.items()})
    return chips


CHIPS: dict[str, Chip] = load_chips()


def get_chip(chip: str | Chip) -> Chip:
    """``chip`` itself, or the entry of :data:`CHIPS` it names."""
    if isinstance(chip, Chip):
        return chip
    if not isinstance(chip, str):
        raise checks.InputTypeError(f"chip must be a key of CHIPS such as 'tpu-v5e' or a Chip, "
                                    f"got {chip!r}.")
    return CHIPS[checks.one_of("chip", chip, CHIPS)]


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class Estimate:
    """Counts of one compiled program and the three times they take on ``chip``."""

    chip: str
    flops: float
    bytes_accessed: float
    comm_bytes: float
    compute_s: float
    memory_s: float
    comm_s: float

    @property
    def bound(self) -> str:
        """``"compute"``, ``"memory"`` or ``"communication"``: the largest of the three times."""
        times = (self.compute_s, self.memory_s, self.comm_s)
        return BOUNDS[times.index(max(times))]

    @property
    def step_s(self) -> float:
        """The roofline's lower bound on the step: everything overlapped, the slowest wins."""
        return max(self.compute_s, self.memory_s, self.comm_s)

    @property
    def intensity(self) -> float:
        """FLOPs per byte accessed."""
        return self.flops / self.bytes_accessed if self.bytes_accessed else math.inf


@dataclass(frozen=True)
class Counts:
    """What one device of a compiled program does: FLOPs, HBM bytes, bytes sent."""

    flops: float
    bytes_accessed: float
    comm_bytes: float


def counts(fn: Callable[..., Any], *args: Any) -> Counts:
    """FLOPs and bytes accessed (XLA's cost analysis of the per-device program) and bytes one
    device sends (ring model) of ``fn`` compiled on ``args``."""
    checks.function("fn", fn)
    compiled = hlo.compile(fn, *args)  # compiled once; both questions ask this program
    cost = compiled.cost_analysis()
    return Counts(flops=float(cost.get("flops", 0.0)),
                  bytes_accessed=float(cost.get("bytes accessed", 0.0)),
                  comm_bytes=float(hlo.communication_bytes(compiled)))


def estimate(work: Counts, chip: str | Chip, *, byte_scale: float = 1.0,
             link: str = "interconnect") -> Estimate:
    """Price ``work`` on ``chip``. ``byte_scale`` multiplies the bytes (0.5 prices a float32
    program as its bfloat16 twin); ``link`` is ``"interconnect"`` (ICI/NVLink) or
    ``"network"`` (DCN/InfiniBand, across slices or nodes)."""
    spec = get_chip(chip)
    scale = checks.real("byte_scale", byte_scale, positive=True)
    rate = {"interconnect": spec.interconnect_bandwidth,
            "network": spec.network_bandwidth}[checks.one_of("link", link, ("interconnect", "network"))]
    return Estimate(chip=spec.key, flops=work.flops, bytes_accessed=work.bytes_accessed * scale,
                    comm_bytes=work.comm_bytes * scale,
                    compute_s=work.flops / spec.peak_flops_bf16,
                    memory_s=work.bytes_accessed * scale / spec.hbm_bandwidth,
                    comm_s=work.comm_bytes * scale / rate)


def predict(fn: Callable[..., Any], *args: Any, chip: str | Chip, byte_scale: float = 1.0,
            link: str = "interconnect") -> Estimate:
    """The roofline estimate of ``fn`` on ``args`` for one device of ``chip``: the compiled
    program's counts (:func:`counts`) priced at the chip's rates (:func:`estimate`)."""
    spec = get_chip(chip)
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
    over the chip's link bandwidth."""
    spec = get_chip(chip)
    kind = checks.one_of("kind", kind, ("all-gather", "reduce-scatter", "all-reduce"))
    size = checks.real("buffer_bytes", buffer_bytes, minimum=0)
    n = checks.count("n", n)
    rate = spec.network_bandwidth if checks.one_of(
        "link", link, ("interconnect", "network")) == "network" else spec.interconnect_bandwidth
    factor = (n - 1) / n * (2 if kind == "all-reduce" else 1)
    return factor * size / rate


def dp_critical_batch(chip: str | Chip, *, n: int | None = None, bytes_per_element: float = 2,
                      link: str = "interconnect") -> float:
    """Tokens (examples) per chip at which data parallelism's gradient all-reduce takes no
    longer than the backward pass it can hide behind.

    The backward pass does 4 FLOPs per parameter per example (two matmuls per weight); the
    all-reduce sends 2 (n-1)/n bytes_per_element per parameter. Equal when
    B = bytes x (n-1)/n x FLOP/s / (2 x link bandwidth). ``n=None`` is the large-n limit.
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    share = 1.0 if n is None else (checks.count("n", n, minimum=2) - 1) / n
    rate = spec.network_bandwidth if checks.one_of(
        "link", link, ("interconnect", "network")) == "network" else spec.interconnect_bandwidth
    return size * share * spec.peak_flops_bf16 / (2 * rate)


def fsdp_critical_batch(chip: str | Chip, *, n: int | None = None, gathers: int = 1,
                        bytes_per_element: float = 2) -> float:
    """Examples per chip at which FSDP's weight traffic takes no longer than the step's
    6 FLOPs per parameter per example.

    Each step all-gathers every weight ``gathers`` times (1 when the gathered weights are kept
    for the backward pass, 2 when they are gathered again there) and reduce-scatters every
    gradient once: (gathers + 1) (n-1)/n bytes per parameter.
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    gathers = checks.count("gathers", gathers, maximum=2)
    share = 1.0 if n is None else (checks.count("n", n, minimum=2) - 1) / n
    return (gathers + 1) * size * share * spec.peak_flops_bf16 / (6 * spec.interconnect_bandwidth)


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


def overlap_speedup(compute_s: float, comm_s: float) -> float:
    """How much faster a step gets when its communication overlaps its compute instead of
    following it: (compute + comm) / max(compute, comm), between 1 and 2."""
    c = checks.real("compute_s", compute_s, minimum=0)
    m = checks.real("comm_s", comm_s, minimum=0)
    if c == 0 and m == 0:
        raise checks.InputError("compute_s and comm_s are both 0; there is nothing to overlap.")
    return (c + m) / max(c, m)


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
