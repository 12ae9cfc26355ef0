"""Where each piece of an array lives: a text table and an HTML grid, one entry per block.

A sharded ``jax.Array`` is cut into blocks; each block sits on one device or, where the array
is replicated over a mesh axis, on several. ``shard_blocks`` reads that layout from
``array.sharding.devices_indices_map`` (the sharding's own answer, so it works for any kind of
sharding on any number of devices), ``layout_table`` prints it and ``layout_grid`` draws it,
one coloured cell per block; ``devices_holding`` answers "who holds this element?".
``gallery`` tries many partition specs on many meshes at once, for the book's gallery page,
and ``ring_diagram`` draws the order in which ``jax.make_mesh`` strings a TPU board's devices
(on ``tpu_v3_tray`` stand-ins, since the book runs without one). The pictures' palette, fonts
and the ring diagram live in :mod:`spmd_guide.core.drawing`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from tabulate import tabulate

from spmd_guide.core import checks
from spmd_guide.core.display import FONT_CSS as _FONT
from spmd_guide.core.display import MONO_CSS as _MONO
from spmd_guide.core.display import PALETTE, Html, side_by_side
from spmd_guide.core.display import TEXT as _TEXT
from spmd_guide.meshes.tpu_ring import (  # noqa: F401  (ring pictures: re-exported for the chapters)
    TrayDevice,
    grid_hops,
    ring_diagram,
    ring_hops,
    tpu_v3_tray,
)

#: Arrays larger than this are shown without their values (``data=True`` raises).
MAX_DATA_ELEMENTS = 4096
#: A grid cell shows at most this many values along each axis of its block (first and last).
VALUES_PER_AXIS = 8


@dataclass(frozen=True)
class Block:
    """One distinct piece of an array and every device that holds a copy of it."""

    bounds: tuple[tuple[int, int], ...]
    """``(start, stop)`` along each array dimension."""
    devices: tuple[int, ...]
    """Ids of the devices holding this block, ascending (several when replicated)."""
    data: np.ndarray | None = None
    """The block's values, when asked for and held by a device of this process."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.bounds)

    @property
    def index(self) -> str:
        """The block as slices of the full array, e.g. ``[0:4, 0:2]``."""
        return "[" + ", ".join(f"{start}:{stop}" for start, stop in self.bounds) + "]"

    @property
    def label(self) -> str:
        """The devices holding the block, e.g. ``D0,D4``."""
        return ",".join(f"D{d}" for d in self.devices)


def _check_array(array: object, *, caller: str) -> jax.Array:
    """The array itself if it is a concrete 1-D or 2-D ``jax.Array``; else a clear error."""
    if isinstance(array, jax.core.Tracer):
        raise checks.InputTypeError(
            f"{caller} needs a concrete jax.Array, but got a traced value (inside jax.jit or "
            "another transformation, where no data is placed yet). Call it on the function's "
            "result instead, or use jax.debug.inspect_array_sharding inside the function."
        )
    if not isinstance(array, jax.Array):
        raise checks.InputTypeError(
            f"{caller} needs a jax.Array, got {type(array).__module__}.{type(array).__name__}. "
            "Put the values on devices first, e.g. jax.device_put(x, sharding)."
        )
    if array.ndim not in (1, 2):
        fix = (
            "reshape it to 1-D, e.g. x.reshape(1)"
            if array.ndim == 0
            else "reshape it to 2-D (e.g. x.reshape(-1, x.shape[-1])) or index a 2-D slice "
            "(e.g. x[0])"
        )
        raise checks.InputError(
            f"{caller} shows 1-D and 2-D arrays; this one is {array.ndim}-D with shape "
            f"{array.shape}. To look at it, {fix}."
        )
    if array.size == 0:
        raise checks.InputError(
            f"{caller}: the array of shape {array.shape} has no elements to show.")
    return array


