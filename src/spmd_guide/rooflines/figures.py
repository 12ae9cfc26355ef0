"""The Part's figures, drawn from predictions: rooflines of the chips with programs marked at
their intensity (:func:`plot_rooflines`), curves over a range of sizes (:func:`plot_curves`)
and the predicted step per strategy and chip (:func:`plot_predictions`), pages
rooflines/rooflines, rooflines/parallelism and rooflines/transformer.

Figures are 4.8 in wide with 11 pt text, so that on a 400 px phone the smallest text still
shows at 11 px or more. Values are checked before anything is drawn: NaN, infinite and (on a
logarithmic axis) non-positive values are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spmd_guide.core import checks
from spmd_guide.rooflines import hardware, roofline
from spmd_guide.rooflines.strategies import Prediction


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
