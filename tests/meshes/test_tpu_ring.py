"""tpu_ring: hop counts on a TPU v3 tray, and the ring drawn as a readable SVG."""

from __future__ import annotations

import re

import numpy as np
import pytest
from jax.experimental import mesh_utils

from spmd_guide.core import drawing
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.meshes import tpu_ring


def test_ring_diagram_svg_has_a_title_and_readable_text():
    svg = tpu_ring.ring_diagram(tpu_ring.tpu_v3_tray(), [0, 1, 3, 2, 6, 7, 5, 4], title="ring").html
    assert "<title>ring: D0 -&gt; D1" in svg and "role='img'" in svg
    sizes = [float(s) for s in re.findall(r"font-size='([\d.]+)'", svg)]
    assert sizes and min(sizes) >= drawing.MIN_TEXT_PX


def test_snake_order_steps_one_chip_at_most_and_the_naive_order_crosses_a_diagonal():
    """The tray is 4 chips of 2 cores in a 2x2 grid: the book's ring order never skips a
    chip, while numbering order 0..7 steps diagonally twice (2 hops)."""
    tray = tpu_ring.tpu_v3_tray()
    assert len(tray) == 8 and {d.core_on_chip for d in tray} == {0, 1}
    assert tpu_ring.ring_hops(tray, [0, 1, 3, 2, 6, 7, 5, 4]) == [0, 1] * 4
    assert max(tpu_ring.ring_hops(tray, list(range(8)))) == 2
    assert tpu_ring.ring_hops(tray, [0, 1]) == [0, 0]  # a partial ring is allowed


def test_numpy_orders_and_devices_work_like_lists():
    tray = tpu_ring.tpu_v3_tray()
    ring = [0, 1, 2, 3, 6, 7, 4, 5]
    expected = tpu_ring.ring_hops(tray, ring)
    assert tpu_ring.ring_hops(tray, np.array(ring)) == expected
    assert tpu_ring.ring_hops(tray, [np.int64(i) for i in ring]) == expected
    assert tpu_ring.ring_hops(tray, tuple(ring)) == expected
    assert tpu_ring.ring_hops(np.array(tray, dtype=object), ring) == expected
    as_devices = mesh_utils.create_device_mesh((8,), tray)
    assert tpu_ring.ring_hops(tray, as_devices) == expected
    assert tpu_ring.diagonal_steps(tray, np.arange(8)) == tpu_ring.diagonal_steps(tray, range(8))
    assert tpu_ring.ring_diagram(tray, np.array(ring)).text == tpu_ring.ring_diagram(tray, ring).text


def test_grid_hops_reads_rows_and_columns_as_rings():
    """The chapter's (2, 4) table: JAX's order keeps rows on neighbouring chips but puts
    each column on diagonal chips; the plain reshape's columns are neighbours."""
    tray = tpu_ring.tpu_v3_tray()
    jax_grid = mesh_utils.create_device_mesh((2, 4), tray)
    assert [[d.id for d in row] for row in jax_grid] == [[0, 1, 2, 3], [6, 7, 4, 5]]
    assert tpu_ring.grid_hops(tray, jax_grid) == {
        "rows": [[0, 1, 0, 1]] * 2, "columns": [[2, 2]] * 4}
    assert tpu_ring.grid_hops(tray, np.arange(8).reshape(2, 4)) == {
        "rows": [[0, 1, 0, 1]] * 2, "columns": [[1, 1]] * 4}
    # Taken from the grid, the columns are the same as ring_hops of each column.
    for column in np.arange(8).reshape(4, 2).T:
        assert tpu_ring.ring_hops(tray, column) in tpu_ring.grid_hops(
            tray, np.arange(8).reshape(4, 2))["columns"]


