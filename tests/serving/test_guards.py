"""Guard classes (turn-5 bad-input audit): every numeric argument of the public serving
functions through one battery of values (bool, NaN, inf, negative, zero, a float where an
int is meant, a string, and NumPy and JAX scalars), every mesh argument with a missing axis,
and no failed call touching the disk.

Each bad value must give the package's own error (:class:`checks.InputError`, or its
subclass :class:`checks.InputTypeError`) naming the argument the caller passed; each NumPy or
JAX scalar of a valid value must give what the Python number gives. The checks run before
anything is compiled, so the battery stays quick; the valid scalars run the cheap entry
points (``plan`` is every check ``generate`` makes, before its program runs)."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide.core import checks
from spmd_guide.serving import batching, costs, sampling, serving, step
from spmd_guide.transformer.lm import Config, init_params

CONFIG = Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=12)
PROMPT = np.arange(8, dtype=np.int32).reshape(2, 4) % CONFIG.vocab


@functools.cache
def params():
    return init_params(jax.random.key(0), CONFIG)


def _generate(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(**kw: Any) -> Any:
        args = {"config": CONFIG, "steps": 3, "key": 0, "temperature": 0.7} | kw
        return fn(params(), PROMPT, **args)
    return call


@functools.cache
def _decode() -> costs.StepCounts:
    return costs.step_counts("decode", batch=1)


@functools.cache
def _line() -> costs.Line:
    return costs.Line.through(costs.step_counts("decode", batch=1),
                              costs.step_counts("decode", batch=2))


def _serve(**kw: Any) -> Any:
    args = {"config": CONFIG, "max_new_tokens": 2, "slots": 2} | kw
    return batching.run(params(), [[1, 2], [3]], **args)


def _feed(**kw: Any) -> Any:
    srv = step.server(CONFIG)
    args = {"start": 0, "t": 0} | kw
    start = args.pop("start")
    return srv.feed(params(), [[1], [2]], start, step.init_cache(CONFIG, batch=2, max_len=4),
                    **args)


def _rows() -> dict[str, Any]:
    p = np.full(4, 0.25, np.float32)
    return {"a": (p, p)}


# (label, call, argument, valid value, kind, is 0 valid, the fast call for valid scalars)
# kind: "int" (an integer), "real" (a finite number).
ARGS: list[tuple[str, Callable[..., Any], str, Any, str, bool, Callable[..., Any] | None]] = [
    ("generate", _generate(serving.generate), "steps", 3, "int", False, _generate(serving.plan)),
    ("generate", _generate(serving.generate), "temperature", 0.7, "real", True,
     _generate(serving.plan)),
    ("generate", _generate(serving.generate), "top_k", 5, "int", False, _generate(serving.plan)),
    ("generate", _generate(serving.generate), "top_p", 0.5, "real", False,
     _generate(serving.plan)),
    ("generate", _generate(serving.generate), "eos_id", 3, "int", True, _generate(serving.plan)),
    ("generate", _generate(serving.generate), "pad_id", 3, "int", True, _generate(serving.plan)),
    ("generate_with_logits", _generate(serving.generate_with_logits), "steps", 3, "int", False,
     None),
    ("generate_with_logits", _generate(serving.generate_with_logits), "temperature", 0.7, "real",
     True, None),
    ("recompute_generate", lambda **kw: serving.recompute_generate(
        params(), PROMPT, config=CONFIG, **({"steps": 3} | kw)), "steps", 3, "int", False, None),
    ("serve", _serve, "max_new_tokens", 2, "int", False, None),
    ("serve", _serve, "slots", 2, "int", False, None),
    ("serve", _serve, "eos_id", 3, "int", True, None),
    ("init_cache", lambda **kw: step.init_cache(CONFIG, **({"batch": 2, "max_len": 4} | kw)),
     "batch", 2, "int", False, "same"),
    ("init_cache", lambda **kw: step.init_cache(CONFIG, **({"batch": 2, "max_len": 4} | kw)),
     "max_len", 4, "int", False, "same"),
    ("cache_shapes", lambda **kw: step.server(CONFIG).cache_shapes(
        **({"batch": 2, "max_len": 4} | kw)), "batch", 2, "int", False, "same"),
    ("cache_shapes", lambda **kw: step.server(CONFIG).cache_shapes(
        **({"batch": 2, "max_len": 4} | kw)), "max_len", 4, "int", False, "same"),
    ("feed", _feed, "start", 0, "int", True, None),
    ("feed", _feed, "t", 0, "int", True, None),
    ("compiled_step", lambda **kw: serving.compiled_step(
        CONFIG, **({"batch": 2, "length": 1, "max_len": 4} | kw)), "batch", 2, "int", False,
     None),
    ("compiled_step", lambda **kw: serving.compiled_step(
        CONFIG, **({"batch": 2, "length": 1, "max_len": 4} | kw)), "length", 1, "int", False,
     None),
    ("compiled_step", lambda **kw: serving.compiled_step(
        CONFIG, **({"batch": 2, "length": 1, "max_len": 4} | kw)), "max_len", 4, "int", False,
     None),
    ("decode_collectives", lambda **kw: serving.decode_collectives(
        CONFIG, strategy="tp", **({"n_devices": 2, "batch": 2} | kw)), "n_devices", 2, "int",
     False, None),
    ("decode_collectives", lambda **kw: serving.decode_collectives(
        CONFIG, strategy="tp", **({"n_devices": 2, "batch": 2} | kw)), "batch", 2, "int",
     False, None),
    ("decode_collectives", lambda **kw: serving.decode_collectives(
        CONFIG, strategy="tp", **({"n_devices": 2, "batch": 2} | kw)), "max_len", 4, "int",
     False, None),
    ("donation_rows", lambda **kw: serving.donation_rows(
        CONFIG, **({"batch": 2, "max_len": 4} | kw)), "batch", 2, "int", False, None),
    ("donation_rows", lambda **kw: serving.donation_rows(
        CONFIG, **({"batch": 2, "max_len": 4} | kw)), "max_len", 4, "int", False, None),
    ("sampler", lambda **kw: sampling.sampler(**({"temperature": 0.7, "key": 0, "vocab": 16}
                                                 | kw)), "temperature", 0.7, "real", True,
     "same"),
    ("sampler", lambda **kw: sampling.sampler(**({"temperature": 0.7, "key": 0, "vocab": 16}
                                                 | kw)), "top_k", 5, "int", False, "same"),
    ("sampler", lambda **kw: sampling.sampler(**({"temperature": 0.7, "key": 0, "vocab": 16}
                                                 | kw)), "top_p", 0.5, "real", False, "same"),
    ("Sampler", lambda **kw: sampling.Sampler(**({"temperature": 0.7} | kw)), "temperature",
     0.7, "real", True, "same"),
    ("Sampler", lambda **kw: sampling.Sampler(**({"temperature": 0.7} | kw)), "top_k", 5,
     "int", False, "same"),
    ("Sampler", lambda **kw: sampling.Sampler(**({"temperature": 0.7} | kw)), "top_p", 0.5,
     "real", False, "same"),
    ("step_key", lambda **kw: sampling.step_key(jax.random.key(0), **({"t": 3} | kw)), "t", 3,
     "int", True, "same"),
    ("frequencies", lambda **kw: sampling.frequencies(
        np.zeros(4, np.float32), sampling.Sampler(1.0), key=0, **({"draws": 10} | kw)),
     "draws", 10, "int", False, None),
    ("draws_figure", lambda **kw: sampling.draws_figure(_rows(), **({"draws": 10} | kw)),
     "draws", 10, "int", False, None),
    ("draws_figure", lambda **kw: sampling.draws_figure(_rows(), **({"draws": 10} | kw)),
     "show", 3, "int", False, None),
    ("throughput_rows", lambda **kw: batching.throughput_rows(
        {"a": batching.Run([[1, 2]], 1, 1, [1])}, chip="x",
        **({"decode_s": 1e-3, "prefill_s": 1e-3} | kw)), "decode_s", 1e-3, "real", False,
     "same"),
    ("throughput_rows", lambda **kw: batching.throughput_rows(
        {"a": batching.Run([[1, 2]], 1, 1, [1])}, chip="x",
        **({"decode_s": 1e-3, "prefill_s": 1e-3} | kw)), "prefill_s", 1e-3, "real", False,
     "same"),
    ("step_counts", lambda **kw: costs.step_counts("decode", **({"batch": 1} | kw)), "batch", 1,
     "int", False, None),
    ("step_counts", lambda **kw: costs.step_counts("decode", **({"batch": 1} | kw)),
     "n_devices", 1, "int", False, None),
    ("step_counts", lambda **kw: costs.step_counts(
        "prefill", **({"batch": 1, "prompt_len": 16} | kw)), "prompt_len", 16, "int", False,
     None),
    ("collective_latency", lambda **kw: costs.collective_latency(_decode(), **kw), "hop_s",
     1e-6, "real", True, "same"),
    ("estimate_at", lambda **kw: costs.estimate_at(_line(), chip="h100-sxm",
                                                   **({"batch": 4} | kw)),
     "batch", 4, "real", False, "same"),
    ("step_args", lambda **kw: serving.step_args(
        step.server(CONFIG), **({"batch": 2, "length": 1, "max_len": 4} | kw)), "batch", 2,
     "int", False, "same"),
    ("step_args", lambda **kw: serving.step_args(
        step.server(CONFIG), **({"batch": 2, "length": 1, "max_len": 4} | kw)), "length", 1,
     "int", False, "same"),
    ("step_args", lambda **kw: serving.step_args(
        step.server(CONFIG), **({"batch": 2, "length": 1, "max_len": 4} | kw)), "max_len", 4,
     "int", False, "same"),
]

IDS = [f"{label}-{arg}" for label, _, arg, *_ in ARGS]


def _bad_values(kind: str, zero_ok: bool) -> list[Any]:
    values: list[Any] = [True, np.bool_(False), math.nan, math.inf, -math.inf, -1, "2",
                         [2], np.float64(math.nan), jnp.float32(math.inf)]
    if kind == "int":
        values += [2.0, np.float32(2.0), jnp.float32(2.0), 2.5, np.array([2, 3]), None]
    if not zero_ok:
        values += [0, np.int64(0), jnp.int32(0)] if kind == "int" else [0.0, jnp.float32(0.0)]
    return values


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    """Run in an empty directory and check nothing was written there."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("label", "call", "arg", "good", "kind", "zero_ok", "fast"), ARGS,
                         ids=IDS)
