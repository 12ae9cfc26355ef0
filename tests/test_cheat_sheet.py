"""The cheat sheet against the shardings the strategies really produce."""

from __future__ import annotations

import jax
import optax
import pytest
from conftest import DEVICES

from spmd_guide import cheat_sheet, checks, nn

SIZES = [8, 32, 32, 8]


@pytest.fixture(scope="module")
def model():
    return (nn.init_mlp(jax.random.key(0), SIZES),
            nn.make_regression_batch(jax.random.key(1), 16, SIZES[0], SIZES[-1]))


@pytest.mark.parametrize(("name", "k"), [("fsdp", 8), ("auto_dp_tp", 4)])
def test_entries_are_the_layouts_the_strategy_produces(model, name, k):
    params, batch = model
    entry = cheat_sheet.entry(name, params, batch, devices=DEVICES[:k])
    strategy = nn.STRATEGIES[name]
    mesh = strategy.mesh(DEVICES[:k])
    placed, _ = strategy.shard(params, batch, mesh)
    assert entry.weights == tuple(cheat_sheet.spec_of(w) for w, _ in placed)
    assert entry.gradients == entry.weights  # the strategies pin their gradients
    assert entry.optimizer_state == entry.weights  # the pinned AdamW state
    assert entry.param_bytes == nn.param_bytes_per_device(placed)
    assert "P" in str(cheat_sheet.table([entry]))


def test_optimizer_state_shardings_pin_mu_nu_and_replicate_the_count(model):
    params, batch = model
    strategy = nn.STRATEGIES["fsdp"]
    mesh = strategy.mesh(DEVICES)
    placed, _ = strategy.shard(params, batch, mesh)
    optimizer = optax.adamw(1e-3)
    state = jax.jit(optimizer.init, out_shardings=cheat_sheet.optimizer_state_shardings(
        optimizer, placed, mesh))(placed)
    for mu, param in zip(jax.tree.leaves(state[0].mu), jax.tree.leaves(placed), strict=True):
        assert mu.sharding.is_equivalent_to(param.sharding, param.ndim)
    assert state[0].count.sharding.is_fully_replicated and len(state[0].count.sharding.device_set) == 8
    unpinned = jax.jit(optimizer.init)(placed)
    assert len(unpinned[0].mu[0][0].sharding.device_set) == 1  # the cheat sheet's warning


def test_bad_input(model):
    with pytest.raises(checks.InputError, match="unknown strategy"):
        cheat_sheet.cheat_sheet(["nope"], *model)
    with pytest.raises(checks.InputError, match="at least one"):
        cheat_sheet.table([])
