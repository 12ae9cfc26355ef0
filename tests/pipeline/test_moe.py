"""The expert-parallel MoE layer against its one-device reference, on 2, 4 and 8 devices."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from hypothesis import given, settings
from hypothesis import strategies as hs

from spmd_guide.core import checks, hlo
from spmd_guide.pipeline import moe

D_MODEL, D_FF, N_EXPERTS, TOKENS = 8, 16, 8, 32


@functools.cache
def _layer(n: int, top_k: int, capacity_factor: float):
    """The jitted sharded layer over the first ``n`` devices, compiled once per case."""
    mesh = mesh_of(n, ("expert",))
    return jax.jit(functools.partial(moe.moe_layer, mesh=mesh, axis_name="expert",
                                     top_k=top_k, capacity_factor=capacity_factor))


@functools.cache
def _reference(top_k: int, capacity_factor: float):
    return jax.jit(functools.partial(moe.reference_moe, top_k=top_k,
                                     capacity_factor=capacity_factor))


@pytest.fixture(scope="module")
def data():
    params = moe.init_moe(jax.random.key(0), d_model=D_MODEL, d_ff=D_FF, n_experts=N_EXPERTS)
    x = jax.random.normal(jax.random.key(1), (TOKENS, D_MODEL))
    return params, x


def _assert_same(got, want):
    (y, stats), (y_ref, ref) = got, want
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    for name in ("tokens_per_expert", "dropped", "kept"):
        np.testing.assert_array_equal(np.asarray(stats[name]), np.asarray(ref[name]))
    assert float(stats["aux_loss"]) == pytest.approx(float(ref["aux_loss"]), rel=1e-6)


@pytest.mark.parametrize(("n", "top_k", "capacity_factor", "drops"), [
    (4, 2, 1.0, True),
    pytest.param(2, 1, 0.5, True, marks=pytest.mark.slow),
    pytest.param(8, 1, 4.0, False, marks=pytest.mark.slow),
])
def test_layer_equals_reference(data, n, top_k, capacity_factor, drops):
    params, x = data
    want = _reference(top_k, capacity_factor)(params, x)
    assert (int(want[1]["dropped"]) > 0) == drops
    got = _layer(n, top_k, capacity_factor)(params, x)
    _assert_same(got, want)
    assert got[0].sharding.spec == jax.P("expert")
    kept = int(np.sum(got[1]["tokens_per_expert"]))
    assert kept + int(got[1]["dropped"]) == TOKENS * top_k


@pytest.mark.slow
def test_gradients_equal_reference(data):
    params, x = data
    weights = jax.random.normal(jax.random.key(2), (TOKENS, D_MODEL))

    def loss(layer):
        def f(params, x):
            y, stats = layer(params, x)
            return jnp.sum(y * weights) + 0.1 * stats["aux_loss"]
        return f

    ref = functools.partial(moe.reference_moe, top_k=2, capacity_factor=1.0)
    want = jax.grad(loss(ref), argnums=(0, 1))(params, x)
    got = jax.jit(jax.grad(loss(_layer(4, 2, 1.0)), argnums=(0, 1)))(params, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(got[0]["router"]).sum()) > 0  # the router learns


@pytest.mark.slow
def test_priority_order_by_hand():
    """Router = identity: tokens 0-3 prefer expert 0 then 1, tokens 4-7 expert 1 then 0."""
    params = {"router": jnp.eye(4), "w_in": jnp.ones((4, 4, 2)), "w_out": jnp.ones((4, 2, 4))}
    x = jnp.array([[3.0, 2, 0, 0]] * 4 + [[2.0, 3, 0, 0]] * 4)
    expected = {  # capacity factor -> kept [token, choice]
        0.5: [[1, 0]] * 2 + [[0, 0]] * 2 + [[1, 0]] * 2 + [[0, 0]] * 2,   # capacity 2
        1.5: [[1, 1]] * 2 + [[1, 0]] * 2 + [[1, 1]] * 2 + [[1, 0]] * 2,   # capacity 6
    }
    for factor, kept in expected.items():
        _, ref = moe.reference_moe(params, x, top_k=2, capacity_factor=factor)
        np.testing.assert_array_equal(np.asarray(ref["kept"]), np.array(kept, bool))
    _, got = _layer(2, 2, 1.5)(params, x)  # one sharded check: compiles are the cost
    np.testing.assert_array_equal(np.asarray(got["kept"]), np.array(expected[1.5], bool))


def test_per_device_rule_depends_on_the_device_count(data):
    params, x = data
    r = moe.route(params, x, top_k=1, capacity_factor=1.0, groups=1)
    per_device = {n: moe.route(params, x, top_k=1, capacity_factor=1.0, groups=n)
                  for n in (2, 4, 8)}
    drops = {n: int(np.sum(~np.asarray(g.kept))) for n, g in per_device.items()}
    assert len(set(drops.values()) | {int(np.sum(~np.asarray(r.kept)))}) > 1
    for g in per_device.values():  # same choices, different drops
        np.testing.assert_array_equal(np.asarray(g.expert), np.asarray(r.expert))


@pytest.mark.slow
@settings(max_examples=2, deadline=None)
@given(n=hs.sampled_from([2, 4]), experts_per_device=hs.integers(1, 2),
       tokens_per_device=hs.integers(1, 5), top_k=hs.integers(1, 2),
       capacity_factor=hs.sampled_from([0.3, 1.0, 1.7]), seed=hs.integers(0, 99))
def test_other_shapes(n, experts_per_device, tokens_per_device, top_k, capacity_factor, seed):
    n_experts = n * experts_per_device
    top_k = min(top_k, n_experts)
    params = moe.init_moe(seed, d_model=4, d_ff=6, n_experts=n_experts)
    x = jax.random.normal(jax.random.key(seed + 1), (n * tokens_per_device, 4))
    want = _reference(top_k, capacity_factor)(params, x)
    got = _layer(n, top_k, capacity_factor)(params, x)
    _assert_same(got, want)


def test_all_to_all_bytes_match_the_compiled_program(data):
    params, x = data
    for n, top_k, factor in [(8, 2, 0.75)]:  # each case costs a compile
        ops = [op for op in hlo.collectives(_layer(n, top_k, factor), params, x)
               if op.kind == "all-to-all"]
        assert len(ops) == 2
        expected = moe.all_to_all_bytes(TOKENS, n, top_k=top_k, n_experts=N_EXPERTS,
                                        capacity_factor=factor, d_model=D_MODEL)
        assert [op.bytes_sent for op in ops] == [expected, expected]
    per_device = moe.all_to_all_bytes(TOKENS, 8, top_k=2, n_experts=N_EXPERTS,
                                      capacity_factor=0.75, d_model=D_MODEL, rule="per_device")
    assert per_device < expected  # global capacity needs a worst-case buffer


def test_traffic_counts_every_kept_assignment(data):
    params, x = data
    r = moe.route(params, x, top_k=2, capacity_factor=1.0)
    m = moe.traffic(r, 4)
    assert m.shape == (4, 4)
    assert m.sum() == int(np.sum(np.asarray(r.kept)))
    kept_rows = np.asarray(r.kept).reshape(4, -1).sum(axis=1)
    np.testing.assert_array_equal(m.sum(axis=1), kept_rows)


def test_dropped_at_other_capacity_factors(data):
    params, x = data
    r = moe.route(params, x, top_k=2, capacity_factor=1.0)
    for factor in (0.5, 1.25):
        other = moe.route(params, x, top_k=2, capacity_factor=factor)
        assert moe.dropped_at(r, factor) == int(np.sum(~np.asarray(other.kept)))
    assert moe.dropped_at(r, 100.0) == 0


def test_load_balancing_loss_is_one_when_even():
    probs = jnp.full((8, 4), 0.25)
    expert = jnp.arange(8)[:, None] % 4
    assert float(moe.load_balancing_loss(probs, expert)) == pytest.approx(1.0)
    skewed = jnp.tile(jnp.array([[0.7, 0.1, 0.1, 0.1]]), (8, 1))
    assert float(moe.load_balancing_loss(skewed, jnp.zeros((8, 1), jnp.int32))) > 2.5


def test_capacity_formula():
    assert moe.capacity(64, top_k=2, n_experts=8, capacity_factor=1.0) == 16
    assert moe.capacity(10, top_k=1, n_experts=4, capacity_factor=1.0) == 3
    assert moe.dispatch_slots(64, 8, top_k=2, n_experts=8, capacity_factor=1.0) == 8


def _bad_cases(params, x):
    mesh = mesh_of(8, ("expert",))
    ok = {"top_k": 1, "capacity_factor": 1.0}
    return [
        ((params, x[:30], mesh, "expert"), ok, checks.InputError, "divisible"),
        ((params, x, mesh_of(8, ("expert",)), "model"), ok, checks.InputError, "not an axis"),
        ((params, x, "mesh", "expert"), ok, checks.InputTypeError, "Mesh"),
        ((moe.init_moe(0, d_model=D_MODEL, d_ff=4, n_experts=4), x, mesh, "expert"), ok,
         checks.InputError, "n_experts"),
        ((params, x, mesh, "expert"), {**ok, "top_k": 9}, checks.InputError, "top_k"),
        ((params, x, mesh, "expert"), {**ok, "top_k": 0}, checks.InputError, "top_k"),
        ((params, x, mesh, "expert"), {**ok, "capacity_factor": 0.0}, checks.InputError,
         "positive"),
        ((params, x, mesh, "expert"), {**ok, "capacity_factor": float("nan")},
         checks.InputError, "finite"),
        ((params, x[:, :4], mesh, "expert"), ok, checks.InputError, "d_model"),
        ((params, x[0], mesh, "expert"), ok, checks.InputError, "dimension"),
        ((params, x.astype(jnp.int32), mesh, "expert"), ok, checks.InputTypeError, "floating"),
        (({"router": params["router"]}, x, mesh, "expert"), ok, checks.InputTypeError,
         "w_in"),
        (({**params, "w_out": params["w_out"][:, :4]}, x, mesh, "expert"), ok,
         checks.InputError, "w_out"),
    ]


def test_bad_inputs_raise_clear_errors(data):
    params, x = data
    for args, kwargs, error, word in _bad_cases(params, x):
        with pytest.raises(error, match=word):
            moe.moe_layer(*args, **kwargs)
    with pytest.raises(checks.InputError, match="top_k"):
        moe.reference_moe(params, x, top_k=9, capacity_factor=1.0)
    with pytest.raises(checks.InputError, match="d_ff"):
        moe.init_moe(0, d_model=4, d_ff=0, n_experts=2)
    with pytest.raises(checks.InputError, match="divisible"):
        moe.route(params, x, top_k=1, capacity_factor=1.0, groups=3)


def test_chapter_exercises():
    """The answers of book/pipeline/experts.md."""
    assert moe.capacity(64, top_k=2, n_experts=8, capacity_factor=1.25) == 20
    kw = {"top_k": 2, "n_experts": 8, "capacity_factor": 1.25, "d_model": 16}
    assert moe.dispatch_slots(64, 8, top_k=2, n_experts=8, capacity_factor=1.25) == 8
    assert moe.all_to_all_bytes(64, 8, **kw) == 3584
    assert moe.all_to_all_bytes(64, 8, rule="per_device", **kw) == 1344


@pytest.mark.slow
def test_descending_on_the_aux_loss_evens_the_router():
    """experts.md: the page's router and batch; gradient steps on router_aux_loss alone bring
    the loss to 1 and the drops to 0, while scaling the router changes no choice."""
    params = moe.init_moe(jax.random.key(0), d_model=16, d_ff=32, n_experts=8)
    x = jax.random.normal(jax.random.key(1), (64, 16))
    kw = dict(top_k=2, capacity_factor=1.0)
    _, before = moe.reference_moe(params, x, **kw)
    np.testing.assert_allclose(moe.router_aux_loss(params["router"], x, top_k=2),
                               before["aux_loss"], rtol=1e-6)
    _, scaled = moe.reference_moe({**params, "router": 4 * params["router"]}, x, **kw)
    assert np.array_equal(scaled["kept"], before["kept"])
    grad = jax.grad(functools.partial(moe.router_aux_loss, x=x, top_k=2))
    router = jax.jit(lambda r: jax.lax.fori_loop(0, 100, lambda _, r: r - 0.5 * grad(r), r))(
        params["router"])
    _, after = moe.reference_moe({**params, "router": router}, x, **kw)
    assert int(before["dropped"]) == 13 and int(after["dropped"]) == 0
    assert float(after["aux_loss"]) < float(before["aux_loss"])
    assert float(after["aux_loss"]) == pytest.approx(1.0, abs=5e-4)