def test_every_numeric_argument_refuses_the_battery(label, call, arg, good, kind, zero_ok,
                                                    fast, empty_cwd):
    wrong = []
    for value in _bad_values(kind, zero_ok):
        if value is None and (arg in ("top_k", "eos_id", "top_p", "show", "prompt_len")
                              or (label, arg) == ("decode_collectives", "max_len")):
            continue  # None is these options' default
        if arg == "start" and isinstance(value, (list, np.ndarray)):
            continue  # one start per row is a valid start
        try:
            call(**{arg: value})
            wrong.append((value, "accepted"))
        except checks.InputError as error:
            if arg not in str(error):
                wrong.append((value, f"does not name {arg}: {error}"))
        except Exception as error:  # noqa: BLE001 - any other exception is a finding
            wrong.append((value, f"{type(error).__name__}: {error}"))
    assert not wrong, (label, arg, wrong)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, serving.Plan):
        return (a.sampler == b.sampler and a.steps == b.steps and a.eos_id == b.eos_id
                and a.pad_id == b.pad_id and a.max_len == b.max_len)
    if isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        return bool(np.array_equal(jax.random.key_data(a), jax.random.key_data(b)))
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        (x.shape, x.dtype) == (y.shape, y.dtype) if hasattr(x, "shape") else x == y
        for x, y in zip(leaves_a, leaves_b, strict=True))


