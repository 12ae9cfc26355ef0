"""Generation with a KV cache: cached decoding equals full recomputation, sharded generation
equals one-device generation on 2, 4 and 8 devices (Auto and Explicit axes), the cache's
layout and bytes per device, donation, and clear errors for bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from hypothesis import given, settings
from hypothesis import strategies as hs
from jax.sharding import PartitionSpec as P

from spmd_guide import serving as face
from spmd_guide.core import checks, hlo
from spmd_guide.serving import serving
from spmd_guide.transformer.lm import Config, init_params
from spmd_guide.transformer.lm import forward as lm_forward

# Not the pages' configs: other widths and vocabulary, an odd prompt length.
CONFIG = Config(vocab=48, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=20)
BATCH, PROMPT_LEN, STEPS = 8, 7, 9


@functools.cache
def fixture():
    params = init_params(jax.random.key(3), CONFIG)
    prompt = jax.random.randint(jax.random.key(4), (BATCH, PROMPT_LEN), 0, CONFIG.vocab,
                                dtype=jnp.int32)
    tokens, logits = serving.generate_with_logits(params, prompt, config=CONFIG, steps=STEPS)
    return params, prompt, np.asarray(tokens), np.asarray(logits)


def test_face_exports_the_contract():
    assert face.generate is serving.generate and face.init_cache is serving.init_cache
    assert face.serve is serving.serve


def test_cached_decoding_equals_full_recomputation():
    params, prompt, tokens, logits = fixture()
    ref_tokens, ref_logits = serving.recompute_generate(params, prompt, config=CONFIG,
                                                        steps=STEPS)
    assert tokens.shape == (BATCH, PROMPT_LEN + STEPS) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens[:, :PROMPT_LEN], np.asarray(prompt))
    np.testing.assert_array_equal(tokens, np.asarray(ref_tokens))
    np.testing.assert_allclose(logits, np.asarray(ref_logits), atol=2e-5)
    # The greedy choices were clear: no near-tie that rounding could flip.
    top2 = np.sort(logits, axis=-1)[..., -2:]
    assert np.min(top2[..., 1] - top2[..., 0]) > 1e-4


def test_generate_matches_generate_with_logits_and_takes_numpy():
    params, prompt, tokens, _ = fixture()
    out = serving.generate(params, np.asarray(prompt, np.int64), config=CONFIG,
                           steps=np.int64(STEPS))
    np.testing.assert_array_equal(np.asarray(out), tokens)


def test_one_step_is_prefill_alone():
    params, prompt, tokens, _ = fixture()
    out = serving.generate(params, prompt, config=CONFIG, steps=1)
    np.testing.assert_array_equal(np.asarray(out), tokens[:, :PROMPT_LEN + 1])


@settings(max_examples=4, deadline=None)
@given(prompt_len=hs.integers(1, 6), steps=hs.integers(1, 5), batch=hs.integers(1, 3),
       layers=hs.integers(1, 2), seed=hs.integers(0, 2**16))
@pytest.mark.slow
def test_cache_equals_recompute_for_any_shape(prompt_len, steps, batch, layers, seed):
    config = Config(vocab=24, d_model=16, n_heads=2, d_ff=32, n_layers=layers, seq_len=12)
    params = init_params(jax.random.key(seed), config)
    prompt = np.random.default_rng(seed).integers(0, config.vocab, (batch, prompt_len))
    tokens, logits = serving.generate_with_logits(params, prompt, config=config, steps=steps)
    ref_tokens, ref_logits = serving.recompute_generate(params, prompt, config=config,
                                                        steps=steps)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens))


# --------------------------------------------------------------------------- sharded

QUICK = {("tp", 8)}  # dp: test_auto_and_explicit_axes; the rest (fsdp_tp too: test_explicit_2d_mesh...) in the slow sweep
CASES = [(name, n) for name in serving.SERVED for n in (2, 4, 8)]


@pytest.mark.parametrize(("name", "n"), [
    pytest.param(name, n, marks=() if (name, n) in QUICK else (pytest.mark.slow,))
    for name, n in CASES])
def test_sharded_generation_equals_one_device(name, n):
    params, prompt, tokens, logits = fixture()
    mesh = serving.STRATEGIES[name].mesh(DEVICES[:n])
    out, out_logits = serving.generate_with_logits(params, prompt, config=CONFIG, steps=STEPS,
                                                   strategy=name, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), tokens)
    np.testing.assert_allclose(np.asarray(out_logits), logits, atol=2e-5)


@pytest.mark.parametrize(("name", "explicit"), [
    ("dp", True),   # Explicit axes: jax.make_mesh's default (tp on Explicit axes, quick:
    # test_sharded_row_on_explicit_axes)
    pytest.param("tp", True, marks=pytest.mark.slow),
    pytest.param("dp", False, marks=pytest.mark.slow),
    pytest.param("tp", False, marks=pytest.mark.slow)])
def test_auto_and_explicit_axes(name, explicit):
    params, prompt, tokens, _ = fixture()
    strategy = serving.STRATEGIES[name]
    mesh = mesh_of(4, strategy.axes, strategy.mesh_shape(4), explicit=explicit)
    out = serving.generate(params, prompt, config=CONFIG, steps=STEPS, strategy=name, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), tokens)
    compiled = serving.compiled_step(CONFIG, batch=BATCH, length=1, max_len=CONFIG.seq_len,
                                     strategy=name, mesh=mesh)
    kinds = hlo.count_kinds(hlo.collectives_in_text(compiled.as_text()))
    assert kinds["all-reduce"] == (2 * CONFIG.n_layers if name == "tp" else 0)
    cache = serving.init_cache(CONFIG, batch=BATCH, max_len=4, strategy=name, mesh=mesh)
    assert cache[0]["k"].sharding.spec == serving.server(
        CONFIG, strategy=name, mesh=mesh).spec("cache")
    assert cache[0]["k"].sharding.device_set == set(mesh.devices.flat)


@pytest.mark.slow
def test_explicit_2d_mesh_and_already_sharded_params():
    params, prompt, tokens, _ = fixture()
    strategy = serving.STRATEGIES["fsdp_tp"]
    mesh = mesh_of(8, strategy.axes, (4, 2), explicit=True)
    placed = serving.server(CONFIG, strategy="fsdp_tp", mesh=mesh).place_params(params)
    out = serving.generate(placed, prompt, config=CONFIG, steps=STEPS, strategy="fsdp_tp",
                           mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), tokens)


def test_sharded_row_on_explicit_axes():
    params, prompt, tokens, logits = fixture()
    mesh = mesh_of(8, ("model",), explicit=True)
    row = serving.sharded_row(params, prompt, config=CONFIG, steps=STEPS, strategy="tp",
                              mesh=mesh, reference=(tokens, logits))
    assert row["same tokens"] is True and row["mesh"] == "model=8"
    assert row["collectives per decode step"] == f"2 all-gather, {2 * CONFIG.n_layers} all-reduce"
    assert row["cache / device"] * 8 == 2 * CONFIG.n_layers * BATCH * (PROMPT_LEN + STEPS - 1) \
        * CONFIG.d_model * 4
    assert row["sent per decode step"] > 0


def test_default_mesh_is_every_device():
    params, prompt, tokens, _ = fixture()
    out = serving.generate(params, prompt, config=CONFIG, steps=STEPS, strategy="tp")
    np.testing.assert_array_equal(np.asarray(out), tokens)
    assert serving.server(CONFIG, strategy="tp").mesh.devices.size == len(DEVICES)


# --------------------------------------------------------------------------- the cache


@pytest.mark.parametrize(("name", "spec"), [
    ("dp", P("data", None, None, None)), ("fsdp", P("data", None, None, None)),
    ("tp", P(None, "model", None, None)), ("fsdp_tp", P("data", "model", None, None))])
def test_cache_layout(name, spec):
    mesh = serving.STRATEGIES[name].mesh(DEVICES[:8])
    cache = serving.init_cache(CONFIG, batch=BATCH, max_len=5, strategy=name, mesh=mesh)
    assert len(cache) == CONFIG.n_layers
    for layer in cache:
        for array in (layer["k"], layer["v"]):
            assert array.shape == (BATCH, CONFIG.n_heads, 5, CONFIG.head_dim)
            assert array.sharding.spec == spec
            assert not np.asarray(array).any()


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", ["tp", "dp", "fsdp_tp"])
def test_cache_holds_one_nth_of_the_bytes_per_device(name, n):
    mesh = serving.STRATEGIES[name].mesh(DEVICES[:n])
    cache = serving.init_cache(CONFIG, batch=BATCH, max_len=6, strategy=name, mesh=mesh)
    sizes = serving.cache_bytes(cache)
    assert sizes["total"] == 2 * CONFIG.n_layers * BATCH * 6 * CONFIG.d_model * 4
    assert sizes["per device"] * n == sizes["total"]


def test_one_device_cache():
    cache = serving.init_cache(CONFIG, batch=3, max_len=4)
    total = 2 * CONFIG.n_layers * 3 * 4 * 32 * 4  # k and v, layers, batch, max_len, d_model
    assert serving.cache_bytes(cache) == {"total": total, "per device": total}
    assert cache[0]["k"].dtype == jnp.float32


def test_cache_takes_the_config_dtype():
    config = Config(vocab=16, d_model=16, n_heads=2, d_ff=16, n_layers=1, seq_len=8,
                    dtype="bfloat16")
    assert serving.init_cache(config, batch=1, max_len=8)[0]["v"].dtype == jnp.bfloat16


def test_donated_cache_is_written_in_place():
    """The step donates the cache: the compiled program aliases every cache byte of its
    output to its input, its temporaries are smaller than the cache (no copy of it), and the
    old buffers are gone after a step."""
    params, prompt, _, _ = fixture()
    rows = serving.donation_rows(CONFIG, batch=BATCH, max_len=CONFIG.seq_len)
    donated, kept = rows
    cache = 2 * CONFIG.n_layers * BATCH * CONFIG.seq_len * CONFIG.d_model * 4
    assert donated["aliased"] == cache and kept["aliased"] == 0
    assert donated["temporaries"] < cache
    assert kept["outputs"] - donated["outputs"] == 0  # same outputs; only aliasing differs
    srv = serving.server(CONFIG)
    old = serving.init_cache(CONFIG, batch=BATCH, max_len=CONFIG.seq_len)
    _, _, new = srv.feed(srv.place_params(params), jnp.asarray(prompt), 0, old)
    assert old[0]["k"].is_deleted() and not new[0]["k"].is_deleted()


def _big_copies(compiled, length: int) -> list[str]:
    return [line for line in compiled.as_text().splitlines()
            if ("transpose(" in line or " copy(" in line) and f",{length}," in line]


def test_heads_first_cache_is_read_in_place():
    """The module's layout claim: with the cache [batch, heads, max_len, head_dim] the
    compiled decode step copies no cache-sized buffer; in the activations' order [batch,
    max_len, heads, head_dim] XLA:CPU transposes it at every step."""
    config = Config(vocab=16, d_model=64, n_heads=4, d_ff=64, n_layers=1, seq_len=512)
    srv = serving.server(config)
    compiled = hlo.compile(srv.step, *serving.step_args(srv, batch=4, length=1, max_len=512))
    assert not _big_copies(compiled, 512)
    start = jax.ShapeDtypeStruct((), jnp.int32)

    def other_order(q, k, new_k, start):
        k = jax.lax.dynamic_update_slice(k, new_k, (0, start, 0, 0))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), k), k

    shape = jax.ShapeDtypeStruct
    compiled = hlo.compile(jax.jit(other_order, donate_argnums=1), shape((4, 1, 4, 16),
                           jnp.float32), shape((4, 512, 4, 16), jnp.float32),
                           shape((4, 1, 4, 16), jnp.float32), start)
    assert any("transpose(" in line for line in compiled.as_text().splitlines()
               if "512" in line)


def test_decode_step_collectives():
    """tp: two all-reduces per block (after attention's and the MLP's output projection)
    and the argmax over the split vocabulary; dp: none."""
    assert serving.decode_collectives(CONFIG, strategy="dp", n_devices=4, batch=BATCH) == {}
    tp = serving.decode_collectives(CONFIG, strategy="tp", n_devices=8, batch=BATCH)
    assert tp == {"all-reduce": 2 * CONFIG.n_layers, "all-gather": 2}


# --------------------------------------------------------------------------- bad input


def _bad(**kw):
    params, prompt, _, _ = fixture()
    args = {"config": CONFIG, "steps": 2} | kw
    return serving.generate(args.pop("params", params), args.pop("prompt", prompt), **args)


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"prompt": np.zeros((2, 3), np.float32)}, checks.InputTypeError, "integer dtype"),
    ({"prompt": np.zeros((3,), np.int32)}, checks.InputError, "2 dimension"),
    ({"prompt": np.zeros((2, 0), np.int32)}, checks.InputError, "at least one token"),
    ({"prompt": np.full((2, 3), 48, np.int32)}, checks.InputError, "[0, 48)"),
    ({"prompt": np.full((2, 3), -1, np.int32)}, checks.InputError, "[0, 48)"),
    ({"prompt": "hello"}, checks.InputTypeError, "array"),
    ({"steps": 15}, checks.InputError, "config.seq_len=20"),
    ({"prompt": np.zeros((2, 21), np.int32)}, checks.InputError, "longer than"),
    ({"steps": 0}, checks.InputError, "steps must be at least 1"),
    ({"steps": 2.0}, checks.InputTypeError, "steps must be an integer"),
    ({"strategy": "zero"}, checks.InputError, "unknown strategy"),
    ({"strategy": "cp"}, checks.InputError, "single position"),
    ({"strategy": "tp_sp"}, checks.InputError, "cannot run this decode step"),
    ({"mesh": "mesh"}, checks.InputError, "without a strategy"),
    ({"strategy": "dp", "mesh": "mesh"}, checks.InputTypeError, "jax.sharding.Mesh"),
    ({"config": {"vocab": 48}}, checks.InputTypeError, "Config"),
])
def test_bad_input_is_refused(kw, error, words):
    with pytest.raises(error, match=None) as info:
        _bad(**kw)
    assert words in str(info.value)


def test_params_of_another_config_are_refused():
    params, prompt, _, _ = fixture()
    other = Config(vocab=48, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=24)
    with pytest.raises(checks.InputError, match="made for seq_len 20, but config says seq_len 24"):
        serving.generate(params, prompt, config=other, steps=2)
    with pytest.raises(checks.InputError, match="params"):
        serving.generate({"embed": params["embed"]}, prompt, config=CONFIG, steps=2)
    with pytest.raises(checks.InputTypeError, match="array"):
        serving.generate(params | {"norm_f": "x"}, prompt, config=CONFIG, steps=2)


def test_mesh_that_cannot_split_the_batch_or_the_heads():
    params, prompt, _, _ = fixture()
    with pytest.raises(checks.InputError, match="does not split into 8"):
        serving.generate(params, prompt[:6], config=CONFIG, steps=2, strategy="dp",
                         mesh=mesh_of(8, ("data",)))
    few_heads = Config(vocab=48, d_model=32, n_heads=2, d_ff=64, n_layers=1, seq_len=20)
    with pytest.raises(checks.InputError, match="n_heads is 2"):
        serving.init_cache(few_heads, batch=8, max_len=4, strategy="tp",
                           mesh=mesh_of(4, ("model",)))
    with pytest.raises(checks.InputError, match="mesh axis='data' is not an axis"):
        serving.generate(params, prompt, config=CONFIG, steps=2, strategy="dp",
                         mesh=mesh_of(2, ("x",)))


def test_cache_longer_than_the_positions_or_fed_past_its_end():
    with pytest.raises(checks.InputError, match="max_len must be at most 20"):
        serving.init_cache(CONFIG, batch=1, max_len=21)
    with pytest.raises(checks.InputError, match="batch must be at least 1"):
        serving.init_cache(CONFIG, batch=0, max_len=4)
    params, prompt, _, _ = fixture()
    srv = serving.server(CONFIG)
    cache = serving.init_cache(CONFIG, batch=BATCH, max_len=PROMPT_LEN)
    placed = srv.place_params(params)
    token, _, cache = srv.feed(placed, jnp.asarray(prompt), 0, cache)
    with pytest.raises(checks.InputError, match="do not fit a cache of max_len=7"):
        srv.feed(placed, token[:, None], PROMPT_LEN, cache)
    with pytest.raises(checks.InputError, match="start must be at least 0"):
        srv.feed(placed, token[:, None], -1, cache)


# --------------------------------------------------------------------------- exercises


@pytest.mark.slow
def test_exercise_answers_kv_cache():
    # 1. Positions processed for 10 tokens after a 6-token prompt.
    assert sum(range(6, 16)) == 105 and 6 + 9 == 15
    # 2. GPT-2-medium's shape, 1024 positions, bfloat16: the cache's bytes, from its shapes.
    config = Config(vocab=16, d_model=1024, n_heads=16, d_ff=16, n_layers=24, seq_len=1024,
                    dtype="bfloat16")
    shapes = serving.server(config).cache_shapes(1, 1024)
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    assert total == 100_663_296 == 96 * 2**20
    # 3. Causality: garbage in the later slots does not change the logits before them.
    params, prompt, _, _ = fixture()
    tokens = jnp.zeros((BATCH, CONFIG.seq_len), jnp.int32).at[:, :PROMPT_LEN].set(prompt)
    noisy = tokens.at[:, PROMPT_LEN:].set(CONFIG.vocab - 1)
    forward = jax.jit(lm_forward)
    np.testing.assert_array_equal(np.asarray(forward(params, tokens)[:, :PROMPT_LEN]),
                                  np.asarray(forward(params, noisy)[:, :PROMPT_LEN]))


@pytest.mark.slow
def test_exercise_answers_sharded_serving():
    params, prompt, _, _ = fixture()
    # 1. dp refuses a batch that does not split; tp serves a single sequence.
    with pytest.raises(checks.InputError, match="does not split"):
        serving.generate(params, prompt[:6], config=CONFIG, steps=1, strategy="dp",
                         mesh=serving.STRATEGIES["dp"].mesh(DEVICES[:8]))
    one = serving.generate(params, prompt[:1], config=CONFIG, steps=2, strategy="tp",
                           mesh=serving.STRATEGIES["tp"].mesh(DEVICES[:8]))
    assert one.shape == (1, PROMPT_LEN + 2)
    # 2. tp sends 16 (n-1)/n B d_model bytes per block per decode step for its all-reduces.
    n = 8
    compiled = serving.compiled_step(CONFIG, batch=BATCH, length=1, max_len=CONFIG.seq_len,
                                     strategy="tp",
                                     mesh=serving.STRATEGIES["tp"].mesh(DEVICES[:n]))
    reduces = [op for op in hlo.collectives_in_text(compiled.as_text())
               if op.kind == "all-reduce"]
    assert sum(op.bytes_sent for op in reduces) == CONFIG.n_layers * 16 * (n - 1) * BATCH \
        * CONFIG.d_model // n


_Q, _CACHE = np.ones((1, 1, 2, 4), np.float32), np.ones((1, 2, 8, 4), np.float32)


@pytest.mark.parametrize(("call", "words"), [
    (lambda: serving.cached_attention(_Q[0], _CACHE, _CACHE, start=0), "4 dimension"),
    (lambda: serving.cached_attention(_Q, _CACHE[..., :2], _CACHE, start=0), "caches"),
    (lambda: serving.cached_attention(_Q, _CACHE, _CACHE, start=-1), "at least 0"),
    (lambda: serving.cached_attention(_Q, _CACHE, _CACHE, start=8), "at most 7"),
    (lambda: serving.cached_attention(_Q, _CACHE, _CACHE, start="0"), "integer"),
    (lambda: serving.abstract_params(serving.Config(), "server"), "Server"),
], ids=["q 3-D", "k head_dim", "start -1", "start past the cache", "start a string",
        "srv a string"])
def test_cached_attention_and_abstract_params_refuse_bad_input(call, words):
    with pytest.raises(checks.InputError, match=words):
        call()


def test_abstract_params_refuses_a_server_of_another_config():
    small = Config(vocab=16, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=20)
    with pytest.raises(checks.InputError, match="srv serves another config"):
        serving.abstract_params(Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=2,
                                       seq_len=20), serving.server(small))
    shapes = serving.abstract_params(small, serving.server(small))
    assert shapes["embed"].shape == (16, 32)


def test_integer_scalars_of_numpy_and_jax_are_ints():
    """eos_id, pad_id, steps and top_k as NumPy or JAX integer scalars give what ints give
    (turn-5 audit E: jnp.int32(e) was refused while a JAX float temperature was taken)."""
    params, prompt, _, _ = fixture()
    want = serving.generate(params, prompt, config=CONFIG, steps=4, eos_id=5, pad_id=1,
                            temperature=0.8, top_k=12, key=3)
    for cast in (np.int64, jnp.int32):
        got = serving.generate(params, prompt, config=CONFIG, steps=cast(4), eos_id=cast(5),
                               pad_id=cast(1), temperature=jnp.float32(0.8), top_k=cast(12),
                               key=3)
        np.testing.assert_array_equal(got, want)


def test_cached_attention_takes_a_numpy_start():
    assert serving.cached_attention(_Q, _CACHE, _CACHE, start=np.int32(3)).shape == _Q.shape


# --------------------------------------------------------------------------- the contract:
# sampling, stop tokens, ragged prompts, the loop on the device

SAMPLED = {"temperature": 0.9, "top_k": 12, "top_p": 0.9}
LENGTHS = np.array([7, 3, 5, 1, 7, 2, 6, 4])


def _options(seed: int = 0) -> dict:
    return SAMPLED | {"key": jax.random.key(seed)}


@pytest.mark.slow
def test_same_key_same_tokens_on_one_device_and_sharded():
    params, prompt, greedy, _ = fixture()
    one = np.asarray(serving.generate(params, prompt, config=CONFIG, steps=STEPS, **_options()))
    mesh = mesh_of(8, ("model",), explicit=True)
    tp = serving.generate(params, prompt, config=CONFIG, steps=STEPS, strategy="tp", mesh=mesh,
                          **_options())
    np.testing.assert_array_equal(np.asarray(tp), one)
    np.testing.assert_array_equal(one[:, :PROMPT_LEN], np.asarray(prompt))
    assert (one != greedy).any()  # it sampled
    other = serving.generate(params, prompt, config=CONFIG, steps=STEPS, **_options(1))
    assert (np.asarray(other) != one).any()  # another key, other tokens


@pytest.mark.slow
def test_top_k_one_samples_the_greedy_tokens():
    """Through generate (test_sampling checks the sampler itself quickly)."""
    params, prompt, greedy, _ = fixture()
    out = serving.generate(params, prompt, config=CONFIG, steps=STEPS, temperature=2.0,
                           top_k=1, key=jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(out), greedy)


def _stopped(tokens: np.ndarray, start: int, eos: int) -> np.ndarray:
    """``tokens`` with every new position after a row's first eos set to eos."""
    out = tokens.copy()
    for row in out:
        hits = np.flatnonzero(row[start:] == eos)
        if hits.size:
            row[start + hits[0]:] = eos
    return out


