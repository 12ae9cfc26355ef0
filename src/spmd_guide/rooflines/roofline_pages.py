"""What the rooflines pages show: the Part IV MLP priced per strategy and chip, predictions
ranked per chip, the figures, and the worked problems, each answer computed from
:mod:`spmd_guide.rooflines.roofline`. (The Part VIII transformer's counts live with the
transformer, in :mod:`spmd_guide.transformer.pricing`.)

The MLP's counts come from compiling each strategy's training step (value and gradient of its
loss) for a model too big for CPU memory: a tiny model is sharded with the strategy's public
``shard`` to learn each array's sharding, and the big program is compiled on
``jax.ShapeDtypeStruct``s with those shardings. Nothing is run; these are predictions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spmd_guide import nn
from spmd_guide.core import checks
from spmd_guide.rooflines import roofline

#: The MLP the page prices: widths of a transformer-sized feed-forward stack, and its batch.
MLP_SIZES = (4096, 16384, 16384, 4096)
MLP_BATCH = 8192


def _abstract_like(tree: Any, shapes: Any) -> Any:
    return jax.tree.map(lambda leaf, shape: jax.ShapeDtypeStruct(shape, leaf.dtype,
                                                                 sharding=leaf.sharding),
                        tree, shapes, is_leaf=lambda x: isinstance(x, tuple) and
                        all(isinstance(i, int) for i in x))


def strategy_counts(name: str, *, layer_sizes: Sequence[int] = MLP_SIZES,
                    batch: int = MLP_BATCH,
                    devices: Sequence[jax.Device] | None = None) -> roofline.Counts:
    """Per-device counts of one training step (loss and gradient) of strategy ``name`` on an
    MLP of ``layer_sizes`` and a batch of ``batch`` examples (float32), compiled, not run."""
    checks.one_of("strategy", name, nn.STRATEGIES)
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batch = checks.count("batch", batch)
    return _strategy_counts(name, sizes, batch,
                            tuple(jax.devices() if devices is None else devices))


@functools.cache
def _strategy_counts(name: str, sizes: tuple[int, ...], batch: int,
                     devices: tuple[jax.Device, ...]) -> roofline.Counts:
    strategy = nn.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    n = math.prod(mesh.devices.shape)
    small = [n * 2] * len(sizes)
    params = nn.init_mlp(jax.random.key(0), small)
    tiny = (jnp.zeros((n * 2, small[0])), jnp.zeros((n * 2, small[-1])))
    params, tiny = strategy.shard(params, tiny, mesh)
    shapes = [((a, b), (b,)) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    big_params = _abstract_like(params, shapes)
    big_batch = _abstract_like(tiny, ((batch, sizes[0]), (batch, sizes[-1])))
    step = jax.jit(jax.value_and_grad(strategy.loss(mesh)))
    return roofline.counts(step, big_params, big_batch)


@dataclass(frozen=True)
class Prediction:
    strategy: str
    chip: str
    estimate: roofline.Estimate


def predict_strategies(counts_by_name: dict[str, roofline.Counts],
                       chips: Sequence[str] = tuple(roofline.CHIPS)) -> list[Prediction]:
    """Each strategy's counts priced on each chip, bytes as bfloat16 (``byte_scale=0.5``)."""
    return [Prediction(name, chip, roofline.estimate(work, chip, byte_scale=0.5))
            for name, work in counts_by_name.items() for chip in chips]


def ranking(predictions: Sequence[Prediction], chip: str) -> list[str]:
    """Strategies on ``chip``, fastest predicted step first."""
    rows = [p for p in predictions if p.chip == chip]
    return [p.strategy for p in sorted(rows, key=lambda p: p.estimate.step_s)]


def prediction_rows(predictions: Sequence[Prediction], chip: str) -> list[dict[str, Any]]:
    """Table rows for one chip: the three times in ms, the bound, the rank."""
    order = ranking(predictions, chip)
    rows = []
    for name in order:
        e = next(p.estimate for p in predictions if p.chip == chip and p.strategy == name)
        rows.append({"strategy": name, "compute ms": f"{e.compute_s * 1e3:.3g}",
                     "memory ms": f"{e.memory_s * 1e3:.3g}",
                     "comm ms": f"{e.comm_s * 1e3:.3g}", "bound": e.bound,
                     "rank": order.index(name) + 1})
    return rows


