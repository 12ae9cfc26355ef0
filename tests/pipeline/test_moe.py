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
        # experts.md: JAX emits one array all-to-all split n ways; XLA:CPU's all-to-all
        # decomposer makes each a tuple of n buffers, one per destination.
        assert moe.lowered_all_to_alls(_layer(n, top_k, factor), params, x) == [n, n]
        assert [len(op.buffers) for op in ops] == [n, n]
        # and the layer's 4 psums travel in 2 all-reduces (experts.md, the aux loss)
        lowered = _layer(n, top_k, factor).lower(params, x).as_text()
        reduces = [op for op in hlo.collectives(_layer(n, top_k, factor), params, x)
                   if op.kind == "all-reduce"]
        assert lowered.count('"stablehlo.all_reduce"') == 4
        assert sum(len(op.buffers) for op in reduces) == 4 and len(reduces) == 2
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


@pytest.mark.parametrize(("tokens", "factor", "want"), [
    (100, 1.1, 11),   # 1.1 * 100 / 10 is 11.000000000000002 in floats
    (100, 0.7, 7),    # and 0.7 * 100 / 10 is 7.000000000000001
    (30, 1.0 / 3, 1),  # a factor that prints as 0.3333333333333333: just under 1 slot
])
def test_capacity_is_exact_where_floats_round_up(tokens, factor, want):
    assert moe.capacity(tokens, top_k=1, n_experts=10, capacity_factor=factor) == want


def test_numpy_scalars_work_like_python_numbers(data):
    params, x = data
    assert moe.capacity(np.int64(64), top_k=np.int32(2), n_experts=np.uint8(8),
                        capacity_factor=np.float32(1.25)) == 20
    kw = {"top_k": np.int64(2), "capacity_factor": np.float64(1.0)}
    _, want = moe.reference_moe(params, x, **kw)
    assert int(want["dropped"]) == int(moe.reference_moe(params, x, top_k=2,
                                                         capacity_factor=1.0)[1]["dropped"])
    assert moe.all_to_all_bytes(np.int64(64), np.int64(8), top_k=2, n_experts=8,
                                capacity_factor=np.float32(1.25), d_model=np.int64(16)) == 3584
    assert moe.dropped_at(moe.route(params, x, **kw), np.float64(100.0)) == 0


@pytest.mark.parametrize("layout", [
    "replicated", pytest.param("sharded elsewhere", marks=pytest.mark.slow)])
def test_layer_on_explicit_axes_equals_reference(data, layout):
    """jax.make_mesh's default axes are Explicit: the layer lays out its inputs itself."""
    params, x = data
    mesh = mesh_of(4, ("expert",), explicit=True)
    if layout == "sharded elsewhere":  # x split by columns, w_in by d_ff
        x = jax.device_put(x, jax.NamedSharding(mesh, jax.P(None, "expert")))
        params = {**params, "w_in": jax.device_put(
            params["w_in"], jax.NamedSharding(mesh, jax.P(None, None, "expert")))}
    want = _reference(2, 1.0)(params, x)
    got = jax.jit(functools.partial(moe.moe_layer, mesh=mesh, axis_name="expert", top_k=2,
                                    capacity_factor=1.0))(params, x)
    _assert_same(got, want)
    assert got[0].sharding.is_equivalent_to(jax.NamedSharding(mesh, jax.P("expert")), 2)
    eager = moe.moe_layer(params, x, mesh, "expert", top_k=2, capacity_factor=1.0)
    _assert_same(eager, want)


def test_ragged_all_to_all_is_not_implemented_on_cpu():
    """experts.md says not every backend runs jax.lax.ragged_all_to_all: XLA:CPU does not
    (JAX 0.12). If this starts passing, the page's sentence must change."""
    mesh = mesh_of(2, ("x",))

    def body(op, out, i_off, send, o_off, recv):
        return jax.lax.ragged_all_to_all(op[0], out[0], i_off[0], send[0], o_off[0],
                                         recv[0], axis_name="x")[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(jax.P("x"),) * 6,
                              out_specs=jax.P("x")))
    sizes = jnp.full((2, 2), 2, jnp.int32)
    offsets = jnp.array([[0, 2], [0, 2]], jnp.int32)
    with pytest.raises(Exception, match="ragged-all-to-all.*not supported by XLA:CPU"):
        f(jnp.ones((2, 4)), jnp.zeros((2, 4)), offsets, sizes, offsets.T, sizes)


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
    for args, kwargs, error, word in _bad_cases(params, x)[:2]:  # and on Explicit axes
        args = (args[0], args[1], mesh_of(8, args[2].axis_names, explicit=True), args[3])
        with pytest.raises(error, match=word):
            moe.moe_layer(*args, **kwargs)


