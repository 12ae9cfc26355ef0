"""The serving step: prefill computes the output head at one position per row (review B2),
rows at their own positions share a batch, and a step fed directly refuses what generate
refuses (ids outside the vocabulary, parameters of another config, positions past the end)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spmd_guide.core import checks, hlo
from spmd_guide.serving import serving, step
from spmd_guide.transformer.lm import Config, forward, init_params

CONFIG = Config(vocab=40, d_model=24, n_heads=4, d_ff=48, n_layers=2, seq_len=16)


@functools.cache
def params():
    return init_params(jax.random.key(11), CONFIG)


@pytest.mark.slow
def test_prefill_logits_are_the_last_positions_and_the_head_runs_once_per_row():
    prompt = np.random.default_rng(1).integers(0, CONFIG.vocab, (3, 9)).astype(np.int32)
    srv = step.server(CONFIG)
    cache = step.init_cache(CONFIG, batch=3, max_len=12)
    token, logits, _ = srv.feed(srv.place_params(params()), prompt, 0, cache)
    full = np.asarray(forward(params(), prompt))[:, -1]
    np.testing.assert_allclose(np.asarray(logits), full, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(token), full.argmax(-1))
    # The compiled prefill multiplies by the head [d_model, vocab] for one position per row.
    text = serving.compiled_step(CONFIG, batch=3, length=9, max_len=12).as_text()
    heads = [line for line in text.splitlines() if " dot(" in line and f",{CONFIG.vocab}]" in
             line.split("=")[1].split("dot(")[0]]
    assert heads and all(f"[3,{CONFIG.vocab}]" in h or f"[3,1,{CONFIG.vocab}]" in h
                         for h in heads), heads


@pytest.mark.slow
def test_rows_at_their_own_positions_equal_rows_alone():
    """Ragged prefill (each row's logits at its own last prompt position) then a decode step
    with one position per row: each row equals feeding it alone."""
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, CONFIG.vocab, (2, 6)).astype(np.int32)
    lengths = np.array([6, 3], np.int32)
    srv = step.server(CONFIG)
    placed = srv.place_params(params())
    token, logits, cache = srv.feed(placed, prompt, 0, step.init_cache(
        CONFIG, batch=2, max_len=8), last=lengths - 1)
    nxt, nxt_logits, _ = srv.feed(placed, np.asarray(token)[:, None], lengths, cache)
    for i, n in enumerate(lengths):
        alone_tok, alone_logits, c = srv.feed(placed, prompt[i:i + 1, :n], 0, step.init_cache(
            CONFIG, batch=1, max_len=8))
        np.testing.assert_allclose(np.asarray(logits)[i], np.asarray(alone_logits)[0], atol=2e-5)
        _, alone_next, _ = srv.feed(placed, np.asarray(alone_tok)[:, None], int(n), c)
        np.testing.assert_allclose(np.asarray(nxt_logits)[i], np.asarray(alone_next)[0],
                                   atol=2e-5)


def test_one_position_for_all_rows_is_written_as_a_slice_in_place():
    """A shared position is a dynamic-update-slice (XLA's cost analysis counts the slot, not
    the cache); one position per row is a scatter. Both are aliased to the donated cache."""
    srv = step.server(CONFIG)
    args = serving.step_args(srv, batch=4, length=1, max_len=16)
    shared = hlo.compile(srv.step, *args).as_text()
    rows = jax.ShapeDtypeStruct((4,), jnp.int32)
    per_row = hlo.compile(srv.step, *args[:2], rows, *args[3:]).as_text()
    assert "dynamic-update-slice" in shared and "scatter" not in shared
    assert "scatter" in per_row
    for text in (shared, per_row):
        assert "input_output_alias" in text


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda srv, p, c: srv.feed(p, [[40], [3]], 0, c), checks.InputError, "[0, 40)"),
    (lambda srv, p, c: srv.feed(p, [[-1], [3]], 0, c), checks.InputError, "[0, 40)"),
    (lambda srv, p, c: srv.feed(p, [[1.0], [3.0]], 0, c), checks.InputTypeError, "integer"),
    (lambda srv, p, c: srv.feed(p, [1, 3], 0, c), checks.InputError, "2 dimension"),
    (lambda srv, p, c: srv.feed(p, [[1], [3]], [0, 1, 2], c), checks.InputError, "one per row"),
    (lambda srv, p, c: srv.feed(p, [[1], [3]], [0, 8], c), checks.InputError, "do not fit"),
    (lambda srv, p, c: srv.feed(p, [[1], [3]], 1.0, c), checks.InputTypeError, "integer"),
    (lambda srv, p, c: srv.feed(p, [[1, 2], [3, 4]], 0, c, last=[0, 2]), checks.InputError,
     "last must be at most 1"),
    (lambda srv, p, c: srv.feed(p, [[1], [3]], 0, c, key="k"), checks.InputTypeError,
     "random key"),
    (lambda srv, p, c: srv.feed(p, [[1], [3]], 0, c, t=-1), checks.InputError, "t must be"),
    (lambda srv, p, c: srv.feed({"embed": p["embed"]}, [[1], [3]], 0, c), checks.InputError,
     "params"),
    (lambda srv, p, c: srv.feed(init_params(jax.random.key(0), Config(
        vocab=32, d_model=24, n_heads=4, d_ff=48, n_layers=2, seq_len=16)), [[1], [3]], 0, c),
     checks.InputError, "vocab"),
    (lambda srv, p, c: srv.feed(p, [[1], [3]], 0, "cache"), checks.InputTypeError, "cache"),
], ids=["id = vocab", "id -1", "float ids", "1-D tokens", "3 starts for 2 rows",
        "a row past the end", "float start", "last past the tokens", "string key",
        "negative step", "params missing leaves", "params of another vocab", "cache a string"])
def test_feed_makes_generates_checks(call, error, words):
    srv = step.server(CONFIG)
    cache = step.init_cache(CONFIG, batch=2, max_len=8)
    with pytest.raises(error) as info:
        call(srv, params(), cache)
    assert words in str(info.value)


def test_cached_attention_takes_one_start_per_row_and_refuses_a_wrong_count():
    q, cache = np.ones((2, 1, 2, 4), np.float32), np.ones((2, 2, 8, 4), np.float32)
    out = step.cached_attention(q, cache, cache, start=np.array([3, 7]))
    assert out.shape == q.shape
    with pytest.raises(checks.InputError, match="one per row"):
        step.cached_attention(q, cache, cache, start=np.array([3, 7, 1]))
    with pytest.raises(checks.InputError, match="at most 7"):
        step.cached_attention(q, cache, cache, start=np.array([3, 8]))


# --------------------------------------------------------------------------- turn-5 audit E


def test_server_spec_cache_shapes_and_stepper_refuse_bad_input():
    for srv in (step.server(CONFIG), step.server(CONFIG, strategy="tp", mesh=serving.STRATEGIES[
            "tp"].mesh(jax.devices()[:2]))):
        with pytest.raises(checks.InputError, match="unknown kind 'nonsense'"):
            srv.spec("nonsense")
        with pytest.raises(checks.InputError, match="batch must be at least 1"):
            srv.cache_shapes(0, 8)
        with pytest.raises(checks.InputError, match="max_len must be at most 16"):
            srv.cache_shapes(2, 99)
        with pytest.raises(checks.InputError, match="max_len must be at least 1"):
            srv.cache_shapes(2, 0)
        with pytest.raises(checks.InputTypeError, match="sampler must be a Sampler"):
            srv.stepper(None)
        assert srv.cache_shapes(np.int64(2), jnp.int32(8))[0]["k"].shape == (2, 4, 8, 6)
        for kind in step.KINDS:
            assert isinstance(srv.spec(kind), type(srv.spec("cache")))


@pytest.mark.parametrize("layers", [1, 3])
def test_a_cache_for_another_number_of_blocks_is_named(layers):
    """A cache made for 2 blocks fed to a model of 1 or 3: the error names the cache and the
    config (turn 4 raised an internal AssertionError about the forward pass)."""
    config = Config(vocab=40, d_model=24, n_heads=4, d_ff=48, n_layers=layers, seq_len=16)
    srv = step.server(config)
    cache = step.init_cache(CONFIG, batch=2, max_len=8)  # 2 blocks
    with pytest.raises(checks.InputError, match=rf"cache has 2 blocks but the model has "
                                                 rf"config.n_layers={layers}"):
        srv.feed(init_params(jax.random.key(0), config), [[1], [3]], 0, cache)


def test_a_cache_of_another_shape_is_named():
    srv = step.server(CONFIG)
    for cache, error in ((step.init_cache(CONFIG, batch=3, max_len=8), checks.InputError),
                         ([{"k": np.zeros((2, 4, 8, 6), np.float32)}] * 2, checks.InputTypeError),
                         ([{"k": np.zeros((2, 2, 8, 6), np.float32),
                            "v": np.zeros((2, 2, 8, 6), np.float32)}] * 2, checks.InputError)):
        with pytest.raises(error, match=r"init_cache\(config, batch=2"):
            srv.feed(params(), [[1], [3]], 0, cache)


@pytest.mark.parametrize("names", [("dp",), pytest.param(("fsdp", "tp"),
                                                          marks=pytest.mark.slow)])
def test_sampled_step_gathers_rows_only_where_split(names):
    """Review S10: a sampled step gathers each row whole on the devices that draw it. Under
    dp (rows split, vocabulary whole) it sends nothing, as the greedy step; under fsdp it
    sends what the greedy step sends; under tp it gathers the vocabulary, as the greedy step
    does to pick its argmax."""
    from spmd_guide.serving import sampling

    sampled = sampling.Sampler(0.8, top_p=0.9)
    for name in names:
        srv = step.server(CONFIG, strategy=name,
                          mesh=serving.STRATEGIES[name].mesh(jax.devices()[:2]))
        args = serving.step_args(srv, batch=2, length=1, max_len=8)
        counts = {label: hlo.count_kinds(hlo.collectives_in_text(
                      hlo.compile(fn, *args, compiler_options=step.fast()).as_text()))
                  for label, fn in (("greedy", srv.step), ("sampled", srv.stepper(sampled)))}
        if name == "dp":
            assert not any(counts["sampled"].values()), counts
        if name in ("dp", "fsdp"):
            assert counts["sampled"] == counts["greedy"], (name, counts)
        else:
            assert counts["sampled"]["all-gather"] >= 1, counts
