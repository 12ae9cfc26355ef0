"""The closed forms Part V derives by hand: thresholds the reader can redo with a pencil.

Each is arithmetic on shapes and, where a chip enters, its rates from
:mod:`spmd_guide.rooflines.hardware`; nothing is compiled, so the pages can set each beside the
count that :func:`spmd_guide.rooflines.roofline.counts` reads from a compiled program (and the
tests keep the two agreeing):

* rooflines/rooflines: a matmul's arithmetic intensity (:func:`matmul_intensity`), the batch
  at which it stops being memory-bound (:func:`critical_batch`), the MLP's FLOPs
  (:func:`mlp_matmul_flops`, :func:`mlp_elementwise_flops`) and a ring collective's time
  (:func:`ring_time`);
* rooflines/parallelism: when each strategy's communication hides behind its compute (data
  parallelism, FSDP, tensor parallelism) and what the overlapped ring collective matmul of
  Part III gains (:func:`overlapped_time`, :func:`overlap_speedup`).

Every communication time takes the topology from the chip and the axis length
(:func:`spmd_guide.rooflines.hardware.axis_wraps`): by default an axis of ``n`` chips is a
whole slice (on a TPU, a cycle through all its chips: a ring); ``slice_chips=8`` says the axis
is part of an 8-chip slice, and a TPU axis without a wraparound link is then priced as a line,
twice the ring's time. GPUs (NVSwitch) keep the ring's price for any axis.

Every result is a **prediction** from published peak rates. Arguments are checked with
:mod:`spmd_guide.core.checks` first: NaN and infinite numbers are refused, NumPy scalars and
arrays are taken wherever Python numbers and lists are.
"""

from __future__ import annotations

import math
from typing import Any

from spmd_guide.core import checks
from spmd_guide.rooflines.hardware import Chip, choice, get_chip, topology_factor

RING_KINDS = ("all-gather", "reduce-scatter", "all-reduce")


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


def _line(spec: Chip, n: int | None, slice_chips: Any, *, link: str = "interconnect",
          name: str = "n") -> float:
    """1 on a ring, 2 on a line (:func:`~spmd_guide.rooflines.hardware.topology_factor`) for
    an axis of ``n`` chips in a slice of ``slice_chips``; the network is not a torus axis."""
    if n is None:
        if slice_chips is not None:
            raise checks.InputError(
                f"slice_chips={slice_chips!r} needs {name}= (the axis length in that slice); "
                f"{name}=None is the limit of a long, wrapped axis.")
        return 1.0
    if link == "network":
        if slice_chips is not None:
            raise checks.InputError(
                f"slice_chips={slice_chips!r} applies to link='interconnect' only: the "
                "network between slices or nodes is not a torus axis.")
        return 1.0
    return topology_factor(spec, n, slice_chips=slice_chips)


def ring_time(buffer_bytes: float, n: int, chip: str | Chip, *, kind: str = "all-gather",
              link: str = "interconnect", slice_chips: int | None = None) -> float:
    """Seconds for a collective over ``n`` chips on a buffer of ``buffer_bytes`` (the full,
    gathered size): the ring model's bytes sent (:func:`spmd_guide.core.hlo.ring_bytes`)
    over the chip's link bandwidth, times the topology's factor.

    On a TPU, ``interconnect_bandwidth`` is the two links of one torus axis, which a ring
    uses only when the axis wraps around (:func:`~spmd_guide.rooflines.hardware.axis_wraps`):
    an axis through a whole slice (``slice_chips=None``, the default) closes a cycle; an axis
    of ``n`` chips in a larger slice of ``slice_chips`` without a wraparound link is a line
    and takes twice the ring's time (the scaling book, tpus.md: no wraparounds "typically
    doubles the time of most communication"). On a GPU the NVSwitch joins every GPU of a
    node: the ring's time for any ``n`` up to 8.
    """
    spec = get_chip(chip)
    kind = choice("kind", kind, RING_KINDS)
    size = checks.real("buffer_bytes", buffer_bytes, minimum=0)
    n = checks.count("n", n, maximum=checks.MAX_DEVICES)
    rate = spec.link_bandwidth(link)
    factor = (n - 1) / n * (2 if kind == "all-reduce" else 1)
    return factor * size / rate * _line(spec, n, slice_chips, link=link)


def _share(n: Any) -> float:
    """(n-1)/n for ``n`` devices, 1 for ``n=None`` (the large-n limit)."""
    return 1.0 if n is None else (checks.count("n", n, minimum=2) - 1) / n


