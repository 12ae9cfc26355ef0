"""lm: the one-device transformer, its parameters, its task and its training loop."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_guide.transformer import lm
from spmd_guide.transformer.lm import Config, init_params, lm_loss

CONFIG = Config(vocab=16, d_model=16, n_heads=8, d_ff=32, n_layers=1, seq_len=16)


def test_counting_task_is_learnable_rule():
    tokens = lm.counting_task(jax.random.key(3), batch=4, config=CONFIG)
    diffs = np.diff(np.asarray(tokens), axis=1) % CONFIG.vocab
    assert (diffs == diffs[:, :1]).all() and set(diffs[:, 0]) <= {1, 2, 3}


@pytest.mark.slow  # a compile per drawn config
@settings(max_examples=8, deadline=None)
@given(heads=st.sampled_from([1, 2, 4]), head_dim=st.integers(1, 6), layers=st.integers(1, 3),
       vocab=st.integers(2, 40), d_ff=st.integers(1, 24), seq_len=st.integers(1, 12))
def test_init_params_has_the_shapes_and_scale_the_config_names(heads, head_dim, layers, vocab,
                                                              d_ff, seq_len):
    config = Config(vocab=vocab, d_model=heads * head_dim, n_heads=heads, d_ff=d_ff,
                    n_layers=layers, seq_len=seq_len)
    params = init_params(jax.random.key(0), config)
    d = config.d_model
    assert params["embed"].shape == (vocab, d) and params["pos"].shape == (seq_len, d)
    assert params["unembed"].shape == (d, vocab) and len(params["blocks"]) == layers
    block = params["blocks"][-1]
    assert block["wq"].shape == (d, heads, head_dim) and block["wo"].shape == (heads, head_dim, d)
    assert block["w_up"].shape == (d, d_ff) and block["w_down"].shape == (d_ff, d)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    n = sum(x.size for x in jax.tree.leaves(params))
    assert lm.param_count(params) == n
    # Norm scales start at one; every weight is a different draw.
    assert all(float(np.min(b["norm1"])) == 1.0 for b in params["blocks"])
    assert not np.allclose(block["wq"], block["wk"])


def test_init_params_scales_by_fan_in_and_is_deterministic():
    config = Config(vocab=64, d_model=64, n_heads=4, d_ff=256, n_layers=2, seq_len=32)
    params = init_params(jax.random.key(0), config)
    block = params["blocks"][0]
    assert float(np.std(block["w_up"])) == pytest.approx(1 / math.sqrt(64), rel=0.1)
    assert float(np.std(block["w_down"])) == pytest.approx(1 / math.sqrt(256), rel=0.1)
    assert float(np.std(params["embed"])) == pytest.approx(1, rel=0.1)
    again = init_params(jax.random.key(0), config)
    other = init_params(jax.random.key(1), config)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                     jax.tree.leaves(again), strict=True))
    assert not np.allclose(params["embed"], other["embed"])
    half = init_params(jax.random.key(0), Config(vocab=8, d_model=8, n_heads=2, d_ff=8,
                                                 n_layers=1, seq_len=4, dtype="bfloat16"))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(half))


@pytest.mark.slow
def test_loss_starts_near_log_vocab():
    params = init_params(jax.random.key(0), CONFIG)
    tokens = lm.counting_task(jax.random.key(1), batch=8, config=CONFIG)
    assert tokens.shape == (8, CONFIG.seq_len + 1) and tokens.dtype == jnp.int32
    loss = float(jax.jit(lm_loss, static_argnames="config")(params, tokens, config=CONFIG))
    assert abs(loss - math.log(CONFIG.vocab)) < 1.0


@pytest.mark.slow
def test_training_on_one_device_learns_the_counting_rule():
    losses = lm.train_one_device(jax.random.key(2), CONFIG, steps=150, batch=16)
    assert len(losses) == 150 and losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("call, error, word", [
    (lambda: lm_loss(init_params(jax.random.key(0), CONFIG),
                     jnp.zeros((2, CONFIG.seq_len), jnp.int32), config=CONFIG),
     ValueError, "seq_len"),
    (lambda: lm_loss(init_params(jax.random.key(0), CONFIG),
                     jnp.zeros((2, CONFIG.seq_len + 1)), config=CONFIG), TypeError, "integer"),
    (lambda: Config(d_model=10, n_heads=4), ValueError, "n_heads"),
    (lambda: Config(n_layers=0), ValueError, "n_layers"),
    (lambda: init_params(jax.random.key(0), {"vocab": 3}), TypeError, "Config"),
    (lambda: init_params(0.5, CONFIG), TypeError, "key"),
    (lambda: lm.counting_task(jax.random.key(0), batch=0, config=CONFIG), ValueError, "batch"),
    (lambda: lm.optimizer(-1.0), ValueError, "learning_rate"),
    (lambda: lm.train_one_device(jax.random.key(0), CONFIG, steps=0, batch=2), ValueError,
     "steps"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_against_uniform_places_a_loss_beside_log_vocab():
    assert lm.against_uniform(3.97, 32) == "above the 3.47 nats of a uniform guess"
    assert lm.against_uniform(0.08, 32) == "below the 3.47 nats of a uniform guess"
    assert lm.against_uniform(math.log(32), 32) == "at the 3.47 nats of a uniform guess"
    with pytest.raises(ValueError, match="vocab"):
        lm.against_uniform(1.0, 0)


def test_untrained_model_starts_above_a_uniform_guess():
    """model.md's caption: the random initial logits cost more than an even guess."""
    config = Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=16)
    params = init_params(jax.random.key(0), config)
    tokens = lm.counting_task(jax.random.key(1), batch=16, config=config)
    loss = float(jax.jit(lm_loss, static_argnames="config")(params, tokens, config=config))
    assert lm.against_uniform(loss, config.vocab).startswith("above")
