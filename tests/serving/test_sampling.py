"""Choosing the next token: the restricted distribution against a NumPy reference, draws
against that distribution (a chi-square bound, fixed seed), top-k = 1 is greedy, and clear
errors for every bad option."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spmd_guide.core import checks
from spmd_guide.serving import sampling

LOGITS = np.random.default_rng(0).normal(0, 2, (3, 24)).astype(np.float32)


def chi2_999(dof: int) -> float:
    """The 99.9th percentile of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty,
    within a percent here): a draw from the right distribution stays below it 999 times in
    1000, and the seed is fixed."""
    a = 2 / (9 * dof)
    return dof * (1 - a + 3.0902 * np.sqrt(a)) ** 3


def reference(logits, temperature, top_k=None, top_p=None):
    """The distribution in NumPy, the definition written out: softmax of logits/T, the top k,
    then the smallest set (likeliest first) whose probability reaches top_p."""
    p = np.exp(logits / temperature - np.max(logits / temperature))
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, bool)
    keep[order[:top_k or len(p)]] = True
    if top_p is not None:
        q = np.where(keep, p, 0)
        q /= q.sum()
        mass = 0.0
        nucleus = np.zeros_like(keep)
        for i in order:
            if keep[i] and mass < top_p:
                nucleus[i] = True
                mass += q[i]
        keep = nucleus
    p = np.where(keep, p, 0)
    return p / p.sum()


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, None, None), (0.5, None, None), (2.0, 5, None), (1.0, None, 0.7),
    (1.0, 8, 0.5), (0.7, 1, None), (1.0, None, 0.01), (1.0, 24, 1.0)])
def test_probabilities_match_the_definition(temperature, top_k, top_p):
    chosen = sampling.sampler(temperature=temperature, top_k=top_k, top_p=top_p, key=0,
                              vocab=24)
    got = np.asarray(sampling.probabilities(LOGITS, chosen))
    for row, want in zip(got, LOGITS, strict=True):
        np.testing.assert_allclose(row, reference(want, temperature, top_k, top_p), atol=1e-6)


def test_draws_follow_the_distribution():
    """8,000 draws from each of three samplers: Pearson's chi-square against the distribution
    stays below its 99.9th percentile, and no draw lands outside the kept set."""
    for options in ({"temperature": 1.0}, {"temperature": 0.8, "top_k": 6},
                    {"temperature": 1.5, "top_p": 0.6}):
        chosen = sampling.sampler(**options, key=0, vocab=24)
        probs = np.asarray(sampling.probabilities(LOGITS[0], chosen))
        freq = sampling.frequencies(LOGITS[0], chosen, key=jax.random.key(7), draws=8000)
        stat, dof = sampling.chi_square(freq * 8000, probs)
        assert stat < chi2_999(dof), (options, stat, dof)
        assert not freq[probs == 0].any()


def test_top_k_one_and_greedy_are_the_argmax():
    logits = jnp.asarray(LOGITS)
    best = np.argmax(LOGITS, axis=-1)
    one = sampling.sampler(temperature=1.3, top_k=1, key=0, vocab=24)
    for seed in range(3):
        np.testing.assert_array_equal(
            np.asarray(sampling.sample(logits, jax.random.key(seed), one)), best)
    np.testing.assert_array_equal(
        np.asarray(sampling.sample(logits, jax.random.key(0), sampling.GREEDY)), best)


def test_same_key_same_draw_and_step_keys_differ():
    chosen = sampling.sampler(temperature=1.0, key=0, vocab=24)
    a = sampling.sample(jnp.asarray(LOGITS), sampling.step_key(jax.random.key(1), 3), chosen)
    b = sampling.sample(jnp.asarray(LOGITS), sampling.step_key(jax.random.key(1), 3), chosen)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    draws = {tuple(np.asarray(sampling.sample(
        jnp.asarray(LOGITS), sampling.step_key(jax.random.key(1), t), chosen))) for t in range(6)}
    assert len(draws) > 1


def test_chi_square_flags_a_draw_outside_the_support():
    assert sampling.chi_square([1, 1], [1.0, 0.0])[0] == np.inf
    assert sampling.chi_square([5, 5], [0.5, 0.5]) == (0.0, 1)


@pytest.mark.parametrize(("options", "error", "words"), [
    ({"temperature": -0.1}, checks.InputError, "at least 0"),
    ({"temperature": float("nan")}, checks.InputError, "finite"),
    ({"temperature": "hot"}, checks.InputTypeError, "real number"),
    ({"temperature": 1.0, "key": None}, checks.InputError, "needs a random key"),
    ({"top_k": 0}, checks.InputError, "top_k must be at least 1"),
    ({"top_k": 25}, checks.InputError, "top_k must be at most 24"),
    ({"top_k": 2.5}, checks.InputTypeError, "top_k must be an integer"),
    ({"top_p": 0.0}, checks.InputError, "(0, 1]"),
    ({"top_p": -0.5}, checks.InputError, "(0, 1]"),
    ({"top_p": 1.5}, checks.InputError, "at most 1.0"),
    ({"top_p": "0.9"}, checks.InputTypeError, "real number"),
])
def test_bad_options_are_refused(options, error, words):
    options = {"temperature": 1.0, "key": 0} | options
    with pytest.raises(error) as info:
        sampling.sampler(**options, vocab=24)
    assert words in str(info.value)


def test_frequencies_refuses_bad_input():
    chosen = sampling.sampler(temperature=1.0, key=0, vocab=24)
    with pytest.raises(checks.InputError, match="temperature > 0"):
        sampling.frequencies(LOGITS[0], sampling.GREEDY, key=0, draws=10)
    with pytest.raises(checks.InputError, match="1 dimension"):
        sampling.frequencies(LOGITS, chosen, key=0, draws=10)
    with pytest.raises(checks.InputError, match="draws must be at least 1"):
        sampling.frequencies(LOGITS[0], chosen, key=0, draws=0)
    with pytest.raises(checks.InputTypeError, match="random key"):
        sampling.frequencies(LOGITS[0], chosen, key="k", draws=10)


@pytest.mark.slow
def test_exercise_answers():
    # 1. Temperature 0.01: one-hot on the argmax.
    cold = np.asarray(sampling.probabilities(LOGITS, sampling.Sampler(0.01)))
    np.testing.assert_allclose(cold, np.eye(24)[np.argmax(LOGITS, -1)], atol=1e-4)
    # 2. Top-p over 0.4, 0.3, 0.2, 0.1.
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32))
    half = np.asarray(sampling.probabilities(logits, sampling.Sampler(1.0, top_p=0.5)))
    np.testing.assert_allclose(half, [4 / 7, 3 / 7, 0, 0], atol=1e-6)
    most = np.asarray(sampling.probabilities(logits, sampling.Sampler(1.0, top_p=0.75)))
    np.testing.assert_allclose(most, [4 / 9, 3 / 9, 2 / 9, 0], atol=1e-6)
    # 3. Eight devices each keeping their own top-2 of 8 logits: 16 candidates.
    row = np.random.default_rng(1).normal(size=64).astype(np.float32)
    local = {i * 8 + j for i in range(8) for j in np.argsort(-row[i * 8:(i + 1) * 8])[:2]}
    assert len(local) == 16 and not local <= set(np.argsort(-row)[:2])


def test_draws_figure_has_alt_text_and_readable_text():
    from spmd_guide.core import drawing

    samplers = {"t 1": sampling.Sampler(1.0), "top-k 3": sampling.Sampler(1.0, top_k=3)}
    rows = sampling.draw_rows(LOGITS[0], samplers, key=1, draws=500)
    fig = sampling.draws_figure(rows, draws=500, show=6)
    assert "500 draws" in fig.alt and "t 1; top-k 3" in fig.alt
    assert drawing.smallest_text_pt(fig) >= 8.5
    assert len(fig.axes) == 2
    with pytest.raises(checks.InputTypeError, match="Sampler"):
        sampling.draw_rows(LOGITS[0], {"x": 1.0}, key=1, draws=5)
    with pytest.raises(checks.InputTypeError, match="draw_rows"):
        sampling.draws_figure({}, draws=5)


# --------------------------------------------------------------------------- turn-5 audit E


@pytest.mark.parametrize("temperature", [1e-39, 1e-40, 1e-45, 5e-324])
def test_subnormal_temperatures_are_refused_everywhere(temperature):
    """float32-subnormal temperatures are flushed to 0 by XLA:CPU (0/0 = NaN): refused by
    sampler(), by a directly built Sampler, and so by generate (test_guards)."""
    with pytest.raises(checks.InputError, match="smallest normal"):
        sampling.sampler(temperature=temperature, key=0, vocab=24)
    with pytest.raises(checks.InputError, match="temperature=0 for greedy"):
        sampling.Sampler(temperature)


@pytest.mark.parametrize("temperature", [sampling.MIN_TEMPERATURE, 1e-37, 1e-30, 1e-6])
def test_tiny_temperatures_draw_the_argmax(temperature):
    """Shifted before the division, no quotient overflows: every accepted temperature near 0
    gives one-hot probabilities on the argmax and draws it (review S7: logits 40 and 5)."""
    logits = np.array([[-1.0, 3.0, 5.0, 4.9], [40.0, -40.0, 0.0, 39.0]], np.float32)
    for top in ({}, {"top_p": 0.9}, {"top_k": 2}):
        chosen = sampling.Sampler(temperature, **top)
        probs = np.asarray(sampling.probabilities(logits, chosen))
        np.testing.assert_array_equal(probs, np.eye(4)[[2, 0]])
        for seed in range(2):
            np.testing.assert_array_equal(
                np.asarray(sampling.sample(logits, jax.random.key(seed), chosen)), [2, 0])


@pytest.mark.parametrize(("fields", "error", "words"), [
    ((-1.0,), checks.InputError, "temperature must be at least 0"),
    ((float("nan"),), checks.InputError, "finite"),
    ((float("inf"),), checks.InputError, "finite"),
    ((True,), checks.InputTypeError, "real number"),
    (("1",), checks.InputTypeError, "real number"),
    ((1.0, 0), checks.InputError, "top_k must be at least 1"),
    ((1.0, 2.0), checks.InputTypeError, "top_k must be an integer"),
    ((1.0, True), checks.InputTypeError, "top_k must be an integer"),
    ((1.0, None, 0.0), checks.InputError, "(0, 1]"),
    ((1.0, None, 1.5), checks.InputError, "at most 1.0"),
    ((1.0, None, float("nan")), checks.InputError, "finite"),
])
def test_a_directly_built_sampler_checks_its_fields(fields, error, words):
    with pytest.raises(error) as info:
        sampling.Sampler(*fields)
    assert words in str(info.value)


def test_sampler_fields_are_normalised():
    assert sampling.Sampler(1.0, top_p=1.0).top_p is None  # no cut, as sampler() gives
    assert sampling.Sampler(np.float32(0.5), np.int64(3)) == sampling.Sampler(0.5, 3)
    assert hash(sampling.Sampler(jnp.float32(0.5), jnp.int32(3))) == hash(
        sampling.Sampler(0.5, 3))


def test_restrict_probabilities_and_sample_refuse_bad_input():
    with pytest.raises(checks.InputError, match="temperature > 0"):
        sampling.restrict(LOGITS, sampling.GREEDY)
    with pytest.raises(checks.InputTypeError, match="a Sampler"):
        sampling.restrict(LOGITS, 0.7)
    with pytest.raises(checks.InputTypeError, match="a Sampler"):
        sampling.probabilities(LOGITS, None)
    with pytest.raises(checks.InputError, match="top_k must be at most 24"):
        sampling.restrict(LOGITS, sampling.Sampler(1.0, top_k=30))
    with pytest.raises(checks.InputError, match="finite"):
        sampling.probabilities(np.array([1.0, np.nan]), sampling.Sampler(1.0))
    with pytest.raises(checks.InputError, match="finite"):
        sampling.probabilities(np.array([1.0, np.inf]), sampling.GREEDY)
    with pytest.raises(checks.InputTypeError, match="floating"):
        sampling.sample(np.array([[1, 2]]), jax.random.key(0), sampling.Sampler(1.0))
    with pytest.raises(checks.InputTypeError, match="random key"):
        sampling.sample(LOGITS, "k", sampling.Sampler(1.0))


@pytest.mark.parametrize(("t", "error"), [
    ("3", checks.InputTypeError), (1.0, checks.InputTypeError), (True, checks.InputTypeError),
    (-1, checks.InputError), (None, checks.InputTypeError)])
def test_step_key_refuses_a_bad_step(t, error):
    with pytest.raises(error, match="t must be"):
        sampling.step_key(jax.random.key(0), t)


def test_step_key_takes_integer_scalars_and_traced_steps():
    key = jax.random.key(1)
    want = jax.random.key_data(jax.random.fold_in(key, 3))
    for t in (3, np.int32(3), jnp.int32(3), np.array(3)):
        np.testing.assert_array_equal(jax.random.key_data(sampling.step_key(key, t)), want)
    traced = jax.jit(lambda t: jax.random.key_data(sampling.step_key(key, t)))(np.int32(3))
    np.testing.assert_array_equal(traced, want)
    with pytest.raises(checks.InputTypeError, match="random key"):
        sampling.step_key("key", 3)


@pytest.mark.parametrize(("counts", "probs", "words"), [
    ([1, 2, 3], [0.0, 0.0, 0.0], "probs must be a distribution"),
    ([1, 2, 3], [0.5, 0.5, 0.8], "probs must be a distribution"),
    ([1, 2, 3], [1.2, -0.1, -0.1], "probs must be a distribution"),
    ([1, 2, 3], [np.nan, 0.5, 0.5], "probs must be a distribution"),
    ([-1, 2, 3], [0.2, 0.3, 0.5], "counts must be"),
    ([0, 0, 0], [0.2, 0.3, 0.5], "counts must be"),
    ([np.inf, 2, 3], [0.2, 0.3, 0.5], "counts must be"),
    ([1, 2], [0.2, 0.3, 0.5], "shape"),
    ([[1, 2, 3]], [0.2, 0.3, 0.5], "1 dimension"),
])
def test_chi_square_refuses_what_is_not_counts_and_a_distribution(counts, probs, words):
    with pytest.raises(checks.InputError) as info:
        sampling.chi_square(counts, probs)
    assert words in str(info.value)


def test_chi_square_of_exact_counts_is_zero():
    stat, dof = sampling.chi_square([20, 30, 50, 0], [0.2, 0.3, 0.5, 0.0])
    assert stat == pytest.approx(0) and dof == 2
    assert sampling.chi_square([20, 30, 49, 1], [0.2, 0.3, 0.5, 0.0])[0] == float("inf")


def test_draws_figure_default_fits_a_small_vocabulary_and_checks_its_inputs():
    logits = LOGITS[0, :8]
    rows = sampling.draw_rows(logits, {"t 1": sampling.Sampler(1.0)}, key=1, draws=200)
    fig = sampling.draws_figure(rows, draws=200)  # default show: all 8 tokens, not 12
    assert "each of the 8 likeliest" in fig.alt
    assert len(fig.axes[0].patches) == 8
    for bad, error, words in (
            ({"draws": -5}, checks.InputError, "draws must be at least 1"),
            ({"draws": 2.5}, checks.InputTypeError, "draws must be an integer"),
            ({"draws": 200, "show": 9}, checks.InputError, "show must be at most 8"),
            ({"draws": 200, "show": 0}, checks.InputError, "show must be at least 1")):
        with pytest.raises(error, match=words):
            sampling.draws_figure(rows, **bad)
    for rows_, words in (({"a": 1}, "not such a pair"),
                         ({"a": (np.ones(3), np.ones(4))}, "not one vocabulary"),
                         ({"a": (np.ones(3), "x")}, "must be an array")):
        with pytest.raises(checks.InputError, match=words):
            sampling.draws_figure(rows_, draws=5)


def test_sampled_noise_depends_on_the_row_index():
    """The summary's caveat (review S2): the same logits in every row of a batch, one key,
    give different draws in different rows: a sampled request's tokens depend on its row."""
    rows = np.broadcast_to(LOGITS[0], (8, 24))
    tokens = np.asarray(sampling.sample(rows, jax.random.key(5), sampling.Sampler(1.0)))
    assert len(set(tokens.tolist())) > 1, tokens
