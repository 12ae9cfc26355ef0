"""tpu_ring: hop counts on a TPU v3 tray, and the ring drawn as a readable SVG."""

from __future__ import annotations

import re

import pytest

from spmd_guide import drawing, tpu_ring


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
