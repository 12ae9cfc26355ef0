"""Continuous batching: every request equals generating it alone (greedy, eos included), on
one device and sharded (1, 2, 4, 8 devices, Auto and Explicit axes); the compiled programs do
not grow with the number of requests; static batching takes more decode steps on the same
requests; clear errors for bad requests and slots."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide.core import checks
from spmd_guide.serving import batching, serving
from spmd_guide.transformer.lm import Config, init_params

CONFIG = Config(vocab=40, d_model=32, n_heads=8, d_ff=48, n_layers=2, seq_len=18)
NEW = 6


@functools.cache
def setup():
    """Parameters, nine requests of two prompt lengths, an eos that greedy decoding meets in
    some requests and not in others, and each request generated alone (no eos)."""
    params = init_params(jax.random.key(21), CONFIG)
    rng = np.random.default_rng(5)
    requests = [list(rng.integers(0, CONFIG.vocab, n)) for n in (5, 2, 5, 5, 2, 5, 2, 2, 5)]
    first = [list(np.asarray(serving.generate(params, np.array([r]), config=CONFIG,
                                              steps=NEW))[0, len(r):]) for r in requests]
    tokens, counts = np.unique(np.concatenate(first), return_counts=True)
    return params, requests, int(tokens[np.argmax(counts)]), first


def alone(eos: int | None) -> list[list[int]]:
    """Each request generated alone, stopped after its first eos (generate's eos rule, which
    test_serving checks against generate(..., eos_id=...))."""
    return [new[:new.index(eos) + 1] if eos in new else new for new in setup()[3]]


@pytest.mark.slow
def test_each_request_equals_generating_it_alone():
    params, requests, eos, _ = setup()
    expected = alone(eos)
    assert len({len(x) for x in expected}) > 1  # eos makes requests finish at different steps
    assert batching.serve(params, requests, config=CONFIG, max_new_tokens=NEW, slots=3,
                          eos_id=eos) == expected
    assert batching.serve(params, requests[:2], config=CONFIG, max_new_tokens=NEW,
                          slots=4) == alone(None)[:2]


def test_continuous_takes_fewer_decode_steps_than_static():
    params, requests, eos, _ = setup()
    runs = {policy: batching.run(params, requests, config=CONFIG, max_new_tokens=NEW,
                                 slots=3, eos_id=eos, policy=policy)
            for policy in ("continuous", "static")}
    assert runs["continuous"].outputs == runs["static"].outputs == alone(eos)
    useful = sum(len(x) for x in alone(eos)) - len(requests)  # first tokens come from prefill
    for r in runs.values():
        assert sum(r.busy) == useful and max(r.busy) <= 3
    assert runs["continuous"].decode_steps < runs["static"].decode_steps
    assert runs["static"].prefills == 3  # 9 requests, 3 at a time


def test_compiled_programs_do_not_grow_with_the_requests():
    """Once 3 requests have been served, 12 and 30 more (of the same longest prompt) compile
    nothing, and the prefill and the decode step each hold one compiled program."""
    config = Config(vocab=33, d_model=16, n_heads=2, d_ff=32, n_layers=1, seq_len=12)
    params = init_params(jax.random.key(0), config)
    first = batching.compiled_programs(batching.serve, params, [[1, 2, 3, 4], [5], [6, 7]],
                                       config=config, max_new_tokens=3, slots=2)[1]
    assert first >= 2  # at least the prefill and the decode step
    for n in (12, 30):
        requests = [[1, 2, 3, 4]] + [[i % 33] * (1 + i % 4) for i in range(n - 1)]
        assert batching.compiled_programs(batching.serve, params, requests, config=config,
                                          max_new_tokens=3, slots=2)[1] == 0
    srv = serving.server(config)
    assert srv.step._cache_size() == 1 and batching._prefill(srv)._cache_size() == 1


SWEEP = [(name, n, explicit) for name in serving.SERVED for n in (1, 2, 4, 8)
         for explicit in (False, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "n", "explicit"), SWEEP)
def test_sharded_serve_equals_alone(name, n, explicit):
    params, requests, eos, _ = setup()
    strategy = serving.STRATEGIES[name]
    mesh = mesh_of(n, strategy.axes, strategy.mesh_shape(n), explicit=explicit)
    slots = 8 if "data" in strategy.axes else 3
    assert batching.serve(params, requests, config=CONFIG, max_new_tokens=NEW, slots=slots,
                          strategy=name, mesh=mesh, eos_id=eos) == alone(eos)


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"requests": []}, checks.InputError, "requests is empty"),
    ({"requests": [[1, 2], []]}, checks.InputError, "requests[1] is empty"),
    ({"requests": "hello"}, checks.InputTypeError, "list of prompts"),
    ({"requests": [[1, 2], 3]}, checks.InputTypeError, "requests[1] must be a list"),
    ({"requests": [[1, 40]]}, checks.InputError, "[0, 40)"),
    ({"requests": [[-1]]}, checks.InputError, "[0, 40)"),
    ({"requests": [[1.5]]}, checks.InputTypeError, "integer"),
    ({"requests": [list(range(18)) + [1]]}, checks.InputError, "longer than"),
    ({"slots": 0}, checks.InputError, "slots must be at least 1"),
    ({"slots": 2.0}, checks.InputTypeError, "slots must be an integer"),
    ({"max_new_tokens": 0}, checks.InputError, "max_new_tokens must be at least 1"),
    ({"max_new_tokens": 17}, checks.InputError, "max_new_tokens=15)"),
    ({"eos_id": 40}, checks.InputError, "eos_id must be at most 39"),
    ({"eos_id": -1}, checks.InputError, "eos_id must be at least 0"),
    ({"config": "C"}, checks.InputTypeError, "Config"),
    ({"strategy": "cp"}, checks.InputError, "cannot run this decode step"),
    ({"strategy": "dp", "slots": 3, "mesh": mesh_of(2, ("data",))}, checks.InputError,
     "dimension 0 of slots is 3, which does not split"),
    ({"max_new_tokens": 16}, checks.InputError, "plus max_new_tokens=16"),
    ({"slots": np.int64(0)}, checks.InputError, "slots must be at least 1"),
    ({"params": {"embed": np.zeros((40, 32))}}, checks.InputError, "params"),
])
def test_bad_input_is_refused(kw, error, words):
    params, requests, _, _ = setup()
    args = {"params": params, "requests": [[1, 2, 3]], "config": CONFIG, "max_new_tokens": 2,
            "slots": 2} | kw
    with pytest.raises(error) as info:
        batching.serve(args.pop("params"), args.pop("requests"), **args)
    assert words in str(info.value)


def test_run_refuses_an_unknown_policy():
    params, *_ = setup()
    with pytest.raises(checks.InputError, match="policy"):
        batching.run(params, [[1]], config=CONFIG, max_new_tokens=1, slots=1, policy="fifo")


def _decode_steps(new_tokens: list[int], slots: int, policy: str) -> int:
    """An independent count: each request makes its first token at prefill and one per decode
    step after; a slot is refilled at once (continuous) or when every slot is free (static)."""
    queue, left, steps = list(new_tokens), [0] * slots, 0
    while queue or any(left):
        free = [s for s in range(slots) if not left[s]]
        if queue and free and (policy == "continuous" or len(free) == slots):
            for s in free[:len(queue)]:
                left[s] = queue.pop(0) - 1
            continue
        steps += 1
        left = [max(n - 1, 0) for n in left]
    return steps


def test_exercise_answers():
    # 1. 6, 2, 2, 6 new tokens through 2 slots.
    assert _decode_steps([6, 2, 2, 6], 2, "static") == 10
    assert _decode_steps([6, 2, 2, 6], 2, "continuous") == 7
    # The same count as batching.run on the requests of this module.
    params, requests, eos, _ = setup()
    news = [len(x) for x in alone(eos)]
    for policy in ("static", "continuous"):
        run = batching.run(params, requests, config=CONFIG, max_new_tokens=NEW, slots=3,
                           eos_id=eos, policy=policy)
        assert run.decode_steps == _decode_steps(news, 3, policy)
    # 3. A request of one new token takes no decode step.
    assert _decode_steps([1, 1, 1], 2, "continuous") == 0
    # 2. The launches: test_serving.py::test_device_loop_equals_python_loop_with_one_dispatch.


def test_throughput_rows():
    """Decode steps alone: 6 tokens over 4 decode steps; priced: the 7 tokens (the prefill's
    first one too) over 1 prefill and 4 decode steps (turn-5 review S3)."""
    runs = {"a": batching.Run([[1] * 7], prefills=1, decode_steps=4, busy=[2, 2, 1, 1])}
    row, = batching.throughput_rows(runs, decode_s=1e-3, prefill_s=3e-3, chip="x")
    assert row["tokens per decode step (measured)"] == "1.50"
    assert row["tokens/s, decode only (x, predicted)"] == "1,500"
    assert row["tokens/s, all steps (x, predicted)"] == f"{7 / 7e-3:,.0f}"
    with pytest.raises(checks.InputError, match="decode_s must be positive"):
        batching.throughput_rows(runs, decode_s=0, prefill_s=1, chip="x")
    with pytest.raises(checks.InputError, match="prefill_s must be a finite"):
        batching.throughput_rows(runs, decode_s=1, prefill_s=float("nan"), chip="x")
    with pytest.raises(checks.InputTypeError, match="Run"):
        batching.throughput_rows({"a": 1}, decode_s=1, prefill_s=1, chip="x")
    with pytest.raises(checks.InputTypeError, match="runs must map"):
        batching.throughput_rows({}, decode_s=1, prefill_s=1, chip="x")


def test_a_short_prefill_is_priced_as_a_decode_step():
    """The batching page's reason continuous batching loses once prefills are priced: on the
    priced model, a prefill of 4 prompts of 6 tokens and a decode step of 4 rows are both
    bound by reading the weights, so they cost about the same (within 5%) on an H100."""
    from spmd_guide.serving import costs

    decode = costs.step_counts("decode", batch=4).estimate("h100-sxm")
    prefill = costs.step_counts("prefill", batch=4, prompt_len=6).estimate("h100-sxm")
    for est in (decode, prefill):
        assert est.memory_s >= max(est.compute_s, est.comm_s), est
    assert prefill.step_s == pytest.approx(decode.step_s, rel=0.05)