def test_eos_stops_each_row_and_the_loop():
    params, prompt, greedy, _ = fixture()
    new = greedy[:, PROMPT_LEN:]
    eos = int(new[0, 1])  # met by row 0 at its second new token
    expected = _stopped(greedy, PROMPT_LEN, eos)
    assert (expected != greedy).any()
    out = serving.generate(params, prompt, config=CONFIG, steps=STEPS, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(out), expected)
    py, _ = serving.generate_with_logits(params, prompt, config=CONFIG, steps=STEPS, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(py), expected)
    # One row whose first new token is eos: the loop stops after the prefill.
    first = int(new[2, 0])
    tokens, logits = serving.generate_with_logits(params, prompt[2:3], config=CONFIG,
                                                  steps=STEPS, eos_id=first)
    assert logits.shape[1] == 1 and (np.asarray(tokens)[0, PROMPT_LEN:] == first).all()


@pytest.mark.slow
def test_ragged_rows_equal_each_row_alone():
    params, prompt, _, _ = fixture()
    out = np.asarray(serving.generate(params, prompt, config=CONFIG, steps=4,
                                      prompt_lengths=LENGTHS, pad_id=5))
    assert out.shape == (BATCH, PROMPT_LEN + 4)
    for i in (1, 3):  # lengths 3 and 1; test_sharded_contract sweeps every row
        n = LENGTHS[i]
        alone = np.asarray(serving.generate(params, prompt[i:i + 1, :n], config=CONFIG, steps=4))
        np.testing.assert_array_equal(out[i, :n + 4], alone[0])
        assert (out[i, n + 4:] == 5).all()


