"""What the rooflines pages show: the Part IV MLP priced per strategy and chip, predictions
ranked per chip, the figures, and the worked problems, each answer computed with
:mod:`spmd_guide.rooflines.roofline` and :mod:`spmd_guide.rooflines.formulas` from the chips of
:mod:`spmd_guide.rooflines.hardware`. (The Part IX transformer's counts live with the
transformer, in :mod:`spmd_guide.transformer.pricing`.)

The MLP's counts come from compiling each strategy's training step (value and gradient of its
loss) for a model too big for CPU memory: a tiny model is sharded with the strategy's public
``shard`` to learn each array's sharding, and the big program is compiled on
``jax.ShapeDtypeStruct``s with those shardings. Nothing is run; these are predictions.

Every public function checks its arguments first (:mod:`spmd_guide.core.checks`): strategy and
chip names as whole strings, NumPy numbers and arrays wherever Python ones are taken, NaN
refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spmd_guide import nn
from spmd_guide.core import checks, hlo
from spmd_guide.rooflines import formulas, hardware, roofline

#: The MLP the page prices: widths of a transformer-sized feed-forward stack, and its batch.
MLP_SIZES = (4096, 16384, 16384, 4096)
MLP_BATCH = 8192


def _abstract_like(tree: Any, shapes: Any) -> Any:
    return jax.tree.map(lambda leaf, shape: jax.ShapeDtypeStruct(shape, leaf.dtype,
                                                                 sharding=leaf.sharding),
                        tree, shapes, is_leaf=lambda x: isinstance(x, tuple) and
                        all(isinstance(i, int) for i in x))


def strategy_counts(name: str, *, layer_sizes: Sequence[int] = MLP_SIZES,
                    batch: int = MLP_BATCH, devices: Any = None,
                    gradient: bool = True) -> roofline.Counts:
    """Per-device counts of one training step (loss and gradient) of strategy ``name`` on an
    MLP of ``layer_sizes`` and a batch of ``batch`` examples (float32), compiled, not run;
    ``gradient=False`` compiles the loss alone (the forward pass).

    ``devices``: a list of devices, or a mesh (Auto or Explicit axes) whose devices to use;
    the strategy builds its own mesh over them, as Part IV does. Sizes that do not split
    evenly over that mesh raise the strategy's ``InputError``."""
    name = hardware.choice("strategy", name, nn.STRATEGIES)
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batch = checks.count("batch", batch)
    return _strategy_counts(name, sizes, batch, roofline.as_devices(devices),
                            checks.flag("gradient", gradient))


@functools.cache
def _strategy_counts(name: str, sizes: tuple[int, ...], batch: int,
                     devices: tuple[jax.Device, ...], gradient: bool = True) -> roofline.Counts:
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
    loss = strategy.loss(mesh)
    step = jax.jit(jax.value_and_grad(loss) if gradient else loss)
    with jax.set_mesh(mesh):  # the strategy's mesh, whatever mesh the caller has set
        compiled = step.lower(big_params, big_batch).compile(hlo.FAST_COMPILE)
    return roofline.counts(compiled)


