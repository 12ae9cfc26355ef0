"""Every picture the book draws: one palette, one font stack, vector figures with alt text.

A base module: it imports only :mod:`spmd_guide.core.display` (whose palette and fonts it
uses, so device ``d`` has colour ``PALETTE[d % len(PALETTE)]`` on every page, in HTML grids
and in matplotlib figures alike); the Part modules call it.

- Matplotlib figures are shown as SVG with alt text (:func:`figure_html`), sized so that their
  smallest text never drops below :data:`MIN_TEXT_PX` CSS pixels: :func:`use_svg_figures` makes
  IPython show every figure that way; :func:`subplots` makes a figure that carries its alt text.
- :class:`Panel` and :func:`draw_panels`: what each device holds at successive moments, the
  picture of every collective and collective matmul.
The TPU ring picture of Part I lives in :mod:`spmd_guide.meshes.tpu_ring`, built on this module.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spmd_guide.core.checks import InputError, InputTypeError, count
from spmd_guide.core.display import (  # noqa: F401 - re-exported: the figures' palette and fonts
    FONT_CSS,
    FONT_STACK,
    MONO_CSS,
    MONO_STACK,
    PALETTE,
    TEXT,
    Html,
)

#: The smallest text a figure may show, in CSS pixels, and the book's text column on a desktop.
MIN_TEXT_PX = 11.0
COLUMN_PX = 688.0
_PX_PER_PT = 96 / 72
_PT = {"value": 8.5, "label": 9.0, "title": 10.0}  # 8.5 pt = 11.3 CSS px


# --- Matplotlib figures as SVG with alt text -------------------------------------------------


def _figure_class() -> type:
    from matplotlib.figure import Figure

    class DrawnFigure(Figure):
        """A matplotlib Figure that knows its alt text and shows itself as SVG."""

        alt: str = ""

        def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
            return figure_bundle(self)

    return DrawnFigure


def subplots(nrows: int = 1, ncols: int = 1, *, alt: str, keep_open: bool = False,
             **options: Any) -> tuple[Any, Any]:
    """``plt.subplots`` for a figure that carries its alt text (shown by :func:`figure_html`).

    The figure is closed for pyplot, so a notebook shows it once, when a cell returns it;
    ``keep_open=True`` leaves it to pyplot, which shows it at the end of the cell.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, FigureClass=_figure_class(), **options)
    fig.alt = alt
    if not keep_open:
        plt.close(fig)
    return fig, axes


def describe(fig: Any) -> str:
    """Alt text for a figure that has none: its titles and axis labels, in order."""
    parts = []
    if getattr(fig, "_suptitle", None) is not None and fig._suptitle.get_text():
        parts.append(fig._suptitle.get_text())
    for ax in fig.axes:
        bits = [ax.get_title()]
        if ax.get_xlabel() or ax.get_ylabel():
            bits.append(f"{ax.get_xlabel() or '?'} against {ax.get_ylabel() or '?'}"
                        if ax.get_ylabel() else ax.get_xlabel())
        parts.append(", ".join(b for b in bits if b))
    return "Figure: " + ("; ".join(p for p in parts if p) or "a chart")


def smallest_text_pt(fig: Any) -> float:
    """The font size, in points, of the smallest visible text in ``fig``."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    return min(sizes, default=_PT["label"])


def figure_html(fig: Any, *, alt: str | None = None) -> str:
    """``fig`` as an SVG ``<img>`` with alt text, in a box that scrolls rather than shrink the
    figure below the width at which its smallest text is :data:`MIN_TEXT_PX` pixels."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", pad_inches=0.05, facecolor="white")
    svg = buffer.getvalue()
    width_pt, height_pt = (float(re.search(rf'{k}="([\d.]+)pt"', svg).group(1))
                           for k in ("width", "height"))
    width, height = width_pt * _PX_PER_PT, height_pt * _PX_PER_PT
    smallest_px = smallest_text_pt(fig) * _PX_PER_PT
    narrowest = math.ceil(width * MIN_TEXT_PX / smallest_px)  # wider than natural if need be
    alt = alt or getattr(fig, "alt", "") or describe(fig)
    data = base64.b64encode(svg.encode()).decode()
    return (f"<div class='spmd-figure'><img src='data:image/svg+xml;base64,{data}' "
            f"alt='{html.escape(alt, quote=True)}' width='{width:.0f}' height='{height:.0f}' "
            f"style='min-width:{narrowest}px'></div>")


def show_figure(fig: Any, *, alt: str) -> Html:
    """A finished figure as displayable HTML (SVG, with ``alt``), closed for pyplot."""
    import matplotlib.pyplot as plt

    if not isinstance(alt, str) or not alt.strip():
        raise InputTypeError("a figure needs alt text: say in words what it shows.")
    shown = Html(html=figure_html(fig, alt=alt), text=alt)
    plt.close(fig)
    return shown


