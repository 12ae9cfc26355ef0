"""spmd_guide.core.drawing: one palette and font stack, readable SVG figures with alt text, panels
and the TPU ring diagram (the panel pictures of collectives are tested in test_collectives)."""

import ast
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import contrast_ratio
from jax.sharding import AxisType

from spmd_guide.core import drawing, hlo
from spmd_guide.meshes import show, tpu_ring
from spmd_guide.nn import step_costs
from spmd_guide.shard_map import collectives, ring_costs

SOURCE = Path(drawing.__file__)


def _shown(figure_html: str) -> tuple[float, float]:
    """(natural width, narrowest width) in CSS px of a figure_html <img>."""
    width = float(re.search(r"width='(\d+)'", figure_html).group(1))
    narrowest = float(re.search(r"min-width:(\d+)px", figure_html).group(1))
    return width, narrowest


def test_drawing_is_a_base_module_and_the_one_palette():
    imported = {node.module for node in ast.walk(ast.parse(SOURCE.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module}
    assert {name for name in imported if name.startswith("spmd_guide")} <= {
        "spmd_guide.core.display", "spmd_guide.core.checks"}
    assert show.PALETTE is drawing.PALETTE and collectives.device_color is drawing.device_color
    assert show.Html is drawing.Html and collectives.Panel is drawing.Panel
    assert show.tpu_v3_tray is tpu_ring.tpu_v3_tray
    assert drawing.FONT_STACK[0] == "DejaVu Sans"  # what matplotlib draws with


def test_palette_meets_wcag_aa_under_the_text_colour():
    assert all(contrast_ratio(colour, drawing.TEXT) >= 4.5 for colour in drawing.PALETTE)


@pytest.mark.parametrize("make", [
    lambda mesh: collectives.draw_collective("all_gather_tiled", mesh),
    lambda mesh: collectives.draw_collective("psum", mesh),
    lambda mesh: ring_costs.draw_ring("reduce_scatter_bidi", 4),
    lambda mesh: ring_costs.draw_ring("allgather_overlapped", 4),
])
def test_panel_figures_fit_the_column_with_text_of_at_least_11_px(make):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    fig = make(mesh)
    html = drawing.figure_html(fig)
    width, narrowest = _shown(html)
    assert width <= drawing.COLUMN_PX
    assert drawing.smallest_text_pt(fig) * 96 / 72 * narrowest / width >= drawing.MIN_TEXT_PX - 0.01
    assert "data:image/svg+xml;base64," in html and "alt='" in html
    assert fig.alt and "devices" in fig.alt


def test_figure_html_never_shrinks_text_below_11_px():
    fig, ax = drawing.subplots(alt="a line", figsize=(9, 2))
    ax.plot([0, 1], [0, 1])
    ax.set_title("small", fontsize=6)
    width, narrowest = _shown(drawing.figure_html(fig))
    assert narrowest == pytest.approx(width * 11 / (6 * 96 / 72), abs=1)  # wider than natural
    assert narrowest > width
    assert "alt='a line'" in drawing.figure_html(fig)


def test_describe_gives_alt_text_from_titles_and_labels():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.set_ylabel("mlp_loss")
    assert drawing.describe(fig) == "Figure: loss, step against mlp_loss"
    assert "alt='Figure: loss" in drawing.figure_bundle(fig)["text/html"]
    plt.close(fig)


def test_use_svg_figures_outside_ipython_changes_nothing():
    assert drawing.use_svg_figures() is False


def test_plot_comparison_text_is_readable_in_the_column():
    timing = type("T", (), {"median": 1e-3, "spread": (9e-4, 2e-3), "device_kind": "cpu"})()
    profile = type("P", (), {"strategy": "dp", "counts": dict.fromkeys(hlo.KINDS, 1),
                             "comm_bytes": 2048, "param_bytes": 4096, "peak_bytes": 8192,
                             "step": timing})()
    fig = step_costs.plot_comparison([profile, profile])
    width, narrowest = _shown(drawing.figure_html(fig))
    assert width <= drawing.COLUMN_PX
    assert drawing.smallest_text_pt(fig) * 96 / 72 * min(width, drawing.COLUMN_PX) / width >= 11
    assert "dp" in fig.alt




@pytest.mark.parametrize("call, error, word", [
    (lambda: drawing.device_color(-2), ValueError, "origin"),
    (lambda: drawing.draw_panels([]), ValueError, "at least one"),
    (lambda: drawing.Panel("a", [[1, 2]], origins=[[0]]).cells(), ValueError, "one origin"),
    (lambda: drawing.Panel("a", [[1]], origins=[[0], [1]]).cells(), ValueError, "origins for"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_before_after_captions_name_dtype_and_shape():
    before = np.zeros((4, 2), np.float32)
    panels = drawing.before_after(before, np.zeros((4, 8), np.float32), np.zeros((4, 8), int))
    assert [p.caption for p in panels] == ["each device: f32[2]", "each device: f32[8]"]