@dataclass(frozen=True)
class Prediction:
    """One strategy's predicted step on one chip (peak rates, bf16 bytes)."""

    strategy: str
    chip: str
    estimate: roofline.Estimate

    def __post_init__(self) -> None:
        for name in ("strategy", "chip"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise checks.InputTypeError(
                    f"{name} must be a non-empty string, got {getattr(self, name)!r}.")
        if not isinstance(self.estimate, roofline.Estimate):
            raise checks.InputTypeError(
                f"estimate must be a roofline.Estimate, got {type(self.estimate).__name__}.")


def predict_strategies(counts_by_name: Mapping[str, roofline.Counts],
                       chips: Any = tuple(hardware.CHIPS), *,
                       topology: bool = True) -> list[Prediction]:
    """Each strategy's counts priced on each chip, bytes as bfloat16 (``byte_scale=0.5``).
    ``chips``: one chip name (``'h100-sxm'``) or a sequence of them. Each collective is
    priced on its axis's topology (:func:`spmd_guide.rooflines.roofline.comm_seconds`: on a
    TPU slice an axis without a wraparound link is a line, twice a ring's time);
    ``topology=False`` prices every axis as a ring."""
    topology = checks.flag("topology", topology)
    if not isinstance(counts_by_name, Mapping) or not counts_by_name:
        raise checks.InputTypeError(
            "counts_by_name must be a non-empty dict of strategy name -> roofline.Counts, "
            f"got {counts_by_name!r}.")
    for name, work in counts_by_name.items():
        if not isinstance(name, str) or not isinstance(work, roofline.Counts):
            raise checks.InputTypeError(
                f"counts_by_name must map strategy names (strings) to roofline.Counts, got "
                f"{name!r}: {type(work).__name__}.")
    keys = [chip.key for chip in hardware.get_chips(chips)]
    return [Prediction(str(name), chip, roofline.estimate(work, chip, byte_scale=0.5,
                                                          topology=topology))
            for name, work in counts_by_name.items() for chip in keys]


def _for_chip(predictions: Any, chip: Any) -> tuple[str, list[Prediction]]:
    """The key of ``chip`` and its predictions; refuses a chip with none."""
    if isinstance(predictions, (str, bytes, Mapping)) or not isinstance(predictions, Sequence):
        raise checks.InputTypeError(
            f"predictions must be a list of Prediction (from predict_strategies), got "
            f"{type(predictions).__name__}.")
    bad = [p for p in predictions if not isinstance(p, Prediction)]
    if bad:
        raise checks.InputTypeError(
            f"predictions must hold Prediction objects, got {type(bad[0]).__name__}.")
    key = hardware.get_chip(chip).key
    rows = [p for p in predictions if p.chip == key]
    if not rows:
        have = sorted({p.chip for p in predictions})
        raise checks.InputError(f"no predictions for chip {key!r}; they cover {have}.")
    return key, rows


def ranking(predictions: Sequence[Prediction], chip: str) -> list[str]:
    """Strategies on ``chip``, fastest predicted step first."""
    _, rows = _for_chip(predictions, chip)
    return [p.strategy for p in sorted(rows, key=lambda p: p.estimate.step_s)]


def first_places(predictions: Sequence[Prediction]) -> str:
    """How many chips each strategy is predicted fastest on, for a sentence:
    ``"auto_dp_tp on 1, tp on 6"`` (strategies in alphabetical order)."""
    if isinstance(predictions, (str, bytes, Mapping)) or not isinstance(predictions, Sequence) \
            or not predictions or not all(isinstance(p, Prediction) for p in predictions):
        raise checks.InputTypeError(
            "predictions must be a non-empty list of Prediction (from predict_strategies), got "
            f"{checks.value_text(predictions)}.")
    firsts = [ranking(predictions, chip)[0] for chip in dict.fromkeys(p.chip for p in predictions)]
    return ", ".join(f"{name} on {firsts.count(name)}" for name in sorted(set(firsts)))


def prediction_rows(predictions: Sequence[Prediction], chip: str) -> list[dict[str, Any]]:
    """Table rows for one chip: the three predicted times in ms, the predicted step (their
    largest), the bound, the rank."""
    _, rows = _for_chip(predictions, chip)
    ordered = sorted(rows, key=lambda p: p.estimate.step_s)
    return [{"strategy": p.strategy, "compute ms": f"{p.estimate.compute_s * 1e3:.3g}",
             "memory ms": f"{p.estimate.memory_s * 1e3:.3g}",
             "comm ms": f"{p.estimate.comm_s * 1e3:.3g}",
             "step ms": f"{p.estimate.step_s * 1e3:.3g}", "bound": p.estimate.bound,
             "rank": rank} for rank, p in enumerate(ordered, start=1)]


#: Device kinds (lower case, spaces removed) -> chip keys. Variants whose rates differ from
#: the chips file's (H100 PCIe and NVL, H200 NVL, the GH200, and the GB200, whose B200 runs
#: at 2,500 dense bf16 TFLOP/s against the HGX B200's 2,250) are matched to ``None`` first.
_KINDS = {"h100pcie": None, "h100nvl": None, "h200nvl": None, "gh200": None, "gb200": None,
          "h100": "h100-sxm",
          "h200": "h200", "b200": "b200", "tpuv4": "tpu-v4", "tpuv5lite": "tpu-v5e",
          "tpuv5e": "tpu-v5e", "tpuv5p": "tpu-v5p", "tpuv5": "tpu-v5p",
          "tpuv6lite": "tpu-v6e", "tpuv6e": "tpu-v6e"}


def chip_for(device: Any) -> str | None:
    """The key of :data:`~spmd_guide.rooflines.hardware.CHIPS` for ``device`` (a
    ``jax.Device``, read by its ``device_kind``), or ``None`` when the chips file does not
    list it: a CPU, or a variant with other rates (an H100 PCIe or NVL, an H200 NVL, a
    GH200, a GB200)."""
    kind = getattr(device, "device_kind", None)
    if not isinstance(kind, str):
        raise checks.InputTypeError(
            f"device must be a jax.Device (such as jax.devices()[0]), got {device!r}.")
    kind = kind.lower().replace(" ", "")
    for name in sorted(_KINDS, key=len, reverse=True):
        if name in kind:
            return _KINDS[name]
    return None


def how_many(count: int, total: int) -> str:
    """``count`` of ``total`` in words for a sentence: "all 7", "none of the 7", "5 of the 7"."""
    total = checks.count("total", total)
    count = checks.count("count", count, minimum=0, maximum=total)
    if count == total:
        return f"all {total}"
    return f"none of the {total}" if count == 0 else f"{count} of the {total}"


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


def _intensities(points: Any) -> dict[str, float]:
    """label -> intensity of each point (an Estimate, or an (intensity, FLOPs) pair)."""
    if not isinstance(points, Mapping):
        raise checks.InputTypeError(
            f"points must be a dict of label -> Estimate or (intensity, FLOPs), got "
            f"{type(points).__name__}.")
    out = {}
    for label, point in points.items():
        if not isinstance(label, str):
            raise checks.InputTypeError(f"a label of points must be a string, got {label!r}.")
        if isinstance(point, roofline.Estimate):
            value = point.intensity
        elif isinstance(point, (tuple, list, np.ndarray)) and len(point) == 2:
            value = point[0]
            checks.real(f"the FLOPs of points[{label!r}]", point[1], minimum=0)
        else:
            raise checks.InputTypeError(
                f"points[{label!r}] must be an Estimate or an (intensity, FLOPs) pair, got "
                f"{point!r}.")
        out[label] = checks.real(f"the intensity of points[{label!r}]", value, positive=True)
    return out


def plot_rooflines(points: Mapping[str, roofline.Estimate | tuple[float, float]],
                   chips: Any = tuple(hardware.CHIPS)) -> Any:
    """Log-log rooflines (attainable FLOP/s against FLOPs per HBM byte) of ``chips`` (one
    name or several), with ``points`` (label -> an Estimate or (intensity, FLOPs)) marked at
    their intensity."""
    marks = _intensities(points)
    specs = hardware.get_chips(chips)
    fig, ax = _axes()
    x = np.logspace(-2, 4, 200)
    for i, chip in enumerate(specs):
        ax.plot(x, np.minimum(chip.peak_flops_bf16, x * chip.hbm_bandwidth), color=f"C{i}",
                label=chip.key, lw=1.6)
    for label, intensity in marks.items():
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
    Values must be finite (NaN refused) and positive where their axis is logarithmic.
    """
    logy = checks.flag("logy", logy)
    x = checks.array("x", x, ndim=1)
    if len(x) < 2:
        raise checks.InputError(f"x needs at least 2 values to draw a line, got {len(x)}.")
    x = _finite("x", np.asarray(x, dtype=float), positive=True)
    if not isinstance(curves, Mapping) or not curves:
        raise checks.InputTypeError(
            f"curves must be a non-empty dict of label -> values, got {type(curves).__name__}.")
    for label in curves:
        if not isinstance(label, str):
            raise checks.InputTypeError(f"a label of curves must be a string, got {label!r}.")
    curves = {label: _finite(f"curves[{label!r}]", np.asarray(
        checks.array(f"curves[{label!r}]", values, ndim=1), dtype=float), positive=logy,
        length=len(x)) for label, values in curves.items()}
    for name, text in (("xlabel", xlabel), ("ylabel", ylabel)):
        if not isinstance(text, str):
            raise checks.InputTypeError(f"{name} must be a string, got {text!r}.")
    if marks is not None and not isinstance(marks, Mapping):
        raise checks.InputTypeError(f"marks must be a dict of label -> y, got {marks!r}.")
    marks = {label: checks.real(f"marks[{label!r}]", level, positive=logy)
             for label, level in (marks or {}).items()}
    if xticks is not None:
        if isinstance(xticks, (str, bytes, Mapping)) or not isinstance(
                xticks, (Sequence, np.ndarray)):
            raise checks.InputTypeError(
                f"xticks must be a sequence of numbers such as [2, 4, 8], got {xticks!r}.")
        xticks = [checks.real("an entry of xticks", t, positive=True) for t in xticks]
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


def _finite(name: str, values: np.ndarray, *, positive: bool = False,
            length: int | None = None) -> np.ndarray:
    """``values`` if every entry is finite (and positive when ``positive``), of ``length``."""
    if length is not None and len(values) != length:
        raise checks.InputError(f"{name} has {len(values)} values, but x has {length}.")
    if not np.all(np.isfinite(values)):
        raise checks.InputError(f"{name} holds NaN or infinite values: {values!r}.")
    if positive and np.any(values <= 0):
        raise checks.InputError(f"{name} must be positive (its axis is logarithmic).")
    return values


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

    if isinstance(predictions, (str, bytes, Mapping)) or not isinstance(predictions, Sequence) \
            or not predictions or not all(isinstance(p, Prediction) for p in predictions):
        raise checks.InputTypeError(
            "predictions must be a non-empty list of Prediction (from predict_strategies).")
    chips = list(dict.fromkeys(p.chip for p in predictions))
    names = list(dict.fromkeys(p.strategy for p in predictions))
    have = {(p.chip, p.strategy) for p in predictions}
    gaps = [(c, n) for c in chips for n in names if (c, n) not in have]
    if gaps or len(have) != len(predictions):
        raise checks.InputError(
            "predictions must hold each strategy on each chip exactly once; "
            f"missing {gaps[:3]}" if gaps else "predictions repeat a (chip, strategy) pair.")
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

    def __post_init__(self) -> None:
        for name in ("key", "question", "answer"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise checks.InputTypeError(
                    f"{name} must be a non-empty string, got {getattr(self, name)!r}.")
        object.__setattr__(self, "value", checks.real("value", self.value))


def _src(key: str) -> str:
    chip = hardware.CHIPS[key]
    return f"{chip.name}: {chip.source}"


def problems() -> list[Problem]:
    """The worked problems of the Part, every number computed from the chips file."""
    h100, v5e, v5p, h200 = (hardware.CHIPS[k] for k in ("h100-sxm", "tpu-v5e", "tpu-v5p", "h200"))
    out = []
    out.append(Problem(
        "ridge", "What arithmetic intensity must a bf16 program reach to be compute-bound on "
        "an H100 SXM?",
        f"peak / HBM bandwidth = {h100.peak_flops_bf16:.3g} / {h100.hbm_bandwidth:.3g} = "
        f"{h100.ridge:.0f} FLOPs per byte.", h100.ridge))
    b = formulas.critical_batch("tpu-v5e", d=8192, f=32768)
    out.append(Problem(
        "matmul_batch", "On a TPU v5e, from what batch B is the bf16 matmul "
        "x[B, 8192] @ W[8192, 32768] compute-bound?",
        f"Solve 2*B*8192*32768 / (2*(8192*B + 8192*32768 + 32768*B)) = {v5e.ridge:.0f} "
        f"(the v5e ridge): B = {b:.0f}, a little above the wide-weight limit "
        f"{formulas.critical_batch('tpu-v5e'):.0f}.", b))
    dp = formulas.dp_critical_batch("h100-sxm", n=8)
    out.append(Problem(
        "dp_nvlink", "Data parallelism over the 8 H100s of one node (bf16 gradients): from how "
        "many examples per GPU does the gradient all-reduce hide behind the backward pass?",
        f"Backward: 4*B*P FLOPs; all-reduce: 2*(7/8)*2*P bytes. Equal at B = 2*(7/8)*"
        f"{h100.peak_flops_bf16:.3g} / (2*{h100.interconnect_bandwidth:.3g}) = {dp:.0f}.", dp))
    dpn = formulas.dp_critical_batch("h100-sxm", link="network", group=8)
    flat = formulas.dp_critical_batch("h100-sxm", link="network", group=1)
    out.append(Problem(
        "dp_network", "The same all-reduce across many 8-GPU H100 nodes over InfiniBand "
        f"({h100.network_bandwidth / 1e9:g} GB/s per GPU): from how many examples per GPU?",
        "Each NIC carries 1/8 of the gradient. NCCL's rings are flat (they span NVLink and "
        "InfiniBand, one ring per NIC) and its trees move the same bytes, as a reduce inside "
        "the node first would: a reduce-scatter over NVLink, an all-reduce of each GPU's 1/8 "
        "over its own NIC, an all-gather over NVLink. So "
        f"B = 2 * {h100.peak_flops_bf16:.3g} / (2 * 8 * "
        f"{h100.network_bandwidth:.3g}) = {dpn:.0f} per GPU, {dpn / dp:.2f} times the NVLink "
        f"answer; the NVLink part still runs, so the step needs both: {max(dpn, dp):.0f} "
        "(the scaling book's GPU chapter gets 2475 from the same rates). A flat ring over the "
        f"NICs would charge each GPU the whole gradient, {flat:.0f}: 8 times too many.", dpn))
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
    ways = formulas.tp_max_ways("tpu-v5p", 28672)
    out.append(Problem(
        "tp_ways", "Over how many TPU v5p chips (one torus axis) can a bf16 weight with 28672 "
        "output columns be split before the all-gather of its input outlasts the matmul?",
        f"Compute-bound while 28672 >= (n-1) * {v5p.comm_ridge:.0f} (2 bytes x FLOP/s over link bandwidth / 2), "
        f"i.e. n <= {ways}.", ways))
    gather = formulas.ring_time(8192 * 28672 * 2, 8, "h100-sxm")
    out.append(Problem(
        "allgather", "How long does all-gathering a bf16[8192, 28672] weight over 8 H100s "
        "take at NVLink's published bandwidth?",
        f"(7/8) * {8192 * 28672 * 2 / 1e6:.0f} MB / {h100.interconnect_bandwidth / 1e9:g} GB/s "
        f"= {gather * 1e6:.0f} us (measured NCCL bandwidth is lower).", gather))
    rows = formulas.ring_matmul_balance_rows(4, "tpu-v5e")
    compute, comm = formulas.collective_matmul_times(4 * round(rows / 4), 8192, 8192, 4,
                                                     "tpu-v5e")
    best = formulas.overlap_speedup(compute, comm, ways=4)
    out.append(Problem(
        "overlap", "The all-gather collective matmul (allgather_overlapped) on a ring of 4 TPU "
        "v5e chips (a 2x2 slice, whose 4 chips close a cycle; bf16): for how many rows m "
        "does overlapping pay the most, and how much?",
        "It does 4 block matmuls (2*m*k*n/16 FLOPs each) and 3 block transfers (k*n/4 "
        "elements each), each transfer beside the previous block's matmul; the last matmul "
        "has nothing left to hide. The gain is largest where one block's matmul takes as "
        f"long as one transfer: m = 4 * 2/2 * {v5e.comm_ridge:.0f} = {rows:.0f} rows. There "
        f"the step takes the compute time alone instead of compute plus transfers: speedup "
        f"{best:.2f} = (2n-1)/n for n = 4, not 2; far from it, little gain.", rows))
    decode = 7e9 * 2 / h200.hbm_bandwidth
    out.append(Problem(
        "decode", "Generating one token with a 7B bf16 model on one H200 reads every weight "
        "once. What is the memory-bound lower limit per token?",
        f"14 GB / {h200.hbm_bandwidth / 1e12:g} TB/s = {decode * 1e3:.2f} ms.", decode))
    return out


def intensity_exercises() -> list[Problem]:
    """The exercises closing the rooflines chapter (arithmetic intensity, critical batch)."""
    f32 = formulas.matmul_intensity(256, 4096, 4096, bytes_per_element=4)
    bf16 = formulas.matmul_intensity(256, 4096, 4096)
    b200 = hardware.CHIPS["b200"]
    return [
        Problem("f32_intensity", "What is the arithmetic intensity of x[256, 4096] @ "
                "W[4096, 4096] in float32, and in bfloat16?",
                f"2*256*4096*4096 / (b*(256*4096 + 4096*4096 + 256*4096)): {f32:.0f} FLOPs "
                f"per byte for b = 4, {bf16:.0f} for b = 2. Halving the bytes doubles it.",
                bf16),
        Problem("b200_batch", "From what batch is a bf16 matmul with a wide weight "
                "compute-bound on a B200, and why is that close to an H100's?",
                f"B* = ridge = {b200.peak_flops_bf16:.3g} / {b200.hbm_bandwidth:.3g} = "
                f"{b200.ridge:.0f} (H100 SXM: {hardware.CHIPS['h100-sxm'].ridge:.0f}): FLOP/s and "
                "HBM bandwidth grew by similar factors.", b200.ridge),
    ]
