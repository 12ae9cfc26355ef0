"""The one-device MLP of Part IV (spmd_guide.nn.mlp): init, predict, losses, SGD, exercises."""

from __future__ import annotations

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import nn
from spmd_guide.core import checks, hlo


def _numpy_predict(params, x):
    x = np.asarray(x, np.float64)
    for i, (w, b) in enumerate(params):
        x = x @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
        if i < len(params) - 1:
            x = np.maximum(x, 0.0)
    return x


SIZES = [16, 64, 64, 64, 16]  # the book's model (and test_strategies'): shared compilations
BATCH = 64


@pytest.fixture(scope="module")
def model():
    """Small params and a regression batch, shared so each shape compiles once."""
    params = nn.init_mlp(jax.random.key(0), SIZES)
    batch = nn.make_regression_batch(jax.random.key(1), BATCH, SIZES[0], SIZES[-1])
    return params, batch


def test_init_mlp_shapes_dtypes_and_zero_biases(model):
    params, _ = model
    assert [(w.shape, b.shape) for w, b in params] == [((a, b), (b,)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    assert all(w.dtype == jnp.float32 and b.dtype == jnp.float32 for w, b in params)
    assert all(not np.any(np.asarray(b)) for _, b in params)


def test_init_mlp_scales_weights_by_fan_in_and_follows_the_key(model):
    params, _ = model
    for w, _ in params[1:3]:  # 64 x 64: 4096 samples each
        assert float(np.std(np.asarray(w))) == pytest.approx(math.sqrt(2 / 64), rel=0.05)
    assert float(np.std(np.asarray(params[0][0]))) == pytest.approx(math.sqrt(2 / 16), rel=0.1)
    again = nn.init_mlp(jax.random.key(0), SIZES)
    other = nn.init_mlp(jax.random.key(2), SIZES)
    np.testing.assert_array_equal(params[1][0], again[1][0])
    assert not np.array_equal(params[1][0], other[1][0])


@pytest.mark.parametrize("sizes", [[3], [], [3, 0], [3, 2.5], [True, 2]])
def test_init_mlp_rejects_bad_layer_sizes(sizes):
    with pytest.raises(ValueError, match="layer_sizes"):
        nn.init_mlp(jax.random.key(0), sizes)


@jax.jit
def _everything(params, batch):
    """predict, layer_outputs and mlp_loss in one compiled program (one compile, not three)."""
    x, _ = batch
    return nn.predict(params, x), nn.layer_outputs(params, x), nn.mlp_loss(params, batch)


def test_predict_and_loss_match_a_numpy_reference(model):
    params, (x, y) = model
    expected = _numpy_predict(params, x)
    predicted, outputs, loss = _everything(params, (x, y))
    np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-5)
    assert [o.shape for o in outputs] == [(BATCH, n) for n in SIZES[1:]]
    np.testing.assert_allclose(outputs[-1], expected, rtol=1e-5, atol=1e-5)
    assert all(float(o.min()) >= 0 for o in outputs[:-1])  # ReLU between layers
    expected_loss = np.mean(np.sum((expected - np.asarray(y)) ** 2, axis=-1))
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)


def test_cross_entropy_matches_log_softmax_and_is_stable(model):
    params, (x, _) = model
    labels = jnp.arange(BATCH) % SIZES[-1]
    logits = np.asarray(_numpy_predict(params, x))
    log_probs = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    expected = -np.mean(log_probs[np.arange(BATCH), np.asarray(labels)])
    loss = jax.jit(nn.cross_entropy_loss)
    assert float(loss(params, (x, labels))) == pytest.approx(expected, rel=1e-5)
    huge = [(w * 1e4, b) for w, b in params]
    assert np.isfinite(float(loss(huge, (x, labels))))


def test_sgd_training_lowers_both_losses(model):
    params, batch = model
    step = nn.make_sgd_step(nn.mlp_loss, learning_rate=0.05)
    _, losses = nn.train(step, params, batch, steps=10)
    assert len(losses) == 10 and losses[-1] < 0.7 * losses[0]
    x, y = batch
    labels = jnp.argmax(y, axis=-1)
    ce_step = nn.make_sgd_step(nn.cross_entropy_loss, learning_rate=0.1)
    _, ce_losses = nn.train(ce_step, params, (x, labels), steps=10)
    assert ce_losses[-1] < ce_losses[0]


def test_sgd_update_is_plain_gradient_descent():
    params = [(jnp.ones((2, 2)), jnp.zeros(2))]
    grads = [(jnp.full((2, 2), 2.0), jnp.ones(2))]
    new = nn.sgd_update(params, grads, learning_rate=0.25)
    np.testing.assert_allclose(new[0][0], 0.5)
    np.testing.assert_allclose(new[0][1], -0.25)