def chip_for(device: jax.Device) -> str | None:
    """The key of :data:`~spmd_guide.rooflines.roofline.CHIPS` for ``device`` (by its device kind),
    or ``None`` when the chips file does not list it (a CPU, say)."""
    kind = str(getattr(device, "device_kind", "")).lower().replace(" ", "")
    names = {"h100": "h100-sxm", "h200": "h200", "b200": "b200", "tpuv4": "tpu-v4",
             "tpuv5lite": "tpu-v5e", "tpuv5e": "tpu-v5e", "tpuv5p": "tpu-v5p",
             "tpuv5": "tpu-v5p", "tpuv6lite": "tpu-v6e", "tpuv6e": "tpu-v6e"}
    for name in sorted(names, key=len, reverse=True):
        if name in kind:
            return names[name]
    return None


# --------------------------------------------------------------------------- figures


def _axes(figsize: tuple[float, float] = (4.8, 3.8)) -> tuple[Any, Any]:
    """Figures 4.8 in wide: on a 400 px phone their 11 pt text still shows at 11 px or more."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    ax.tick_params(labelsize=11)
    ax.grid(alpha=0.3, which="both")
    return fig, ax


def _finish(ax: Any) -> None:
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.label.set_fontsize(11)
    ax.yaxis.label.set_fontsize(11)


def plot_rooflines(points: dict[str, roofline.Estimate | tuple[float, float]],
                   chips: Sequence[str] = tuple(roofline.CHIPS)) -> Any:
    """Log-log rooflines (attainable FLOP/s against FLOPs per HBM byte) of ``chips``, with
    ``points`` (label -> an Estimate or (intensity, FLOPs)) marked at their intensity."""
    fig, ax = _axes()
    x = np.logspace(-2, 4, 200)
    for i, key in enumerate(chips):
        chip = roofline.get_chip(key)
        ax.plot(x, np.minimum(chip.peak_flops_bf16, x * chip.hbm_bandwidth), color=f"C{i}",
                label=key, lw=1.6)
    for label, point in points.items():
        intensity = point.intensity if isinstance(point, roofline.Estimate) else point[0]
        ax.axvline(intensity, color="0.3", ls=":", lw=1)
        ax.text(intensity * 1.12, 1.3e11, label, fontsize=11, color="0.15", rotation=90,
                va="bottom")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOPs per HBM byte)",
           ylabel="attainable FLOP/s (bf16)", ylim=(1e11, 5e15))
    _finish(ax)
    ax.legend(fontsize=11, ncol=2, loc="upper left", handlelength=1.2)
    fig.tight_layout()
    return fig


def plot_curves(x: np.ndarray, curves: dict[str, np.ndarray], *, xlabel: str, ylabel: str,
                marks: dict[str, float] | None = None, logy: bool = True,
                xticks: Sequence[float] | None = None) -> Any:
    """One line per curve over ``x`` (log x axis), optional horizontal marks (label -> y).

    ``xticks``: where to label the x axis, in plain numbers (say ``[2, 4, 8, 16, 32, 64]`` for
    a range too short for the log axis's powers of ten); by default, matplotlib's choice.
    """
    fig, ax = _axes((4.8, 3.8))
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(x, values, label=label, color=f"C{i}", lw=1.6)
    for label, level in (marks or {}).items():
        ax.axhline(level, color="0.3", lw=1)
        ax.text(x[0], level * (1.15 if logy else 1.02), label, fontsize=11, color="0.15")
    ax.set(xscale="log", yscale="log" if logy else "linear", xlabel=xlabel, ylabel=ylabel)
    _finish(ax)
    if xticks is not None:
        ax.set_xticks(list(xticks), [f"{t:g}" for t in xticks])
    ax.legend(fontsize=11, ncol=2, handlelength=1.2)
    fig.tight_layout()
    return fig


#: The mark above each bar of :func:`plot_predictions`: which of the three times is longest.
BOUND_MARKERS: dict[str, str] = {"compute": "o", "memory": "s", "communication": "^"}


def plot_predictions(predictions: Sequence[Prediction]) -> Any:
    """Predicted step time (ms, log) per strategy, one group of bars per chip; a black mark
    above each bar says which bound dominates (:data:`BOUND_MARKERS`). The key, strategies
    then bounds, sits above the plot, clear of the bars."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    chips = list(dict.fromkeys(p.chip for p in predictions))
    names = list(dict.fromkeys(p.strategy for p in predictions))
    cols = 3
    strategy_rows = -(-len(names) // cols)
    fig, ax = plt.subplots(figsize=(4.8, 3.5 + 0.25 * (strategy_rows + 2)),
                           layout="constrained")
    ax.tick_params(labelsize=11)
    ax.grid(alpha=0.3, which="major")
    width = 0.8 / len(names)
    times = {(p.chip, p.strategy): p.estimate for p in predictions}
    for j, name in enumerate(names):
        for i, chip in enumerate(chips):
            e = times[chip, name]
            x, top = i + j * width, e.step_s * 1e3
            ax.bar(x, top, width, color=f"C{j}", edgecolor="white", linewidth=0.3)
            ax.plot(x, top * 1.35, BOUND_MARKERS[e.bound], color="black", markersize=4.2,
                    markeredgewidth=0)
    ax.set_xticks(np.arange(len(chips)) + 0.4 - width / 2, chips, rotation=40, ha="right")
    low = min(p.estimate.step_s for p in predictions) * 1e3
    high = max(p.estimate.step_s for p in predictions) * 1e3
    ax.set(yscale="log", ylim=(low / 2, high * 2.5))
    ax.set_ylabel("predicted step (ms)", fontsize=11)
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    # The key as a grid read row by row: strategies, padded to whole rows, then the bounds.
    blank = Patch(color="none", label="")
    entries = [Patch(color=f"C{j}", label=name) for j, name in enumerate(names)]
    entries += [blank] * (strategy_rows * cols - len(names))
    entries += [Line2D([], [], ls="", marker=m, color="black", markersize=6, label=b)
                for b, m in BOUND_MARKERS.items()]
    rows = len(entries) // cols
    by_column = [entries[r * cols + c] for c in range(cols) for r in range(rows)]
    fig.legend(handles=by_column, ncol=cols, fontsize=11, loc="outside upper left",
               handlelength=1.0, handletextpad=0.4, columnspacing=0.9, frameon=False,
               title="bar colour: strategy; mark above: the bound", title_fontsize=11,
               alignment="left")
    return fig


# --------------------------------------------------------------------------- worked problems


@dataclass(frozen=True)
class Problem:
    """A worked problem: the question, the answer in words, and the number it rests on."""

    key: str
    question: str
    answer: str
    value: float


def _src(key: str) -> str:
    chip = roofline.CHIPS[key]
    return f"{chip.name}: {chip.source}"


def problems() -> list[Problem]:
    """The worked problems of the Part, every number computed from the chips file."""
    h100, v5e, v5p, h200 = (roofline.CHIPS[k] for k in ("h100-sxm", "tpu-v5e", "tpu-v5p", "h200"))
    out = []
    out.append(Problem(
        "ridge", "What arithmetic intensity must a bf16 program reach to be compute-bound on "
        "an H100 SXM?",
        f"peak / HBM bandwidth = {h100.peak_flops_bf16:.3g} / {h100.hbm_bandwidth:.3g} = "
        f"{h100.ridge:.0f} FLOPs per byte.", h100.ridge))
    b = roofline.critical_batch("tpu-v5e", d=8192, f=32768)
    out.append(Problem(
        "matmul_batch", "On a TPU v5e, from what batch B is the bf16 matmul "
        "x[B, 8192] @ W[8192, 32768] compute-bound?",
        f"Solve 2*B*8192*32768 / (2*(8192*B + 8192*32768 + 32768*B)) = {v5e.ridge:.0f} "
        f"(the v5e ridge): B = {b:.0f}, a little above the wide-weight limit "
        f"{roofline.critical_batch('tpu-v5e'):.0f}.", b))
    dp = roofline.dp_critical_batch("h100-sxm", n=8)
    out.append(Problem(
        "dp_nvlink", "Data parallelism over the 8 H100s of one node (bf16 gradients): from how "
        "many examples per GPU does the gradient all-reduce hide behind the backward pass?",
        f"Backward: 4*B*P FLOPs; all-reduce: 2*(7/8)*2*P bytes. Equal at B = 2*(7/8)*"
        f"{h100.peak_flops_bf16:.3g} / (2*{h100.interconnect_bandwidth:.3g}) = {dp:.0f}.", dp))
    dpn = roofline.dp_critical_batch("h100-sxm", link="network")
    out.append(Problem(
        "dp_network", "The same all-reduce across many H100 nodes over InfiniBand "
        f"({h100.network_bandwidth / 1e9:g} GB/s per GPU): from how many examples per GPU?",
        f"B = 2 * {h100.peak_flops_bf16:.3g} / (2 * {h100.network_bandwidth:.3g}) = "
        f"{dpn:.0f}: {dpn / dp:.0f} times the NVLink answer, which is why DP across nodes "
        "wants big batches (or hierarchical reductions).", dpn))
    need = math.ceil(7e9 * 16 / v5e.hbm_bytes)
    out.append(Problem(
        "fsdp_fit", "How many TPU v5e chips does FSDP need to hold a 7B-parameter model with "
        "AdamW state (float32 master weights, gradients and two moments: 16 bytes per "
        "parameter), before activations?",
        f"7e9 * 16 B = {7e9 * 16 / 1e9:g} GB over {v5e.hbm_bytes / 1e9:g} GB per chip: "
        f"{need} chips at least (in practice a power of two, and room for activations: 8 or "
        "16).", need))
    step = 6 * 7e9 * 1e6 / (256 * v5p.peak_flops_bf16)
    out.append(Problem(
        "train_step", "A 7B model trains on 1M-token batches on 256 TPU v5p chips. What is the "
        "compute-bound step time at peak FLOP/s?",
        f"6 * 7e9 * 1e6 FLOPs / (256 * {v5p.peak_flops_bf16:.3g} FLOP/s) = {step:.3f} s; "
        "a real step runs at a fraction of peak (its MFU).", step))
    ways = roofline.tp_max_ways("tpu-v5p", 28672)
    out.append(Problem(
        "tp_ways", "Over how many TPU v5p chips (one torus axis) can a bf16 weight with 28672 "
        "output columns be split before the all-gather of its input outlasts the matmul?",
        f"Compute-bound while 28672 >= (n-1) * {v5p.comm_ridge:.0f} (2 bytes x FLOP/s over link bandwidth / 2), "
        f"i.e. n <= {ways}.", ways))
    gather = roofline.ring_time(8192 * 28672 * 2, 8, "h100-sxm")
    out.append(Problem(
        "allgather", "How long does all-gathering a bf16[8192, 28672] weight over 8 H100s "
        "take at NVLink's published bandwidth?",
        f"(7/8) * {8192 * 28672 * 2 / 1e6:.0f} MB / {h100.interconnect_bandwidth / 1e9:g} GB/s "
        f"= {gather * 1e6:.0f} us (measured NCCL bandwidth is lower).", gather))
    rows = 3 * 2 * v5e.comm_ridge / 2
    out.append(Problem(
        "overlap", "The all-gather collective matmul (allgather_overlapped) on a ring of 4 TPU v5e chips "
        "(bf16): for how many rows m does overlapping pay the most, and how much?",
        f"Compute 2*m*k*n/4 over FLOP/s equals (3/4)*k*n*2 bytes over link bandwidth at "
        f"m = 3*2*{v5e.comm_ridge:.0f}/2 = {rows:.0f}; there the overlapped version takes "
        "half the time (speedup 2); far from it, little gain.", rows))
    decode = 7e9 * 2 / h200.hbm_bandwidth
    out.append(Problem(
        "decode", "Generating one token with a 7B bf16 model on one H200 reads every weight "
        "once. What is the memory-bound lower limit per token?",
        f"14 GB / {h200.hbm_bandwidth / 1e12:g} TB/s = {decode * 1e3:.2f} ms.", decode))
    return out


def intensity_exercises() -> list[Problem]:
    """The exercises closing the rooflines chapter (arithmetic intensity, critical batch)."""
    f32 = roofline.matmul_intensity(256, 4096, 4096, bytes_per_element=4)
    bf16 = roofline.matmul_intensity(256, 4096, 4096)
    b200 = roofline.CHIPS["b200"]
    return [
        Problem("f32_intensity", "What is the arithmetic intensity of x[256, 4096] @ "
                "W[4096, 4096] in float32, and in bfloat16?",
                f"2*256*4096*4096 / (b*(256*4096 + 4096*4096 + 256*4096)): {f32:.0f} FLOPs "
                f"per byte for b = 4, {bf16:.0f} for b = 2. Halving the bytes doubles it.",
                bf16),
        Problem("b200_batch", "From what batch is a bf16 matmul with a wide weight "
                "compute-bound on a B200, and why is that close to an H100's?",
                f"B* = ridge = {b200.peak_flops_bf16:.3g} / {b200.hbm_bandwidth:.3g} = "
                f"{b200.ridge:.0f} (H100 SXM: {roofline.CHIPS['h100-sxm'].ridge:.0f}): FLOP/s and "
                "HBM bandwidth grew by similar factors.", b200.ridge),
    ]
