"""Prefill and decode counted from compiled programs and priced: the counts against the
model's arithmetic, the line in the batch, critical batches, the memory limit, the
latency/throughput table, the collectives' latency floor, the page's exercise answers, and
bad input refused by name."""

from __future__ import annotations

import math

import numpy as np
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
    assert step.matmul_params == MATMUL_PARAMS and step.hops == 0
    assert step.written_bytes == CACHE_PER_SEQ // T  # one position's keys and values


def test_prefill_reads_the_same_bytes_for_a_prompt_of_tokens():
    prefill = costs.step_counts("prefill", batch=1)
    decode = costs.step_counts("decode", batch=1)
    P = costs.PROMPT_LEN
    assert prefill.new_tokens == P
    assert prefill.bytes_read - decode.bytes_read == 4 * (P - 1)  # tokens
    # The blocks' matmuls and attention over the whole (masked) cache at every prompt
    # position; the output head at the last position only (review B2: serving's KeepLast).
    heads = costs.head_positions(prefill)
    assert heads == 1 and costs.head_positions(decode) == 1
    blocks = MATMUL_PARAMS - D * V
    assert prefill.flops == pytest.approx(
        2 * blocks * P + 2 * D * V * heads + 4 * L * P * T * D, rel=0.01)
    # What a prefill must move, beside what this one reads: the prompt's keys and values.
    assert prefill.written_bytes == 2 * L * P * D * 4
    assert prefill.bytes_read == pytest.approx(prefill.weight_bytes + prefill.cache_bytes,
                                               abs=4 * P + 8)
    h100 = hardware.CHIPS["h100-sxm"]  # the page's claims: prefill above its ridge, decode
    assert prefill.estimate(h100).bound == "compute"  # far below every chip's
    assert prefill.intensity / costs.BYTE_SCALE > h100.ridge
    assert decode.estimate(h100).bound == "memory"
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
    # A bidirectional ring of 8: an all-gather 4 hops, an all-reduce 8.
    assert tp.hops == 4 * tp.collectives["all-gather"] + 8 * tp.collectives["all-reduce"]
    assert costs.collective_latency(tp) == pytest.approx(tp.hops * costs.HOP_S)
    assert costs.collective_latency(tp, hop_s=0) == 0
    assert costs.collective_latency(one) == 0


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
    assert line.weight_flops == 2 * MATMUL_PARAMS
    for chip in hardware.CHIPS.values():
        assert math.isinf(costs.critical_batch(line, chip))
        # Weight matmuls only (2 FLOPs per bf16 weight of 2 bytes per sequence): Part V's
        # critical batch, the ridge (the norms and the tokens are the 1e-4).
        weights_only = costs.critical_batch(line, chip, with_cache=False)
        assert weights_only == pytest.approx(chip.ridge, rel=1e-4)
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
    for r in rows:  # the page: weights only, the critical batch is the ridge on every chip
        assert r["critical batch, weights only"] == r["ridge FLOP/B"]
    one = costs.chip_rows(line, decode, chips="h100-sxm")  # one name is one chip
    assert [r["chip"] for r in one] == ["h100-sxm"]


def test_roofline_tie_and_the_latency_that_breaks_it():
    """The page: per chip, tp x8 and one device tie in the roofline at batch 1 on a v5e (an
    upper bound); the collectives' fixed latency breaks the tie."""
    one = costs.step_counts("decode", batch=1)
    tp = costs.step_counts("decode", batch=1, strategy="tp", n_devices=8)
    t_one, t_tp = (s.estimate("tpu-v5e").step_s for s in (one, tp))
    assert 1 / t_one == pytest.approx(1 / t_tp / 8, rel=0.01)
    lag = costs.collective_latency(tp)
    assert 1 / (t_tp + lag) / 8 < 0.5 / t_one


class Steps:
    """Compiled counts the bad calls are given (cached across tests)."""

    @property
    def decode(self):
        return costs.step_counts("decode", batch=1)

    @property
    def line(self):
        return costs.Line.through(costs.step_counts("decode", batch=16),
                                  costs.step_counts("decode", batch=128))

    @property
    def small(self):  # another model: cheap to compile
        return costs.step_counts("decode", batch=2, seq_len=16)

    @property
    def small_prefill(self):
        return costs.step_counts("prefill", batch=1, prompt_len=4, seq_len=16)

    @property
    def tp(self):
        return costs.step_counts("decode", batch=1, strategy="tp", n_devices=8)

    @property
    def served(self):
        return costs.Served("one device", 1, 1, self.decode.estimate("h100-sxm"), True)