def test_bad_training_options_raise():
    with pytest.raises(ValueError, match="learning_rate"):
        nn.make_sgd_step(nn.mlp_loss, learning_rate=0.0)
    step = nn.make_sgd_step(nn.mlp_loss, learning_rate=0.1)
    with pytest.raises(ValueError, match="steps"):
        nn.train(step, [], (None, None), steps=0)
    with pytest.raises(ValueError, match="batch_size"):
        nn.make_regression_batch(jax.random.key(0), 0, 4, 4)


def test_param_bytes_per_device_counts_shards():
    params = [(np.ones((8, 16), np.float32), np.ones(16, np.float32))]
    total = 8 * 16 * 4 + 16 * 4
    mesh = mesh_of(8)
    replicated = jax.device_put(params, NamedSharding(mesh, P()))
    split = jax.device_put(params, NamedSharding(mesh, P("x")))
    assert nn.param_bytes_per_device(replicated) == total
    assert nn.param_bytes_per_device(split) == total // 8


@jax.jit
def _predict_and_loss(params, batch):
    return nn.predict(params, batch[0]), nn.mlp_loss(params, batch)


@settings(max_examples=5, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    batch_size=st.integers(1, 6),
)
def test_predict_and_loss_are_shape_generic(sizes, batch_size):
    rng = np.random.default_rng(0)  # NumPy data: one compile per example, not one per random op
    params = [
        (rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=(b,)).astype(np.float32))
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    x = rng.normal(size=(batch_size, sizes[0])).astype(np.float32)
    y = rng.normal(size=(batch_size, sizes[-1])).astype(np.float32)
    out, loss = _predict_and_loss(params, (x, y))
    assert out.shape == (batch_size, sizes[-1])
    np.testing.assert_allclose(out, _numpy_predict(params, x), rtol=1e-4, atol=1e-4)
    assert np.isfinite(float(loss)) and float(loss) >= 0


# -- the model chapter's exercises ------------------------------------------------------


def _zeros_like(params):
    return [(np.zeros(w.shape, np.float32), np.zeros(b.shape, np.float32)) for w, b in params]


def test_exercise_zero_model_loss_is_mean_squared_target_norm(model):
    params, (x, y) = model
    zero_loss = float(_everything(_zeros_like(params), (x, y))[2])
    assert zero_loss == pytest.approx(float(np.mean(np.sum(np.asarray(y) ** 2, -1))), rel=1e-6)


def test_exercise_uniform_logits_give_log_of_class_count(model):
    params, (x, _) = model
    loss = jax.jit(nn.cross_entropy_loss)(_zeros_like(params), (x, jnp.arange(BATCH) % SIZES[-1]))
    assert float(loss) == pytest.approx(math.log(SIZES[-1]), rel=1e-6)


def test_exercise_he_scaling_keeps_activations_in_range_unit_scaling_does_not():
    sizes = [64] * 9
    x = np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32)
    he = nn.init_mlp(jax.random.key(0), sizes)
    unit = [(np.asarray(w) / np.std(np.asarray(w)), b) for w, b in he]
    rms = lambda a: float(np.sqrt(np.mean(np.asarray(a) ** 2)))  # noqa: E731
    outputs = jax.jit(nn.layer_outputs)
    he_rms = [rms(o) for o in outputs(he, x)[:-1]]
    unit_rms = [rms(o) for o in outputs(unit, x)[:-1]]
    assert 0.3 < min(he_rms) and max(he_rms) < 3
    assert unit_rms[-1] > 1e5


# --------------------------------------------------------------------------- bad input

@functools.cache
def _p():
    """The bad-input cases' parameters, made on first use (not at import, which both workers pay)."""
    return nn.init_mlp(jax.random.key(0), [4, 8, 1])


_X = np.ones((6, 4), np.float32)