@pytest.mark.slow
def test_device_loop_equals_python_loop_with_one_dispatch():
    params, prompt, _, _ = fixture()
    counts = serving.dispatches(params, prompt, config=CONFIG, steps=STEPS)
    assert counts == {"python loop": STEPS, "device loop": 1, "same tokens": True}
    counts = serving.dispatches(params, prompt, config=CONFIG, steps=5, prompt_lengths=LENGTHS,
                                eos_id=3, **_options(2))
    assert counts["device loop"] == 1 and counts["same tokens"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "n", "explicit"), [
    (name, n, explicit) for name in serving.SERVED for n in (1, 2, 4, 8)
    for explicit in (False, True)])
def test_sharded_contract(name, n, explicit):
    """Sampled, stopped and ragged at once, on every served strategy, 1 to 8 devices, Auto and
    Explicit axes: the one-device tokens; and greedy ragged rows equal each row alone."""
    params, prompt, greedy, _ = fixture()
    strategy = serving.STRATEGIES[name]
    mesh = mesh_of(n, strategy.axes, strategy.mesh_shape(n), explicit=explicit)
    options = _options(4) | {"prompt_lengths": LENGTHS, "eos_id": int(greedy[0, PROMPT_LEN])}
    one = serving.generate(params, prompt, config=CONFIG, steps=STEPS, **options)
    out = serving.generate(params, prompt, config=CONFIG, steps=STEPS, strategy=name,
                           mesh=mesh, **options)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(one))
    ragged = np.asarray(serving.generate(params, prompt, config=CONFIG, steps=3, strategy=name,
                                         mesh=mesh, prompt_lengths=LENGTHS))
    for i, length in enumerate(LENGTHS):
        alone = serving.generate(params, prompt[i:i + 1, :length], config=CONFIG, steps=3)
        np.testing.assert_array_equal(ragged[i, :length + 3], np.asarray(alone)[0])


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"temperature": -1.0}, checks.InputError, "temperature must be at least 0"),
    ({"temperature": 1.0}, checks.InputError, "needs a random key"),
    ({"temperature": 1.0, "key": "k"}, checks.InputTypeError, "random key"),
    ({"top_k": 0}, checks.InputError, "top_k must be at least 1"),
    ({"top_k": 49}, checks.InputError, "top_k must be at most 48"),
    ({"top_p": 0.0}, checks.InputError, "(0, 1]"),
    ({"top_p": 1.01}, checks.InputError, "top_p must be at most 1.0"),
    ({"prompt_lengths": np.array([0] * 8)}, checks.InputError, "at least 1"),
    ({"prompt_lengths": np.array([8] * 8)}, checks.InputError, "at most the prompt's 7"),
    ({"prompt_lengths": np.array([3] * 7)}, checks.InputError, "prompt_lengths"),
    ({"prompt_lengths": np.array([3.0] * 8)}, checks.InputTypeError, "integer dtype"),
    ({"prompt_lengths": "3"}, checks.InputTypeError, "array"),
    ({"eos_id": 48}, checks.InputError, "eos_id must be at most 47"),
    ({"eos_id": -1}, checks.InputError, "eos_id must be at least 0"),
    ({"eos_id": 1.0}, checks.InputTypeError, "eos_id must be an integer"),
    ({"pad_id": 48}, checks.InputError, "pad_id must be at most 47"),
    ({"pad_id": None}, checks.InputTypeError, "pad_id must be an integer"),
])
def test_bad_generation_options_are_refused(kw, error, words):
    with pytest.raises(error) as info:
        _bad(**kw)
    assert words in str(info.value)


