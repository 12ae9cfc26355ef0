"""The order in which a ring visits the cores of a TPU board (Part I), on stand-in devices.

``jax.experimental.mesh_utils.create_device_mesh`` orders TPU v2/v3 cores so that neighbours
on a mesh axis are neighbours on the board; :func:`tpu_v3_tray` makes stand-in devices with
the coordinates it reads, :func:`ring_hops` counts the board hops of a ring order,
:func:`grid_hops` does it for each row and column of a 2-D mesh, :func:`diagonal_steps` words
the steps that skip a chip and :func:`ring_diagram` draws it. Device orders may be lists,
tuples or NumPy arrays of ids (NumPy integers included), or of the devices themselves.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise, product

import numpy as np

from spmd_guide.core import checks
from spmd_guide.core.display import FONT_CSS, PALETTE, TEXT, Html, listed


@dataclass(frozen=True)
class TrayDevice:
    """Just enough of a TPU device for ``jax.experimental.mesh_utils.create_device_mesh``."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int
    device_kind: str = "TPU v3"
    platform: str = "tpu"

    def __post_init__(self) -> None:
        checks.count("id", self.id, minimum=0)
        coords = self.coords
        if isinstance(coords, (str, bytes)) or not isinstance(coords, Sequence) \
                or len(coords) != 3:
            raise checks.InputTypeError(
                f"coords must be three integers (x, y, z) such as (0, 1, 0), got {coords!r}.")
        object.__setattr__(self, "coords", tuple(
            checks.count(f"coords[{i}]", c, minimum=0) for i, c in enumerate(coords)))
        checks.count("core_on_chip", self.core_on_chip, minimum=0)


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


def _board(devices: object) -> dict[int, object]:
    """The devices by id, after checking each has the ``id``, ``coords`` and
    ``core_on_chip`` a TPU device (or a :func:`tpu_v3_tray` stand-in) has."""
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"devices must be a list of TPU devices (or tpu_v3_tray() stand-ins), got "
            f"{devices!r:.60}.")
    by_id = {}
    for device in list(np.ravel(np.asarray(devices, dtype=object))):
        if not all(hasattr(device, attribute) for attribute in ("id", "coords", "core_on_chip")):
            raise checks.InputTypeError(
                "Device order can only be drawn for devices with coords and core_on_chip "
                f"(TPU devices, or tpu_v3_tray() stand-ins); got {device!r:.60}.")
        by_id[int(device.id)] = device
    if not by_id:
        raise checks.InputError("devices must hold at least one device, got none.")
    return by_id


def _ids(name: str, order: object) -> tuple[int, ...]:
    """A ring of device ids (list, tuple or 1-D NumPy array, NumPy integers included), or of
    devices, whose ids are taken."""
    if isinstance(order, np.ndarray) and order.dtype == object or (
            isinstance(order, Sequence) and not isinstance(order, (str, bytes))
            and order and all(hasattr(d, "id") for d in order)):
        order = [d.id for d in np.ravel(np.asarray(order, dtype=object))]
    return checks.counts(name, order, minimum=0)


def _positions(devices: Sequence[object], order: Sequence[int], *,
               complete: bool) -> tuple[dict[int, object], tuple[int, ...]]:
    """Devices by id and the order as ids, after checking ``order`` names distinct devices
    of ``devices`` (all of them if complete)."""
    by_id = _board(devices)
    ids = _ids("order", order)
    wanted = sorted(by_id) if complete else sorted(set(ids) & set(by_id))
    if sorted(ids) != wanted:
        which = "every device" if complete else "distinct devices out of"
        raise checks.InputError(
            f"The order must list {which} {sorted(by_id)} exactly once; got {list(ids)}.")
    return by_id, ids


def _steps(order: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive pairs around the ring, including the step from the last back to the first."""
    return list(zip(order, [*order[1:], order[0]], strict=True))


def ring_hops(devices: Sequence[object], order: Sequence[int]) -> list[int]:
    """Chip-to-chip distance of each step around ``order`` (and back to its start).

    ``order`` may be any ring of distinct devices, e.g. one row of a mesh.

    0: both devices are cores of one chip; 1: neighbouring chips; 2 or more: the data must cross
    an intermediate chip (on a 2x2 board, a diagonal step).
    """
    by_id, ids = _positions(devices, order, complete=False)
    hops = []
    for here, there in _steps(ids):
        a, b = by_id[here].coords, by_id[there].coords
        hops.append(int(sum(abs(p - q) for p, q in zip(a, b, strict=True))))
    return hops


def grid_hops(devices: Sequence[object], grid: object) -> dict[str, list[list[int]]]:
    """Chip distances along each row and each column of a 2-D mesh of ``devices``.

    ``grid`` is the mesh as a 2-D array of device ids (or of devices, as
    ``mesh_utils.create_device_mesh`` returns). Each row and each column is taken as a ring,
    as a collective along that mesh axis walks it: ``{"rows": [...], "columns": [...]}``,
    one list of :func:`ring_hops` per line.
    """
    ids = np.asarray(grid, dtype=object)
    if ids.ndim != 2 or 0 in ids.shape:
        raise checks.InputError(
            f"grid must be a 2-D mesh of device ids such as [[0, 1, 2, 3], [4, 5, 6, 7]], "
            f"got shape {ids.shape}.")
    ids = np.vectorize(lambda d: d.id if hasattr(d, "id") else d, otypes=[object])(ids)
    flat = _ids("grid", list(ids.ravel()))
    if len(set(flat)) != len(flat):
        raise checks.InputError(f"grid names a device twice: {ids.tolist()}.")
    table = np.array(flat).reshape(ids.shape)
    return {"rows": [ring_hops(devices, list(row)) for row in table],
            "columns": [ring_hops(devices, list(column)) for column in table.T]}


def diagonal_steps(devices: Sequence[object], order: Sequence[int]) -> str:
    """The steps of the ring ``order`` that skip a chip, in words for the prose.

    ``"no step"`` when there are none, else the count and each step, e.g.
    ``"2 steps (dashed red: device 3 to device 4 and device 7 back to device 0)"``
    (the step from the last device to the first is the one that goes *back*).
    """
    ids = _ids("order", order)
    far = [(i, here, there)
           for i, ((here, there), hop) in enumerate(zip(_steps(ids), ring_hops(devices, ids),
                                                        strict=True))
           if hop > 1]
    if not far:
        return "no step"
    words = [f"device {here} {'back ' if i == len(ids) - 1 else ''}to device {there}"
             for i, here, there in far]
    return f"{len(far)} step{'s' if len(far) > 1 else ''} (dashed red: {listed(words)})"


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
    by_id, order = _positions(devices, order, complete=True)
    if title is not None and not isinstance(title, str):
        raise checks.InputTypeError(f"title must be a string or None, got {title!r:.60}.")
    chip_w, chip_h, gap = 128, 88, 34
    core_w, core_h, pad = 48, 40, 4  # pad: how far a link keeps from a core it passes
    # The room a "chip (x, y)" label takes: 12 px DejaVu Sans (the first font of the stack)
    # is about 5.6 px a character; 6 px leaves a margin.
    label_w = 6 * len("chip (0, 0)")

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
                  for y in (top + 17, bottom - 5)
                  for x, anchor in ((left + 6, "start"), (right - 6, "end"))]
        # The first corner no link passes; failing that, the one the fewest link points cross.
        x, y, anchor, _ = min(places, key=lambda p: sum(
            _hits([point], [p[3]]) for point in link_points))
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
