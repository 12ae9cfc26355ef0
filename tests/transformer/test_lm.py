"""lm: the one-device transformer, its parameters, its task and its training loop."""

from __future__ import annotations

import functools
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


@functools.cache
def _params(config=CONFIG):
    return init_params(jax.random.key(0), config)


def _tokens(value=0, batch=2, length=CONFIG.seq_len + 1):
    return jnp.full((batch, length), value, jnp.int32)


WIDE = Config(vocab=32, d_model=16, n_heads=8, d_ff=32, n_layers=1, seq_len=16)


# Each row: a call with one bad argument, the error class, and words the message must hold
# (the argument's name, the value, the rule). The first rows are the silent wrong answers
# of issue #27: before the checks, each returned numbers.
BAD = {
    "forward: token id 99": (lambda: lm.forward(_params(), _tokens(99, length=16)),
                             ValueError, "token id 99.*\\[0, 16\\)"),
    "forward: token id -3": (lambda: lm.forward(_params(), _tokens(-3, length=16)),
                             ValueError, "token id -3"),
    "forward: 40 tokens for seq_len 16": (lambda: lm.forward(_params(), _tokens(length=40)),
                                          ValueError, "40 positions.*16"),
    "check_tokens: id 99": (lambda: lm.check_tokens(_tokens(99), CONFIG), ValueError,
                            "tokens holds token id 99"),
    "check_tokens: NumPy id -1": (lambda: lm.check_tokens(np.full((2, 17), -1), CONFIG),
                                  ValueError, "-1"),
    "lm_loss: params for vocab 32, Config(vocab=8)": (
        lambda: lm_loss(_params(WIDE), _tokens(), config=Config(
            vocab=8, d_model=16, n_heads=8, d_ff=32, n_layers=1, seq_len=16)),
        ValueError, "made for vocab 32, but config says vocab 8"),
    "lm_loss: params for 1 layer, config for 2": (
        lambda: lm_loss(_params(), _tokens(), config=Config(
            vocab=16, d_model=16, n_heads=8, d_ff=32, n_layers=2, seq_len=16)),
        ValueError, "n_layers 1.*n_layers 2"),
    "lm_loss: tokens one short": (lambda: lm_loss(_params(), _tokens(length=16), config=CONFIG),
                                  ValueError, "seq_len"),
    "lm_loss: float tokens": (lambda: lm_loss(_params(), jnp.zeros((2, 17)), config=CONFIG),
                              TypeError, "integer"),
    "lm_loss: empty batch": (lambda: lm_loss(_params(), _tokens(batch=0), config=CONFIG),
                             ValueError, "empty"),
    "lm_loss: config a dict": (lambda: lm_loss(_params(), _tokens(), config={"vocab": 16}),
                               TypeError, "Config"),
    "forward: params missing a leaf": (
        lambda: lm.forward({k: v for k, v in _params().items() if k != "pos"}, _tokens(
            length=16)), ValueError, "pos"),
    "forward: a leaf of the wrong shape": (
        lambda: lm.forward(_params() | {"unembed": jnp.zeros((16, 5))}, _tokens(length=16)),
        ValueError, "unembed.*\\(16, 5\\).*\\(16, 16\\)"),
    "forward: params a list": (lambda: lm.forward([1], _tokens(length=16)), TypeError,
                               "params"),
    "forward: 1-D inputs": (lambda: lm.forward(_params(), jnp.zeros(16, jnp.int32)), ValueError,
                            "inputs must have 2"),
    "forward: position 16": (lambda: lm.forward(_params(), _tokens(length=16),
                                                positions=np.arange(16) + 1),
                             ValueError, "position 16"),
    "forward: positions too short": (lambda: lm.forward(_params(), _tokens(length=16),
                                                        positions=np.arange(8)),
                                     ValueError, "positions has shape"),
    "forward: constrain not callable": (lambda: lm.forward(_params(), _tokens(length=16),
                                                           constrain=3), TypeError,
                                        "constrain"),
    "cross_entropy: target 7 of 5": (lambda: lm.cross_entropy(jnp.zeros((2, 3, 5)),
                                                               _tokens(7, length=3)),
                                     ValueError, "targets holds token id 7"),
    "cross_entropy: shapes": (lambda: lm.cross_entropy(jnp.zeros((2, 3, 5)), _tokens(
        length=4)), ValueError, "targets has shape"),
    "Config: d_model into heads": (lambda: Config(d_model=10, n_heads=4), ValueError,
                                   "n_heads"),
    "Config: 0 layers": (lambda: Config(n_layers=0), ValueError, "n_layers"),
    "Config: vocab 2.5": (lambda: Config(vocab=2.5), TypeError, "vocab"),
    "Config: vocab '8'": (lambda: Config(vocab="8"), TypeError, "vocab"),
    "Config: vocab True": (lambda: Config(vocab=True), TypeError, "vocab"),
    "Config: dtype int32": (lambda: Config(dtype="int32"), TypeError, "floating"),
    "Config: dtype nonsense": (lambda: Config(dtype="float33"), TypeError, "dtype"),
    "init_params: config a dict": (lambda: init_params(jax.random.key(0), {"vocab": 3}),
                                   TypeError, "Config"),
    "init_params: key 0.5": (lambda: init_params(0.5, CONFIG), TypeError, "key"),
    "param_shapes: config None": (lambda: lm.param_shapes(None), TypeError, "Config"),
    "counting_task: batch 0": (lambda: lm.counting_task(jax.random.key(0), batch=0,
                                                        config=CONFIG), ValueError, "batch"),
    "counting_task: stride 0": (lambda: lm.counting_task(jax.random.key(0), batch=2,
                                                         config=CONFIG, strides=(0, 1)),
                                ValueError, "strides"),
    "counting_task: config None": (lambda: lm.counting_task(jax.random.key(0), batch=2,
                                                            config=None), TypeError, "Config"),
    "optimizer: learning rate -1": (lambda: lm.optimizer(-1.0), ValueError, "learning_rate"),
    "optimizer: weight decay -1": (lambda: lm.optimizer(weight_decay=-1.0), ValueError,
                                   "weight_decay"),
    "train_one_device: 0 steps": (lambda: lm.train_one_device(jax.random.key(0), CONFIG,
                                                              steps=0, batch=2),
                                  ValueError, "steps"),
    "train_one_device: batch 0": (lambda: lm.train_one_device(jax.random.key(0), CONFIG,
                                                              steps=1, batch=0),
                                  ValueError, "batch"),
    "train_one_device: learning rate nan": (
        lambda: lm.train_one_device(jax.random.key(0), CONFIG, steps=1, batch=2,
                                    learning_rate=float("nan")), ValueError, "learning_rate"),
    "param_count: None": (lambda: lm.param_count(None), ValueError, "params"),
    "against_uniform: vocab 0": (lambda: lm.against_uniform(1.0, 0), ValueError, "vocab"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_a_clear_error(case):
    call, error, words = BAD[case]
    with pytest.raises(error, match=words):
        call()


def test_good_values_in_numpy_types_are_accepted():
    config = Config(vocab=np.int64(16), d_model=np.int32(16), n_heads=8, d_ff=32, n_layers=1,
                    seq_len=16, dtype=np.float32)
    assert config == CONFIG and type(config.vocab) is int and config.dtype == "float32"
    tokens = lm.counting_task(np.int64(1), batch=np.int32(2), config=config,
                              strides=np.array([1, 2]))
    assert tokens.shape == (2, 17)
    assert lm.check_tokens(np.asarray(tokens), config).shape == (2, 17)  # NumPy tokens too
    # eval_shape runs every check on the concrete NumPy arguments, and compiles nothing
    params = _params()   # outside the trace: _params is cached, and must not cache tracers
    out = jax.eval_shape(lambda: lm.forward(params, np.asarray(tokens)[:, :-1],
                                            positions=np.arange(16, dtype=np.int64)))
    assert out.shape == (2, 16, 16)


def test_checks_cost_nothing_inside_jit_but_shapes_still_count():
    """Under jit the token values do not exist yet: only the shape and dtype are checked (a
    concrete array closed over by the traced function is still checked)."""
    params = _params()
    loss = jax.jit(functools.partial(lm_loss, config=CONFIG))
    assert np.isfinite(float(loss(params, _tokens(3))))
    with pytest.raises(ValueError, match="seq_len"):
        loss(params, _tokens(length=16))
    bad = _tokens(99)
    with pytest.raises(ValueError, match="token id 99"):
        jax.jit(lambda p: lm_loss(p, bad, config=CONFIG))(params)
    jaxpr = jax.make_jaxpr(loss)(params, _tokens(3))
    assert "reduce_min" not in str(jaxpr)  # no value check staged into the program


def test_params_are_checked_against_the_config_by_shape_only():
    shapes = jax.eval_shape(lambda: _params())
    assert lm.check_params(shapes, CONFIG) is shapes  # ShapeDtypeStructs work
    assert lm.config_of(_params()) == CONFIG
    assert jax.tree.map(lambda x: x.shape, _params()) == jax.tree.map(
        lambda s: s, lm.param_shapes(CONFIG), is_leaf=lambda x: isinstance(x, tuple))


def test_counting_task_loss_floor_is_the_first_predictions_entropy():
    """counting_task's docstring: only the first prediction is uncertain, one of
    len(strides) tokens, so the best loss is log(len(strides)) / seq_len."""
    tokens = np.asarray(lm.counting_task(jax.random.key(4), batch=64, config=CONFIG))
    steps = np.diff(tokens, axis=1) % CONFIG.vocab
    assert (steps == steps[:, :1]).all()  # after the first target every token follows
    best = math.log(3) / CONFIG.seq_len
    assert best == pytest.approx(0.0687, abs=1e-4)


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


def test_the_model_nests_inside_other_programs():
    """init_params, counting_task and lm_loss are called inside jit, eval_shape and scan by
    other Parts (checkpointing traces init_params): none may carry compile-only options."""
    shapes = jax.eval_shape(functools.partial(init_params, config=CONFIG), jax.random.key(0))
    assert shapes["embed"].shape == (CONFIG.vocab, CONFIG.d_model)
    tokens = jax.eval_shape(lambda k: lm.counting_task(k, batch=2, config=CONFIG),
                            jax.random.key(1))
    assert tokens.shape == (2, CONFIG.seq_len + 1)
    loss = jax.eval_shape(lambda k: lm_loss(init_params(k, CONFIG), lm.counting_task(
        k, batch=2, config=CONFIG), config=CONFIG), jax.random.key(2))
    assert loss.shape == ()


def test_nan_in_nan_out_is_documented_and_holds():
    """Values inside arrays are not inspected (a pass over them, impossible under jit): a NaN
    logit gives a NaN loss, and the docstring says so."""
    logits = jnp.zeros((2, 3, 8)).at[0, 0, 0].set(jnp.nan)
    assert math.isnan(float(lm.cross_entropy(logits, jnp.zeros((2, 3), jnp.int32))))
    assert "NaN" in lm.cross_entropy.__doc__


@pytest.mark.parametrize(("call", "word"), [
    (lambda: lm.against_uniform(-1.0, 16), "loss must be at least 0"),
    (lambda: lm.param_count({"w": 3}), "params"),
    (lambda: lm.param_count(2.5), "params"),
])
def test_values_no_model_can_have_are_refused(call, word):
    from spmd_guide.core.checks import InputError
    with pytest.raises(InputError, match=word):
        call()


def test_counting_task_refuses_a_stride_of_vocab_or_more():
    """A stride of vocab counts by 0: every sequence would repeat one token."""
    from spmd_guide.core.checks import InputError
    config = Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)
    with pytest.raises(InputError, match="strides\\[0\\] must be at most 15"):
        lm.counting_task(jax.random.key(0), batch=2, config=config, strides=(16,))