def test_recompute_generate_makes_generates_checks():
    params, prompt, _, _ = fixture()
    other = Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=20)
    with pytest.raises(checks.InputError, match="vocab"):
        serving.recompute_generate(params, np.asarray(prompt) % 32, config=other, steps=2)
    with pytest.raises(checks.InputError, match=r"\[0, 48\)"):
        serving.recompute_generate(params, np.full((1, 3), 48), config=CONFIG, steps=2)
    with pytest.raises(checks.InputTypeError, match="Config"):
        serving.recompute_generate(params, prompt, config="C", steps=2)
    with pytest.raises(checks.InputError, match=r"generate at most 13 new tokens \(steps=13\)"):
        serving.recompute_generate(params, prompt, config=CONFIG, steps=14)


def test_prompt_longer_than_the_positions_says_so():
    params, _, _, _ = fixture()
    with pytest.raises(checks.InputError, match="longer than the model's config.seq_len=20"):
        serving.generate(params, np.zeros((1, 21), np.int32), config=CONFIG, steps=1)
    # The whole sequence fits the model's positions: prompt_len + steps = seq_len, and one
    # more step is refused (a token past seq_len has no position; turn-5 audit D).
    out = serving.generate(params, np.zeros((1, 10), np.int32), config=CONFIG, steps=10)
    assert out.shape == (1, 20)
    for fn in (serving.generate, serving.generate_with_logits, serving.recompute_generate):
        with pytest.raises(checks.InputError, match=r"makes 21 tokens.*\(steps=10\)"):
            fn(params, np.zeros((1, 10), np.int32), config=CONFIG, steps=11)


