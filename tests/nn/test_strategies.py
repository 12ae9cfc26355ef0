"""Every parallel strategy against the one-device reference, and the compiler facts Part IV states."""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide import nn
from spmd_guide.core import checks, hlo, traced
from spmd_guide.nn import strategies

SIZES = [16, 64, 64, 64, 16]  # the book's sizes: first layer, a column/row pair, last layer
BATCH = 64
LAYERS = len(SIZES) - 1


_STEPS: dict = {}


def _run_step(name: str, k: int, params, batch):
    """One SGD step (learning rate 1, so ``params - new_params`` is the gradient), compiled once."""
    key = (name, k)
    if key not in _STEPS:
        strategy = strategies.STRATEGIES[name]
        mesh = strategy.mesh(DEVICES[:k])
        params, batch = strategy.shard(params, batch, mesh)
        step = strategy.sgd_step(mesh, params, learning_rate=1.0)
        _STEPS[key] = (step, params, batch, *step(params, batch))
    return _STEPS[key]


@pytest.fixture(scope="module")
def model():
    """Params, batch, and the one-device reference: the loss and gradient of ``mlp_loss``."""
    params = nn.init_mlp(jax.random.key(0), SIZES)
    batch = nn.make_regression_batch(jax.random.key(1), BATCH, SIZES[0], SIZES[-1])
    _, placed, _, new_params, loss = _run_step("single", 8, params, batch)
    x, y = (np.asarray(a, np.float64) for a in batch)
    for i, (w, b) in enumerate(params):  # an independent NumPy check of the reference loss
        x = x @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
        x = np.maximum(x, 0) if i < len(params) - 1 else x
    assert float(loss) == pytest.approx(np.mean(np.sum((x - y) ** 2, axis=-1)), rel=1e-5)
    grads = jax.tree.map(lambda p, q: np.asarray(p) - np.asarray(q), placed, new_params)
    return params, batch, float(loss), grads


def _step(name: str, k: int, model):
    return _run_step(name, k, model[0], model[1])


CASES = [(name, 8) for name in strategies.STRATEGIES if name != "single"] + [
    # The hand-written collectives depend on the device count: 2 and 4 devices too (slow
    # sweep). (The reference is the "single" strategy's step, checked against NumPy in `model`.)
    pytest.param("dp", 2, marks=pytest.mark.slow), pytest.param("fsdp", 4, marks=pytest.mark.slow),
    pytest.param("tp", 4, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "k"), CASES)
def test_loss_gradient_and_layouts_match_the_reference(name, k, model):
    _, _, ref_loss, ref_grads = model
    _, params, _, new_params, loss = _step(name, k, model)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    for old, new, ref in zip(jax.tree.leaves(params), jax.tree.leaves(new_params), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(old) - np.asarray(new), ref, atol=2e-5)
        assert new.sharding.is_equivalent_to(old.sharding, old.ndim), name  # the step keeps layouts


def _explicit_twin(mesh):
    """The same devices and axis names as ``mesh``, Explicit axes (jax.make_mesh's default)."""
    return jax.make_mesh(mesh.devices.shape, mesh.axis_names, devices=list(mesh.devices.flat),
                         axis_types=(jax.sharding.AxisType.Explicit,) * mesh.devices.ndim)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=() if n in ("auto_dp_tp", "fsdp") else (pytest.mark.slow,))
    for n in strategies.STRATEGIES])
def test_every_strategy_works_on_explicit_axes(name, model):
    """On a mesh of Explicit axes, every method works: shard places on it, the step gives the
    reference loss and gradient, keeps every layout, and compiles to the collectives of the
    Auto mesh; an input not yet laid out (NumPy) is resharded by the loss."""
    strategy = strategies.STRATEGIES[name]
    mesh = _explicit_twin(strategy.mesh(DEVICES))
    assert set(mesh.axis_types) == {jax.sharding.AxisType.Explicit}
    params, batch = strategy.shard(model[0], model[1], mesh)
    assert all(leaf.sharding.mesh == mesh for leaf in jax.tree.leaves((params, batch)))
    step = strategy.sgd_step(mesh, params, learning_rate=1.0)
    new_params, loss = step(params, batch)
    assert float(loss) == pytest.approx(model[2], rel=1e-5)
    for old, new, ref in zip(jax.tree.leaves(params), jax.tree.leaves(new_params),
                             jax.tree.leaves(model[3]), strict=True):
        np.testing.assert_allclose(np.asarray(old) - np.asarray(new), ref, atol=2e-5)
        assert new.sharding.is_equivalent_to(old.sharding, old.ndim)
    auto_step, auto_params, auto_batch, *_ = _step(name, 8, model)
    assert hlo.collective_counts(step, params, batch) == hlo.collective_counts(
        auto_step, auto_params, auto_batch)
    unplaced = jax.tree.map(np.asarray, (model[0], model[1]))
    assert float(jax.jit(strategy.loss(mesh))(*unplaced)) == pytest.approx(model[2], rel=1e-5)