def dp_critical_batch(chip: str | Chip, *, n: int | None = None, bytes_per_element: float = 2,
                      link: str = "interconnect", group: int | None = None,
                      slice_chips: int | None = None) -> float:
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

    ``slice_chips``: the all-reduce runs along an axis of ``n`` chips of a slice this big; a
    TPU axis without a wraparound link is a line and needs twice the batch (:func:`ring_time`).
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    share = _share(n)
    link = choice("link", link, ("interconnect", "network"))
    rate = spec.link_bandwidth(link) / _line(spec, n, slice_chips, link=link)
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
                        bytes_per_element: float = 2, phase: str | None = None,
                        slice_chips: int | None = None) -> float:
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
    ``slice_chips`` as in :func:`ring_time`: a TPU line doubles it.
    """
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    gathers = checks.count("gathers", gathers, maximum=2)
    share = _share(n)
    base = size * share * spec.peak_flops_bf16 / spec.interconnect_bandwidth * _line(
        spec, n, slice_chips)
    phases = {"forward": base / 2, "backward": gathers * base / 4}
    if phase is None:
        return max(phases.values())
    return phases[choice("phase", phase, phases)]


def tp_min_width(chip: str | Chip, n: int, *, bytes_per_element: float = 2,
                 link: str = "interconnect", slice_chips: int | None = None) -> float:
    """The smallest weight width ``f`` for which an ``n``-way tensor-parallel matmul
    ``x[B, d] @ W[d, f/n]`` that all-gathers its ``[B, d]`` input stays compute-bound:
    2 B d f / n FLOPs against (n-1)/n B d bytes sent gives f >= bytes (n-1) FLOP/s / (2 W),
    W the bandwidth of ``link`` (``"network"`` for GPU groups past one node).
    ``slice_chips`` as in :func:`ring_time`: a TPU line doubles it."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    n = checks.count("n", n, minimum=2, maximum=checks.MAX_DEVICES)
    ridge = spec.peak_flops_bf16 / spec.link_bandwidth(link)
    return size * (n - 1) * ridge / 2 * _line(spec, n, slice_chips, link=link)


def tp_max_ways(chip: str | Chip, width: int, *, bytes_per_element: float = 2,
                slice_chips: int | None = None) -> int:
    """The most chips a weight of ``width`` columns can be split over before the all-gather
    outlasts the matmul (the inverse of :func:`tp_min_width`); at least 1. Without
    ``slice_chips`` every axis is a ring; with it, the answer is the largest axis length that
    divides the slice and keeps the matmul compute-bound at its topology's price."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    width = _width("width", width)
    if slice_chips is None:
        return max(1, math.floor(1 + 2 * width / (size * spec.comm_ridge)))
    total = checks.count("slice_chips", slice_chips, maximum=checks.MAX_DEVICES)
    fits = [n for n in range(2, total + 1) if total % n == 0 and tp_min_width(
        spec, n, bytes_per_element=size, slice_chips=total) <= width]
    return max(fits, default=1)


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


def _one_way(spec: Chip, one_way: Any) -> float:
    """2 for a ring that sends one way round on a TPU: ``interconnect_bandwidth`` is the two
    links of a torus axis, one direction each, and a one-way ring uses one of them. 1 on a
    GPU (through NVSwitch one peer can take the whole NVLink egress) or for a ring that
    sends both ways."""
    return 2.0 if checks.flag("one_way", one_way) and spec.topology != "switch" else 1.0


def ring_matmul_balance_rows(ways: int, chip: str | Chip, *, bytes_per_element: float = 2,
                             one_way: bool = False,
                             slice_chips: int | None = None) -> float:
    """Rows ``m`` at which the overlapped all-gather matmul ``[m, k] @ [k, n]`` on a ring of
    ``ways`` chips gains most (:func:`overlap_speedup` with ``ways``): where one block's
    matmul, 2 m k n / ways^2 FLOPs, takes as long as one block's transfer, k n / ways
    elements; k and n cancel: m = ways x bytes/2 x FLOP/s / link bandwidth (twice that on a
    TPU line, ``slice_chips`` as in :func:`ring_time`). The link bandwidth is both
    directions, as ``allgather_bidi`` sends; ``one_way=True`` prices ``allgather_overlapped``,
    which on a TPU sends over one link (:func:`_one_way`): twice the rows."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    ways = checks.count("ways", ways, minimum=2, maximum=checks.MAX_DEVICES)
    return ways * size / 2 * spec.comm_ridge * _line(spec, ways, slice_chips, name="ways") \
        * _one_way(spec, one_way)


def collective_matmul_times(m: int, k: int, n: int, ways: int, chip: str | Chip, *,
                            bytes_per_element: float = 2, one_way: bool = False,
                            slice_chips: int | None = None) -> tuple[float, float]:
    """(compute, communication) seconds of the all-gather collective matmul of Part III:
    each of ``ways`` chips multiplies its ``m / ways`` rows of ``[m, k]`` by the ``[k, n]``
    right-hand side, whose ``k / ways`` row blocks are all-gathered around the ring (twice
    the ring's time on a TPU line, ``slice_chips`` as in :func:`ring_time`). The transfers
    use both directions of the ring, as ``allgather_bidi`` does; ``one_way=True`` prices the
    one-way ``allgather_overlapped``, twice the transfer time on a TPU. ``m`` and ``k`` must
    split into ``ways`` equal blocks, as the matmul itself requires."""
    spec, size = get_chip(chip), _bytes(bytes_per_element)
    m, k, n = _width("m", m), _width("k", k), _width("n", n)
    ways = checks.count("ways", ways, maximum=checks.MAX_DEVICES)
    checks.divisible("m (rows of the left-hand side)", m, ways, why=f"over ways={ways} chips")
    checks.divisible("k (rows of the right-hand side)", k, ways, why=f"over ways={ways} chips")
    compute = 2 * m * k * n / ways / spec.peak_flops_bf16
    comm = (ways - 1) / ways * k * n * size / spec.interconnect_bandwidth * _line(
        spec, ways, slice_chips, name="ways") * _one_way(spec, one_way)
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