def shard_blocks(array: jax.Array, *, data: bool = False) -> list[Block]:
    """The distinct blocks of ``array``, in row-major order of their position.

    Devices that hold the same slice of the array (a replicated block) share
    one ``Block``. With ``data=True`` each block carries its values, read
    from the array's addressable shards.
    """
    array = _check_array(array, caller="shard_blocks")
    data = checks.flag("data", data)
    if data and array.size > MAX_DATA_ELEMENTS:
        raise checks.InputError(
            f"This array has {array.size} elements, too many to show its "
            f"values (the limit is {MAX_DATA_ELEMENTS}). Call it with "
            "data=False, or look at a smaller array."
        )
    holders: dict[tuple[tuple[int, int], ...], list[int]] = {}
    index_map = array.sharding.devices_indices_map(array.shape)
    for device, index in index_map.items():
        bounds = tuple(
            tuple(part.indices(size)[:2])
            for part, size in zip(index, array.shape, strict=True)
        )
        holders.setdefault(bounds, []).append(device.id)
    local = (
        {shard.device.id: shard for shard in array.addressable_shards}
        if data
        else {}
    )
    blocks = []
    for bounds in sorted(holders):
        devices = tuple(sorted(holders[bounds]))
        values = next(
            (np.asarray(local[d].data) for d in devices if d in local), None
        )
        blocks.append(Block(bounds=bounds, devices=devices, data=values))
    return blocks


def devices_holding(array: jax.Array, index: Sequence[int]) -> tuple[int, ...]:
    """Ids of the devices that hold the element ``array[index]`` (several if replicated).

    ``index`` has one non-negative integer per dimension (NumPy integers too; not floats,
    which would silently pick another element)."""
    blocks = shard_blocks(array)
    index = checks.counts("index", index, minimum=-(2**62), min_length=0)
    if len(index) != array.ndim or not all(
        0 <= i < size for i, size in zip(index, array.shape, strict=True)
    ):
        raise checks.InputError(f"Index {tuple(index)} is not an element of an array of shape "
                         f"{array.shape}; give one non-negative index per dimension.")
    return next(
        block.devices for block in blocks
        if all(start <= i < stop for i, (start, stop) in zip(index, block.bounds, strict=True))
    )


def layout_table(array: jax.Array, *, data: bool = False) -> str:
    """A text table with one row per distinct block: devices, index slices, shape (and data).

    A replicated block lists every device that holds a copy of it.
    """
    blocks = shard_blocks(array, data=data)
    headers = ["devices", "index", "shape"] + (["data"] if data else [])
    rows = []
    for block in blocks:
        row = [block.label.replace(",", ", "), block.index, str(block.shape)]
        if data:
            row.append(_array_text(block.data))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="grid" if data else "simple",
                    disable_numparse=True)


def _array_text(values: np.ndarray | None) -> str:
    if values is None:
        return "(held by another process)"
    return np.array2string(values, threshold=64, edgeitems=3, precision=4, suppress_small=True)


def spec_text(spec: PartitionSpec) -> str:
    """A spec as you would write it: ``P('b')``, where JAX's own ``str`` gives ``P('b',)``."""
    return "P(" + ", ".join(repr(entry) for entry in _check_spec(spec)) + ")"


def describe(array: jax.Array) -> str:
    """One line: dtype and shape, and the partition spec and mesh where there is one."""
    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
        _check_array(array, caller="describe")
    parts = [f"{array.dtype}{list(array.shape)}"]
    sharding = array.sharding
    if isinstance(sharding, NamedSharding):
        axes = ", ".join(f"{name}={size}" for name, size in sharding.mesh.shape.items())
        parts += [spec_text(sharding.spec), f"mesh {axes}"]
    else:
        parts.append(type(sharding).__name__)
    return " · ".join(parts)