def figure_bundle(fig: Any) -> dict[str, str]:
    """IPython's mime bundle for a figure: the SVG ``<img>`` and a line of text."""
    alt = getattr(fig, "alt", "") or describe(fig)
    return {"text/html": figure_html(fig, alt=alt), "text/plain": f"<{alt}>"}


def use_svg_figures() -> bool:
    """Make the running IPython show every matplotlib figure as :func:`figure_html` (vector,
    alt text, readable size) instead of a PNG. Called once when the package is imported;
    returns False (and changes nothing) outside IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    shell.display_formatter.mimebundle_formatter.for_type_by_name(
        "matplotlib.figure", "Figure", figure_bundle)
    # No PNG besides: set the inline backend's formats now, or for when pyplot is imported.
    shell.config.InlineBackend.figure_formats = set()
    inline = sys.modules.get("matplotlib_inline.config")
    if inline is not None and inline.InlineBackend.initialized():
        inline.InlineBackend.instance().figure_formats = set()
    return True


# --- Panels: what every device holds at successive moments ------------------------------------

COMBINED = -1
"""Origin marker for a value reduced over several devices (drawn white with a grey border)."""


@dataclass(frozen=True)
class Panel:
    """What every device holds at one moment, for :func:`draw_panels`.

    ``values[d]`` is what device d holds (any shape; drawn flattened, one cell per element).
    ``origins[d]`` has the same size: for each cell, the device whose colour it gets, or
    :data:`COMBINED` (-1) for a value reduced over several devices. By default every cell
    takes the colour of the device holding it. ``caption`` is drawn under the panel.
    """

    title: str
    values: Sequence[Any]
    origins: Sequence[Any] | None = None
    caption: str = ""

    def cells(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per device: (flat values, flat origin of each value), checked for matching sizes."""
        out = []
        for d, held in enumerate(self.values):
            flat = np.ravel(np.asarray(held))
            if self.origins is None:
                origin = np.full(flat.shape, d)
            else:
                origin = np.ravel(np.asarray(self.origins[d])).astype(int)
                if origin.shape != flat.shape:
                    raise ValueError(
                        f"panel {self.title!r}: device {d} holds {flat.size} values but has "
                        f"{origin.size} origins; give one origin per value."
                    )
            out.append((flat, origin))
        if self.origins is not None and len(self.origins) != len(self.values):
            raise ValueError(
                f"panel {self.title!r}: values for {len(self.values)} devices but origins for "
                f"{len(self.origins)}."
            )
        return out


def device_color(origin: int) -> tuple[float, float, float, float]:
    """Device ``origin``'s colour (:data:`PALETTE`, repeating after its length); white for
    :data:`COMBINED` (drawn with a grey border)."""
    from matplotlib.colors import to_rgba

    try:
        origin = count("origin", origin, minimum=COMBINED)
    except InputError as error:
        raise type(error)(f"{error} An origin is a device index >= 0 or COMBINED (-1).") from None
    if origin == COMBINED:
        return (1.0, 1.0, 1.0, 1.0)
    return to_rgba(PALETTE[origin % len(PALETTE)])


def shape_label(block: np.ndarray) -> str:
    """``f32[2,4]``: a block's dtype and shape, as a panel caption says it."""
    return f"{block.dtype.name[0]}{block.dtype.itemsize * 8}[{','.join(map(str, block.shape))}]"


def before_after(before: Sequence[Any], after: Sequence[Any],
                 origins: Sequence[Any]) -> list[Panel]:
    """The two panels of a collective: each device's input block in its own colour, then what
    each device holds, coloured by where each value came from (``origins``)."""
    return [
        Panel("before", list(before), caption=f"each device: {shape_label(np.asarray(before[0]))}"),
        Panel("after", list(after), list(origins),
              caption=f"each device: {shape_label(np.asarray(after[0]))}"),
    ]


def _label(value: Any, fmt: str) -> str:
    return fmt.format(value.item() if hasattr(value, "item") else value)


_CELL_EDGE = {False: "white", True: "0.45"}
_CHAR_EM = 0.62  # width of an average label character, in ems of its font (DejaVu Sans)


