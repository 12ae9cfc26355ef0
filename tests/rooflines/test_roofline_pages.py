"""roofline_pages: strategy predictions ranked per chip, the worked problems' answers, the
chip a device is, the compiler facts the parallelism page states, and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import formulas, hardware, roofline, roofline_pages

SIZES, BATCH = (64, 128, 128, 64), 256


def _small(name, **options):
    return roofline_pages.strategy_counts(name, **{"layer_sizes": SIZES, "batch": BATCH} | options)


def test_mlp_predictions_rank_every_strategy_on_every_chip():
    sizes, batch = SIZES, BATCH
    work = {n: _small(n) for n in ("dp", "tp")}
    # dp all-reduces every f32 gradient once over 8 devices.
    grads = sum(4 * (a * b + b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    assert work["dp"].comm_bytes == pytest.approx(2 * 7 / 8 * grads, abs=16)
    assert work["dp"].flops == pytest.approx(
        formulas.mlp_matmul_flops(sizes, batch, with_gradient=True) / 8, rel=0.05)
    predictions = roofline_pages.predict_strategies(work)
    assert len(predictions) == 2 * len(hardware.CHIPS)
    for key in hardware.CHIPS:
        assert sorted(roofline_pages.ranking(predictions, key)) == ["dp", "tp"]
        rows = roofline_pages.prediction_rows(predictions, key)
        assert [r["rank"] for r in rows] == [1, 2]
        assert {r["bound"] for r in rows} <= set(roofline.BOUNDS)
        assert float(rows[0]["step ms"]) <= float(rows[1]["step ms"])


def test_one_chip_name_is_one_chip_not_its_letters():
    """Issue #27: chips='h100-sxm' used to iterate the string ("unknown chip 'h'")."""
    work = {"dp": _small("dp")}
    one = roofline_pages.predict_strategies(work, chips="h100-sxm")
    assert [(p.strategy, p.chip) for p in one] == [("dp", "h100-sxm")]
    assert roofline_pages.predict_strategies(work, chips=np.str_("h100-sxm")) == one
    assert roofline_pages.predict_strategies(work, chips=["h100-sxm"]) == one
    with pytest.raises(InputError, match="unknown an entry of chips 'h'"):
        roofline_pages.predict_strategies(work, chips=["h"])


def test_backward_flops_explain_the_dp_threshold():
    """Review W4: the compiled backward (step minus forward) is the closed form's backward
    matmuls, 4BP less the first layer's input gradient, not 2/3 of the step."""
    step, forward = _small("dp"), _small("dp", gradient=False)
    backward = step.flops - forward.flops
    closed = (formulas.mlp_matmul_flops(SIZES, BATCH, with_gradient=True)
              - formulas.mlp_matmul_flops(SIZES, BATCH)) / 8
    params = sum(a * b for a, b in zip(SIZES[:-1], SIZES[1:], strict=True))
    assert closed == (4 * BATCH * params - 2 * BATCH * SIZES[0] * SIZES[1]) / 8
    assert backward == pytest.approx(closed, rel=0.05)  # plus element-wise work
    assert backward < 4 * BATCH * params / 8 and backward < 2 / 3 * step.flops


def test_collectives_the_parallelism_page_reads():
    """XLA:CPU keeps auto_fsdp's gradient all-reduce (no reduce-scatter: review M2), and on
    JAX 0.12 fsdp gathers its weights again in the backward pass (its remat policy), so it
    sends more than dp."""
    dp, fsdp, auto_fsdp = (_small(n) for n in ("dp", "fsdp", "auto_fsdp"))
    weights = sum(4 * (a * b + b) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True))
    assert set(dp.sent_by_kind) == {"all-reduce"}
    assert auto_fsdp.sent_by_kind["all-reduce"] == pytest.approx(2 * 7 / 8 * weights, abs=16)
    assert "reduce-scatter" not in auto_fsdp.sent_by_kind
    assert fsdp.sent_by_kind["reduce-scatter"] == pytest.approx(7 / 8 * weights, abs=16)
    # Gathered once for the forward, and again in the backward where the backward needs the
    # weight: every layer but the first (no input gradient there), weights but not biases.
    again = sum(4 * a * b for a, b in zip(SIZES[1:-1], SIZES[2:], strict=True))
    assert fsdp.sent_by_kind["all-gather"] == pytest.approx(7 / 8 * (weights + again), abs=16)
    assert fsdp.comm_bytes > dp.comm_bytes


