"""Expert parallelism composed with data parallelism: moe_layer_2d equals reference_moe on
data x expert meshes of 2, 4 and 8 devices, Auto and Explicit; its collectives; bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide.core import hlo
from spmd_guide.pipeline import composed, moe

TOKENS, D_MODEL = 64, 16


@functools.cache
def _data(n_experts=8, tokens=TOKENS):
    params = moe.init_moe(0, d_model=D_MODEL, d_ff=32, n_experts=n_experts)
    x = jax.random.normal(jax.random.key(1), (tokens, D_MODEL))
    return params, x


def _mesh(shape, explicit=False):
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.make_mesh(shape, ("data", "expert"), axis_types=(kind, kind),
                         devices=DEVICES[:shape[0] * shape[1]])


def _assert_same(got, want):
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-5, atol=1e-5)
    for key in ("tokens_per_expert", "dropped", "kept"):
        np.testing.assert_array_equal(np.asarray(got[1][key]), np.asarray(want[1][key]))
    np.testing.assert_allclose(float(got[1]["aux_loss"]), float(want[1]["aux_loss"]), rtol=1e-5)


@pytest.mark.parametrize(("shape", "explicit", "factor"), [
    pytest.param((2, 1), False, 1.0, marks=pytest.mark.slow), ((2, 2), True, 1.0),
    ((2, 4), False, 0.5),
    pytest.param((2, 4), True, 1.0, marks=pytest.mark.slow),
    pytest.param((4, 2), False, 1.25, marks=pytest.mark.slow),
    pytest.param((2, 1), True, 0.5, marks=pytest.mark.slow),
    pytest.param((2, 2), False, 0.5, marks=pytest.mark.slow)])
def test_equals_reference(shape, explicit, factor):
    params, x = _data()
    want = moe.reference_moe(params, x, top_k=2, capacity_factor=factor)
    got = composed.moe_layer_2d(params, x, _mesh(shape, explicit), top_k=2,
                                capacity_factor=factor)
    _assert_same(got, want)
    assert int(got[1]["dropped"]) > 0 or factor >= 1.0  # the drop rule is exercised
    mesh = _mesh(shape, explicit)
    assert got[0].sharding.is_equivalent_to(
        jax.NamedSharding(mesh, jax.P(("data", "expert"))), 2)


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "n_experts", "tokens", "top_k"), [
    ((2, 2), 4, 32, 1), ((2, 4), 16, 96, 3), ((4, 2), 2, 48, 2)])
def test_other_shapes(shape, n_experts, tokens, top_k):
    params, x = _data(n_experts, tokens)
    want = moe.reference_moe(params, x, top_k=top_k, capacity_factor=1.0)
    step = jax.jit(functools.partial(composed.moe_layer_2d, mesh=_mesh(shape), top_k=top_k,
                                     capacity_factor=1.0))
    _assert_same(step(params, x), want)


def _loss(layer):
    def f(params, x):
        y, stats = layer(params, x)
        return jnp.mean(y ** 2) + 0.01 * stats["aux_loss"]
    return f


@pytest.mark.slow
def test_layer_gradients_equal_reference():
    params, x = _data()
    ref = functools.partial(moe.reference_moe, top_k=2, capacity_factor=1.0)
    layer = functools.partial(composed.moe_layer_2d, mesh=_mesh((2, 2), explicit=True),
                              top_k=2, capacity_factor=1.0)
    want = jax.grad(_loss(ref), argnums=(0, 1))(params, x)
    got = jax.jit(jax.grad(_loss(layer), argnums=(0, 1)))(params, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


@functools.cache
def _stack():
    layers = composed.init_moe_stack(0, n_layers=2, d_model=D_MODEL, d_ff=32, n_experts=8)
    return layers, _data()[1]


def _stack_loss(layers, x, mesh):
    y, aux = composed.moe_stack(layers, x, mesh, top_k=2, capacity_factor=1.0)
    return jnp.mean(y ** 2) + 0.01 * aux


@functools.cache
def _grads_program(shape):
    """composing.md's program: the gradient of a 2-layer stack's loss on a data x expert
    mesh, with respect to the layers and the input."""
    layers, x = _stack()
    mesh = _mesh(shape)
    grad = jax.grad(functools.partial(_stack_loss, mesh=mesh), argnums=(0, 1))
    return hlo.compile(grad, layers, x, compiler_options=hlo.FAST_COMPILE), mesh


def test_stack_and_its_gradients_equal_one_device():
    layers, x = _stack()
    want = jax.grad(_stack_loss, argnums=(0, 1))(layers, x, None)
    got = _grads_program((2, 4))[0](layers, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
    y2, aux2 = composed.moe_stack(layers, x, _mesh((2, 2), explicit=True), top_k=2,
                                  capacity_factor=1.0)
    y1, aux1 = composed.moe_stack(layers, x, top_k=2, capacity_factor=1.0)
    np.testing.assert_allclose(np.asarray(y2), np.asarray(y1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(aux2), float(aux1), rtol=1e-6)


def _groups_along(op, mesh):
    """The mesh axes along which an op's device groups vary."""
    shape = mesh.devices.shape
    axes = set()
    for group in op.groups:
        coords = [np.unravel_index(d, shape) for d in group]
        axes |= {mesh.axis_names[i] for i in range(len(shape)) if len({c[i] for c in coords}) > 1}
    return axes


