"""spmd_guide.core.timeline: one lane per device, kinds told apart by colour and fill, text of
at least 11 px, alt text, colours with WCAG AA contrast on white; bad lanes refused."""

import ast
import re
from pathlib import Path

import pytest
from helpers import contrast_ratio

from spmd_guide.core import checks, drawing, timeline

LANES = {"device 0": [(0.0, 5.0, "compute"), (5.0, 20.0, "collective"), (6.0, 10.0, "wait"),
                      (1.0, 3.0, "other")],
         "device 1": [(0.0, 15.0, "compute"), (15.0, 10.0, "collective")]}


def test_timeline_is_a_base_module():
    tree = ast.parse(Path(timeline.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in imported if m.startswith("spmd_guide")} <= {
        "spmd_guide.core", "spmd_guide.core.checks", "spmd_guide.core.drawing"}


def test_every_kind_is_visible_on_white():
    for kind, style in timeline.KIND_STYLE.items():
        # A solid bar contrasts with the page; a white (wait) bar by its hatch and outline.
        shown = style["color"] if style["color"].upper() != "#FFFFFF" else style["edge"]
        assert contrast_ratio(shown, "#FFFFFF") >= 4.5, kind
        assert kind == "wait" or not style["hatch"]


def test_a_timeline_has_one_lane_per_device_readable_text_and_alt_text():
    fig = timeline.draw_timeline(LANES, alt="Two devices, one waits.")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 1", "device 0"]
    assert drawing.smallest_text_pt(fig) * 96 / 72 >= drawing.MIN_TEXT_PX
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["compute", "collective", "waiting for the others", "loop (contains ops)"]
    html = drawing.figure_html(fig)
    assert "alt='Two devices, one waits.'" in html
    width = float(re.search(r"width='(\d+)'", html).group(1))
    assert width <= 700  # the book's column


def test_only_the_kinds_that_occur_are_in_the_legend():
    fig = timeline.draw_timeline({"d": [(0.0, 1.0, "compute")]}, alt="one op")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["compute"]


@pytest.mark.parametrize("lanes, match", [
    ({}, "non-empty mapping"), ([("d", [])], "non-empty mapping"),
    ({"d": "spans"}, "list of"), ({"d": [(0, 1)]}, "start, duration, kind"),
    ({"d": [(0, -1, "compute")]}, "at least 0"), ({"d": [(0, 1, "idle")]}, "kind"),
    ({"d": [(float("nan"), 1, "compute")]}, "finite"),
])
def test_bad_lanes_are_refused(lanes, match):
    with pytest.raises(checks.InputError, match=match):
        timeline.draw_timeline(lanes, alt="x")


def test_alt_text_is_required():
    with pytest.raises(checks.InputError, match="alt text"):
        timeline.draw_timeline(LANES, alt=" ")
