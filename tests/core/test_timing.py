"""timing: warm-up excluded, results waited for, hardware named."""

import time

import jax
import jax.numpy as jnp
import pytest

from spmd_guide.core.timing import beyond_cores, ratio_words, reading, time_fn, timing_table


def test_counts_runs_and_names_the_hardware():
    calls = []

    def f(x):
        calls.append(1)
        return x + 1

    t = time_fn(f, jnp.ones(4), runs=5, warmup=2, label="add one")
    assert len(t.times) == 5 and len(calls) == 7
    assert t.device_kind == "cpu" and t.device_count == 1
    assert min(t.times) <= t.median <= max(t.times)
    assert "add one" in str(t) and "1 x cpu" in str(t)


def test_the_first_call_is_not_in_the_statistics():
    state = {"first": True}

    def slow_first(x):
        if state["first"]:
            state["first"] = False
            time.sleep(0.2)
        return x

    t = time_fn(slow_first, jnp.ones(2), runs=3)
    assert t.first_call >= 0.2 and max(t.times) < 0.2


def test_waits_for_the_result():
    x = jnp.ones((256, 256))
    t = time_fn(jax.jit(lambda a: a @ a @ a), x, runs=3)
    assert t.median > 0


def test_reports_the_devices_of_a_sharded_result(devices):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("x",), devices=devices)
    x = jax.device_put(jnp.ones(16), NamedSharding(mesh, P("x")))
    t = time_fn(jax.jit(lambda a: a * 2), x, runs=2)
    assert t.device_count == 8
    assert "<table>" in timing_table([t])


@pytest.mark.parametrize("kwargs", [{"runs": 0}, {"warmup": 0}])
def test_rejects_settings_that_would_mislead(kwargs):
    with pytest.raises(ValueError):
        time_fn(lambda x: x, jnp.ones(1), **kwargs)


@pytest.mark.parametrize("ratio, words", [
    (3.0, "ran 3.0 times faster sharded"),
    (1.25, "ran 1.2 times faster sharded"),
    (1.0, "about the same speed"),
    (0.9, "about the same speed"),
    (0.5, "ran 2.0 times slower sharded"),
])
def test_reading_claims_no_more_than_the_ratio(ratio, words):
    assert words in reading(ratio)
    assert ("faster" in reading(ratio)) == (ratio >= 1.2)
    caveat = beyond_cores([ratio, 1.0], cores=2)
    if ratio > 2:
        assert caveat.startswith("A ratio above 2,")
    else:
        assert caveat == ""
    assert beyond_cores([ratio], cores=None) == ""


@pytest.mark.parametrize("ratio, words", [
    (1.52, "1.52 times as long as"), (0.61, "only 0.61 of the time of"),
    (1.04, "about as long as (1.04 times)"), (0.95, "about as long as (0.95 times)"),
    (1.1, "about as long as (1.10 times)")])
def test_ratio_words_says_no_more_than_the_ratio(ratio, words):
    assert ratio_words(ratio) == words
    assert ratio_words(1.3, tolerance=1.5).startswith("about as long as")


def test_reading_refuses_nonsense():
    with pytest.raises(ValueError, match="positive"):
        reading(0.0)


# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402
from spmd_guide.core.timing import speedup  # noqa: E402

BAD_INPUT = [
    ("reading nan", lambda: reading(float("nan")), InputError, "finite"),
    ("reading inf", lambda: reading(float("inf")), InputError, "finite"),
    ("reading 0", lambda: reading(0), InputError, "positive"),
    ("reading str", lambda: reading("2"), InputTypeError, "real number"),
    ("cores 0", lambda: beyond_cores([1.5], cores=0), InputError, "cores"),
    ("cores float", lambda: beyond_cores([1.5], cores=2.5), InputTypeError, "integer"),
    ("ratios empty", lambda: beyond_cores([], cores=2), InputError, "empty"),
    ("ratios a number", lambda: beyond_cores(3.0, cores=2), InputTypeError, "list"),
    ("ratio nan", lambda: beyond_cores([float("nan")], cores=2), InputError, "finite"),
    ("runs 0", lambda: time_fn(jnp.sin, 1.0, runs=0), InputError, "runs"),
    ("warmup 0", lambda: time_fn(jnp.sin, 1.0, warmup=0), InputError, "compiles"),
    ("runs float", lambda: time_fn(jnp.sin, 1.0, runs=2.0), InputTypeError, "integer"),
    ("fn not callable", lambda: time_fn(3.0), InputTypeError, "function"),
    ("label not str", lambda: time_fn(jnp.sin, 1.0, runs=1, label=3), InputTypeError, "label"),
    ("table of floats", lambda: timing_table([1.0]), InputTypeError, "Timing"),
    ("table empty", lambda: timing_table([]), InputTypeError, "non-empty"),
    ("ratio_words 0", lambda: ratio_words(0.0), InputError, "positive"),
    ("ratio_words tolerance", lambda: ratio_words(1.0, tolerance=0.5), InputError, "at least 1"),
    ("speedup of floats", lambda: speedup(1.0, 2.0), InputTypeError, "Timing"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_beyond_cores_takes_any_iterable_of_ratios():
    assert beyond_cores((r for r in [1.5, 3.0]), cores=2).startswith("A ratio above 2")
    assert beyond_cores([1.5], cores=None) == ""
