"""tpu_ring: hop counts on a TPU v3 tray, and the ring drawn as a readable SVG."""

from __future__ import annotations

import re

import pytest

from spmd_guide.core import drawing
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


@pytest.mark.parametrize("call, word", [
    (lambda: tpu_ring.ring_hops([object()], [0]), "coords"),
    (lambda: tpu_ring.ring_diagram(tpu_ring.tpu_v3_tray(), [0, 1]), "every device"),
])
def test_bad_input_gets_a_clear_error(call, word):
    with pytest.raises(ValueError, match=word):
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