def test_collectives_stay_on_their_axes():
    """composing.md: 4 all-to-alls per layer along expert only; the expert weights'
    gradients of both layers in one all-reduce along data only (w_in and w_out of the
    device's 2 experts, per layer)."""
    compiled, mesh = _grads_program((2, 4))
    ops = hlo.collectives_in_text(compiled)
    a2a = [op for op in ops if op.kind == "all-to-all"]
    assert len(a2a) == 2 * 4
    assert all(op.group_size == 4 and _groups_along(op, mesh) == {"expert"} for op in a2a)
    by_data = [op for op in ops if _groups_along(op, mesh) == {"data"}]
    assert [op.kind for op in by_data] == ["all-reduce"]
    expert_weights = 2 * 2 * (2 * D_MODEL * 32) * 4  # 2 layers, 2 experts, w_in + w_out
    assert len(by_data[0].buffers) == 4
    assert by_data[0].bytes_sent == 2 * expert_weights // 2
    both = [op for op in ops if _groups_along(op, mesh) == {"data", "expert"}]
    assert {op.kind for op in both} <= {"all-gather", "all-reduce"}
    assert all(op.bytes_sent < 2048 for op in both)  # routing counts, stats, the router


@pytest.mark.slow
def test_exercise_answer():
    params, _ = _data()
    assert params["w_in"].shape[0] // _mesh((4, 2)).shape["expert"] == 4
    compiled, mesh = _grads_program((4, 2))
    ops = hlo.collectives_in_text(compiled)
    assert {op.group_size for op in ops if op.kind == "all-to-all"} == {2}
    assert [op.group_size for op in ops if _groups_along(op, mesh) == {"data"}] == [4]


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda p, x, m: composed.moe_layer_2d(p, x[:60], m, top_k=2, capacity_factor=1.0),
     ValueError, "tokens"),
    (lambda p, x, m: composed.moe_layer_2d(moe.init_moe(0, d_model=D_MODEL, d_ff=8,
                                                        n_experts=6), x, m, top_k=2,
                                           capacity_factor=1.0), ValueError, "n_experts"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, expert_axis="e", top_k=2,
                                           capacity_factor=1.0), ValueError, "expert_axis"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, data_axis=0, top_k=2, capacity_factor=1.0),
     TypeError, "data_axis"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, data_axis="expert", top_k=2,
                                           capacity_factor=1.0), ValueError, "different"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, jax.make_mesh((8,), ("expert",),
                                                               devices=DEVICES), top_k=2,
                                           capacity_factor=1.0), ValueError, "data_axis"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, "mesh", top_k=2, capacity_factor=1.0),
     TypeError, "mesh"),
    (lambda p, x, m: composed.moe_stack(p, x, m, top_k=2, capacity_factor=1.0), TypeError,
     "layers"),
    (lambda p, x, m: composed.moe_stack([], x, m, top_k=2, capacity_factor=1.0), TypeError,
     "layers"),
    (lambda p, x, m: composed.moe_stack([p], x, m, top_k=0, capacity_factor=1.0), ValueError,
     "top_k"),
    (lambda p, x, m: composed.init_moe_stack(0, n_layers=0, d_model=4, d_ff=4, n_experts=2),
     ValueError, "n_layers"),
    (lambda p, x, m: composed.init_moe_stack(0, n_layers=2.0, d_model=4, d_ff=4, n_experts=2),
     TypeError, "n_layers"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, top_k=9, capacity_factor=1.0), ValueError,
     "top_k"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, top_k=2.0, capacity_factor=1.0), TypeError,
     "top_k"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, top_k=2, capacity_factor=float("nan")),
     ValueError, "capacity_factor"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, m, top_k=2, capacity_factor=0), ValueError,
     "capacity_factor"),
    (lambda p, x, m: composed.moe_layer_2d(p, x[:, :8], m, top_k=2, capacity_factor=1.0),
     ValueError, "d_model"),
    (lambda p, x, m: composed.moe_layer_2d({"router": p["router"]}, x, m, top_k=2,
                                           capacity_factor=1.0), TypeError, "params"),
    (lambda p, x, m: composed.moe_layer_2d(p, x, jax.make_mesh(
        (2, 4), ("data", "expert"), devices=DEVICES,
        axis_types=(jax.sharding.AxisType.Manual,) * 2), top_k=2, capacity_factor=1.0),
     ValueError, "Manual"),
])
def test_bad_input_is_refused_by_name(call, error, word):
    params, x = _data()
    with pytest.raises(error, match=word):
        call(params, x, _mesh((2, 4)))
