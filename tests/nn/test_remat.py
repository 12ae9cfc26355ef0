"""FSDP's remat against the compiled programs: the re-gathers XLA keeps on this JAX (0.12),
what they cost and save, the pass that lifts remat's barriers, and the kept JAX 0.10 run."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide import nn
from spmd_guide.core import checks, hlo, results
from spmd_guide.nn import remat, strategies

SIZES = [16, 64, 64, 64, 16]  # the manual chapter's model
LAYERS = len(SIZES) - 1
RESULTS = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"


def _model(sizes=SIZES):
    return (nn.init_mlp(jax.random.key(0), sizes),
            nn.make_regression_batch(jax.random.key(1), 64, sizes[0], sizes[-1]))


@pytest.fixture(scope="module")
def compared():
    params, batch = _model()
    return params, remat.compare(params, batch, devices=DEVICES)


def test_jax_hands_xla_one_regather_per_weight_the_backward_pass_needs(compared):
    _, (with_remat, without) = compared
    # forward: a weight and a bias per layer; backward: every weight but the first layer's
    # (no input gradient there), and no bias (the gradient of + b does not use b)
    assert with_remat.handed == 2 * LAYERS + (LAYERS - 1)
    assert without.handed == 2 * LAYERS


def test_xla_cpu_keeps_the_regathers_on_this_jax(compared):
    """manual_parallelism.md and coming_from_notebooks.md: JAX 0.12's XLA:CPU compiles every
    all-gather it is handed; the extra ones are the backward pass's re-gathers of the
    weights of layers L-1 .. 1 (in that order, the order the backward pass needs them)."""
    params, (with_remat, without) = compared
    assert with_remat.gathers == with_remat.handed == 3 * LAYERS - 1
    assert without.gathers == 2 * LAYERS and without.regathers == []
    assert [op.shape for op in with_remat.regathers] == [w.shape for w, _ in params[:0:-1]]
    assert all("transpose(" in op.line for op in with_remat.regathers)
    forward = [op for op in with_remat.report.ops if op.kind == "all-gather"
               and not remat.is_regather(op)]
    assert len(forward) == 2 * LAYERS and not any("transpose(" in op.line for op in forward)


def test_the_regathers_cost_bytes(compared):
    """Honoured remat sends the re-gathered weights once more, (n-1)/n each."""
    params, (with_remat, without) = compared
    regathered = sum(np.asarray(w).nbytes for w, _ in params[1:]) * 7 // 8
    assert with_remat.sent_bytes == without.sent_bytes + regathered
    assert [r["of them re-gathers"] for r in (with_remat.row(), without.row())] == [3, 0]


def test_whether_remat_saves_temporaries_depends_on_the_model(compared):
    """manual_parallelism.md: fewer temporaries with remat for the chapter's model, more for
    the appendix's three-layer one (XLA:CPU's buffer plan decides)."""
    _, (with_remat, without) = compared
    assert with_remat.temp_bytes < without.temp_bytes
    three, three_plain = remat.compare(*_model([16, 64, 64, 16]), devices=DEVICES)
    assert three.temp_bytes > three_plain.temp_bytes


def test_fsdp_with_remat_sends_about_one_and_a_half_times_dp(compared):
    """The manual chapter's rule of thumb: gather, re-gather, reduce-scatter (three passes
    over the parameters) against DP's all-reduce (two); a little under 1.5 here because the
    biases and the first weight are not gathered again."""
    params, (with_remat, without) = compared
    dp = strategies.STRATEGIES["dp"]
    mesh = dp.mesh(DEVICES)
    placed, placed_batch = dp.shard(params, _model()[1], mesh)
    dp_bytes = hlo.communication_bytes(dp.sgd_step(mesh, placed, learning_rate=0.01),
                                       placed, placed_batch)
    assert without.sent_bytes == dp_bytes  # all-gather + reduce-scatter = one all-reduce
    assert with_remat.sent_bytes / dp_bytes == pytest.approx(1.44, abs=0.01)


def test_three_layer_fsdp_keeps_its_two_regathers():
    """coming_from_notebooks.md: without the policy 6 all-gathers (XLA re-gathers nothing by
    itself); with it 8 asked for (6 + 2 re-gathers) and 8 compiled."""
    with_remat, without = remat.compare(*_model([16, 64, 64, 16]), devices=DEVICES)
    assert (with_remat.handed, with_remat.gathers, len(with_remat.regathers)) == (8, 8, 2)
    assert (without.handed, without.gathers, without.regathers) == (6, 6, [])


def test_pass_trace_shows_the_barriers_lifted_after_every_merging_pass():
    """On jaxlib 0.12 XLA:CPU lifts remat's barriers after scheduling, and no later pass
    lowers the count of all-gathers (in jaxlib 0.10 a CSE pass after layout assignment
    merged them: the kept run below)."""
    params, batch = _model()
    fsdp = strategies.STRATEGIES["fsdp"]
    mesh = fsdp.mesh(DEVICES)
    placed, placed_batch = fsdp.shard(params, batch, mesh)
    trace = remat.pass_trace(fsdp.sgd_step(mesh, placed, learning_rate=0.01), placed,
                             placed_batch)
    assert (trace[0].barriers, trace[0].gathers) == (LAYERS, 3 * LAYERS - 1)
    lifted = next(i for i, step in enumerate(trace) if step.barriers == 0)
    assert trace[lifted].name == "cse_barrier_expander"
    assert "after_scheduling" in trace[lifted].pipeline
    assert all(step.gathers == 3 * LAYERS - 1 for step in trace)
    assert set(trace[0].row()) == {"after pass", "in pipeline", "optimization barriers",
                                   "all-gathers"}


def test_remat3_compiles_the_same_step():
    """The rewritten remat (``jax_remat3``, off by default in JAX 0.12.0.1) hands XLA a
    program that compiles to the same all-gathers and temporaries."""
    assert jax.config.jax_remat3 is False
    params, batch = _model()
    default, _ = remat.compare(params, batch, devices=DEVICES)
    jax.config.update("jax_remat3", True)
    try:
        rewritten, _ = remat.compare(params, batch, devices=DEVICES)
    finally:
        jax.config.update("jax_remat3", False)
    assert (rewritten.gathers, len(rewritten.regathers), rewritten.temp_bytes) == (
        default.gathers, len(default.regathers), default.temp_bytes)


def test_the_kept_jax_0_10_run_merged_the_regathers():
    """What the chapter says of JAX 0.10, from the run kept with its provenance."""
    run = results.load(RESULTS / "fsdp_remat_jax0.10.2.json")
    assert run.environment.jax_version == "0.10.2" and run.script == "benchmarks/fsdp_remat.py"
    with_remat, without = run.rows
    assert (with_remat["all-gathers handed to XLA"], with_remat["compiled"],
            with_remat["of them re-gathers"]) == (11, 8, 0)
    assert with_remat["bytes sent"] == without["bytes sent"]
    assert with_remat["gathers merged after"].startswith("cse ")
    assert "after_scheduling" not in with_remat["barriers lifted after"]


@pytest.mark.parametrize("call", [remat.is_regather, remat.op_name])
def test_bad_op_gets_a_clear_error(call):
    with pytest.raises(checks.InputTypeError, match="Collective"):
        call("all-gather")


def test_op_name_reads_the_metadata(compared):
    _, (with_remat, _) = compared
    assert all(remat.op_name(op).endswith("rematted_computation/all_gather")
               for op in with_remat.regathers)
    assert remat.op_name(hlo.Collective("all-gather", (), 8, 0)) == ""
