"""Timelines: one lane per device, what it did when, coloured by kind (the profiling Part's
picture of a trace).

A base module (it imports :mod:`spmd_guide.core.drawing` and :mod:`spmd_guide.core.checks`
only): it draws lanes of ``(start, duration, kind)`` spans and knows nothing of traces.

The four kinds are told apart by colour *and* fill: compute and collectives are solid bars of
colours with at least 4.5:1 contrast on the white background, a wait is a white bar hatched
in dark grey (its hatch and outline 7:1), and an ``"other"`` span (a loop around other ops)
is a thin dark line under the lane. Text is at least :data:`~spmd_guide.core.drawing.MIN_TEXT_PX`
pixels, as on every figure of the book.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spmd_guide.core import checks
from spmd_guide.core.drawing import _PT, TEXT, subplots

__all__ = ["KIND_STYLE", "draw_timeline"]

#: How each kind is drawn: fill colour, hatch, edge, the legend's words, and the order of
#: drawing (later on top).
KIND_STYLE: dict[str, dict[str, Any]] = {
    "other": {"color": "#555555", "hatch": "", "edge": "#555555", "label": "loop (contains ops)"},
    "compute": {"color": "#3A6EA5", "hatch": "", "edge": "#3A6EA5", "label": "compute"},
    "collective": {"color": "#AA3377", "hatch": "", "edge": "#AA3377", "label": "collective"},
    "wait": {"color": "#FFFFFF", "hatch": "////", "edge": "#444444",
             "label": "waiting for the others"},
}


def _spans(name: str, spans: Any) -> list[tuple[float, float, str]]:
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
        raise checks.InputTypeError(
            f"{name} must be a list of (start, duration, kind), got {checks.value_text(spans)}.")
    out = []
    for i, span in enumerate(spans):
        if not isinstance(span, (tuple, list)) or len(span) != 3:
            raise checks.InputTypeError(
                f"{name}[{i}] must be (start, duration, kind), got {checks.value_text(span)}.")
        start = checks.real(f"{name}[{i}] start", span[0])
        duration = checks.real(f"{name}[{i}] duration", span[1], minimum=0)
        kind = checks.one_of(f"{name}[{i}] kind", span[2], KIND_STYLE)
        out.append((start, duration, kind))
    return out


def draw_timeline(lanes: Mapping[str, Sequence[tuple[float, float, str]]], *, alt: str,
                  title: str = "", unit: str = "µs", width_in: float = 5.4) -> Any:
    """A figure with one lane per entry of ``lanes`` (top to bottom in their order), each
    span ``(start, duration, kind)`` drawn as a bar of its kind's style (:data:`KIND_STYLE`).

    ``alt`` is the figure's alt text (required: say what the picture shows); the x axis is
    time in ``unit``. Only the kinds that occur appear in the legend.
    """
    if not isinstance(lanes, Mapping) or not lanes:
        raise checks.InputTypeError(
            f"lanes must be a non-empty mapping of lane label -> spans, got "
            f"{checks.value_text(lanes)}.")
    if not isinstance(alt, str) or not alt.strip():
        raise checks.InputTypeError("a figure needs alt text: say in words what it shows.")
    width_in = checks.real("width_in", width_in, minimum=2.0, maximum=20.0)
    parsed = {str(label): _spans(f"lanes[{label!r}]", spans) for label, spans in lanes.items()}
    from matplotlib.patches import Patch

    n = len(parsed)
    fig, ax = subplots(alt=alt, figsize=(width_in, 0.34 * n + 1.25))
    used: set[str] = set()
    end = 0.0
    for row, spans in enumerate(parsed.values()):
        y = n - 1 - row
        for kind in KIND_STYLE:  # drawing order: later kinds on top
            bars = [(s, d) for s, d, k in spans if k == kind]
            if not bars:
                continue
            used.add(kind)
            style = KIND_STYLE[kind]
            if kind == "other":
                ax.broken_barh(bars, (y - 0.42, 0.08), facecolors=style["color"],
                               edgecolor="none")
            else:
                ax.broken_barh(bars, (y - 0.32, 0.64), facecolors=style["color"],
                               edgecolor=style["edge"], hatch=style["hatch"] or None,
                               linewidth=0.6 if kind == "wait" else 0.0)
            end = max(end, max(s + d for s, d in bars))
    ax.set_yticks(range(n), list(reversed(parsed)), fontsize=_PT["label"], color=TEXT)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, end * 1.01 if end > 0 else 1.0)
    ax.tick_params(axis="x", labelsize=_PT["value"], colors=TEXT)
    ax.set_xlabel(f"time ({unit})", fontsize=_PT["label"], color=TEXT)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=KIND_STYLE[k]["color"], edgecolor=KIND_STYLE[k]["edge"],
                     hatch=KIND_STYLE[k]["hatch"] or None, label=KIND_STYLE[k]["label"])
               for k in ("compute", "collective", "wait", "other") if k in used]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2,
              frameon=False, fontsize=_PT["value"], borderaxespad=0.2)
    if title:
        fig.suptitle(title, fontsize=_PT["title"], color=TEXT, y=1.0, va="bottom")
    fig.tight_layout()
    return fig