@dataclass(frozen=True)
class _Layout:
    """Where each panel's cells start (x, in cell units), their widths, the figure's width."""

    cells_at: tuple[float, ...]
    widths: tuple[int, ...]
    width: float
    left: float

    @classmethod
    def of(cls, panels: Sequence[Panel], contents: list, gap_labels: Sequence[str],
           title: str | None, device_labels: Sequence[str], char: float) -> _Layout:
        """``char``: the width of one character of label text, in cells."""
        widths = tuple(max(1, max(flat.size for flat, _ in cells)) for cells in contents)
        left = char * max(map(len, device_labels)) + 0.6
        cursor, cells_at = left, []
        for k, (panel, width) in enumerate(zip(panels, widths, strict=True)):
            # A panel's slot is wide enough for its cells, its title and its caption.
            slot = max(width, char * 1.15 * len(panel.title) + 0.4,
                       char * len(panel.caption) + 0.4)
            cells_at.append(cursor + (slot - width) / 2)
            cursor += slot
            if k < len(gap_labels):
                cursor += max(2.2, char * len(gap_labels[k]) + 0.6)
        longest_line = max(map(len, (title or "").splitlines()), default=0)
        width = max(cursor + 0.3, char * 1.15 * longest_line + 0.6)
        return cls(tuple(cells_at), widths, width, left)