@pytest.mark.parametrize(("call", "error", "word"), [
    # silent wrong answers before: a 1-D y broadcast to [B, B]; wider targets; labels
    (lambda: nn.mlp_loss(_p(), (_X, np.ones(6, np.float32))), checks.InputError, "shape (6, 1)"),
    (lambda: nn.mlp_loss(_p(), (_X, np.ones((6, 3), np.float32))), checks.InputError, "(6, 1)"),
    (lambda: nn.mlp_loss(_p(), {"x": _X, "y": _X}), checks.InputTypeError, "pair (x, y)"),
    (lambda: nn.mlp_loss(_p(), (np.ones((6, 5)), np.ones((6, 1)))), checks.InputError, "4 input"),
    (lambda: nn.predict(_p(), np.ones((6, 3))), checks.InputError, "4 input"),
    (lambda: nn.predict("params", _X), checks.InputTypeError, "(W, b) pairs"),
    (lambda: nn.predict([(np.ones((4, 8)), np.ones(7))], _X), checks.InputError, "b has 7"),
    (lambda: nn.cross_entropy_loss(_p3(), (_X, np.array([0, 1, 2, 3, 0, 1]))),
     checks.InputError, "class ids in [0, 3)"),
    (lambda: nn.cross_entropy_loss(_p3(), (_X, np.array([0, -1, 2, 0, 0, 1]))),
     checks.InputError, "class ids"),
    (lambda: nn.cross_entropy_loss(_p3(), (_X, np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]])),
     checks.InputError, "one-hot"),
    (lambda: nn.cross_entropy_loss(_p3(), (_X, np.zeros(6, np.float32))),
     checks.InputTypeError, "integer"),
    (lambda: nn.sgd_update(_p(), _p(), learning_rate=-0.1), checks.InputError, "positive"),
    (lambda: nn.make_sgd_step(nn.mlp_loss, learning_rate=float("inf")), checks.InputError, "finite"),
    (lambda: nn.make_sgd_step(nn.mlp_loss, learning_rate="0.1"), checks.InputTypeError, "real"),
    (lambda: nn.make_sgd_step(3, learning_rate=0.1), checks.InputTypeError, "function"),
    (lambda: nn.make_sgd_step(nn.mlp_loss, learning_rate=0.1, param_shardings=[1]),
     checks.InputTypeError, "Sharding"),
    (lambda: nn.init_mlp(jax.random.key(0), [4]), checks.InputError, "at least 2"),
    (lambda: nn.init_mlp(jax.random.key(0), [4, 0]), checks.InputError, "at least 1"),
    (lambda: nn.init_mlp(1.5, [4, 2]), checks.InputTypeError, "random key"),
    (lambda: nn.init_mlp(jax.random.split(jax.random.key(0)), [4, 2]), checks.InputError, "one key"),
    (lambda: nn.make_regression_batch(jax.random.key(0), 0, 4, 2), checks.InputError, "batch_size"),
    (lambda: nn.train(lambda p, b: (p, 0.0), _p(), (_X, _X), steps=0), checks.InputError, "steps"),
    (lambda: nn.param_bytes_per_device([(np.ones(2), np.ones(2))]), checks.InputTypeError, "jax.Array"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=re.escape(word)):
        call()


@functools.cache
def _p3():
    return nn.init_mlp(jax.random.key(0), [4, 8, 3])


def test_valid_inputs_that_used_to_fail():
    assert len(nn.init_mlp(0, np.array([4, 8]))) == 1  # an int seed and a NumPy array of sizes
    x, y = nn.make_regression_batch(1, np.int64(16), 4, 2)
    assert x.shape == (16, 4) and y.shape == (16, 2)
    step = nn.make_sgd_step(nn.mlp_loss, learning_rate=jnp.float32(0.01))
    assert step is nn.make_sgd_step(nn.mlp_loss, learning_rate=jnp.float32(0.01))  # cached


def test_traced_out_of_range_labels_give_nan_not_another_class():
    labels = jnp.array([0, 1, 2, 5, 0, 1])
    assert np.isnan(float(jax.jit(nn.cross_entropy_loss)(_p3(), (_X, labels))))


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 6), d_in=st.integers(1, 5), d_out=st.integers(1, 4),
       y_shape=st.sampled_from(["right", "1d", "wide", "rows"]))
def test_mlp_loss_is_the_numpy_loss_or_a_clear_error(batch, d_in, d_out, y_shape):
    params = nn.init_mlp(jax.random.key(1), [d_in, 3, d_out])
    x = np.linspace(-1, 1, batch * d_in, dtype=np.float32).reshape(batch, d_in)
    y_shapes = {"right": (batch, d_out), "1d": (batch,), "wide": (batch, d_out + 1),
                "rows": (batch + 1, d_out)}
    y = np.ones(y_shapes[y_shape], np.float32)
    if y_shape != "right":
        with pytest.raises(checks.InputError):
            nn.mlp_loss(params, (x, y))
        return
    h = np.maximum(x @ np.asarray(params[0][0]) + np.asarray(params[0][1]), 0)
    out = h @ np.asarray(params[1][0]) + np.asarray(params[1][1])
    expected = np.mean(np.sum((out - y) ** 2, axis=-1))
    assert float(nn.mlp_loss(params, (x, y))) == pytest.approx(expected, rel=1e-5)


def test_donation_aliases_the_parameters_and_deletes_the_old_arrays():
    params = jax.device_put(nn.init_mlp(jax.random.key(0), [4, 8, 2]), jax.devices()[0])
    batch = jax.device_put(nn.make_regression_batch(jax.random.key(1), 8, 4, 2), jax.devices()[0])
    keep = nn.make_sgd_step(nn.mlp_loss, learning_rate=0.1)
    donating = nn.make_sgd_step(nn.mlp_loss, learning_rate=0.1, donate=True)
    param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    assert hlo.memory_per_device(keep, params, batch).alias_bytes == 0
    assert hlo.memory_per_device(donating, params, batch).alias_bytes == param_bytes
    expected, _ = keep(params, batch)
    new, _ = donating(params, batch)
    assert params[0][0].is_deleted()
    np.testing.assert_allclose(np.asarray(new[0][0]), np.asarray(expected[0][0]))
    with pytest.raises(checks.InputTypeError, match="True or False"):
        nn.make_sgd_step(nn.mlp_loss, learning_rate=0.1, donate=1)
