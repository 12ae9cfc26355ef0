"""Prefill and decode counted from compiled programs and priced: the counts against the
model's arithmetic, the line in the batch, critical batches, the memory limit, the
latency/throughput table and the page's exercise answers."""

from __future__ import annotations

import math

import pytest

from spmd_guide.core import checks
from spmd_guide.rooflines import hardware
from spmd_guide.serving import costs

C = costs.LM_CONFIG
D, F, V, L, T = C["d_model"], C["d_ff"], C["vocab"], C["n_layers"], C["seq_len"]
#: Parameters of the matmuls a token goes through: per block q, k, v, o and the MLP; the head.
MATMUL_PARAMS = L * (4 * D * D + 2 * D * F) + D * V
CACHE_PER_SEQ = 2 * L * T * D * 4  # float32


def test_decode_counts_are_the_models_arithmetic():
    step = costs.step_counts("decode", batch=1)
    attention = 4 * L * T * D  # scores and weighted values over every cache slot
    assert step.flops == pytest.approx(2 * MATMUL_PARAMS + attention, rel=0.01)
    assert step.weight_bytes == 4 * MATMUL_PARAMS + 4 * L * 2 * D + 4 * D  # + norms
    assert step.cache_bytes == CACHE_PER_SEQ
    assert step.bytes_read == step.weight_bytes + step.cache_bytes + 8  # + token, position
    assert step.table_bytes == 4 * (V + T) * D
    assert step.comm_bytes == 0 and not any(step.collectives.values())
    assert step.new_tokens == 1 and step.local_batch == 1


def test_prefill_reads_the_same_bytes_for_a_prompt_of_tokens():
    prefill = costs.step_counts("prefill", batch=1)
    decode = costs.step_counts("decode", batch=1)
    assert prefill.new_tokens == costs.PROMPT_LEN
    assert prefill.bytes_read - decode.bytes_read == 4 * (costs.PROMPT_LEN - 1)  # tokens
    head = 2 * D * V  # prefill applies the output head to the last position only (review B2)
    assert prefill.flops == pytest.approx(costs.PROMPT_LEN * (decode.flops - head) + head,
                                          rel=0.01)
    h100 = hardware.CHIPS["h100-sxm"]
    assert prefill.estimate(h100).bound == "compute"
    assert decode.estimate(h100).bound == "memory"
    # With the head on the last position only (review B2), prefill at this prompt is above the
    # H100's ridge but not every chip's (the v6e's is higher); decode is far below every one.
    assert prefill.intensity / costs.BYTE_SCALE > h100.ridge
    for chip in hardware.CHIPS.values():
        assert decode.intensity / costs.BYTE_SCALE < chip.ridge / 100


def test_tp_splits_weights_cache_and_flops_eight_ways():
    one = costs.step_counts("decode", batch=1)
    tp = costs.step_counts("decode", batch=1, strategy="tp", n_devices=8)
    assert tp.cache_bytes * 8 == one.cache_bytes
    # Megatron splits every matmul weight; the norms stay whole on every device.
    assert tp.weight_bytes == (one.weight_bytes - 4 * (2 * L + 1) * D) // 8 + 4 * (2 * L + 1) * D
    assert tp.flops == pytest.approx(one.flops / 8, rel=0.01)
    assert tp.collectives["all-reduce"] == 2 * L and tp.collectives["all-gather"] == 2
    assert tp.local_batch == 1


def test_fsdp_gathers_the_weights_every_step():
    fsdp = costs.step_counts("decode", batch=8, strategy="fsdp", n_devices=8)
    assert fsdp.local_batch == 1
    # Every block weight and the head are gathered: (n-1)/n of them sent per step.
    assert fsdp.comm_bytes == pytest.approx(7 / 8 * 4 * MATMUL_PARAMS, rel=0.01)


def test_counts_are_a_line_in_the_batch():
    a, b, c = (costs.step_counts("decode", batch=n) for n in (16, 128, 40))
    line = costs.Line.through(a, b)
    assert line.bytes_read[0] == pytest.approx(a.weight_bytes, abs=64)
    assert line.bytes_read[1] == pytest.approx(CACHE_PER_SEQ, abs=8)
    at = line.at(40)
    assert at.bytes_accessed == pytest.approx(c.bytes_read, rel=1e-9)
    assert at.flops == pytest.approx(c.flops, rel=1e-3)
    with pytest.raises(checks.InputError, match="two different batch"):
        costs.Line.through(a, a)


def test_critical_batches():
    line = costs.Line.through(costs.step_counts("decode", batch=16),
                              costs.step_counts("decode", batch=128))
    for chip in hardware.CHIPS.values():
        assert math.isinf(costs.critical_batch(line, chip))
        weights_only = costs.critical_batch(line, chip, with_cache=False)
        # B flops_per_seq / peak = bf16 weight bytes / bandwidth
        assert weights_only == pytest.approx(
            chip.ridge * costs.BYTE_SCALE * line.bytes_read[0] / line.flops[1])
        assert chip.ridge / 2 < weights_only < chip.ridge
    # A short cache leaves room: finite, and above the weights-only batch.
    short = costs.Line.through(costs.step_counts("decode", batch=16, seq_len=16),
                               costs.step_counts("decode", batch=128, seq_len=16))
    finite = costs.critical_batch(short, "h100-sxm")
    assert costs.critical_batch(short, "h100-sxm", with_cache=False) < finite < math.inf
    e = costs.estimate_at(short, math.ceil(finite), "h100-sxm")
    assert e.bound == "compute"
    assert costs.estimate_at(short, math.floor(finite), "h100-sxm").bound == "memory"


