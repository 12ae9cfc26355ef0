"""The decision guide: its rules on made-up models, its flowchart, and the traffic it measures."""

from __future__ import annotations

import re

import pytest
from helpers import DEVICES
from hypothesis import given, settings
from hypothesis import strategies as hs

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.nn import which_strategy

GIB = 2**30


@pytest.mark.parametrize(("params", "batch", "answer", "mesh", "round_to"), [
    (4 * 10**9, 256, "DP", {"data": 8}, None),                  # 16 GB of state < 40 GiB budget
    (4 * 10**9, 4, "DP x TP", {"data": 4, "model": 2}, None),   # too few examples for 8 devices
    (4 * 10**9, 1, "TP", {"model": 8}, None),                   # one example: all TP
    # B2: a batch that does not split is rounded, not answered with tensor parallelism
    (4 * 10**9, 100, "DP", {"data": 8}, (96, 104)),
    (4 * 10**9, 9, "DP", {"data": 8}, (8, 16)),
    (4 * 10**9, 1000, "DP", {"data": 8}, None),
    (4 * 10**9, 5, "DP x TP", {"data": 4, "model": 2}, (4,)),  # below n: the axis shrinks
    (4 * 10**9, 6, "DP x TP", {"data": 4, "model": 2}, (4,)),  # N5: round down only
    (40 * 10**9, 256, "FSDP", {"data": 8}, None),               # 160 GB of state, 20 GB each
    (40 * 10**9, 100, "FSDP", {"data": 8}, (96, 104)),
    (40 * 10**9, 2, "FSDP x TP", {"data": 2, "model": 4}, None),
    (400 * 10**9, 256, "none", {}, None),                       # 1.6 TB: 200 GB per device
])
def test_recommend(params, batch, answer, mesh, round_to):
    rec = which_strategy.recommend(params, 80 * GIB, batch=batch, n_devices=8)
    assert rec.answer == answer and rec.mesh == mesh and rec.round_to == round_to
    assert rec.batch == batch
    if round_to:
        assert f"The batch of {batch} does not split evenly" in " ".join(rec.explain().split())
    assert rec.state_bytes == 4 * params  # params + grads + AdamW's mu and nu
    words = " ".join(rec.explain().split())
    assert rec.title in words and ("Yes" in words or answer == "none")
    assert max(len(line) for line in rec.explain().splitlines()) <= 76
    if mesh:
        assert rec.state_bytes_per_device <= rec.budget_bytes
        assert rec.batch_per_device == batch / mesh.get("data", 1)


def test_page_exercise():
    rec = which_strategy.recommend(12 * 10**9, 16 * GIB, batch=32, n_devices=8)
    assert rec.answer == "FSDP" and rec.mesh == {"data": 8} and rec.batch_per_device == 4
    assert rec.state_bytes > rec.budget_bytes >= rec.state_bytes_per_device


def test_budget_and_optimizer_slots_move_the_line():
    # 12 GB of params with plain SGD (2x) fits 40 GiB; with AdamW (4x) it does not.
    assert which_strategy.recommend(12 * 10**9, 80 * GIB, batch=64, n_devices=8, optimizer_slots=0).answer == "DP"
    assert which_strategy.recommend(12 * 10**9, 80 * GIB, batch=64, n_devices=8).answer == "FSDP"
    assert which_strategy.recommend(12 * 10**9, 80 * GIB, batch=64, n_devices=8,
                        memory_fraction=1.0, optimizer_slots=1).answer == "DP"
    assert which_strategy.recommend(10**9, 80 * GIB, batch=64, n_devices=8,
                        min_batch_per_device=16).mesh == {"data": 4, "model": 2}
    # below n x min_batch_per_device the data axis shrinks; at or above it, it does not
    assert which_strategy.recommend(10**9, 80 * GIB, batch=100, n_devices=8,
                        min_batch_per_device=16).mesh == {"data": 4, "model": 2}
    assert which_strategy.recommend(10**9, 80 * GIB, batch=130, n_devices=8,
                        min_batch_per_device=16).mesh == {"data": 8}


