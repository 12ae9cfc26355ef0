"""figures: the Part's figures (bounds marked, the key above the bars, plain ticks) and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import figures, roofline, strategies

NAN = float("nan")


def _predictions():
    work = {"dp": roofline.Counts(1e9, 1e6, 1e6), "tp": roofline.Counts(1e9, 2e6, 1e5)}
    return strategies.predict_strategies(work, chips=["h200", "b200"])

@pytest.mark.slow
def test_prediction_figure_marks_every_bar_with_its_bound_and_keeps_the_key_above():
    import matplotlib.pyplot as plt

    sizes, batch = (64, 128, 128, 64), 256
    work = {n: strategies.strategy_counts(n, layer_sizes=sizes, batch=batch)
            for n in ("dp", "tp")}
    predictions = strategies.predict_strategies(work)
    fig = figures.plot_predictions(predictions)
    ax = fig.axes[0]
    marks = [line.get_marker() for line in ax.get_lines()]
    expected = [figures.BOUND_MARKERS[p.estimate.bound]
                for name in ("dp", "tp") for p in predictions if p.strategy == name]
    assert marks == expected
    assert len(set(figures.BOUND_MARKERS.values())) == len(roofline.BOUNDS)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (key,) = fig.legends
    labels = [t.get_text() for t in key.get_texts()]
    assert {"dp", "tp", *figures.BOUND_MARKERS} <= set(labels)
    # The key lies wholly above the plotting area, so no bar hides behind it.
    assert key.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1
    plt.close(fig)


def test_curves_take_plain_x_ticks():
    import matplotlib.pyplot as plt

    ways = np.arange(2, 65)
    fig = figures.plot_curves(ways, {"a": ways * 1.0}, xlabel="n", ylabel="f",
                                     xticks=[2, 4, 8, 16, 32, 64])
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [2, 4, 8, 16, 32, 64]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8", "16", "32", "64"]
    plt.close(fig)


@pytest.mark.parametrize("call, error, word", [
    (lambda: figures.plot_rooflines({"x": (NAN, 1)}), InputError, "finite"),
    (lambda: figures.plot_rooflines({"x": (0.0, 1)}), InputError, "positive"),
    (lambda: figures.plot_rooflines({"x": 3}), InputTypeError, "points"),
    (lambda: figures.plot_rooflines({"x": (1, 1)}, chips="nope"), InputError, "nope"),
    (lambda: figures.plot_curves([1, 2], {"a": [1, NAN]}, xlabel="x", ylabel="y"),
     InputError, "NaN"),
    (lambda: figures.plot_curves([0, 2], {"a": [1, 2]}, xlabel="x", ylabel="y"),
     InputError, "positive"),
    (lambda: figures.plot_curves([1, 2], {"a": [1, 2, 3]}, xlabel="x", ylabel="y"),
     InputError, "3 values"),
    (lambda: figures.plot_curves([1, 2], {"a": [1, 2]}, xlabel=1, ylabel="y"),
     InputTypeError, "xlabel"),
    (lambda: figures.plot_curves([1, 2], {"a": [1, 2]}, xlabel="x", ylabel="y",
                                        marks={"m": NAN}), InputError, "marks"),
    (lambda: figures.plot_predictions([]), InputTypeError, "predictions"),
    (lambda: figures.plot_predictions(_predictions()[:3]), InputError, "missing"),
    (lambda: figures.plot_rooflines({"x": (1.0, NAN)}), InputError, "FLOPs"),
    (lambda: figures.plot_rooflines({"x": (1.0, "a")}), InputTypeError, "FLOPs"),
    (lambda: figures.plot_curves([1, 2], {1: [1, 2]}, xlabel="x", ylabel="y"),
     InputTypeError, "label of curves"),
    (lambda: figures.plot_curves([], {"a": []}, xlabel="x", ylabel="y"), InputError,
     "at least 2"),
    (lambda: figures.plot_curves([1, 2], {"a": [1, 2]}, xlabel="x", ylabel="y",
                                        xticks="24"), InputTypeError, "xticks"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


@pytest.mark.parametrize("chips", ["tpu-v9", "h", b"h200", None, {"h200": 1}, {"h200", "b200"},
                                   ["h200", "zz"]])
def test_a_bad_chips_argument_is_named(chips):
    import matplotlib.pyplot as plt

    with pytest.raises(InputError, match=r"\bchips\b"):
        figures.plot_rooflines({"x": (1.0, 1.0)}, chips=chips)
    plt.close("all")