def test_max_batch_fills_the_hbm():
    decode = costs.step_counts("decode", batch=1)
    for chip in hardware.CHIPS.values():
        n = costs.max_batch(decode, chip)
        held = costs.BYTE_SCALE * (decode.weight_bytes + decode.table_bytes)
        assert held + n * costs.BYTE_SCALE * CACHE_PER_SEQ <= chip.hbm_bytes
        assert held + (n + 1) * costs.BYTE_SCALE * CACHE_PER_SEQ > chip.hbm_bytes
    dp = costs.step_counts("decode", batch=16, strategy="dp", n_devices=8)
    assert dp.local_batch == 2 and costs.max_batch(dp, "h100-sxm") == costs.max_batch(
        decode, "h100-sxm")


@pytest.mark.slow
def test_serve_table_and_winners():
    # The page's chip: the least HBM of the chips file, so memory binds.
    assert min(hardware.CHIPS.values(), key=lambda c: c.hbm_bytes).key == "tpu-v5e"
    served = costs.serve_table([(None, 1), ("tp", 8), ("dp", 8)], [1, 1024],
                               chip="tpu-v5e")
    at = {(s.strategy, s.batch): s for s in served}
    assert ("dp", 1) not in at  # 1 sequence does not split over 8 devices
    assert not at["one device", 1024].fits and at["tp", 1024].fits
    assert at["tp", 1].ms_per_token < at["one device", 1].ms_per_token / 7
    s = at["tp", 1024]
    assert s.tokens_per_s_per_chip == pytest.approx(1024 / s.estimate.step_s / 8)
    best = costs.winners(served)
    assert best[1]["latency"] == "tp x8" and "one device" not in best[1024]["throughput"]
    rows = costs.serve_rows(served)
    assert [r["batch"] for r in rows] == [1, 1024] and rows[0]["dp x8"] == "-"
    assert "(no fit)" in rows[1]["one device"]
    text = costs.winners_text({1: {"latency": "a"}, 2: {"latency": "a"}, 3: {"latency": "b"}},
                              "latency")
    assert text == "a at batches 1 and 2; b at batch 3"


def test_phase_rows_and_chip_rows():
    decode = costs.step_counts("decode", batch=1)
    row = costs.phase_rows([decode], "h100-sxm")[0]
    assert row["step"] == "decode (one device)" and row["bound"] == "memory"
    line = costs.Line.through(costs.step_counts("decode", batch=16),
                              costs.step_counts("decode", batch=128))
    rows = costs.chip_rows(line, decode)
    assert [r["chip"] for r in rows] == list(hardware.CHIPS)
    assert {r["critical batch, with cache"] for r in rows} == {"never"}


def test_bad_input():
    with pytest.raises(checks.InputError, match="unknown kind"):
        costs.step_counts("train", batch=1)
    with pytest.raises(checks.InputError, match="needs a strategy"):
        costs.step_counts("decode", batch=8, n_devices=8)
    with pytest.raises(checks.InputError, match="does not split into 8"):
        costs.step_counts("decode", batch=4, strategy="dp", n_devices=8)
    with pytest.raises(checks.InputError, match="prompt_len must be at most"):
        costs.step_counts("prefill", batch=1, prompt_len=T + 1)
    with pytest.raises(checks.InputError, match="unknown key"):
        costs.winners_text({}, "speed")


def test_exercise_answers_prefill_decode():
    decode = costs.step_counts("decode", batch=1)
    h100 = hardware.CHIPS["h100-sxm"]
    # 1. bytes over bandwidth: about 134 MB / 3.35 TB/s, about 40 us, the table's figure.
    by_hand = costs.BYTE_SCALE * decode.bytes_read / h100.hbm_bandwidth
    assert costs.BYTE_SCALE * decode.bytes_read / 1e6 == pytest.approx(134, abs=0.5)
    assert by_hand * 1e6 == pytest.approx(40, abs=0.5)
    assert decode.estimate(h100).step_s == pytest.approx(by_hand)
    # 2. GQA (cache / 8): the FLOPs per sequence still pay for less than its cache.
    line = costs.Line.through(costs.step_counts("decode", batch=16),
                              costs.step_counts("decode", batch=128))
    affordable = line.flops[1] / h100.ridge
    cache_gqa = costs.BYTE_SCALE * line.bytes_read[1] / 8
    assert line.flops[1] / 1e6 == pytest.approx(135, abs=1)
    assert affordable / 1e6 == pytest.approx(0.46, abs=0.01)
    assert cache_gqa / 1e6 == pytest.approx(2.1, abs=0.05)
    assert affordable < cache_gqa


def test_why_not_xla_bytes_accessed():
    """The page's dropdown: XLA:CPU's estimate charges a gather of several rows with the
    whole embedding table, and at batch 1 adds copies of the cache; bytes read is the floor."""
    one, two = (costs.step_counts("decode", batch=n) for n in (1, 2))
    embed = 4 * V * D
    assert one.bytes_accessed - one.bytes_read > 2 * one.cache_bytes
    assert embed <= two.bytes_accessed - two.bytes_read < embed + two.cache_bytes