def test_registry_has_the_contract_names_and_kinds():
    assert {"dp", "fsdp", "tp", "auto_dp", "auto_dp_tp"} <= set(strategies.STRATEGIES)
    assert {strategies.STRATEGIES[n].kind for n in ("dp", "fsdp", "tp")} == {"shard_map"}
    assert {strategies.STRATEGIES[n].kind for n in ("auto_dp", "auto_dp_tp", "auto_2d", "auto_fsdp")} == {"jit"}


def test_meshes():
    assert dict(strategies.STRATEGIES["auto_dp_tp"].mesh(DEVICES).shape) == {"batch": 4, "model": 2}
    assert dict(strategies.STRATEGIES["auto_2d"].mesh(DEVICES[:4]).shape) == {"data": 2, "model": 2}
    assert dict(strategies.STRATEGIES["tp"].mesh(DEVICES).shape) == {"model": 8}
    assert dict(strategies.STRATEGIES["single"].mesh(DEVICES).shape) == {"batch": 1}


@pytest.mark.parametrize("name", ["fsdp", "auto_fsdp", "tp"])
@pytest.mark.parametrize("k", [4, 8])
def test_sharded_parameters_hold_one_nth_of_the_bytes(name, k, model):
    params = model[0]
    strategy = strategies.STRATEGIES[name]
    placed, _ = strategy.shard(params, model[1], strategy.mesh(DEVICES[:k]))
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    assert nn.param_bytes_per_device(placed) * k == total


