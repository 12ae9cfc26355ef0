"""step_costs: a strategy against the reference, and each training step's counts, memory and the comparison table."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide import nn
from spmd_guide.core import checks, hlo
from spmd_guide.nn import step_costs

SIZES = [16, 32, 32, 16]


@pytest.fixture(scope="module")
def model():
    params = nn.init_mlp(jax.random.key(0), SIZES)
    batch = nn.make_regression_batch(jax.random.key(1), 32, SIZES[0], SIZES[-1])
    return params, batch


def test_profile_and_comparison(model):
    params, batch = model
    profiles = step_costs.compare(["single", "fsdp"], params, batch, runs=2, learning_rate=1.0)
    single, fsdp = profiles
    assert single.n_collectives == 0 and single.comm_bytes == 0
    assert fsdp.param_bytes * 8 == single.param_bytes
    strategy = nn.STRATEGIES["fsdp"]
    mesh = strategy.mesh(DEVICES)
    placed, placed_batch = strategy.shard(params, batch, mesh)
    step = strategy.sgd_step(mesh, placed, learning_rate=1.0)
    assert fsdp.counts == hlo.collective_counts(step, placed, placed_batch)
    assert fsdp.peak_bytes == hlo.memory_per_device(step, placed, placed_batch).peak_bytes
    table = str(step_costs.comparison_table(profiles))
    assert "fsdp" in table and "reduce-scatter" in table and "peak memory (bound)" in table
    import matplotlib.pyplot as plt  # here, not at import: collecting the suite stays fast

    figure = step_costs.plot_comparison(profiles)
    assert len(figure.axes) == 6
    plt.close(figure)


@pytest.mark.slow
def test_reference_check_matches_on_every_device_count(model):
    params, batch = model
    for k in (2, 4, 8):
        check = step_costs.check_against_reference("fsdp", params, batch, devices=DEVICES[:k])
        assert check.loss == pytest.approx(check.reference_loss, rel=1e-5)
        assert check.max_grad_error < 1e-4 * max(1.0, check.max_grad)


@pytest.mark.slow
def test_dp_and_fsdp_do_the_same_arithmetic_bit_for_bit():
    """manual_parallelism.md: on the book's model the dp and fsdp check rows are equal because
    the loss and every gradient are equal bit for bit (FSDP gathers whole weights first)."""
    sizes = [16, 64, 64, 64, 16]
    params = nn.init_mlp(jax.random.key(0), sizes)
    batch = nn.make_regression_batch(jax.random.key(1), 64, sizes[0], sizes[-1])
    results = []
    for name in ("dp", "fsdp"):
        strategy = nn.STRATEGIES[name]
        mesh = strategy.mesh(DEVICES)
        placed = strategy.shard(params, batch, mesh)
        results.append(jax.device_get(jax.jit(jax.value_and_grad(strategy.loss(mesh)))(*placed)))
    (dp_loss, dp_grads), (fsdp_loss, fsdp_grads) = results
    assert dp_loss == fsdp_loss
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(dp_grads), jax.tree.leaves(fsdp_grads), strict=True))
    check = step_costs.check_against_reference("dp", params, batch)
    assert check.max_grad_error <= 4 * np.spacing(np.float32(check.max_grad))


@pytest.mark.parametrize(("call", "word"), [
    (lambda p, b: step_costs.compare(["dp", "nope"], p, b), "unknown strategy"),
    (lambda p, b: step_costs.profile_step("dp", p, b, runs=0), "runs"),
    (lambda p, b: step_costs.comparison_table([]), "StepProfile"),
    (lambda p, b: step_costs.check_against_reference(3, p, b), "unknown strategy"),
])
def test_bad_input_is_refused(model, call, word):
    with pytest.raises(checks.InputError, match=word):
        call(*model)


def test_train_run_trains_with_pinned_layouts_and_profiles_that_step(model):
    params, batch = model
    run = step_costs.train_run("auto_fsdp", params, batch, steps=3, runs=1)
    assert run.layouts_kept and len(run.losses) == 3 and run.losses[-1] < run.losses[0]
    assert run.profile.strategy == "auto_fsdp" and run.profile.param_bytes * 8 == sum(
        leaf.nbytes for leaf in jax.tree.leaves(params))
