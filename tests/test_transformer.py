"""The transformer's strategies against the one-device model (lm_loss) on 2, 4 and 8 devices."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide import lm, transformer
from spmd_guide.transformer import STRATEGIES, Config, init_params, lm_loss

CONFIG = Config(vocab=16, d_model=16, n_heads=8, d_ff=32, n_layers=1, seq_len=16)
BATCH = 8


@functools.cache
def reference():
    params = init_params(jax.random.key(0), CONFIG)
    tokens = lm.counting_task(jax.random.key(1), batch=BATCH, config=CONFIG)
    loss, grads = jax.jit(jax.value_and_grad(functools.partial(lm_loss, config=CONFIG)))(
        params, tokens)
    return params, tokens, loss, grads


# One device count per strategy (compiles are the cost), 2, 4 and 8 all covered.
CASES = [("dp", 2), ("fsdp", 4), ("tp", 8), ("tp_sp", 4), ("cp", 8), ("cp_zigzag", 2),
         ("fsdp_tp", 8)]


# The training step (its compile is the test's main cost) on the layouts that differ most.
STEP_CASES = ("fsdp", "tp_sp", "cp_zigzag", "fsdp_tp")


QUICK = {"tp", "fsdp_tp"}  # the rest run in the slow sweep (.ci/run runs both)


@pytest.mark.parametrize(("name", "n"), [
    pytest.param(name, n, marks=() if name in QUICK else (pytest.mark.slow,)) for name, n in CASES])
def test_loss_and_grads_equal_reference_and_keep_layouts(name, n):
    params, tokens, ref_loss, ref_grads = reference()
    strategy = STRATEGIES[name]
    mesh = strategy.mesh(DEVICES[:n])
    sp, st = strategy.shard(params, tokens, mesh)
    opt = lm.optimizer(1e-2)
    trainer = transformer.train_step(strategy, mesh, CONFIG, sp, optimizer=opt, donate=False)
    loss, grads = trainer.grads(sp, st)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r, p in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads),
                       jax.tree.leaves(sp), strict=True):
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-6)
        assert g.sharding.is_equivalent_to(p.sharding, g.ndim)
    if name not in STEP_CASES:
        return
    state = trainer.init(sp)
    shardings = [x.sharding for x in jax.tree.leaves((sp, state))]
    new_p, new_s, _ = trainer.step(sp, state, st)
    new_p, new_s, loss2 = trainer.step(new_p, new_s, st)
    for x, s in zip(jax.tree.leaves((new_p, new_s)), shardings, strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    assert float(loss2) < float(ref_loss)  # two steps on the same batch lower its loss


def test_fsdp_shards_optimizer_state_like_params():
    params = init_params(jax.random.key(0), CONFIG)
    strategy = STRATEGIES["fsdp"]
    mesh = strategy.mesh(DEVICES[:4])
    shardings = strategy.shardings(params, mesh)
    state = jax.eval_shape(lm.optimizer().init, params)
    ss = transformer.state_shardings(state, params, shardings, mesh)
    mu = ss[0].mu
    assert jax.tree.leaves(mu) == jax.tree.leaves(shardings)
    assert mu["blocks"][0]["wq"].spec == jax.P("data", None, None)
    assert ss[0].count.spec == jax.P()


def test_strategy_specs():
    params = init_params(jax.random.key(0), CONFIG)
    mesh = STRATEGIES["fsdp_tp"].mesh(DEVICES[:8])
    specs = STRATEGIES["fsdp_tp"].param_specs(params, mesh)
    assert specs["blocks"][0]["wq"] == jax.P("data", "model", None)
    assert specs["blocks"][0]["w_down"] == jax.P("model", "data")
    assert STRATEGIES["tp_sp"].activation_specs()["residual"] == jax.P(None, "model", None)
    assert set(STRATEGIES) >= {"dp", "fsdp", "tp", "tp_sp", "cp", "fsdp_tp"}


@pytest.mark.parametrize(("name", "config", "n", "word"), [
    ("tp", Config(vocab=16, d_model=12, n_heads=3, d_ff=32, seq_len=16), 2, "n_heads"),
    ("tp", Config(vocab=15, d_model=16, n_heads=4, d_ff=32, seq_len=16), 2, "vocab"),
    ("cp", Config(vocab=16, d_model=16, n_heads=4, d_ff=32, seq_len=12), 8, "seq_len"),
    ("cp_zigzag", Config(vocab=16, d_model=16, n_heads=4, d_ff=32, seq_len=12), 4, "seq_len"),
])
def test_bad_sizes_are_refused(name, config, n, word):
    strategy = STRATEGIES[name]
    with pytest.raises(ValueError, match=word):
        strategy.loss(strategy.mesh(DEVICES[:n]), config)


def test_bad_inputs():
    params, tokens, *_ = reference()
    with pytest.raises(ValueError, match="tokens"):
        STRATEGIES["dp"].shard(params, tokens[:3], STRATEGIES["dp"].mesh(DEVICES[:2]))




@pytest.mark.slow
def test_predicted_parameter_bytes_match_held_bytes():
    params, tokens, *_ = reference()
    strategy = STRATEGIES["fsdp_tp"]
    mesh = strategy.mesh(DEVICES[:8])
    sp, _ = strategy.shard(params, tokens, mesh)
    pred = transformer.predicted_bytes(strategy, mesh, CONFIG, params, BATCH)
    assert pred["parameters"] == transformer._bytes_per_device(sp)
    assert pred["parameters"] < lm.param_count(params) * 4 / 4


@pytest.mark.slow
def test_exercise_answers():
    params = init_params(jax.random.key(0), CONFIG)
    whole = [name for name, s in STRATEGIES.items()
             if all(spec == jax.P() or set(spec) == {None}
                    for spec in jax.tree.leaves(s.param_specs(params, s.mesh(DEVICES))))]
    assert whole == ["dp", "cp", "cp_zigzag"]
    big = init_params(jax.random.key(0), Config(d_model=32))
    specs = STRATEGIES["fsdp"].param_specs(big, STRATEGIES["fsdp"].mesh(DEVICES))
    assert specs["blocks"][0]["norm1"] == jax.P("data")


@pytest.mark.slow
def test_exercise_answers_tp():
    config = Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=16)
    params = init_params(jax.random.key(0), config)
    s = STRATEGIES["tp"]
    pred = transformer.predicted_comm_bytes(s, s.mesh(DEVICES), config, params, 8)
    assert pred["total"] == 229_376


def test_exercise_answers_memory():
    params = init_params(jax.random.key(0), CONFIG)
    s = STRATEGIES["fsdp"]
    mesh = s.mesh(DEVICES)
    pred = transformer.predicted_bytes(s, mesh, CONFIG, params, BATCH)
    n = lm.param_count(params)
    assert pred["optimizer state"] == 2 * pred["parameters"]
    # every leaf of this config splits over 8 devices, so 1 byte of state per parameter
    assert pred["optimizer state"] == n * 8 // 8