TRAY = tpu_ring.tpu_v3_tray()
BAD_INPUT = [
    ("device without coords", lambda: tpu_ring.ring_hops([object()], [0]),
     InputTypeError, "coords"),
    ("devices a string", lambda: tpu_ring.ring_hops("tray", [0]), InputTypeError, "devices"),
    ("no devices", lambda: tpu_ring.ring_hops([], [0]), InputError, "at least one"),
    ("order a string", lambda: tpu_ring.ring_hops(TRAY, "0123"), InputTypeError, "sequence"),
    ("order of floats", lambda: tpu_ring.ring_hops(TRAY, [0.0, 1.0]), InputTypeError,
     "integer"),
    ("order with a bool", lambda: tpu_ring.ring_hops(TRAY, [True, 1]), InputTypeError,
     "integer"),
    ("order negative", lambda: tpu_ring.ring_hops(TRAY, [0, -1]), InputError, "at least 0"),
    ("order repeats", lambda: tpu_ring.ring_hops(TRAY, [0, 0, 1]), InputError, "distinct"),
    ("order unknown id", lambda: tpu_ring.ring_hops(TRAY, [0, 9]), InputError, "distinct"),
    ("order empty", lambda: tpu_ring.ring_hops(TRAY, []), InputError, "at least 1"),
    ("order 2-D", lambda: tpu_ring.ring_hops(TRAY, np.arange(8).reshape(2, 4)),
     InputTypeError, "integer"),
    ("diagram misses devices", lambda: tpu_ring.ring_diagram(TRAY, [0, 1]), InputError,
     "every device"),
    ("diagram title a number", lambda: tpu_ring.ring_diagram(TRAY, range(8), title=3),
     InputTypeError, "title"),
    ("diagonal_steps of None", lambda: tpu_ring.diagonal_steps(TRAY, None), InputTypeError,
     "sequence"),
    ("grid 1-D", lambda: tpu_ring.grid_hops(TRAY, np.arange(8)), InputError, "2-D"),
    ("grid repeats a device", lambda: tpu_ring.grid_hops(TRAY, [[0, 1], [1, 2]]), InputError,
     "twice"),
    ("TrayDevice with two coords", lambda: tpu_ring.TrayDevice(0, (0, 0), 0), InputTypeError,
     "three integers"),
    ("TrayDevice id -1", lambda: tpu_ring.TrayDevice(-1, (0, 0, 0), 0), InputError, "id"),
    ("grid of strings", lambda: tpu_ring.grid_hops(TRAY, [["a", "b"]]), InputTypeError,
     "integer"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_diagonal_steps_words_any_count():
    tray = tpu_ring.tpu_v3_tray()
    assert tpu_ring.diagonal_steps(tray, [0, 1, 2, 3, 6, 7, 4, 5]) == "no step"
    assert tpu_ring.diagonal_steps(tray, list(range(8))) == (
        "2 steps (dashed red: device 3 to device 4 and device 7 back to device 0)")
    assert tpu_ring.diagonal_steps(tray, [0, 6]) == (
        "2 steps (dashed red: device 0 to device 6 and device 6 back to device 0)")
    assert tpu_ring.diagonal_steps(tray, [0, 1, 6, 2]) == (
        "1 step (dashed red: device 1 to device 6)")


def _links_and_labels(svg: str):
    """The points along each link of a ring diagram, and the box of each chip label."""
    links = [tpu_ring._curve(*[tuple(map(float, p.split(","))) for p in (a, b, c, d)])
             for a, b, c, d in re.findall(r"d='M([\d.,-]+) C([\d.,-]+) ([\d.,-]+) ([\d.,-]+)'", svg)]
    labels = []
    for x, y, anchor in re.findall(r"<text x='([\d.]+)' y='([\d.]+)' text-anchor='(\w+)'[^>]*>chip",
                                   svg):
        x, y, width = float(x), float(y), 6 * len("chip (0, 0)")
        labels.append((x - width if anchor == "end" else x, y - 11,
                       x if anchor == "end" else x + width, y + 3))
    return links, labels


@pytest.mark.parametrize("order", [list(range(8)), [0, 1, 2, 3, 6, 7, 4, 5]])
def test_no_link_crosses_a_chip_label(order):
    links, labels = _links_and_labels(
        tpu_ring.ring_diagram(tpu_ring.tpu_v3_tray(), order).html)
    assert len(links) == 8 and len(labels) == 4
    assert not any(tpu_ring._hits(points, labels) for points in links)