@pytest.mark.parametrize(("label", "call", "arg", "good", "kind", "zero_ok", "fast"),
                         [a for a in ARGS if a[-1] is not None],
                         ids=[i for i, a in zip(IDS, ARGS, strict=True) if a[-1] is not None])
def test_numpy_and_jax_scalars_are_numbers(label, call, arg, good, kind, zero_ok, fast,
                                           empty_cwd):
    run = call if fast == "same" else fast
    want = run(**{arg: good})
    casts = ((np.int32, np.int64, jnp.int32, np.array) if kind == "int"
             else (np.float32, np.float64, jnp.float32, np.array))
    for cast in casts:
        value = cast(good)
        if kind == "real" and cast in (np.float32, jnp.float32):
            want_here = run(**{arg: float(np.float32(good))})
        else:
            want_here = want
        assert _same(run(**{arg: value}), want_here), (label, arg, cast)
    if zero_ok:
        run(**{arg: 0})  # 0 is valid here: greedy, token 0, step 0, no latency


@pytest.mark.slow
@pytest.mark.parametrize("cast", [np.int64, jnp.int32])
def test_compiling_entry_points_take_integer_scalars(cast):
    """The entry points that compile (not in the quick battery's valid half): a NumPy or
    JAX integer scalar gives the program a Python int gives."""
    want = serving.compiled_step(CONFIG, batch=2, length=1, max_len=4).as_text()
    got = serving.compiled_step(CONFIG, batch=cast(2), length=cast(1), max_len=cast(4))
    assert got.as_text() == want
    assert serving.decode_collectives(CONFIG, strategy="tp", n_devices=cast(2),
                                      batch=cast(2)) == serving.decode_collectives(
        CONFIG, strategy="tp", n_devices=2, batch=2)
    out = batching.serve(params(), [[1, 2], [3]], config=CONFIG, max_new_tokens=cast(2),
                         slots=cast(2), eos_id=cast(3))
    assert out == batching.serve(params(), [[1, 2], [3]], config=CONFIG, max_new_tokens=2,
                                 slots=2, eos_id=3)


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize("key", ["k", 1.5, True, np.float32(1), jnp.float32(1),
                                 np.zeros(3, np.uint32), jax.random.split(jax.random.key(0),
                                                                          (2, 2)),
                                 jax.random.split(jax.random.key(0), 3), [1, 2]],
                         ids=["str", "float", "bool", "np float", "jax float", "uint32[3]",
                              "2-D keys", "3 keys for 2 rows", "list"])
