"""Every picture the book draws: one palette, one font stack, vector figures with alt text.

A base module (it imports nothing else of the package): the Part modules call it.

- :data:`PALETTE`, :data:`FONT_STACK`: device ``d`` has colour ``PALETTE[d % len(PALETTE)]``
  on every page, in HTML grids and in matplotlib figures alike.
- :class:`Html`: rendered HTML with a plain-text twin (what a notebook or the book shows).
- Matplotlib figures are shown as SVG with alt text (:func:`figure_html`), sized so that their
  smallest text never drops below :data:`MIN_TEXT_PX` CSS pixels: :func:`use_svg_figures` makes
  IPython show every figure that way; :func:`subplots` makes a figure that carries its alt text.
- :class:`Panel` and :func:`draw_panels`: what each device holds at successive moments, the
  picture of every collective and collective matmul.
- :func:`tpu_v3_tray`, :func:`ring_hops` and :func:`ring_diagram`: the order in which a ring
  visits the cores of a TPU board, on stand-in devices.
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
from itertools import pairwise, product
from typing import Any

import numpy as np

#: Paul Tol's "light" qualitative colour scheme, in his recommended order: told apart under the
#: common colour-vision deficiencies, and light enough for dark text (:data:`TEXT`) on top
#: (contrast above 7:1 for each colour, WCAG AAA).
PALETTE = (
    "#77AADD", "#EE8866", "#EEDD88", "#FFAABB", "#99DDFF",
    "#44BB99", "#BBCC33", "#AAAA00", "#DDDDDD",
)
TEXT = "#1a1a1a"
#: One font stack for HTML and figures: matplotlib draws with its own DejaVu Sans, the first.
FONT_STACK = ("DejaVu Sans", "Verdana", "system-ui", "Segoe UI", "Helvetica", "Arial",
              "sans-serif")
MONO_STACK = ("DejaVu Sans Mono", "ui-monospace", "Menlo", "Consolas", "monospace")
# CSS declarations without quotes: they sit inside single-quoted style attributes.
FONT_CSS = f"font-family:{','.join(FONT_STACK)};"
MONO_CSS = f"font-family:{','.join(MONO_STACK)};"
#: The smallest text a figure may show, in CSS pixels, and the book's text column on a desktop.
MIN_TEXT_PX = 11.0
COLUMN_PX = 688.0
_PX_PER_PT = 96 / 72
_PT = {"value": 8.5, "label": 9.0, "title": 10.0}  # 8.5 pt = 11.3 CSS px


@dataclass(frozen=True)
class Html:
    """Rendered HTML with a plain-text twin: notebooks and the book show the HTML."""

    html: str
    text: str

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


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

    if origin == COMBINED:
        return (1.0, 1.0, 1.0, 1.0)
    if origin < 0:
        raise ValueError(f"an origin is a device index >= 0 or COMBINED (-1), got {origin}.")
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


# --- The device order on a TPU board ----------------------------------------------------------


@dataclass(frozen=True)
class TrayDevice:
    """Just enough of a TPU device for ``jax.experimental.mesh_utils.create_device_mesh``."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int
    device_kind: str = "TPU v3"
    platform: str = "tpu"


