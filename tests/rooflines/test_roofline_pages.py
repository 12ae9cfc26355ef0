"""roofline_pages: strategy predictions ranked per chip, the worked problems' answers, and
the chip a device is."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from spmd_guide.core.checks import InputError
from spmd_guide.rooflines import roofline, roofline_pages


def test_mlp_predictions_rank_every_strategy_on_every_chip():
    sizes, batch = (64, 128, 128, 64), 256
    work = {n: roofline_pages.strategy_counts(n, layer_sizes=sizes, batch=batch) for n in ("dp", "tp")}
    # dp all-reduces every f32 gradient once over 8 devices.
    grads = sum(4 * (a * b + b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    assert work["dp"].comm_bytes == pytest.approx(2 * 7 / 8 * grads, abs=16)
    assert work["dp"].flops == pytest.approx(
        roofline.mlp_matmul_flops(sizes, batch, with_gradient=True) / 8, rel=0.05)
    predictions = roofline_pages.predict_strategies(work)
    assert len(predictions) == 2 * len(roofline.CHIPS)
    for key in roofline.CHIPS:
        assert sorted(roofline_pages.ranking(predictions, key)) == ["dp", "tp"]
        rows = roofline_pages.prediction_rows(predictions, key)
        assert [r["rank"] for r in rows] == [1, 2]
        assert {r["bound"] for r in rows} <= set(roofline.BOUNDS)


def test_worked_problems_answers():
    answers = {p.key: p.value for p in roofline_pages.problems()}
    assert len(answers) >= 8
    assert answers["ridge"] == pytest.approx(9.89e14 / 3.35e12)
    assert answers["matmul_batch"] == pytest.approx(250, abs=1)
    assert answers["dp_nvlink"] == pytest.approx(7 / 8 * 9.89e14 / 4.5e11)
    assert answers["dp_network"] == pytest.approx(9.89e14 / 5e10)
    assert answers["fsdp_fit"] == 7
    assert answers["train_step"] == pytest.approx(6 * 7e9 * 1e6 / (256 * 4.59e14))
    assert answers["tp_ways"] == 12
    assert answers["allgather"] == pytest.approx(7 / 8 * 8192 * 28672 * 2 / 4.5e11)
    assert answers["overlap"] == pytest.approx(3 * 1.97e14 / 9e10)
    assert answers["decode"] == pytest.approx(14e9 / 4.8e12)
    for p in roofline_pages.problems():
        assert p.question.endswith("?") and p.answer


def test_rooflines_exercises_answers():
    answers = {p.key: p.value for p in roofline_pages.intensity_exercises()}
    assert answers["f32_intensity"] == pytest.approx(
        2 * 256 * 4096**2 / (2 * (256 * 4096 * 2 + 4096**2)))
    assert answers["b200_batch"] == pytest.approx(2.25e15 / 8e12)


def test_chip_for_device_kinds():
    class Fake:
        def __init__(self, kind):
            self.device_kind = kind

    assert roofline_pages.chip_for(Fake("NVIDIA H100 80GB HBM3")) == "h100-sxm"
    assert roofline_pages.chip_for(Fake("TPU v5 lite")) == "tpu-v5e"
    assert roofline_pages.chip_for(Fake("TPU v5p")) == "tpu-v5p"
    assert roofline_pages.chip_for(Fake("cpu")) is None


def test_measured_beside_predicted_on_an_accelerator():
    if jax.default_backend() == "cpu":
        pytest.skip("no accelerator here: only predictions can be checked on CPU mock devices")
    a = jnp.ones((4096, 4096), jnp.bfloat16)
    from spmd_guide.core.timing import time_fn

    step = jax.jit(lambda x: x @ x)
    measured = time_fn(step, a, runs=5).median
    chip = roofline_pages.chip_for(jax.devices()[0])
    if chip is None:
        pytest.skip(f"{jax.devices()[0].device_kind} is not in the chips file")
    assert measured >= 0.5 * roofline.predict(step, a, chip=chip).step_s


def test_bad_input():
    with pytest.raises(InputError, match="strategy"):
        roofline_pages.strategy_counts("pipeline")


@pytest.mark.slow
def test_prediction_figure_marks_every_bar_with_its_bound_and_keeps_the_key_above():
    import matplotlib.pyplot as plt

    sizes, batch = (64, 128, 128, 64), 256
    work = {n: roofline_pages.strategy_counts(n, layer_sizes=sizes, batch=batch)
            for n in ("dp", "tp")}
    predictions = roofline_pages.predict_strategies(work)
    fig = roofline_pages.plot_predictions(predictions)
    ax = fig.axes[0]
    marks = [line.get_marker() for line in ax.get_lines()]
    expected = [roofline_pages.BOUND_MARKERS[p.estimate.bound]
                for name in ("dp", "tp") for p in predictions if p.strategy == name]
    assert marks == expected
    assert len(set(roofline_pages.BOUND_MARKERS.values())) == len(roofline.BOUNDS)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (key,) = fig.legends
    labels = [t.get_text() for t in key.get_texts()]
    assert {"dp", "tp", *roofline_pages.BOUND_MARKERS} <= set(labels)
    # The key lies wholly above the plotting area, so no bar hides behind it.
    assert key.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1
    plt.close(fig)


def test_curves_take_plain_x_ticks():
    import matplotlib.pyplot as plt
    import numpy as np

    ways = np.arange(2, 65)
    fig = roofline_pages.plot_curves(ways, {"a": ways * 1.0}, xlabel="n", ylabel="f",
                                     xticks=[2, 4, 8, 16, 32, 64])
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [2, 4, 8, 16, 32, 64]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8", "16", "32", "64"]
    plt.close(fig)
