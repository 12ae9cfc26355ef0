"""step_memory: remat of the partitioner's all-gathers, hybrid sharding against the
accumulation factor, refused donations (book/transformer/step_memory). The compiler facts
are XLA:CPU's on JAX 0.12; a release that changes them fails here, not on the page."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.transformer import step_memory as sm

LAYERS, WIDTH, BATCH = 4, 64, 16


def _placed(mesh, ws, x, axis="x"):
    return (jax.device_put(ws, NamedSharding(mesh, P(None, axis, None))),
            jax.device_put(x, NamedSharding(mesh, P(axis, None))))


@functools.cache
def _inputs():
    ws = sm.init_stack(0, layers=LAYERS, width=WIDTH)
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    return ws, x


# --------------------------------------------------------------------------- remat


def test_remat_counts_and_memory_pinned():
    """The table's facts on XLA:CPU: which variants gather each weight once (kept) and
    which twice (re-gathered), and what keeping costs."""
    ws, x = _inputs()
    mesh = mesh_of(8)
    pws, px = _placed(mesh, ws, x)
    rows = {v: sm.remat_row(mesh, pws, px, variant=v) for v in sm.REMAT_VARIANTS}
    assert [rows[v]["all-gathers per layer"] for v in sm.REMAT_VARIANTS] == [2, 1, 1, 2, 1, 2]
    assert [rows[v]["weight"] for v in sm.REMAT_VARIANTS] == [
        "re-gathered", "kept", "kept", "re-gathered", "kept", "re-gathered"]
    whole = LAYERS * WIDTH * WIDTH * 4
    kept = rows["gathered, no remat"]["peak"] - rows["gathered inside remat"]["peak"]
    assert kept >= 0.75 * whole, (kept, whole)
    assert rows["inside remat, save gathered"]["peak"] - rows["gathered inside remat"][
        "peak"] >= 0.75 * whole


def test_unrolled_stack_keeps_the_gather_unless_the_input_is_pinned():
    ws, x = _inputs()
    mesh = mesh_of(8)
    pws, px = _placed(mesh, ws, x)
    inside = sm.remat_row(mesh, pws, px, variant="gathered inside remat", unrolled=True)
    pinned = sm.remat_row(mesh, pws, px, variant="inside remat, input pinned", unrolled=True)
    assert (inside["all-gathers per layer"], pinned["all-gathers per layer"]) == (1, 2)
    reduces = [op for op in hlo.collectives(
        sm.remat_grad(mesh, variant="gathered inside remat", unrolled=True), pws, px)
        if op.kind == "all-reduce"]
    assert len(reduces) == 1 and len(reduces[0].buffers) == LAYERS


@pytest.mark.parametrize("n, unrolled", [
    (8, False), pytest.param(2, False, marks=pytest.mark.slow),
    pytest.param(4, False, marks=pytest.mark.slow), pytest.param(2, True, marks=pytest.mark.slow),
    pytest.param(8, True, marks=pytest.mark.slow)])
def test_remat_gradients_equal_one_device(n, unrolled):
    ws, x = _inputs()
    expected = jax.grad(sm.stack_loss)(ws, x)
    mesh = mesh_of(n)
    pws, px = _placed(mesh, ws, x)
    for variant in sm.REMAT_VARIANTS:
        got = sm.remat_grad(mesh, variant=variant, unrolled=unrolled)(pws, px)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=variant)
        assert got.sharding.is_equivalent_to(pws.sharding, 3)


# --------------------------------------------------------------------------- hybrid


def _reference_step(ws, mom, xs, *, lr=0.1, beta=0.9):
    g = jax.grad(sm.stack_loss)(ws, xs.reshape(-1, xs.shape[-1]))
    mom = beta * mom + g
    return ws - lr * mom, mom


@pytest.mark.parametrize("shape, k", [
    pytest.param((1, 2), 2, marks=pytest.mark.slow), pytest.param((2, 2), 1, marks=pytest.mark.slow),
    pytest.param((2, 2), 4, marks=pytest.mark.slow), ((2, 4), 2)])
def test_hybrid_step_equals_one_device(shape, k):
    n = shape[0] * shape[1]
    mesh = mesh_of(n, ("data", "fsdp"), shape)
    ws = sm.init_stack(2, layers=2, width=32)
    mom = jax.random.normal(jax.random.key(3), ws.shape) * 0.01
    xs = jax.random.normal(jax.random.key(4), (k, 8, 32))
    want_ws, want_mom = _reference_step(ws, mom, xs)
    lay = sm.hybrid_shardings(mesh)
    got_ws, got_mom = sm.hybrid_step(mesh, k=k)(
        jax.device_put(ws, lay["params"]), jax.device_put(mom, lay["state"]),
        jax.device_put(xs, lay["batch"]))
    np.testing.assert_allclose(got_ws, want_ws, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_mom, want_mom, rtol=1e-5, atol=1e-6)
    assert got_ws.sharding.is_equivalent_to(lay["params"], 3)
    assert got_mom.sharding.is_equivalent_to(lay["state"], 3)


def test_hybrid_peak_falls_with_k_and_state_does_not_move():
    mesh = mesh_of(8, ("data", "fsdp"), (2, 4))
    rows = [sm.hybrid_row(mesh, k=k, layers=2, width=64, batch=1024) for k in (1, 4)]
    assert rows[1]["peak"] < rows[0]["peak"]
    assert rows[1]["temporaries"] > rows[0]["temporaries"] / 4     # a floor, not 1/k
    assert rows[0]["arguments"] == rows[1]["arguments"]
    # Parameters (1/4) and momentum (1/8) are donated and aliased, per device.
    assert rows[0]["aliased"] == rows[1]["aliased"] == 2 * 64 * 64 * 4 * (1 / 4 + 1 / 8)


@pytest.mark.slow
def test_hybrid_without_the_loop_has_the_one_trip_peak_at_the_page_sizes():
    mesh = mesh_of(8, ("data", "fsdp"), (2, 4))
    sizes = dict(layers=4, width=256, batch=2048)
    plain = sm.hybrid_row(mesh, k=1, loop=False, **sizes)
    looped = sm.hybrid_row(mesh, k=1, **sizes)
    assert plain["peak"] == looped["peak"] and plain["k"] == "1, no loop"


def test_hybrid_without_the_loop_equals_one_device():
    mesh = mesh_of(4, ("data", "fsdp"), (2, 2))
    ws = sm.init_stack(2, layers=2, width=32)
    mom = jnp.zeros_like(ws)
    xs = jax.random.normal(jax.random.key(4), (1, 8, 32))
    want_ws, want_mom = _reference_step(ws, mom, xs)
    lay = sm.hybrid_shardings(mesh)
    got_ws, got_mom = sm.hybrid_step(mesh, k=1, loop=False)(
        jax.device_put(ws, lay["params"]), jax.device_put(mom, lay["state"]),
        jax.device_put(xs, lay["batch"]))
    np.testing.assert_allclose(got_ws, want_ws, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_mom, want_mom, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- donation


def _sgd(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)


def _donation_inputs():
    mesh = mesh_of(8)
    w = jax.device_put(jnp.ones((64, 16)) / 8, NamedSharding(mesh, P("x", None)))
    x = jax.device_put(jnp.ones((16, 64)), NamedSharding(mesh, P("x", None)))
    return mesh, w, x


def test_donation_refused_for_another_layout_and_fixed_by_the_same_layout():
    mesh, w, x = _donation_inputs()
    refused = sm.check_donation(
        jax.jit(_sgd, donate_argnums=0, out_shardings=NamedSharding(mesh, P())), w, x)
    assert refused.warned and refused.aliased_bytes == 0
    assert "float32[8,16]" in refused.refused[0]          # the shard's shape, not (64, 16)
    fixed = sm.check_donation(jax.jit(_sgd, donate_argnums=0, out_shardings=w.sharding), w, x)
    assert not fixed.warned and fixed.aliased_bytes == 8 * 16 * 4


def test_donation_silent_cases():
    mesh, w, x = _donation_inputs()
    unspecified = sm.check_donation(jax.jit(_sgd, donate_argnums=(0, 1)), w, x)
    assert not unspecified.warned and unspecified.aliased_bytes == 8 * 16 * 4
    narrowed = sm.check_donation(
        jax.jit(lambda w, x: _sgd(w, x).astype(jnp.bfloat16), donate_argnums=0), w, x)
    assert not narrowed.warned and narrowed.aliased_bytes == 0
    batch = sm.check_donation(
        jax.jit(_sgd, donate_argnums=(0, 1), out_shardings=w.sharding), w, x)
    assert batch.warned and "float32[2,64]" in batch.refused[0]


def test_exercise_answers():
    # 1: re-gathering holds less than keeping.
    ws, x = _inputs()
    mesh = mesh_of(8)
    pws, px = _placed(mesh, ws, x)
    inside = sm.remat_row(mesh, pws, px, variant="gathered inside remat")
    kept = sm.remat_row(mesh, pws, px, variant="gathered, no remat")
    assert inside["peak"] < kept["peak"]
    assert inside["all-gathers per layer"] == kept["all-gathers per layer"] + 1
    # 2: same number of elements per device, another shape: no warning.
    w = jax.device_put(jnp.ones((256, 64)), NamedSharding(mesh, P("x", None)))
    xx = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("x", None)))
    other = sm.check_donation(
        jax.jit(_sgd, donate_argnums=0, out_shardings=NamedSharding(mesh, P(None, "x"))), w, xx)
    assert not other.warned


# --------------------------------------------------------------------------- bad input


BAD = {
    "variant unknown": (lambda m, e: sm.remat_grad(m, variant="remat"), ValueError,
                        "unknown variant 'remat'"),
    "variant None": (lambda m, e: sm.remat_grad(m, variant=None), ValueError, "variant"),
    "mesh explicit": (lambda m, e: sm.remat_grad(e, variant="no remat"), ValueError,
                      "Explicit axes"),
    "mesh missing axis": (lambda m, e: sm.remat_grad(m, variant="no remat", axis="data"),
                          ValueError, "needs 'data'"),
    "mesh not a mesh": (lambda m, e: sm.remat_grad("x", variant="no remat"), TypeError,
                        "jax.sharding.Mesh"),
    "hybrid mesh lacks fsdp": (lambda m, e: sm.hybrid_step(m, k=1), ValueError, "'data'"),
    "k 0": (lambda m, e: sm.hybrid_step(_hybrid(), k=0), ValueError, "k must be at least 1"),
    "k True": (lambda m, e: sm.hybrid_step(_hybrid(), k=True), TypeError, "k must be an integer"),
    "k 2.0": (lambda m, e: sm.hybrid_step(_hybrid(), k=2.0), TypeError, "k must be an integer"),
    "k numpy": (lambda m, e: sm.hybrid_row(_hybrid(), k=np.int64(3), layers=1, width=8,
                                           batch=64), ValueError, "batch is 64"),
    "learning rate nan": (lambda m, e: sm.hybrid_step(_hybrid(), k=1, learning_rate=float("nan")),
                          ValueError, "learning_rate must be a finite"),
    "learning rate negative": (lambda m, e: sm.hybrid_step(_hybrid(), k=1, learning_rate=-1),
                               ValueError, "learning_rate must be positive"),
    "momentum 1": (lambda m, e: sm.hybrid_step(_hybrid(), k=1, momentum=1.0), ValueError,
                   "momentum must be below 1"),
    "loop False with k 2": (lambda m, e: sm.hybrid_step(_hybrid(), k=2, loop=False),
                            ValueError, "needs k=1"),
    "loop not a bool": (lambda m, e: sm.hybrid_step(_hybrid(), k=1, loop="no"), TypeError,
                        "loop"),
    "microbatch indivisible": (lambda m, e: sm.hybrid_row(_hybrid(), k=2, layers=1, width=8,
                                                          batch=12), ValueError, "microbatch"),
    "width indivisible": (lambda m, e: sm.hybrid_row(_hybrid(), k=1, layers=1, width=12,
                                                     batch=16), ValueError, "width is 12"),
    "layers 0": (lambda m, e: sm.init_stack(0, layers=0, width=8), ValueError,
                 "layers must be at least 1"),
    "width float": (lambda m, e: sm.init_stack(0, layers=1, width=8.0), TypeError,
                    "width must be an integer"),
    "ws 2-D": (lambda m, e: sm.remat_row(m, jnp.ones((8, 8)), jnp.ones((8, 8)),
                                         variant="no remat"), ValueError, "ws"),
    "x wrong width": (lambda m, e: sm.remat_row(m, jnp.ones((1, 8, 8)), jnp.ones((8, 4)),
                                                variant="no remat"), ValueError, "width"),
    "unrolled not a bool": (lambda m, e: sm.remat_grad(m, variant="no remat", unrolled=1),
                            TypeError, "unrolled"),
    "donation of a plain function": (lambda m, e: sm.check_donation(_sgd, 1, 2), TypeError,
                                     "jitted function"),
}


def _hybrid():
    return mesh_of(8, ("data", "fsdp"), (2, 4))


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused(case):
    call, error, words = BAD[case]
    with pytest.raises(error, match=words) as info:
        call(mesh_of(8), mesh_of(8, explicit=True))
    assert isinstance(info.value, checks.InputError)