BAD = {  # call -> what the error must say (the argument, or the rule it broke)
    "kind": (lambda s: costs.step_counts("train", batch=1), "unknown kind 'train'"),
    "batch 0": (lambda s: costs.step_counts("decode", batch=0), "batch must be at least 1"),
    "batch float": (lambda s: costs.step_counts("decode", batch=1.5), "batch must be an integer"),
    "strategy unknown": (lambda s: costs.step_counts("decode", batch=1, strategy="zz"),
                         "unknown strategy 'zz'"),
    "strategy not served": (lambda s: costs.step_counts("decode", batch=1, strategy="cp",
                                                        n_devices=8), "unknown strategy 'cp'"),
    "strategy not a name": (lambda s: costs.step_counts("decode", batch=1, strategy=3),
                            "unknown strategy 3"),
    "devices without strategy": (lambda s: costs.step_counts("decode", batch=8, n_devices=8),
                                 "n_devices=8 needs a strategy"),
    "devices 0": (lambda s: costs.step_counts("decode", batch=1, strategy="tp", n_devices=0),
                  "n_devices must be at least 1"),
    "devices too many": (lambda s: costs.step_counts("decode", batch=1, strategy="tp",
                                                     n_devices=16), "n_devices must be at most 8"),
    "batch does not split": (lambda s: costs.step_counts("decode", batch=4, strategy="dp",
                                                         n_devices=8), "does not split into 8"),
    "decode prompt_len": (lambda s: costs.step_counts("decode", batch=1, prompt_len=-5),
                          "prompt_len=-5 is for a prefill"),
    "prefill prompt_len 0": (lambda s: costs.step_counts("prefill", batch=1, prompt_len=0),
                             "prompt_len must be at least 1"),
    "prefill prompt_len long": (lambda s: costs.step_counts("prefill", batch=1, prompt_len=T + 1),
                                "prompt_len must be at most"),
    "prefill prompt_len str": (lambda s: costs.step_counts("prefill", batch=1, prompt_len="8"),
                               "prompt_len must be an integer"),
    "unknown size": (lambda s: costs.step_counts("decode", batch=1, bogus=3),
                     r"unknown transformer size\(s\) \['bogus'\]"),
    "size 0": (lambda s: costs.step_counts("decode", batch=1, d_model=0),
               "d_model must be at least 1"),
    "size float": (lambda s: costs.step_counts("decode", batch=1, d_ff=1.5),
                   "d_ff must be an integer"),
    "phase_rows empty": (lambda s: costs.phase_rows([]), "steps is empty"),
    "phase_rows str": (lambda s: costs.phase_rows("decode"), "steps must be a list"),
    "phase_rows item": (lambda s: costs.phase_rows([None]), r"steps\[0\] must be a StepCounts"),
    "phase_rows chip": (lambda s: costs.phase_rows([s.decode], "h100"), "unknown chip 'h100'"),
    "phase_rows chip type": (lambda s: costs.phase_rows([s.decode], 5), "chip must be a key"),
    "line same batch": (lambda s: costs.Line.through(s.decode, s.decode), "two different batch"),
    "line prefill": (lambda s: costs.Line.through(s.small, s.small_prefill),
                     "b is a prefill step"),
    "line two models": (lambda s: costs.Line.through(s.decode, s.small), "differ in config"),
    "line not steps": (lambda s: costs.Line.through(None, s.decode), "a must be a StepCounts"),
    "line made by hand": (lambda s: costs.Line((1.0,), (1.0, 2.0), (0.0, 0.0), 1.0),
                          "Line.flops must be a pair"),
    "line at": (lambda s: s.line.at(-1), "batch must be at least 0"),
    "estimate_at line": (lambda s: costs.estimate_at(None, 1, "h100-sxm"), "line must be a Line"),
    "estimate_at batch": (lambda s: costs.estimate_at(s.line, 0, "h100-sxm"),
                          "batch must be positive"),
    "estimate_at chip": (lambda s: costs.estimate_at(s.line, 1, "x"), "unknown chip 'x'"),
    "critical with_cache": (lambda s: costs.critical_batch(s.line, "h100-sxm", with_cache="no"),
                            "with_cache must be True or False"),
    "critical chip": (lambda s: costs.critical_batch(s.line, "zz"), "unknown chip 'zz'"),
    "critical line": (lambda s: costs.critical_batch("line", "h100-sxm"), "line must be a Line"),
    "max_batch step": (lambda s: costs.max_batch(s.line, "h100-sxm"), "step must be a StepCounts"),
    "max_batch chip": (lambda s: costs.max_batch(s.decode, None), "chip must be a key"),
    "chip_rows unknown": (lambda s: costs.chip_rows(s.line, s.decode, chips="h"),
                          "unknown chips 'h'"),
    "chip_rows empty": (lambda s: costs.chip_rows(s.line, s.decode, chips=[]), "chips is empty"),
    "chip_rows item": (lambda s: costs.chip_rows(s.line, s.decode, chips=["h100-sxm", 3]),
                       "an entry of chips must be"),
    "chip_rows layouts": (lambda s: costs.chip_rows(s.line, s.tp), "of one layout"),
    "latency hop_s": (lambda s: costs.collective_latency(s.decode, hop_s=-1),
                      "hop_s must be at least 0"),
    "latency nan": (lambda s: costs.collective_latency(s.decode, hop_s=float("nan")),
                    "hop_s must be a finite"),
    "latency step": (lambda s: costs.collective_latency("decode"), "step must be a StepCounts"),
    "head_positions": (lambda s: costs.head_positions(None), "step must be a StepCounts"),
    "serve devices 0": (lambda s: costs.serve_table([("tp", 0)], [1]),
                        r"cases\[0\]: n_devices must be at least 1"),
    "serve devices 16": (lambda s: costs.serve_table([("tp", 16)], [1]),
                         r"cases\[0\]: n_devices must be at most 8"),
    "serve strategy": (lambda s: costs.serve_table([("zz", 8)], [8]),
                       r"cases\[0\]: unknown strategy 'zz'"),
    "serve no strategy": (lambda s: costs.serve_table([(None, 2)], [8]), "needs a strategy"),
    "serve splits none": (lambda s: costs.serve_table([("dp", 8)], [1, 4]),
                          r"none of batches \(1, 4\) is a multiple of 8"),
    "serve cases str": (lambda s: costs.serve_table("tp", [1]), "cases must be a list"),
    "serve cases empty": (lambda s: costs.serve_table([], [1]), "cases is empty"),
    "serve case short": (lambda s: costs.serve_table([("tp",)], [1]), r"cases\[0\] must be a"),
    "serve case repeated": (lambda s: costs.serve_table([("tp", 8), ("tp", 8)], [8]),
                            r"cases\[1\] \('tp', 8\) is repeated"),
    "serve batches empty": (lambda s: costs.serve_table([("tp", 8)], []), "batches needs at"),
    "serve batch 0": (lambda s: costs.serve_table([("tp", 8)], [0]),
                      r"batches\[0\] must be at least 1"),
    "serve batches int": (lambda s: costs.serve_table([("tp", 8)], 8), "batches must be a"),
    "serve chip": (lambda s: costs.serve_table([("tp", 8)], [8], chip="h100"),
                   "unknown chip 'h100'"),
    "serve_rows empty": (lambda s: costs.serve_rows([]), "served is empty"),
    "serve_rows item": (lambda s: costs.serve_rows([1]), r"served\[0\] must be a Served"),
    "winners empty": (lambda s: costs.winners([]), "served is empty"),
    "winners tie": (lambda s: costs.winners([s.served], tie=-0.1), "tie must be at least 0"),
    "winners tie 1": (lambda s: costs.winners([s.served], tie=1), "tie must be below 1"),
    "winners_text key": (lambda s: costs.winners_text({}, "speed"), "unknown key 'speed'"),
    "winners_text empty": (lambda s: costs.winners_text({}, "latency"), "best is empty"),
    "winners_text type": (lambda s: costs.winners_text([1], "latency"), "best must be the dict"),
    "winners_text row": (lambda s: costs.winners_text({1: {"throughput": "a"}}, "latency"),
                         r"best\[1\] must map 'latency'"),
    "winners_text batch": (lambda s: costs.winners_text({0: {"latency": "a"}}, "latency"),
                           "a batch of best must be at least 1"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_by_name(case):
    call, message = BAD[case]
    with pytest.raises(checks.InputError, match=message):
        call(Steps())


def test_valid_edge_cases():
    """NumPy sizes, a Chip for a name, one chip name for chips; the same answers."""
    decode = costs.step_counts("decode", batch=np.int64(1), d_model=np.int32(1024))
    assert decode is costs.step_counts("decode", batch=1)
    prefill = costs.step_counts("prefill", batch=1, prompt_len=4, seq_len=16)
    assert prefill.new_tokens == 4 and prefill.written_bytes == 2 * L * 4 * D * 4
    h100 = hardware.CHIPS["h100-sxm"]
    assert costs.phase_rows([decode], h100) == costs.phase_rows([decode], "h100-sxm")
    assert costs.max_batch(decode, h100) == costs.max_batch(decode, "h100-sxm")
    assert costs.winners([Steps().served], tie=0)[1]["latency"] == "one device"


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