def test_decode_collectives_refuses_an_empty_cache_and_no_strategy():
    with pytest.raises(checks.InputError, match="max_len must be at least 1"):
        serving.decode_collectives(CONFIG, strategy="tp", n_devices=2, batch=8, max_len=0)
    with pytest.raises(checks.InputError, match="needs a strategy"):
        serving.decode_collectives(CONFIG, strategy=None, n_devices=2, batch=8)
    with pytest.raises(checks.InputError, match="n_devices must be at most 8"):
        serving.decode_collectives(CONFIG, strategy="tp", n_devices=9, batch=8)


_C = Config(vocab=16, d_model=16, n_heads=2, d_ff=16, n_layers=1, seq_len=8)


@functools.cache
def _small():
    return init_params(jax.random.key(0), _C)


_PR = np.ones((2, 3), np.int32)


@pytest.mark.parametrize(("call", "words"), [
    (lambda: serving.init_cache("C", batch=1, max_len=2), "config must be a Config"),
    (lambda: serving.init_cache(_C, batch=True, max_len=2), "batch must be an integer"),
    (lambda: serving.init_cache(_C, batch=1, max_len=0), "max_len must be at least 1"),
    (lambda: serving.cache_bytes("x"), "must be an array"),
    (lambda: serving.cache_bytes([]), "at least one array"),
    (lambda: serving.compiled_step(_C, batch=1, length=0, max_len=4), "length must be at least"),
    (lambda: serving.compiled_step(_C, batch=1, length=5, max_len=4), "length must be at most"),
    (lambda: serving.compiled_step({}, batch=1, length=1, max_len=4), "Config"),
    (lambda: serving.donation_rows(_C, batch=1, max_len=9), "max_len must be at most 8"),
    (lambda: serving.donation_rows(None, batch=1, max_len=2), "Config"),
    (lambda: serving.sharded_row(_small(), _PR, config=_C, steps=2, strategy="tp",
                                 mesh=serving.STRATEGIES["tp"].mesh(DEVICES[:2]),
                                 reference=(np.zeros((1, 1)), np.zeros(3))), "reference's"),
    (lambda: serving.sharded_row(_small(), _PR, config=_C, steps=2, strategy=None, mesh=None,
                                 reference=(0, 0)), "needs a strategy"),
    (lambda: serving.dispatches(_small(), _PR, config=_C, steps=2, temp=1), "unknown options"),
    (lambda: serving.generate("p", _PR, config=_C, steps=2), "params"),
    (lambda: serving.generate(_small(), _PR, config=_C, steps=True), "steps must be an integer"),
    (lambda: serving.generate(_small(), _PR, config=_C, steps=2, key=1.5), "random key"),
    (lambda: serving.generate(_small(), _PR, config=_C, steps=2, prompt_lengths=[[1], [2]]),
     "1 dimension"),
    (lambda: serving.generate(_small(), _PR, config=_C, steps=2, strategy=3), "unknown strategy"),
    (lambda: serving.server(3), "Config"),
    (lambda: serving.serve(_small(), {"a": [1]}, config=_C, max_new_tokens=1, slots=1),
     "list of prompts"),
    (lambda: serving.serve(_small(), [[[1, 2]]], config=_C, max_new_tokens=1, slots=1),
     "1 dimension"),
    (lambda: serving.serve(_small(), [[True]], config=_C, max_new_tokens=1, slots=1), "integer"),
    (lambda: serving.decode_collectives(_C, strategy="tp", n_devices=2, batch=0),
     "batch must be at least 1"),
    (lambda: serving.decode_collectives(_C, strategy="tp", n_devices=2, batch=2, max_len="4"),
     "max_len must be an integer"),
], ids=lambda x: "" if callable(x) else x)
def test_the_boundary_refuses_each_class_of_bad_argument(call, words):
    """Every public function, each kind of argument (config, sizes, pytrees, options, names):
    a clear InputError naming it, before anything runs."""
    with pytest.raises(checks.InputError) as info:
        call()
    assert words in str(info.value)