@settings(max_examples=15, deadline=None)
@given(n=hs.sampled_from([1, 2, 4, 8, 16]), batch=hs.integers(1, 512),
       params=hs.integers(1, 10**12))
def test_recommend_is_consistent(n, batch, params):
    rec = which_strategy.recommend(params, 80 * GIB, batch=batch, n_devices=n)
    if rec.answer != "none":
        data = rec.mesh.get("data", 1)
        assert data * rec.mesh.get("model", 1) == n
        # the strategies refuse an uneven split: the batch is rounded to the data axis
        if rec.round_to is None:
            assert batch % data == 0 and rec.pad_to is None
        elif data == n:
            low, high = rec.round_to
            assert low % data == 0 and high % data == 0 and low < batch < high
            assert high - low == data and low >= data and rec.pad_to is None
        else:  # N5: a shrunk axis rounds down only; padding up would make it 1-D over n
            (low,) = rec.round_to
            assert low % data == 0 and batch - data < low < batch
            assert rec.pad_to == n and batch < rec.pad_to
            padded = which_strategy.recommend(params, 80 * GIB, batch=rec.pad_to, n_devices=n)
            assert padded.mesh == {"data": n} and padded.round_to is None
        assert rec.state_bytes_per_device <= rec.budget_bytes
        # the explanation answers its own question rightly (P4-W1), and divisibility alone
        # never shrinks the data axis (B2)
        assert dict(rec.path)["batch"] == (batch >= n)
        assert (data == n) == (batch >= n)
        assert (rec.answer == "TP") == (data == 1 and n > 1)
        assert rec.answer not in ("DP x TP", "FSDP x TP") or 1 < data < n
    html = which_strategy.flowchart(rec)._repr_html_()
    assert which_strategy.ANSWERS[rec.answer][0] in html and html.count("&#9654;") == len(rec.path) + 1


def test_the_book_strategy_named_can_build_the_mesh():
    """P4-W1: auto_dp_tp's model axis is 2 unless built otherwise; the answer says how."""
    rec = which_strategy.recommend(4 * 10**9, 80 * GIB, batch=2, n_devices=8)
    assert rec.mesh == {"data": 2, "model": 4}
    assert rec.book_strategies == "auto_dp_tp, built as AutoDataTensorParallel(model_size=4)"
    from spmd_guide.nn.strategies import AutoDataTensorParallel
    assert dict(AutoDataTensorParallel(model_size=4).mesh(DEVICES).shape) == {"batch": 2, "model": 4}
    assert which_strategy.recommend(4 * 10**9, 80 * GIB, batch=4, n_devices=8).book_strategies == "auto_dp_tp"
    words = " ".join(which_strategy.recommend(4 * 10**9, 80 * GIB, batch=100, n_devices=8).explain().split())
    assert "at least n times the smallest batch per device (enough examples for every device)? Yes." in words
    assert "round it to a multiple of 8, 96 or 104 (drop the last 4 examples, or pad 4 examples)" in words
    words = " ".join(which_strategy.recommend(4 * 10**9, 80 * GIB, batch=5, n_devices=8).explain().split())
    assert "? No." in words and "round it down to 4 (drop the last 1 example)" in words
    assert "pad 3" not in words