def _other_bad_cases(params, x):
    """(function, args, kwargs, error, words) for every public function but moe_layer."""
    cap = {"top_k": 2, "n_experts": 8, "capacity_factor": 1.0}
    size = {**cap, "d_model": 16}
    routing = moe.route(params, x, top_k=2, capacity_factor=1.0)
    E, TE = checks.InputError, checks.InputTypeError
    return [
        (moe.capacity, (-32,), cap, E, "tokens must be at least 1, got -32"),
        (moe.load_balancing_loss, (routing.probs, jnp.full(routing.expert.shape, 8, jnp.int32)),
         {}, E, "expert ids must be in"),
        (moe.capacity, (32,), {**cap, "top_k": 9}, E, "top_k must be at most 8, got 9"),
        (moe.capacity, (32,), {**cap, "n_experts": 0}, E, "n_experts"),
        (moe.capacity, (32.0,), cap, TE, "tokens must be an integer"),
        (moe.capacity, (32,), {**cap, "capacity_factor": float("nan")}, E, "finite"),
        (moe.capacity, (32,), {**cap, "capacity_factor": "1.0"}, TE, "real number"),
        (moe.capacity, (32,), {**cap, "capacity_factor": -1.0}, E, "positive"),
        (moe.dispatch_slots, (30, 8), cap, E, "tokens is 30.*8"),
        (moe.dispatch_slots, (32, 0), cap, E, "n_devices"),
        (moe.dispatch_buffer_bytes, (32, 8), {**size, "d_model": 0}, E, "d_model"),
        (moe.dispatch_buffer_bytes, (32, 8), {**size, "bytes_per_element": "4"}, TE,
         "bytes_per_element"),
        (moe.dispatch_buffer_bytes, (36, 8), {**size, "rule": "per_device"}, E, "tokens is 36"),
        (moe.all_to_all_bytes, (32, 8), {**size, "rule": "local"}, E, "rule"),
        (moe.all_to_all_bytes, (32, 8), {**size, "top_k": 9}, E, "top_k"),
        (moe.init_moe, (0,), {"d_model": 4, "d_ff": 0, "n_experts": 2}, E, "d_ff"),
        (moe.init_moe, ("seed",), {"d_model": 4, "d_ff": 4, "n_experts": 2}, TE, "key"),
        (moe.reference_moe, (params, x), {"top_k": 9, "capacity_factor": 1.0}, E, "top_k"),
        (moe.reference_moe, (params, x), {"top_k": 1, "capacity_factor": float("inf")}, E,
         "finite"),
        (moe.route, (params, x), {"top_k": 1, "capacity_factor": 1.0, "groups": 3}, E,
         "divisible"),
        (moe.route, (params, x), {"top_k": 1, "capacity_factor": 1.0, "groups": 0}, E,
         "groups"),
        (moe.dropped_at, ("routing", 1.0), {}, TE, "Routing"),
        (moe.dropped_at, (routing, float("nan")), {}, E, "finite"),
        (moe.traffic, (routing._asdict(), 4), {}, TE, "Routing"),
        (moe.traffic, (routing, 3), {}, E, "divisible by 3"),
        (moe.load_balancing_loss, (routing.probs[0], routing.expert), {}, E, "probs"),
        (moe.load_balancing_loss, (routing.probs, routing.gate), {}, TE, "integer"),
        (moe.load_balancing_loss, (routing.probs, routing.expert[:4]), {}, E, "tokens"),
        (moe.router_aux_loss, (params["router"], x), {"top_k": 9}, E, "top_k"),
        (moe.router_aux_loss, (params["router"], x[:, :4]), {"top_k": 1}, E, "d_model"),
        (moe.draw_traffic, (np.ones((2, 3), int),), {}, E, "square"),
        (moe.draw_traffic, (np.ones((2, 2)),), {}, TE, "integer"),
        (moe.lowered_all_to_alls, ("layer", x), {}, TE, "function"),
    ]


def test_every_public_function_refuses_bad_input(data):
    params, x = data
    for fn, args, kwargs, error, words in _other_bad_cases(params, x):
        with pytest.raises(error, match=words):
            fn(*args, **kwargs)


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


# --------------------------------------------------------------------------- bad input, by class
SIZES = {"top_k": 2, "capacity_factor": 1.0, "d_model": 8}


@pytest.mark.parametrize(("call", "word"), [
    # Experts that do not split over the devices (6 experts, 8 devices): the layer refuses
    # them, so must its costs.
    (lambda: moe.all_to_all_bytes(32, 8, n_experts=6, **SIZES), "n_experts"),
    (lambda: moe.dispatch_buffer_bytes(32, 8, n_experts=6, **SIZES), "n_experts"),
    (lambda: moe.dispatch_buffer_bytes(32, 8, n_experts=6, rule="per_device", **SIZES),
     "n_experts"),
    (lambda: moe.dispatch_slots(32, 8, top_k=2, n_experts=12, capacity_factor=1.0), "n_experts"),
    (lambda: moe.draw_traffic(np.ones((2, 2), int), title=3), "title"),
    (lambda: moe.draw_traffic(-np.ones((2, 2), int)), "negative"),
])
def test_sizes_and_strings_the_layer_would_refuse_are_refused(call, word):
    with pytest.raises(checks.InputError, match=word):
        call()


def test_costs_accept_experts_that_split():
    assert moe.all_to_all_bytes(32, 8, n_experts=16, **SIZES) > 0
    assert moe.dispatch_slots(32, 8, top_k=2, n_experts=8, capacity_factor=1.0) >= 1


def test_lowered_all_to_alls_refuses_arguments_that_are_not_arrays():
    with pytest.raises(checks.InputError, match="args"):
        moe.lowered_all_to_alls(lambda t: t, "a")