def test_dp_x_tp_layout_keeps_the_hidden_activation_split_over_model(model):
    step, params, batch, *_ = _step("auto_dp_tp", 8, model)
    assert [tuple(w.sharding.spec) for w, _ in params] == [(), (None, "model"), ("model",), ()]
    outputs = jax.jit(nn.layer_outputs)(params, batch[0])
    assert [o.sharding.spec for o in outputs] == [jax.P("batch"), jax.P("batch", "model"),
                                                  jax.P("batch"), jax.P("batch")]
    ops = hlo.collectives(step, params, batch)
    assert {op.kind for op in ops} == {"all-reduce"}
    model_ops = [op for op in ops if op.group_size == 2]
    # Activation-sized partial sums over 'model': one in the forward pass, one in the backward.
    assert [op.shape for op in model_ops] == [(BATCH // 4, 64)] * 2
    assert sorted("transpose(" in op.line for op in model_ops) == [False, True]
    assert [op.group_size for op in ops if op not in model_ops] == [4]  # the gradients
    # The model chapter's exercise: replicated outer layers plus half of the middle pair.
    assert nn.param_bytes_per_device(params) == 4 * (16 * 64 + 64 + 64 * 16 + 16 + 2080 + 2048 + 64)


def test_fully_2d_layout_gathers_weight_rows_and_activation_features(model):
    step, params, batch, *_ = _step("auto_2d", 8, model)
    outputs = jax.jit(nn.layer_outputs)(params, batch[0])
    assert {o.sharding.spec for o in outputs} == {jax.P("data", "model")}
    gathers = [op for op in hlo.collectives(step, params, batch) if op.kind == "all-gather"]
    weight_blocks = {(n_in, n_out // 2) for n_in, n_out in zip(SIZES[:-1], SIZES[1:], strict=True)}
    over_data = [op.shape for op in gathers if op.group_size == 4]
    over_model = [op.shape for op in gathers if op.group_size == 2]
    assert over_data and set(over_data) <= weight_blocks  # full rows of a weight's column block
    assert over_model and {shape[0] for shape in over_model} == {BATCH // 4}  # activation blocks
    assert len(over_data) + len(over_model) == len(gathers)


def test_data_parallel_gradients_need_one_all_reduce(model):
    for name in ("dp", "auto_dp"):
        step, params, batch, *_ = _step(name, 8, model)
        ops = hlo.collectives(step, params, batch)
        assert [op.kind for op in ops] == ["all-reduce"], name  # every gradient, combined
        assert len(ops[0].buffers) == 2 * LAYERS + 1  # each weight and bias, and the loss
        param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
        assert ops[0].bytes_sent == pytest.approx(2 * 7 / 8 * param_bytes, rel=0.01)


def test_data_parallel_gradient_psums_come_from_the_broadcast_transpose(model):
    _, params, batch, *_ = _step("dp", 8, model)
    loss = strategies.STRATEGIES["dp"].loss(strategies.STRATEGIES["dp"].mesh(DEVICES))
    forward = [name for _, name, _ in traced.traced_collectives(loss, params, batch)]
    gradient = [name for _, name, _ in traced.traced_collectives(jax.grad(loss), params, batch)]
    assert forward == ["psum_invariant"]  # the loss's pmean
    assert gradient == ["psum_invariant"] * (1 + 2 * LAYERS)  # and one per parameter array


def test_fsdp_gathers_weights_and_reduce_scatters_gradients(model):
    step, params, batch, *_ = _step("fsdp", 8, model)
    counts = hlo.collective_counts(step, params, batch)
    # a gather of every array in the forward pass, and (remat, kept by XLA:CPU in JAX 0.12;
    # test_remat) a re-gather of every weight but the first in the backward pass
    assert counts["all-gather"] == 2 * LAYERS + (LAYERS - 1)
    assert counts["reduce-scatter"] == 2 * LAYERS
    auto_step, auto_params, auto_batch, *_ = _step("auto_fsdp", 8, model)
    auto = hlo.collective_counts(auto_step, auto_params, auto_batch)
    # jit + constraint: the same weight gathers, but the gradients are all-reduced whole.
    assert auto["all-gather"] == 2 * LAYERS and auto["reduce-scatter"] == 0 and auto["all-reduce"] == 1
    param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(model[0]))
    auto_bytes = hlo.communication_bytes(auto_step, auto_params, auto_batch)
    assert auto_bytes == pytest.approx(3 * 7 / 8 * param_bytes, rel=0.01)  # auto chapter, ex. 3
    # Hand-written FSDP sends what data parallelism sends (all-gather + reduce-scatter = one
    # all-reduce), plus the re-gathered weights.
    dp_step, dp_params, dp_batch, *_ = _step("dp", 8, model)
    regathered = sum(np.asarray(w).nbytes for w, _ in model[0][1:]) * 7 // 8
    assert hlo.communication_bytes(step, params, batch) == hlo.communication_bytes(
        dp_step, dp_params, dp_batch) + regathered


def test_exercise_psum_instead_of_pmean_multiplies_the_loss_by_the_device_count(model):
    """The manual chapter's exercise 1: the local losses must be averaged, not added."""
    _, params, batch, *_ = _step("dp", 8, model)
    mesh = strategies.STRATEGIES["dp"].mesh(DEVICES)
    summed = jax.jit(jax.shard_map(lambda p, b: jax.lax.psum(nn.mlp_loss(p, b), "batch"), mesh=mesh,
                                   in_specs=(jax.P(), jax.P("batch")), out_specs=jax.P()))
    assert float(summed(params, batch)) == pytest.approx(8 * model[2], rel=1e-5)


def test_save_anything_except_these_names_is_a_placeholder_that_saves_everything():
    """Why the manual chapter uses dots_saveable: this policy ignores the names it is given."""
    policy = jax.checkpoint_policies.save_anything_except_these_names("gathered")
    assert policy(None, name="gathered") is True and policy(None) is True


def test_fsdp_remat_regathers_weights_in_the_traced_backward_pass(model):
    params, batch, _, _ = model
    counts = {}
    for remat in (True, False):
        strategy = strategies.FSDP(remat=remat)
        mesh = strategy.mesh(DEVICES)
        placed, placed_batch = strategy.shard(params, batch, mesh)
        loss = strategy.loss(mesh)
        forward = traced.primitive_counts(loss, placed, placed_batch)["all_gather"]
        gradient = traced.primitive_counts(jax.grad(loss), placed, placed_batch)["all_gather"]
        counts[remat] = (forward, gradient)
    assert counts[False] == (2 * LAYERS, 2 * LAYERS)  # gathered weights saved for backward
    # With remat the backward pass gathers again every weight it needs: all but the first
    # layer's (no input gradient there); the biases are not needed at all.
    assert counts[True] == (2 * LAYERS, 2 * LAYERS + LAYERS - 1)



def test_tensor_parallel_reduce_scatters_each_layer_and_psums_the_loss(model):
    step, params, batch, *_ = _step("tp", 8, model)
    counts = hlo.collective_counts(step, params, batch)
    assert counts["reduce-scatter"] == LAYERS  # forward: one per layer
    assert counts["all-gather"] == LAYERS  # backward: the transpose of every layer's, the first's too
    assert counts["all-reduce"] == 1  # the loss: a sum over the feature shards


@pytest.mark.parametrize(
    ("name", "k", "batch_size", "sizes", "needle"),
    [
        ("dp", 8, 30, SIZES, r"batch size of x \(30, 16\) is 30"),
        ("auto_dp", 8, 12, SIZES, "not divisible by 8"),
        ("fsdp", 8, 32, [16, 30, 16], r"layer width of layer 0's [Wb] .* is 30"),
        ("tp", 8, 32, [12, 32, 16], r"input width of x .* is 12"),
        ("auto_dp_tp", 8, 32, [16, 32, 33, 32, 16], r"layer width of layer \d's W .* is 33"),
        ("auto_2d", 8, 32, [16, 32, 16, 5], r"output width of y .* is 5"),
        ("auto_2d", 8, 30, [16, 32, 16], r"batch size of x .* is 30"),
    ],
)
def test_uneven_splits_raise_a_clear_error(name, k, batch_size, sizes, needle):
    rng = np.random.default_rng(0)
    params = [(rng.normal(size=(a, b)).astype(np.float32), np.zeros(b, np.float32))
              for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    batch = (np.zeros((batch_size, sizes[0]), np.float32), np.zeros((batch_size, sizes[-1]), np.float32))
    strategy = strategies.STRATEGIES[name]
    mesh = strategy.mesh(DEVICES[:k])
    with pytest.raises(ValueError, match=needle):
        strategy.shard(params, batch, mesh)
    with pytest.raises(ValueError, match=needle):
        strategy.loss(mesh)(params, batch)


def test_wrong_mesh_device_count_and_name_raise(model):
    with pytest.raises(ValueError, match="axes"):
        strategies.STRATEGIES["tp"].loss(strategies.STRATEGIES["dp"].mesh(DEVICES))
    with pytest.raises(ValueError, match="3 devices"):
        strategies.STRATEGIES["auto_dp_tp"].mesh(DEVICES[:3])
    params, batch, _, _ = model
    with pytest.raises(ValueError, match="same B"):
        strategies.STRATEGIES["dp"].shard(params, (batch[0], batch[1][:8]), strategies.STRATEGIES["dp"].mesh(DEVICES))




# --------------------------------------------------------------------------- layouts never drift

def _drift_cases():
    """Every strategy on 1, 2, 4 and 8 devices (the 'model' axis of the 2-D ones needs 2),
    on three layers (an odd number of middle layers, unlike the chapter's), plus five layers
    of uneven widths for the strategies that split layers unevenly by position."""
    for name in strategies.STRATEGIES:
        for k in (1, 2, 4, 8):
            if name in ("auto_dp_tp", "auto_2d") and k == 1:
                continue
            if k == 8 and name != "single":
                continue  # 8 devices: the five-layer cases below and the chapter-size cases above
            yield name, k, (8, 16, 16, 8)
    for name in strategies.STRATEGIES:
        if name != "single":
            yield name, 8, (8, 24, 16, 32, 16, 8)


def _drift_params():
    """The 4-device cases run in the quick suite; the other device counts are ``slow``."""
    for name, k, sizes in _drift_cases():
        marks = () if k == 4 or name == "single" else (pytest.mark.slow,)
        yield pytest.param(name, k, sizes, marks=marks)


@pytest.mark.parametrize(("name", "k", "sizes"), list(_drift_params()))
def test_gradients_and_steps_keep_every_parameter_layout(name, k, sizes):
    """The gradient of each parameter has the parameter's sharding, and three steps keep
    every sharding (and compile once)."""
    params = nn.init_mlp(jax.random.key(3), sizes)
    batch = nn.make_regression_batch(jax.random.key(4), 16, sizes[0], sizes[-1])
    strategy = strategies.STRATEGIES[name]
    mesh = strategy.mesh(DEVICES[:k])
    placed, placed_batch = strategy.shard(params, batch, mesh)
    grads = jax.jit(jax.grad(strategy.loss(mesh)))(placed, placed_batch)
    step = strategy.sgd_step(mesh, placed, learning_rate=0.01)
    current, _ = step(placed, placed_batch)
    compiled = step._cache_size()  # the cached step may hold other tests' shapes too
    for _ in range(2):
        current, _ = step(current, placed_batch)
    for leaf, grad, new in zip(jax.tree.leaves(placed), jax.tree.leaves(grads),
                               jax.tree.leaves(current), strict=True):
        assert grad.sharding.is_equivalent_to(leaf.sharding, leaf.ndim)
        assert new.sharding.is_equivalent_to(leaf.sharding, leaf.ndim)
    assert step._cache_size() == compiled  # the same layouts came back in: no recompiling


def test_without_pinning_the_step_can_drift():
    """Why sgd_step pins: with an unconstrained loss and no ``out_shardings``, auto_dp_tp on
    three layers gets its last weight back split over 'model' (the compiler's choice), not
    replicated. (With the strategy's own loss, which constrains the parameters, nothing
    drifts: test_gradients_and_steps_keep_every_parameter_layout.)"""
    sizes = [8, 16, 16, 8]
    strategy = strategies.STRATEGIES["auto_dp_tp"]
    mesh = strategy.mesh(DEVICES)
    params, batch = strategy.shard(nn.init_mlp(jax.random.key(3), sizes),
                                   nn.make_regression_batch(jax.random.key(4), 16, 8, 8), mesh)
    unpinned = jax.jit(lambda p, b: nn.sgd_update(
        p, jax.grad(lambda q, c: nn.predict(q, c[0]).sum())(p, b), learning_rate=0.1))
    drifted = unpinned(params, batch)
    assert drifted[-1][0].sharding.spec != params[-1][0].sharding.spec


# --------------------------------------------------------------------------- bad input

@functools.cache
def _bad_params():
    """The bad-input cases' parameters and batch, made on first use (not at import, which
    both workers pay)."""
    return nn.init_mlp(jax.random.key(0), [8, 16, 8])


@functools.cache
def _bad_batch():
    return nn.make_regression_batch(jax.random.key(1), 16, 8, 8)


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda s, m: s.mesh_shape(0), checks.InputError, "at least 1"),
    (lambda s, m: s.mesh([]), checks.InputError, "empty list"),
    (lambda s, m: s.mesh("cpu"), checks.InputTypeError, "list of jax.Device"),
    (lambda s, m: s.mesh(8), checks.InputTypeError, "list of jax.Device"),
    (lambda s, m: s.mesh([0, 1]), checks.InputTypeError, "jax.Device objects"),
    (lambda s, m: s.mesh(m), checks.InputTypeError, "list(mesh.devices.flat)"),
    (lambda s, m: s.shard(_bad_params(), {"x": _bad_batch()[0], "y": _bad_batch()[1]}, m),
     checks.InputTypeError, "batch['x']"),
    (lambda s, m: s.shard(_bad_params(), _bad_batch(), "mesh"), checks.InputTypeError, "Mesh"),
    (lambda s, m: s.shard("params", _bad_batch(), m), checks.InputTypeError, "(W, b) pairs"),
    (lambda s, m: s.shard(_bad_params(), (_bad_batch()[0], _bad_batch()[1][:, :3]), m),
     checks.InputError, "(16, 8)"),
    (lambda s, m: s.sgd_step(m, _bad_params(), learning_rate=0), checks.InputError, "positive"),
    (lambda s, m: s.loss(m)(_bad_params(), (_bad_batch()[0][:, :3], _bad_batch()[1])),
     checks.InputError, "8 input features"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    strategy = strategies.STRATEGIES["dp"]
    with pytest.raises(error, match=re.escape(word)):
        call(strategy, strategy.mesh(DEVICES))


def test_auto_fsdp_all_reduce_comes_from_the_cpu_compiler_not_the_constraint(model):
    """The auto chapter's claim: the plain mlp_loss on the FSDP layout compiles to the same
    collectives and bytes as the constrained loss (XLA:CPU keeps all-reduce + slice)."""
    step, params, batch, *_ = _step("auto_fsdp", 8, model)
    strategy = strategies.STRATEGIES["auto_fsdp"]
    plain = nn.make_sgd_step(nn.mlp_loss, learning_rate=1.0, param_shardings=strategy.param_shardings(
        model[0], strategy.mesh(DEVICES)))
    constrained, unconstrained = hlo.report(step, params, batch), hlo.report(plain, params, batch)
    assert constrained.counts == unconstrained.counts
    assert constrained.total_bytes == unconstrained.total_bytes