@pytest.mark.slow
@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_devices_may_come_from_a_mesh_of_either_axis_type(explicit):
    mesh = mesh_of(8, ("a", "b"), (4, 2), explicit=explicit)
    listed = _small("tp")
    assert _small("tp", devices=mesh) == listed
    assert _small("tp", devices=mesh.devices) == listed
    with jax.set_mesh(mesh):  # an ambient mesh does not get in the way (compiled afresh)
        fresh = roofline_pages._strategy_counts.__wrapped__(
            "tp", SIZES, BATCH, tuple(mesh.devices.flat))
    assert fresh == listed


def test_worked_problems_answers():
    answers = {p.key: p.value for p in roofline_pages.problems()}
    assert len(answers) >= 8
    assert answers["ridge"] == pytest.approx(9.89e14 / 3.35e12)
    assert answers["matmul_batch"] == pytest.approx(250, abs=1)
    assert answers["dp_nvlink"] == pytest.approx(7 / 8 * 9.89e14 / 4.5e11)
    assert answers["dp_network"] == pytest.approx(9.89e14 / 5e10 / 8)  # NIC: 1/8 of the gradient
    network = next(p for p in roofline_pages.problems() if p.key == "dp_network")
    assert "flat" in network.answer and "every library" not in network.answer  # review B6
    assert answers["fsdp_fit"] == 7
    assert answers["train_step"] == pytest.approx(6 * 7e9 * 1e6 / (256 * 4.59e14))
    assert answers["tp_ways"] == 12
    assert answers["allgather"] == pytest.approx(7 / 8 * 8192 * 28672 * 2 / 4.5e11)
    assert answers["overlap"] == pytest.approx(4 * 1.97e14 / 9e10)  # per-block balance
    overlap = next(p for p in roofline_pages.problems() if p.key == "overlap")
    assert "speedup 1.75" in overlap.answer
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
    assert roofline_pages.chip_for(Fake("NVIDIA B200")) == "b200"
    assert roofline_pages.chip_for(Fake("cpu")) is None
    # Variants with other rates than the file's (review N4) are not priced as the SXM.
    # Review B5: a GB200's B200 runs at 2,500 dense bf16 TFLOP/s, not the HGX B200's 2,250.
    for kind in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB",
                 "NVIDIA GB200"):
        assert roofline_pages.chip_for(Fake(kind)) is None, kind
    assert roofline_pages.chip_for(jax.devices()[0]) is None  # a CPU here


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


NAN = float("nan")


def _predictions():
    work = {"dp": roofline.Counts(1e9, 1e6, 1e6), "tp": roofline.Counts(1e9, 2e6, 1e5)}
    return roofline_pages.predict_strategies(work, chips=["h200", "b200"])