def test_a_small_batch_is_rounded_down_or_padded_to_a_1d_layout():
    """Review N5: batch 6 on 8 devices is DP x TP {data: 4, model: 2}; rounding it up to 8
    would be plain DP over 8, so the answer offers that as its own alternative."""
    rec = which_strategy.recommend(4 * 10**9, 80 * GIB, batch=6, n_devices=8)
    assert rec.mesh == {"data": 4, "model": 2} and rec.round_to == (4,) and rec.pad_to == 8
    words = " ".join(rec.explain().split())
    assert "round it down to 4 (drop the last 2 examples)" in words
    assert "Or pad it to 8 (2 examples more), enough for all 8 devices: then the answer is " \
           "DP, data=8." in words
    assert which_strategy.recommend(4 * 10**9, 80 * GIB, batch=8, n_devices=8).mesh == {"data": 8}
    sharded = which_strategy.recommend(40 * 10**9, 80 * GIB, batch=3, n_devices=8,
                                       min_batch_per_device=1)
    assert sharded.answer == "FSDP x TP" and sharded.pad_to == 8
    assert "then the answer is FSDP, data=8." in " ".join(sharded.explain().split())
    assert which_strategy.recommend(4 * 10**9, 80 * GIB, batch=4, n_devices=8).pad_to is None


def test_numpy_scalars_work_where_python_ones_do():
    import numpy as np

    plain = which_strategy.recommend(40 * 10**9, 80 * GIB, batch=2, n_devices=8)
    numpy = which_strategy.recommend(np.int64(40 * 10**9), np.int64(80 * GIB), batch=np.int32(2),
                                     n_devices=np.uint8(8), memory_fraction=np.float32(0.5),
                                     optimizer_slots=np.int16(2), min_batch_per_device=np.int64(1))
    assert numpy == plain
    assert which_strategy.data_axis_size(np.int64(12), np.int32(8)) == 8
    assert which_strategy.training_state_bytes(np.int64(10), optimizer_slots=np.int8(0)) == 20


def test_flowchart_marks_the_path():
    chart = which_strategy.flowchart()
    plain = chart._repr_html_()
    assert all(q in plain for q in which_strategy.QUESTIONS.values()) and "&#9654;" not in plain
    assert all(q in str(chart) for q in which_strategy.QUESTIONS.values())
    assert not any(line.startswith(">") for line in str(chart).splitlines())
    rec = which_strategy.recommend(40 * 10**9, 80 * GIB, batch=2, n_devices=8)
    marked = which_strategy.flowchart(rec)._repr_html_()
    assert "<b>no &rarr; go to 2</b>" in marked and "<b>no &rarr; 2-D: FSDP x tensor" in marked
    text = str(which_strategy.flowchart(rec))
    assert text.splitlines()[0].startswith("> 1.") and text.splitlines()[-1].startswith("> ")


def test_data_axis_size():
    """Enough examples per device decides the axis, not divisibility (B2)."""
    assert which_strategy.data_axis_size(12, 8) == 8 and which_strategy.data_axis_size(3, 8) == 2
    assert which_strategy.data_axis_size(64, 8, min_batch_per_device=16) == 4
    assert which_strategy.data_axis_size(15, 8, min_batch_per_device=16) == 1


def test_round_batch():
    assert which_strategy.round_batch(100, 8) == (96, 104)
    assert which_strategy.round_batch(96, 8) is None and which_strategy.round_batch(7, 1) is None
    assert which_strategy.round_batch(9, 8) == (8, 16)
    with pytest.raises(InputError, match="data"):
        which_strategy.round_batch(9, 0)