def draw_panels(
    panels: Sequence[Panel],
    *,
    arrows: Sequence[Sequence[tuple[int, int]] | None] | None = None,
    gap_labels: Sequence[str] | None = None,
    title: str | None = None,
    fmt: str = "{:g}",
    cell_inches: float | None = None,
    device_label: str = "device {}",
    alt: str | None = None,
) -> Any:
    """Draw what each device holds at successive moments, left to right; return the Figure.

    Each panel is a grid with one row per device (device 0 on top) and one cell per value,
    labelled with the value (``fmt``) and coloured by the device the value came from
    (:func:`device_color`; white for values combined over devices). Between panel k and k+1:

    - ``arrows[k]``: (source device, destination device) pairs, drawn as arrows from the
      source row of panel k to the destination row of panel k+1 (e.g. a ring of sends);
    - ``gap_labels[k]``: text over the gap (e.g. the collective's name).

    Works for any number of panels and devices (colours repeat after ``len(PALETTE)``
    devices). A ring diagram is a list of panels, one per step, with the ring's sends as
    ``arrows``; for example, four devices passing blocks of ``rhs`` one step round a ring::

        ring = [(i, (i + 1) % 4) for i in range(4)]
        held = [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1]]  # held[k][d]: block on d at step k
        steps = [Panel(f"step {k}", [[f"B{b}"] for b in held[k]], origins=[[b] for b in held[k]])
                 for k in range(3)]
        fig = draw_panels(steps, arrows=[ring, ring], gap_labels=["ppermute", "ppermute"],
                          fmt="{}")

    Values may be numbers (labelled with ``fmt``) or strings (use ``fmt="{}"``). Text is never
    smaller than 8.5 pt (11 CSS px); cells are sized (``cell_inches``, default: fit the book's
    text column) to hold their labels. Every cell is a ``Rectangle`` with gid ``"cell"``, every
    arrow a ``FancyArrowPatch`` with gid ``"arrow"`` and every cell label a ``Text`` with gid
    ``"value"``, so tests can count them. ``alt`` is the figure's alt text (default: its title
    and panels). The figure is closed before it is returned: display it (it shows as SVG) or
    save it with ``fig.savefig``.
    """
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    if not panels:
        raise ValueError("draw_panels needs at least one Panel.")
    contents = [panel.cells() for panel in panels]
    n_devices = len(contents[0])
    if n_devices == 0:
        raise ValueError("a Panel needs the values of at least one device.")
    for panel, cells in zip(panels, contents, strict=True):
        if len(cells) != n_devices:
            raise ValueError(
                f"panel {panel.title!r} has {len(cells)} devices, the first panel {n_devices}: "
                "every panel must show the same devices."
            )
    gaps = len(panels) - 1
    arrows = list(arrows) if arrows is not None else [None] * gaps
    gap_labels = list(gap_labels) if gap_labels is not None else [""] * gaps
    if len(arrows) != gaps or len(gap_labels) != gaps:
        raise ValueError(
            f"{len(panels)} panels have {gaps} gaps: give arrows and gap_labels one entry per "
            f"gap (got {len(arrows)} and {len(gap_labels)})."
        )
    for sends in arrows:
        for src, dst in sends or ():
            if not (0 <= src < n_devices and 0 <= dst < n_devices):
                raise ValueError(f"arrow ({src}, {dst}) names a device outside 0..{n_devices - 1}.")

    if title:  # wrapped to the column's width
        title = "\n".join(textwrap.wrap(title, int((COLUMN_PX / 96 - 0.6) / (
            _CHAR_EM * _PT["title"] / 72))))
    labels = [device_label.format(d) for d in range(n_devices)]
    longest = max(len(_label(v, fmt)) for cells in contents for flat, _ in cells for v in flat)
    char_in = _CHAR_EM * _PT["label"] / 72
    smallest = max(0.23, longest * _CHAR_EM * _PT["value"] / 72 + 0.07)  # a label fits
    column = (COLUMN_PX - 12) / 96  # inches, less the margin figure_html adds
    if cell_inches is None:  # the largest cell (up to 0.34 in) at which the figure fits the column
        sizes = [0.34 - 0.01 * i for i in range(11) if 0.34 - 0.01 * i >= smallest]
        cell = next((c for c in sizes if _Layout.of(panels, contents, gap_labels, title, labels,
                                                     char_in / c).width * c <= column),
                    smallest)
    else:
        cell = cell_inches
    layout = _Layout.of(panels, contents, gap_labels, title, labels, char_in / cell)
    any_combined = any((origin == COMBINED).any() for cells in contents for _, origin in cells)
    label_h = _PT["label"] * 1.3 / 72 / cell  # one line of label text, in cells
    title_h = _PT["title"] * 1.3 / 72 / cell
    top = 0.4 + label_h + ((title or "").count("\n") + 1.3) * title_h * bool(title)
    bottom = (0.3 + label_h * any(panel.caption for panel in panels)
              + 1.5 * label_h * any_combined + 0.1)
    alt = alt or (f"{title.replace(chr(10), ' ') + '. ' if title else ''}What each of "
                  f"{n_devices} devices holds: "
                  + ", then ".join(panel.title for panel in panels) + ".")
    fig, ax = subplots(alt=alt, figsize=(layout.width * cell, (n_devices + top + bottom) * cell))
    fig.subplots_adjust(0, 0, 1, 1)
    ax.set_xlim(0, layout.width)
    ax.set_ylim(n_devices + bottom, -top)
    ax.set_aspect("equal")
    ax.axis("off")
    # Cells and arrows go in with add_artist, not add_patch: the limits are fixed above,
    # and add_patch's per-patch limit update costs more than drawing them.
    for d, text in enumerate(labels):
        ax.text(layout.cells_at[0] - 0.3, d + 0.5, text, ha="right", va="center",
                fontsize=_PT["label"], color=TEXT)
    for k, (panel, cells) in enumerate(zip(panels, contents, strict=True)):
        x0, middle = layout.cells_at[k], layout.cells_at[k] + layout.widths[k] / 2
        ax.text(middle, -0.3, panel.title, ha="center", va="bottom", fontsize=_PT["label"],
                fontweight="bold", color=TEXT)
        if panel.caption:
            ax.text(middle, n_devices + 0.25, panel.caption, ha="center", va="top",
                    fontsize=_PT["label"], color=TEXT)
        for d, (flat, origin) in enumerate(cells):
            for i, (value, src) in enumerate(zip(flat, origin, strict=True)):
                ax.add_artist(Rectangle((x0 + i, d + 0.06), 1, 0.88,
                                        facecolor=device_color(src),
                                        edgecolor=_CELL_EDGE[src == COMBINED], linewidth=1.0,
                                        gid="cell"))
                ax.text(x0 + i + 0.5, d + 0.5, _label(value, fmt), ha="center", va="center",
                        fontsize=_PT["value"], color=TEXT, gid="value")
    for k in range(gaps):
        x_from = layout.cells_at[k] + layout.widths[k] + 0.2
        x_to = layout.cells_at[k + 1] - 0.2
        for src, dst in arrows[k] or ():
            ax.add_artist(FancyArrowPatch((x_from, src + 0.5), (x_to, dst + 0.5),
                                          arrowstyle="-|>", mutation_scale=9, color="0.25",
                                          linewidth=0.9, gid="arrow"))
        if not arrows[k]:
            ax.annotate("", xy=(x_to, n_devices / 2), xytext=(x_from, n_devices / 2),
                        arrowprops=dict(arrowstyle="-|>", color="0.3", linewidth=1.5))
        if gap_labels[k]:
            y = -0.3 if arrows[k] else n_devices / 2 - 0.25
            ax.text((x_from + x_to) / 2, y, gap_labels[k], ha="center", va="bottom",
                    fontsize=_PT["label"], style="italic", color=TEXT)
    if title:
        ax.text(layout.width / 2, -top + 0.1, title, ha="center", va="top",
                fontsize=_PT["title"], color=TEXT)
    if any_combined:
        ax.legend(handles=[Patch(facecolor=device_color(COMBINED), edgecolor=_CELL_EDGE[True],
                                 label="combined over all devices (a reduction)")],
                  loc="lower center", fontsize=_PT["label"], frameon=False,
                  bbox_to_anchor=(0.5, 0.0))
    return fig