def test_every_bad_key_is_refused(key, empty_cwd):
    with pytest.raises(checks.InputError, match="key"):
        serving.plan(params(), PROMPT, config=CONFIG, steps=2, temperature=0.7, key=key)


def test_a_sampled_generation_without_a_key_is_refused():
    with pytest.raises(checks.InputError, match="key=jax.random.key"):
        serving.generate(params(), PROMPT, config=CONFIG, steps=2, temperature=0.7)


def test_integer_seeds_of_every_kind_are_the_same_key():
    want = jax.random.key_data(serving.plan(params(), PROMPT, config=CONFIG, steps=2,
                                            temperature=0.7, key=jax.random.key(3)).key)
    for seed in (3, np.int64(3), np.int32(3), jnp.int32(3), np.array(3)):
        got = serving.plan(params(), PROMPT, config=CONFIG, steps=2, temperature=0.7,
                           key=seed).key
        np.testing.assert_array_equal(jax.random.key_data(got), want)


# --------------------------------------------------------------------------- meshes

MESH_CALLS: list[tuple[str, Callable[..., Any]]] = [
    ("generate", lambda strategy, mesh: serving.generate(
        params(), PROMPT, config=CONFIG, steps=2, strategy=strategy, mesh=mesh)),
    ("serve", lambda strategy, mesh: batching.serve(
        params(), [[1, 2]], config=CONFIG, max_new_tokens=2, slots=2, strategy=strategy,
        mesh=mesh)),
    ("init_cache", lambda strategy, mesh: step.init_cache(
        CONFIG, batch=2, max_len=4, strategy=strategy, mesh=mesh)),
    ("compiled_step", lambda strategy, mesh: serving.compiled_step(
        CONFIG, batch=2, length=1, max_len=4, strategy=strategy, mesh=mesh)),
    ("server", lambda strategy, mesh: step.server(CONFIG, strategy=strategy, mesh=mesh)),
]


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("strategy", list(serving.SERVED))
@pytest.mark.parametrize(("label", "call"), MESH_CALLS, ids=[m[0] for m in MESH_CALLS])
def test_a_mesh_missing_the_strategys_axis_is_refused(label, call, strategy, explicit,
                                                      empty_cwd):
    """Each served strategy on a mesh whose axis has another name: a clear error naming the
    axis the strategy needs and the axes the mesh has, on Auto and on Explicit axes."""
    wrong = mesh_of(2, ("rows",), explicit=explicit)
    needs = serving.STRATEGIES[strategy].axes
    with pytest.raises(checks.InputError) as info:
        call(strategy, wrong)
    text = str(info.value)
    assert "mesh" in text and any(repr(a) in text for a in needs) and "'rows'" in text, text


def test_a_mesh_without_a_strategy_or_not_a_mesh_is_refused(empty_cwd):
    with pytest.raises(checks.InputError, match="without a strategy"):
        serving.generate(params(), PROMPT, config=CONFIG, steps=2, mesh=mesh_of(2, ("data",)))
    with pytest.raises(checks.InputTypeError, match="jax.sharding.Mesh"):
        serving.generate(params(), PROMPT, config=CONFIG, steps=2, strategy="dp",
                         mesh=[jax.devices()[:2]])