def layout_grid(array: jax.Array, *, data: bool = False, title: str | None = None) -> Html:
    """An HTML grid of ``array``'s blocks, laid out like the array and coloured by device.

    Each cell names the devices holding that block (``D0,D4`` for a block replicated on two
    devices) and, with ``data=True``, the values it holds (first and last few of large blocks).
    A 1-D array is one row of cells. Display it as a cell's last expression; ``str()`` gives the
    text table instead.
    """
    if title is not None and not isinstance(title, str):
        raise checks.InputTypeError(f"title must be a string, got {title!r}.")
    blocks = shard_blocks(array, data=data)
    shape = array.shape if array.ndim == 2 else (1, array.shape[0])
    bounds = [b.bounds if array.ndim == 2 else ((0, 1),) + b.bounds for b in blocks]
    row_cuts, col_cuts = (_cuts([bd[dim] for bd in bounds], shape[dim]) for dim in (0, 1))
    cells = []
    for block, (rows, cols) in zip(blocks, bounds, strict=True):
        place = (
            f"grid-row:{row_cuts.index(rows[0]) + 1}/{row_cuts.index(rows[1]) + 1};"
            f"grid-column:{col_cuts.index(cols[0]) + 1}/{col_cuts.index(cols[1]) + 1};"
        )
        cells.append(_cell_html(block, place))
    template = (
        f"grid-template-rows:{_tracks(row_cuts)};grid-template-columns:{_tracks(col_cuts)};"
    )
    caption = describe(array)
    caption_html = " · ".join(
        f"<span style='white-space:nowrap'>{html.escape(part)}</span>"
        for part in caption.split(" · ")
    )
    heading = ""
    if title:
        heading = f"<div style='font-weight:600;margin-bottom:2px'>{html.escape(title)}</div>"
    markup = (
        f"<div style='display:inline-block;vertical-align:top;margin:4px 0;color:{_TEXT};{_FONT}'>"
        f"{heading}"
        f"<div style='display:inline-grid;{template}gap:2px;background:#555;padding:2px;"
        f"border-radius:3px'>{''.join(cells)}</div>"
        f"<div style='font-size:0.8em;color:#555;margin-top:2px;width:13em;min-width:100%;{_MONO}'>"
        f"{caption_html}</div>"
        "</div>"
    )
    text = "\n".join(filter(None, [title, caption, layout_table(array, data=data)]))
    return Html(html=markup, text=text)


def _cuts(spans: list[tuple[int, int]], size: int) -> list[int]:
    """Every block boundary along one dimension, so blocks of any size line up in the grid."""
    return sorted({0, size, *(point for span in spans for point in span)})


def _tracks(cuts: list[int]) -> str:
    """Grid track sizes proportional to each stretch of the array (never below a readable size)."""
    return " ".join(f"minmax(2.2em,{stop - start}fr)" for start, stop in pairwise(cuts))


def _cell_html(block: Block, place: str) -> str:
    colours = [PALETTE[d % len(PALETTE)] for d in block.devices]
    if len(colours) == 1:
        background = colours[0]
        box = ""
    else:  # a replicated block: a stripe in each holder's colour, text on a light box
        stripe = 9
        stops = ",".join(
            f"{c} {i * stripe}px {(i + 1) * stripe}px" for i, c in enumerate(colours)
        )
        background = f"repeating-linear-gradient(135deg,{stops})"
        box = "background:rgba(255,255,255,0.85);border-radius:3px;padding:0 4px;"
    values = "" if block.data is None else _values_html(block.data, box)
    return (
        f"<div style='{place}background:{background};padding:4px 6px;display:flex;"
        "flex-direction:column;align-items:center;justify-content:center;gap:2px;"
        "min-width:2.6em'>"
        f"<span style='font-weight:600;font-size:0.85em;{box}'>{html.escape(block.label)}</span>"
        f"{values}</div>"
    )


def _kept(n: int) -> list[int | None]:
    """Indices to show along an axis of length n; None marks the elided middle."""
    if n <= VALUES_PER_AXIS:
        return list(range(n))
    half = VALUES_PER_AXIS // 2
    return [*range(half), None, *range(n - half, n)]


def _format_value(value: np.generic) -> str:
    if isinstance(value, np.floating):
        return f"{float(value):.4g}"
    return str(value)