@pytest.mark.slow
def test_measured_traffic():
    sizes, devices = [8, 8], DEVICES[:4]
    rows = which_strategy.measure_traffic(["dp", "tp"], layer_sizes=sizes, batch_sizes=[8, 32],
                              devices=devices)
    rows += which_strategy.measure_traffic(["fsdp"], layer_sizes=sizes, batch_sizes=[8], devices=devices)
    by = {(r.strategy, r.batch): r for r in rows}
    total = 4 * (8 * 8 + 8)
    # DP: one all-reduce of every gradient, 2 (n-1)/n of the parameter bytes, whatever the batch
    assert by["dp", 8].bytes_sent == by["dp", 32].bytes_sent
    assert by["dp", 8].bytes_sent == pytest.approx(2 * 3 * total / 4, rel=0.02)  # + the loss
    assert by["dp", 8].param_bytes_per_device == total == by["dp", 8].param_bytes
    # TP moves activations: more batch, more bytes; params split 4 ways
    assert by["tp", 32].bytes_sent > by["tp", 8].bytes_sent
    assert by["tp", 8].param_bytes_per_device * 4 == total
    # FSDP: all-gather + reduce-scatter = one all-reduce's bytes (the which-strategy page says so)
    assert by["fsdp", 8].bytes_sent == pytest.approx(by["dp", 8].bytes_sent, rel=0.02)
    assert by["fsdp", 8].param_bytes_per_device * 4 == total
    assert by["dp", 8].row()["sent / param bytes"] == f"{by['dp', 8].bytes_sent / total:.2f}"


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: which_strategy.recommend(0, GIB, batch=1, n_devices=1), InputError, "param_bytes"),
    (lambda: which_strategy.recommend(1, GIB, batch=1, n_devices=0), InputError, "n_devices"),
    (lambda: which_strategy.recommend(1, GIB, batch=1.5, n_devices=2), InputTypeError, "batch"),
    (lambda: which_strategy.recommend(1, GIB, batch=1, n_devices=2, memory_fraction=1.5), InputError,
     "memory_fraction"),
    (lambda: which_strategy.recommend(1, GIB, batch=1, n_devices=2, optimizer_slots=-1), InputError,
     "optimizer_slots"),
    (lambda: which_strategy.flowchart("DP"), InputTypeError, "Recommendation"),
    (lambda: which_strategy.recommend(4e9, GIB, batch=1, n_devices=2), InputTypeError,
     "param_bytes must be an integer"),
    (lambda: which_strategy.recommend(1, "80GiB", batch=1, n_devices=2), InputTypeError,
     "device_bytes"),
    (lambda: which_strategy.recommend(1, GIB, batch=1, n_devices=2, min_batch_per_device=0),
     InputError, "min_batch_per_device"),
    (lambda: which_strategy.recommend(1, GIB, batch=1, n_devices=2, memory_fraction="half"),
     InputTypeError, "memory_fraction"),
    (lambda: which_strategy.recommend(1, GIB, batch=True, n_devices=2), InputTypeError, "batch"),
    (lambda: which_strategy.training_state_bytes(-1), InputError, "param_bytes"),
    (lambda: which_strategy.data_axis_size(0, 8), InputError, "batch"),
    (lambda: which_strategy.data_axis_size(8, 2.0), InputTypeError, "n_devices"),
    (lambda: which_strategy.data_axis_size(8, 8, min_batch_per_device=-1), InputError,
     "min_batch_per_device"),
    (lambda: which_strategy.measure_traffic("dp", layer_sizes=[8, 8], batch_sizes=[8]),
     InputTypeError, "wrap it: ['dp']"),
    (lambda: which_strategy.measure_traffic([], layer_sizes=[8, 8], batch_sizes=[8]), InputError,
     "at least one strategy"),
    (lambda: which_strategy.measure_traffic(["dp"], layer_sizes=[8], batch_sizes=[8]), InputError,
     "layer_sizes"),
    (lambda: which_strategy.measure_traffic(["dp"], layer_sizes=[8, 8], batch_sizes=8),
     InputTypeError, "batch_sizes"),
    (lambda: which_strategy.measure_traffic(["dp"], layer_sizes=[8, 8], batch_sizes=[8],
                                            learning_rate=-1), InputError, "learning_rate"),
    (lambda: which_strategy.measure_traffic(["dp"], layer_sizes=[8, 8], batch_sizes=[8],
                                            devices="cpu"), InputTypeError, "jax.Device"),
    (lambda: which_strategy.measure_traffic(["zero"], layer_sizes=[8, 8], batch_sizes=[8]), InputError,
     "strategy"),
    (lambda: which_strategy.measure_traffic(["dp"], layer_sizes=[8, 8], batch_sizes=[0]), InputError,
     "batch_sizes"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=re.escape(word)):
        call()