def tpu_v3_tray() -> list[TrayDevice]:
    """Stand-ins for the 8 devices of a TPU v3 board: 4 chips in a 2x2
    layout, 2 cores each.

    Ids go two per chip (core 0, core 1) and chips are numbered row by row,
    x fastest. This is an assumed numbering, used to draw the ring; JAX's
    own code holds only the resulting order.
    """
    return [
        TrayDevice(
            id=2 * chip + core,
            coords=(chip % 2, chip // 2, 0),
            core_on_chip=core,
        )
        for chip in range(4)
        for core in range(2)
    ]


def _positions(devices: Sequence[object], order: Sequence[int], *,
               complete: bool) -> dict[int, object]:
    """Devices by id, after checking ``order`` names distinct ones (all of them if complete)."""
    by_id = {}
    for device in devices:
        if not (hasattr(device, "coords") and hasattr(device, "core_on_chip")):
            raise ValueError(
                "Device order can only be drawn for devices with coords and core_on_chip "
                f"(TPU devices, or tpu_v3_tray() stand-ins); got {device!r}."
            )
        by_id[device.id] = device
    wanted = sorted(by_id) if complete else sorted(set(order) & set(by_id))
    if sorted(order) != wanted or not order:
        which = "every device" if complete else "distinct devices out of"
        raise ValueError(
            f"The order must list {which} {sorted(by_id)} exactly once; got {list(order)}."
        )
    return by_id


def _steps(order: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive pairs around the ring, including the step from the last back to the first."""
    return list(zip(order, [*order[1:], order[0]], strict=True))


def ring_hops(devices: Sequence[object], order: Sequence[int]) -> list[int]:
    """Chip-to-chip distance of each step around ``order`` (and back to its start).

    ``order`` may be any ring of distinct devices, e.g. one row of a mesh.

    0: both devices are cores of one chip; 1: neighbouring chips; 2 or more: the data must cross
    an intermediate chip (on a 2x2 board, a diagonal step).
    """
    by_id = _positions(devices, order, complete=False)
    hops = []
    for here, there in _steps(order):
        a, b = by_id[here].coords, by_id[there].coords
        hops.append(sum(abs(p - q) for p, q in zip(a, b, strict=True)))
    return hops


Point = tuple[float, float]
#: Box corners ``(left, top, right, bottom)`` in SVG coordinates (y grows downwards).
Box = tuple[float, float, float, float]


def _curve(start: Point, c1: Point, c2: Point, end: Point, n: int = 40) -> list[Point]:
    """Points along the cubic Bézier curve from start to end (control points c1, c2)."""
    points = []
    for t in (i / n for i in range(n + 1)):
        weights = ((1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t**2, t**3)
        points.append(tuple(
            sum(w * p[axis] for w, p in zip(weights, (start, c1, c2, end), strict=True))
            for axis in (0, 1)
        ))
    return points


def _hits(points: Sequence[Point], boxes: Sequence[Box]) -> bool:
    """Whether any of the points lies inside any of the boxes."""
    return any(
        left < x < right and top < y < bottom
        for x, y in points
        for left, top, right, bottom in boxes
    )


def _route(start: Point, end: Point, obstacles: Sequence[Box],
           middle: Point) -> tuple[Point, Point]:
    """Control points of a link from start to end that passes over none of the obstacles.

    Straight if it can be; else the shortest clear curve that bows each third of the line to
    one side (a U around a row of cores, a gentle S past cores on both sides), bowing away from
    the picture's middle where two curves are equally short.
    """
    if not _hits(_curve(start, start, end, end), obstacles):
        return start, end
    dx, dy = end[0] - start[0], end[1] - start[1]
    length = math.hypot(dx, dy)
    nx, ny = -dy / length, dx / length  # unit normal to the line
    options = []
    for depth in (48, 96, 144):
        for a, b in product((-depth, 0, depth), repeat=2):
            c1 = (start[0] + dx / 3 + a * nx, start[1] + dy / 3 + a * ny)
            c2 = (start[0] + 2 * dx / 3 + b * nx, start[1] + 2 * dy / 3 + b * ny)
            points = _curve(start, c1, c2, end)
            if not _hits(points, obstacles):
                curve_length = sum(math.dist(p, q) for p, q in pairwise(points))
                away = math.dist(points[len(points) // 2], middle)
                options.append((round(curve_length), -away, c1, c2))
    if not options:  # nothing clear: a straight line over the cores beats no line
        return start, end
    return min(options)[2:]


def ring_diagram(devices: Sequence[object], order: Sequence[int], *,
                 title: str | None = None) -> Html:
    """An SVG of chips and cores with the ring ``order`` drawn through them.

    Each core is labelled with its device id and its step in the ring; steps between chips
    that are not neighbours are dashed red. Links go around the cores they would cross, and
    each chip's label sits in a corner no link passes; links are painted beneath the labels.
    """
    by_id = _positions(devices, order, complete=True)
    chip_w, chip_h, gap = 128, 88, 34
    core_w, core_h, pad = 48, 40, 4  # pad: how far a link keeps from a core it passes
    label_w = 80  # the room a "chip (x, y)" label takes (12 px text)

    def corner(coords: Sequence[int]) -> Point:
        return coords[0] * (chip_w + gap), coords[1] * (chip_h + gap)

    def centre(device_id: int) -> Point:
        device = by_id[device_id]
        x0, y0 = corner(device.coords)
        x = x0 + 11 + device.core_on_chip * (core_w + 10) + core_w / 2
        return x, y0 + 26 + core_h / 2

    def core_box(device_id: int, margin: float) -> Box:
        x, y = centre(device_id)
        half_w, half_h = core_w / 2 + margin, core_h / 2 + margin
        return x - half_w, y - half_h, x + half_w, y + half_h

    chips = sorted({tuple(d.coords[:2]) for d in by_id.values()})
    chip_boxes = [(*corner(c), corner(c)[0] + chip_w, corner(c)[1] + chip_h) for c in chips]
    middle = (max(b[2] for b in chip_boxes) / 2, max(b[3] for b in chip_boxes) / 2)
    hops = ring_hops(list(by_id.values()), order)
    links, link_points = [], []
    for (here, there), hop in zip(_steps(order), hops, strict=True):
        start, end = centre(here), centre(there)
        others = [core_box(d, pad) for d in by_id if d not in (here, there)]
        c1, c2 = _route(start, end, others, middle)
        link_points += _curve(start, c1, c2, end)
        style = ("stroke='#CC3311' stroke-width='3' stroke-dasharray='7 5'" if hop > 1
                 else "stroke='#222' stroke-width='3'")
        links.append(f"<path d='M{start[0]},{start[1]} C{c1[0]},{c1[1]} {c2[0]},{c2[1]} "
                     f"{end[0]},{end[1]}' fill='none' {style}/>")
    chip_parts, label_parts = [], []
    for (cx, cy), (left, top, right, bottom) in zip(chips, chip_boxes, strict=True):
        chip_parts.append(f"<rect x='{left}' y='{top}' width='{chip_w}' height='{chip_h}' "
                          "rx='6' fill='#f4f4f4' stroke='#555'/>")
        places = [(x, y, anchor, (x - label_w, y - 11, x, y + 3) if anchor == "end"
                   else (x, y - 11, x + label_w, y + 3))
                  for y in (top + 15, bottom - 5)
                  for x, anchor in ((left + 6, "start"), (right - 6, "end"))]
        x, y, anchor, _ = next((p for p in places if not _hits(link_points, [p[3]])), places[0])
        # A halo in the chip's colour keeps the label readable should a link still cross it.
        label_parts.append(f"<text x='{x}' y='{y}' text-anchor='{anchor}' font-size='12' "
                           "fill='#444' stroke='#f4f4f4' stroke-width='4' "
                           f"stroke-linejoin='round' paint-order='stroke'>chip ({cx}, {cy})</text>")
    core_parts = []
    for step, device_id in enumerate(order):
        x, y = centre(device_id)
        colour = PALETTE[device_id % len(PALETTE)]
        core_parts.append(f"<rect x='{x - core_w / 2}' y='{y - core_h / 2}' width='{core_w}' "
                          f"height='{core_h}' rx='4' fill='{colour}' stroke='#222'/>")
        core_parts.append(f"<text x='{x}' y='{y - 3}' font-size='14' font-weight='600' "
                          f"text-anchor='middle' fill='{TEXT}'>D{device_id}</text>")
        core_parts.append(f"<text x='{x}' y='{y + 14}' font-size='12' text-anchor='middle' "
                          f"fill='{TEXT}'>step {step}</text>")
    # The picture's extent: the chips and every link (a detour may leave the chips), plus a margin.
    xs = [x for b in chip_boxes for x in (b[0], b[2])] + [p[0] for p in link_points]
    ys = [y for b in chip_boxes for y in (b[1], b[3])] + [p[1] for p in link_points]
    x_min, y_min = min(xs) - 12, min(ys) - 12
    width, height = max(xs) + 12 - x_min, max(ys) + 12 - y_min
    heading = f"<div style='font-weight:600'>{html.escape(title)}</div>" if title else ""
    text = (f"{title}: " if title else "") + " -> ".join(f"D{d}" for d in order)
    # Paint order is document order: chips, then links, then labels and cores on top.
    markup = (
        f"<div style='display:inline-block;color:{TEXT};{FONT_CSS}'>{heading}"
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:g}' height='{height:g}' "
        f"viewBox='{x_min:g} {y_min:g} {width:g} {height:g}' role='img' "
        f"aria-label='{html.escape(text, quote=True)}' style='{FONT_CSS}'>"
        f"<title>{html.escape(text)}</title>"
        f"{''.join(chip_parts + links + label_parts + core_parts)}</svg></div>"
    )
    return Html(html=markup, text=text)