def _values_html(values: np.ndarray, box: str) -> str:
    matrix = values.reshape(1, -1) if values.ndim == 1 else values
    rows = []
    for i in _kept(matrix.shape[0]):
        cols = []
        for j in _kept(matrix.shape[1]):
            if i is None:
                text = "⋮"
            elif j is None:
                text = "⋯"
            else:
                text = _format_value(matrix[i, j])
            cols.append(
                f"<td style='padding:0 3px;text-align:right;border:none;{_MONO}'>{text}</td>"
            )
        rows.append(f"<tr style='background:none;border:none'>{''.join(cols)}</tr>")
    return (
        f"<table style='border-collapse:collapse;margin:0;font-size:0.78em;{_MONO}{box}'>"
        f"{''.join(rows)}</table>"
    )


@dataclass(frozen=True)
class GalleryEntry:
    """One (mesh shape, partition spec) pair: the grid it gives, or the error JAX raised."""

    mesh_shape: tuple[int, ...]
    spec: PartitionSpec
    grid: Html | None
    error: str | None
    """``"ExceptionType: message"`` when JAX refused the layout, else None."""
    blocks: tuple[Block, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        """Short: each device's block shape and copies, or the exception type."""
        if not self.ok:
            return "✗ " + self.error.split(":", 1)[0]
        copies = len(self.blocks[0].devices)
        return f"{self.blocks[0].shape}" + (f" ×{copies}" if copies > 1 else "")

    def _repr_html_(self) -> str:
        if self.grid is not None:
            return self.grid.html
        return (
            f"<div style='max-width:21em;border:2px solid #CC3311;border-radius:4px;"
            f"padding:4px 8px;color:{_TEXT};background:#FFF4F0;{_FONT}'>"
            f"<div style='font-weight:600'>{html.escape(str(self.spec))}</div>"
            f"<div style='font-size:0.78em;white-space:pre-wrap;overflow-wrap:anywhere;{_MONO}'>"
            f"{html.escape(self.error or '')}</div></div>"
        )

    def __str__(self) -> str:
        return str(self.grid) if self.grid is not None else f"{self.spec}: {self.error}"


def gallery_entry(values: object, mesh: jax.sharding.Mesh,
                  spec: PartitionSpec, *, data: bool = True) -> GalleryEntry:
    """Place ``values`` on ``mesh`` with ``spec``; the grid, or the
    ``ValueError`` JAX gives.

    Only a ``ValueError`` (JAX's answer to a spec that does not fit the array
    or the mesh) is caught and recorded; anything else is a bug and
    propagates.
    """
    checks.mesh("mesh", mesh)
    _check_spec(spec)
    values = checks.array("values", values)
    mesh_shape = tuple(mesh.devices.shape)
    try:
        array = jax.device_put(values, NamedSharding(mesh, spec))
    except ValueError as error:
        message = f"{type(error).__name__}: {error}"
        return GalleryEntry(mesh_shape, spec, None, message)
    grid = layout_grid(array, data=data, title=str(spec))
    blocks = tuple(shard_blocks(array))
    return GalleryEntry(mesh_shape, spec, grid, None, blocks)


def _check_spec(spec: object) -> PartitionSpec:
    if not isinstance(spec, PartitionSpec):
        raise checks.InputTypeError(
            f"spec must be a PartitionSpec such as P('data', None), got {spec!r}.")
    return spec


@dataclass(frozen=True)
class Gallery:
    """Every spec tried on every mesh shape, for one array."""

    mesh_shapes: tuple[tuple[int, ...], ...]
    axis_names: tuple[str, ...]
    specs: tuple[PartitionSpec, ...]
    entries: tuple[GalleryEntry, ...]

    def entry(self, mesh_shape: Sequence[int], spec: PartitionSpec) -> GalleryEntry:
        for entry in self.entries:
            if entry.mesh_shape == tuple(mesh_shape) and entry.spec == spec:
                return entry
        raise KeyError(f"No gallery entry for mesh shape {tuple(mesh_shape)} and spec {spec}.")

    def section(self, mesh_shape: Sequence[int]) -> Html:
        """The entries for one mesh shape, side by side."""
        return side_by_side(*(self.entry(mesh_shape, spec) for spec in self.specs))

    def overview(self) -> Html:
        """A spec x mesh-shape table: each device's block shape (×copies), or the error type.

        Each spec heads its own row, spanning the table, with its results on the row below, so
        the table is as narrow as the four results (it fits a 400 px phone) however long the
        specs are.
        """
        names = ", ".join(self.axis_names)
        headers = ["spec"] + [f"mesh {shape}" for shape in self.mesh_shapes]
        rows = [
            [str(spec)] + [self.entry(shape, spec).summary() for shape in self.mesh_shapes]
            for spec in self.specs
        ]
        cell = "padding:2px 5px;white-space:nowrap;"
        head = "".join(
            f"<th scope='col' style='{cell}text-align:center'>{html.escape(str(shape))}</th>"
            for shape in self.mesh_shapes)
        groups = []
        for spec, row in zip(self.specs, rows, strict=True):
            cells = []
            for shape, text in zip(self.mesh_shapes, row[1:], strict=True):
                bad = not self.entry(shape, spec).ok
                colour = "background:#FFE4DC;" if bad else ""
                cells.append(f"<td style='{cell}text-align:center;{colour}{_MONO}'>"
                             f"{html.escape(text)}</td>")
            groups.append(
                f"<tbody><tr><th scope='rowgroup' colspan='{len(self.mesh_shapes)}' "
                f"style='{cell}text-align:left;font-weight:600;padding-top:6px;{_MONO}'>"
                f"{html.escape(row[0])}</th></tr><tr>{''.join(cells)}</tr></tbody>")
        markup = (
            f"<div style='overflow-x:auto;max-width:100%'><table style='border-collapse:collapse;"
            f"font-size:0.8em;{_FONT}'><caption style='caption-side:top;text-align:left;"
            f"font-size:0.85em'>Block shape on each device (×copies where replicated), for "
            f"each spec on each mesh shape; mesh axes ({html.escape(names)})</caption>"
            f"<thead><tr>{head}</tr></thead>{''.join(groups)}</table></div>"
        )
        return Html(html=markup, text=tabulate(rows, headers=headers, disable_numparse=True))


def gallery(values: object, mesh_shapes: Sequence[Sequence[int]], specs: Sequence[PartitionSpec],
            *, axis_names: Sequence[str] = ("data", "model"),
            devices: Sequence[jax.Device] | None = None, data: bool = True) -> Gallery:
    """Place ``values`` with every spec on a mesh of every shape (``jax.make_mesh``)."""
    if isinstance(mesh_shapes, (str, bytes)) or not isinstance(mesh_shapes, Sequence) \
            or not mesh_shapes:
        raise checks.InputTypeError(
            f"mesh_shapes must be a non-empty list of mesh shapes such as [(2, 4)], got "
            f"{mesh_shapes!r}.")
    shapes = tuple(checks.counts(f"mesh_shapes[{i}]", shape)
                   for i, shape in enumerate(mesh_shapes))
    if isinstance(axis_names, str) or not all(isinstance(n, str) for n in axis_names):
        raise checks.InputTypeError(
            f"axis_names must be a sequence of names such as ('data', 'model'), got "
            f"{axis_names!r}.")
    names = tuple(axis_names)
    for shape in shapes:
        if len(shape) != len(names):
            raise checks.InputError(
                f"mesh shape {shape} has {len(shape)} axes but axis_names {names} names "
                f"{len(names)}: give one name per axis.")
    available = len(devices) if devices is not None else len(jax.devices())
    for shape in shapes:
        if math.prod(shape) > available:
            raise checks.InputError(
                f"mesh shape {shape} needs {math.prod(shape)} devices, but "
                f"{available} are available: use a smaller mesh shape.")
    specs = tuple(_check_spec(spec) for spec in specs)
    values = checks.array("values", values)
    entries = []
    for shape in shapes:
        mesh = jax.make_mesh(shape, names, devices=devices)
        entries += [gallery_entry(values, mesh, spec, data=data) for spec in specs]
    return Gallery(shapes, names, tuple(specs), tuple(entries))