@pytest.mark.slow
def test_each_sampler_and_stop_token_compiles_its_own_program():
    """The sampling page's note (review, missing for a practitioner): the sampler and eos_id
    are static in generate's program, so a new value compiles a new whole-generation program
    and a repeated one compiles nothing."""
    from spmd_guide.serving import batching

    params, prompt, _, _ = fixture()
    run = functools.partial(batching.compiled_programs, serving.generate, params, prompt,
                            config=CONFIG, steps=3, key=1)
    run(temperature=0.8, top_p=0.9, eos_id=5)
    for options in ({"temperature": 0.81, "top_p": 0.9, "eos_id": 5},
                    {"temperature": 0.8, "top_p": 0.91, "eos_id": 5},
                    {"temperature": 0.8, "top_p": 0.9, "eos_id": 6}):
        assert run(**options)[1] >= 1, options
    assert run(temperature=0.8, top_p=0.9, eos_id=5)[1] == 0


@pytest.mark.parametrize(("name", "n", "rows"), [
    (None, 1, 2), pytest.param(None, 1, 4, marks=pytest.mark.slow),
    pytest.param("dp", 2, 4, marks=pytest.mark.slow),
    pytest.param("tp", 2, 4, marks=pytest.mark.slow)])
def test_one_key_per_row_makes_each_sampled_row_its_request_alone(name, n, rows):
    """Keys of shape [batch]: row i of a sampled, ragged batch equals its prompt generated
    alone with the single key keys[i], on one device and sharded (review S2: with one key for
    the batch a row's noise depends on its index)."""
    params, prompt, _, _ = fixture()
    # The quick case: two full rows (the alone runs share a program); the sweep: ragged.
    lengths = LENGTHS[:rows] if rows > 2 else np.full(rows, PROMPT_LEN)
    keys = jax.random.split(jax.random.key(9), rows)
    mesh = None if name is None else serving.STRATEGIES[name].mesh(jax.devices()[:n])
    out = np.asarray(serving.generate(params, prompt[:rows], config=CONFIG, steps=4,
                                      prompt_lengths=lengths, key=keys, strategy=name,
                                      mesh=mesh, **SAMPLED))
    for i, n_i in enumerate(lengths):
        alone = np.asarray(serving.generate(params, prompt[i:i + 1, :n_i], config=CONFIG,
                                            steps=4, key=keys[i], **SAMPLED))[0]
        np.testing.assert_array_equal(out[i, :n_i + 4], alone)


def test_a_row_of_keys_of_another_length_is_refused():
    params, prompt, _, _ = fixture()
    for keys, error, words in ((jax.random.split(jax.random.key(0), 3), checks.InputError,
                                "holds 3 keys but there are 8 rows"),
                               (jax.random.split(jax.random.key(0), (2, 4)),
                                checks.InputError, "must be one key")):
        with pytest.raises(error, match=words):
            serving.generate(params, prompt, config=CONFIG, steps=2, key=keys, **SAMPLED)