@pytest.mark.parametrize("call, error, word", [
    (lambda: roofline_pages.strategy_counts("pipeline"), InputError, "unknown strategy 'pipeline'"),
    (lambda: roofline_pages.strategy_counts(["dp"]), InputTypeError, "strategy"),
    (lambda: roofline_pages.strategy_counts(np.array(["dp", "tp"])), InputTypeError, "strategy"),
    (lambda: roofline_pages.strategy_counts("dp", batch=0), InputError, "batch"),
    (lambda: roofline_pages.strategy_counts("dp", batch=NAN), InputTypeError, "batch"),
    (lambda: roofline_pages.strategy_counts("dp", layer_sizes=[8]), InputError, "layer_sizes"),
    (lambda: roofline_pages.strategy_counts("dp", layer_sizes="64,64"), InputTypeError, "layer_sizes"),
    (lambda: roofline_pages.strategy_counts("dp", devices="cpu"), InputTypeError, "devices"),
    (lambda: roofline_pages.strategy_counts("dp", devices=[]), InputError, "devices"),
    (lambda: roofline_pages.strategy_counts("dp", gradient="yes"), InputTypeError, "gradient"),
    (lambda: roofline_pages.strategy_counts("dp", layer_sizes=SIZES, batch=BATCH + 1),
     InputError, "batch size"),
    (lambda: roofline_pages.predict_strategies({}), InputTypeError, "counts_by_name"),
    (lambda: roofline_pages.predict_strategies({"dp": 3.0}), InputTypeError, "Counts"),
    (lambda: roofline_pages.predict_strategies({"dp": roofline.Counts(1, 1, 1)}, chips="h"),
     InputError, "unknown chips 'h'"),
    (lambda: roofline_pages.predict_strategies({"dp": roofline.Counts(1, 1, 1)}, chips=[]),
     InputError, "empty"),
    (lambda: roofline_pages.predict_strategies({"dp": roofline.Counts(1, 1, 1)}, chips=5),
     InputTypeError, "chips"),
    (lambda: roofline_pages.ranking(_predictions(), "h100"), InputError, "unknown chip 'h100'"),
    (lambda: roofline_pages.ranking(_predictions(), "tpu-v4"), InputError, "no predictions"),
    (lambda: roofline_pages.ranking("dp", "h200"), InputTypeError, "predictions"),
    (lambda: roofline_pages.prediction_rows(_predictions(), ["h200"]), InputTypeError, "chip"),
    (lambda: roofline_pages.prediction_rows([1, 2], "h200"), InputTypeError, "Prediction"),
    (lambda: roofline_pages.chip_for("NVIDIA H100"), InputTypeError, "device"),
    (lambda: roofline_pages.Prediction("dp", "h200", 1.0), InputTypeError, "Estimate"),
    (lambda: roofline_pages.Problem("k", "q?", "a", NAN), InputError, "value"),
    (lambda: roofline_pages.how_many(1, 0), InputError, "total"),
    (lambda: roofline_pages.plot_rooflines({"x": (NAN, 1)}), InputError, "finite"),
    (lambda: roofline_pages.plot_rooflines({"x": (0.0, 1)}), InputError, "positive"),
    (lambda: roofline_pages.plot_rooflines({"x": 3}), InputTypeError, "points"),
    (lambda: roofline_pages.plot_rooflines({"x": (1, 1)}, chips="nope"), InputError, "nope"),
    (lambda: roofline_pages.plot_curves([1, 2], {"a": [1, NAN]}, xlabel="x", ylabel="y"),
     InputError, "NaN"),
    (lambda: roofline_pages.plot_curves([0, 2], {"a": [1, 2]}, xlabel="x", ylabel="y"),
     InputError, "positive"),
    (lambda: roofline_pages.plot_curves([1, 2], {"a": [1, 2, 3]}, xlabel="x", ylabel="y"),
     InputError, "3 values"),
    (lambda: roofline_pages.plot_curves([1, 2], {"a": [1, 2]}, xlabel=1, ylabel="y"),
     InputTypeError, "xlabel"),
    (lambda: roofline_pages.plot_curves([1, 2], {"a": [1, 2]}, xlabel="x", ylabel="y",
                                        marks={"m": NAN}), InputError, "marks"),
    (lambda: roofline_pages.plot_predictions([]), InputTypeError, "predictions"),
    (lambda: roofline_pages.plot_predictions(_predictions()[:3]), InputError, "missing"),
    (lambda: roofline_pages.predict_strategies({"dp": roofline.Counts(1, 1, 1)}, topology="no"),
     InputTypeError, "topology"),
    (lambda: roofline_pages.first_places("dp"), InputTypeError, "predictions"),
    (lambda: roofline_pages.first_places([]), InputTypeError, "predictions"),
    (lambda: roofline_pages.plot_rooflines({"x": (1.0, NAN)}), InputError, "FLOPs"),
    (lambda: roofline_pages.plot_rooflines({"x": (1.0, "a")}), InputTypeError, "FLOPs"),
    (lambda: roofline_pages.plot_curves([1, 2], {1: [1, 2]}, xlabel="x", ylabel="y"),
     InputTypeError, "label of curves"),
    (lambda: roofline_pages.plot_curves([], {"a": []}, xlabel="x", ylabel="y"), InputError,
     "at least 2"),
    (lambda: roofline_pages.plot_curves([1, 2], {"a": [1, 2]}, xlabel="x", ylabel="y",
                                        xticks="24"), InputTypeError, "xticks"),
    (lambda: roofline_pages.how_many(True, 7), InputTypeError, "count"),
    (lambda: roofline_pages.Problem("k", "q?", "a", True), InputTypeError, "value"),
    (lambda: roofline_pages.strategy_counts("tp", layer_sizes=(64, 63, 64), batch=8),
     InputError, "63"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_numpy_inputs_work_wherever_python_ones_do():
    assert _small("dp", layer_sizes=np.array(SIZES), batch=np.int64(BATCH)) == _small("dp")
    predictions = _predictions()
    assert roofline_pages.ranking(predictions, np.str_("h200")) == \
        roofline_pages.ranking(predictions, "h200")


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


def test_how_many_words_a_count():
    assert roofline_pages.how_many(7, 7) == "all 7"
    assert roofline_pages.how_many(0, 7) == "none of the 7"
    assert roofline_pages.how_many(np.int64(5), 7) == "5 of the 7"
    with pytest.raises(InputError, match="count"):
        roofline_pages.how_many(8, 7)


def test_the_parallelism_page_ranking_prices_tpu_lines():
    """Review B2, on the page's MLP and 8 devices: auto_dp_tp sends the fewest bytes, but its
    collectives run over 2- and 4-chip groups, lines on an 8-chip TPU slice (twice a ring's
    time); priced so, tp (whose collectives span all 8 chips) is first on every TPU, while
    pricing every axis as a ring puts auto_dp_tp first on some of them. GPUs keep the ring."""
    names = ("tp", "auto_dp_tp", "auto_2d", "auto_dp", "dp")
    work = {n: roofline_pages.strategy_counts(n) for n in names}
    assert min(names, key=lambda n: work[n].comm_bytes) == "auto_dp_tp"
    assert set(work["auto_dp_tp"].sent_by_group) == {2, 4}
    assert set(work["auto_2d"].sent_by_group) == {2, 4}
    assert all(set(work[n].sent_by_group) == {8} for n in ("tp", "auto_dp", "dp"))
    lines = roofline_pages.predict_strategies(work)
    rings = roofline_pages.predict_strategies(work, topology=False)
    tpus = [k for k, c in hardware.CHIPS.items() if c.topology != "switch"]
    assert {roofline_pages.ranking(lines, k)[0] for k in tpus} == {"tp"}
    assert "auto_dp_tp" in {roofline_pages.ranking(rings, k)[0] for k in tpus}
    for p, q in zip(lines, rings, strict=True):
        assert p.estimate.comm_s >= q.estimate.comm_s
        if hardware.CHIPS[p.chip].topology == "switch" or p.strategy in ("tp", "auto_dp", "dp"):
            assert p.estimate.comm_s == q.estimate.comm_s
        else:
            assert p.estimate.comm_s == pytest.approx(2 * q.estimate.comm_s)
    assert roofline_pages.first_places(lines) == "auto_dp_tp on 1, tp on 6"
    assert roofline_pages.first_places(rings) == "auto_dp_tp on 4, tp on 3"


# --------------------------------------------------------------------------- the audit

BAD_INTS = {"str": "4", "float": 2.5, "None": None, "zero": 0, "negative": -3, "nan": NAN,
            "bool": True}
BAD_NAMES = {"unknown": "zz", "list": ["dp"], "bytes": b"dp", "None": None, "array":
             np.array(["dp", "tp"])}
BAD_CHIPS = {"unknown": "tpu-v9", "letters": "h", "bytes": b"h200", "None": None, "dict":
             {"h200": 1}, "set": {"h200", "b200"}, "list of unknown": ["h200", "zz"]}
CALLS = [  # (function, valid keyword arguments, argument, its bad values)
    (roofline_pages.strategy_counts, dict(name="dp", layer_sizes=SIZES, batch=BATCH), "batch",
     BAD_INTS),
    (roofline_pages.strategy_counts, dict(name="dp", layer_sizes=SIZES, batch=BATCH), "strategy",
     BAD_NAMES),
    (roofline_pages.how_many, dict(count=1, total=2), "total", BAD_INTS),
    (roofline_pages.how_many, dict(count=1, total=2), "count",
     {k: v for k, v in BAD_INTS.items() if k != "zero"}),
    (roofline_pages.predict_strategies, dict(counts_by_name={"dp": roofline.Counts(1, 1, 1)},
                                             chips="h200"), "chips", BAD_CHIPS),
    (roofline_pages.plot_rooflines, dict(points={"x": (1.0, 1.0)}, chips="h200"), "chips",
     BAD_CHIPS),
]
AUDIT = [pytest.param(fn, valid, arg, value, id=f"{fn.__name__}-{arg}-{tag}")
         for fn, valid, arg, bad in CALLS for tag, value in bad.items()]


@pytest.mark.parametrize("fn, valid, arg, value", AUDIT)
def test_every_bad_argument_is_named(fn, valid, arg, value):
    import matplotlib.pyplot as plt

    key = "name" if arg == "strategy" else arg
    with pytest.raises(InputError, match=rf"\b{arg}\b"):
        fn(**valid | {key: value})
    plt.close("all")


@pytest.mark.parametrize("chip", ["tpu-v9", ["h200"], b"h200", None, "H200"])
def test_a_bad_chip_name_is_named(chip):
    predictions = _predictions()
    for fn in (roofline_pages.ranking, roofline_pages.prediction_rows):
        with pytest.raises(InputError, match="chip"):
            fn(predictions, chip)
