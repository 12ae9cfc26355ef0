"""GQA under tensor parallelism: both layouts equal the one-device reference on 2, 4 and 8
devices, on Auto and Explicit axes; the bytes and collectives the page states; bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide.transformer import gqa


@functools.cache
def _data(n_heads=8, n_kv_heads=2, batch=8, seq=5, d_model=32):
    params = gqa.init_gqa(0, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
    x = jax.random.normal(jax.random.key(1), (batch, seq, d_model))
    return params, x, gqa.reference(params, x)


def _decode(step, params, x, max_len):
    cache = gqa.init_cache(params, batch=x.shape[0], max_len=max_len)
    ys = []
    for t in range(x.shape[1]):
        y, cache = step(params, x[:, t], cache, t)
        ys.append(y)
    return jnp.stack(ys, axis=1), cache


def test_decode_steps_equal_the_reference_on_one_device():
    params, x, ref = _data()
    got, cache = _decode(jax.jit(gqa.decode_step), params, x, max_len=7)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert cache["k"].shape == (8, 2, 7, 4)
    assert not np.any(np.asarray(cache["k"][:, :, 5:]))  # nothing written past the tokens


def test_replicated_kv_heads_are_the_same_model():
    params, x, ref = _data()
    for copies in (2, 4):
        np.testing.assert_allclose(gqa.reference(gqa.replicate_kv_heads(params, copies), x),
                                   ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("n", "explicit"), [
    (8, False), pytest.param(8, True, marks=pytest.mark.slow), (4, True),
    pytest.param(4, False, marks=pytest.mark.slow),
    *(pytest.param(2, e, marks=pytest.mark.slow) for e in (False, True))])
@pytest.mark.parametrize("layout", gqa.LAYOUTS)
def test_sharded_decode_equals_reference(n, layout, explicit):
    params, x, ref = _data()
    mesh, copies = gqa.make_mesh(DEVICES[:n], n_heads=8, n_kv_heads=2, layout=layout,
                                 explicit=explicit)
    p = gqa.replicate_kv_heads(params, copies)
    got, cache = _decode(functools.partial(gqa.sharded_decode_step, mesh=mesh), p, x, 6)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    want = jax.NamedSharding(mesh, gqa.SPECS["cache"])
    assert cache["k"].sharding.is_equivalent_to(want, 4)


@pytest.mark.slow
@pytest.mark.parametrize(("n", "h", "kv", "layout"), [
    (8, 8, 1, "replicate_kv"), (8, 8, 1, "split_batch"), (4, 8, 8, "replicate_kv"),
    (4, 16, 8, "split_batch"), (8, 16, 4, "split_batch")])
def test_other_shapes(n, h, kv, layout):
    params, x, ref = _data(n_heads=h, n_kv_heads=kv, batch=8, seq=3, d_model=2 * h)
    mesh, copies = gqa.make_mesh(DEVICES[:n], n_heads=h, n_kv_heads=kv, layout=layout)
    step = jax.jit(functools.partial(gqa.sharded_decode_step, mesh=mesh))
    got, _ = _decode(step, gqa.replicate_kv_heads(params, copies), x, 4)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_plan():
    assert gqa.plan(8, n_heads=8, n_kv_heads=2, layout="replicate_kv") == {
        "mesh_shape": (1, 8), "kv_copies": 4}
    assert gqa.plan(8, n_heads=8, n_kv_heads=2, layout="split_batch") == {
        "mesh_shape": (4, 2), "kv_copies": 1}
    assert gqa.plan(2, n_heads=8, n_kv_heads=4, layout="replicate_kv")["kv_copies"] == 1
    assert gqa.plan(2, n_heads=8, n_kv_heads=4, layout="split_batch")["mesh_shape"] == (1, 2)


@pytest.mark.parametrize("explicit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_costs_from_the_compiled_program(explicit):
    """tensor_parallelism.md: on 8 devices with 2 KV heads, replicating stores each cache
    slice 4 times (the same cache bytes per device as one KV head for the whole batch),
    splitting the batch stores a quarter of that and all-reduces a quarter of the batch over
    2 devices instead of 8; it holds more weight bytes per device."""
    params, _, _ = _data()
    rows = {}
    for layout in gqa.LAYOUTS:
        mesh, copies = gqa.make_mesh(DEVICES, n_heads=8, n_kv_heads=2, layout=layout,
                                     explicit=explicit)
        rows[layout] = gqa.costs(gqa.replicate_kv_heads(params, copies), batch=16,
                                 max_len=32, mesh=mesh)
    rep, split = rows["replicate_kv"], rows["split_batch"]
    one_head = 2 * 16 * 32 * 4 * 4  # k and v, whole batch, one head of 4, float32
    assert rep["cache bytes/device"] == one_head
    assert split["cache bytes/device"] == one_head // 4
    assert rep["collectives"] == split["collectives"] == "1 all-reduce"
    y = 16 * 32 * 4  # the [batch, d_model] output
    assert rep["bytes sent/device"] == 2 * 7 * y // 8
    assert split["bytes sent/device"] == 2 * (y // 4) // 2
    attn = 4 * 32 * 32 * 4  # wq, wo: d_model x d_model; wk, wv repeated to d_model too
    assert rep["weight bytes/device"] == attn // 8
    assert split["weight bytes/device"] == (2 * 32 * 32 + 2 * 32 * 8) * 4 // 2


def test_exercise_answer():
    """tensor_parallelism.md, exercise: 8 KV heads on 32 devices."""
    assert gqa.plan(32, n_heads=64, n_kv_heads=8, layout="replicate_kv")["kv_copies"] == 4
    assert gqa.plan(32, n_heads=64, n_kv_heads=8, layout="split_batch")["mesh_shape"] == (4, 8)


def test_kv_heads_the_model_axis_cannot_split_are_refused_by_name():
    params, x, _ = _data()
    mesh = jax.make_mesh((1, 8), gqa.AXES, devices=DEVICES)
    cache = gqa.init_cache(params, batch=8, max_len=4)
    with pytest.raises(ValueError, match=r"2 KV head.*replicate_kv_heads\(params, 4\)"):
        gqa.sharded_decode_step(params, x[:, 0], cache, 0, mesh)


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda p, x, c, m: gqa.init_gqa(0, d_model=32, n_heads=8, n_kv_heads=3), ValueError,
     "n_kv_heads"),
    (lambda p, x, c, m: gqa.init_gqa(0, d_model=30, n_heads=8, n_kv_heads=2), ValueError,
     "d_model"),
    (lambda p, x, c, m: gqa.init_gqa(0, d_model=32, n_heads=8.0, n_kv_heads=2), TypeError,
     "n_heads"),
    (lambda p, x, c, m: gqa.init_gqa(0, d_model=32, n_heads=8, n_kv_heads=True), TypeError,
     "n_kv_heads"),
    (lambda p, x, c, m: gqa.init_gqa(0, d_model=32, n_heads=8, n_kv_heads=0), ValueError,
     "n_kv_heads"),
    (lambda p, x, c, m: gqa.plan(8, n_heads=8, n_kv_heads=3, layout="split_batch"), ValueError,
     "n_kv_heads"),
    (lambda p, x, c, m: gqa.plan(6, n_heads=12, n_kv_heads=4, layout="replicate_kv"),
     ValueError, "device count"),
    (lambda p, x, c, m: gqa.plan(6, n_heads=8, n_kv_heads=4, layout="split_batch"),
     ValueError, "split_batch"),
    (lambda p, x, c, m: gqa.plan(3, n_heads=12, n_kv_heads=4, layout="replicate_kv"),
     ValueError, "n_kv_heads"),
    (lambda p, x, c, m: gqa.plan(8, n_heads=8, n_kv_heads=2, layout="tp"), ValueError, "layout"),
    (lambda p, x, c, m: gqa.plan(np.float32(8), n_heads=8, n_kv_heads=2, layout="split_batch"),
     TypeError, "n_devices"),
    (lambda p, x, c, m: gqa.replicate_kv_heads(p, 0), ValueError, "copies"),
    (lambda p, x, c, m: gqa.replicate_kv_heads(p, 2.0), TypeError, "copies"),
    (lambda p, x, c, m: gqa.decode_step(p, x[:, :, 0], c, 0), ValueError, "x"),
    (lambda p, x, c, m: gqa.decode_step(p, x[:, 0], c, 4), ValueError, "pos"),
    (lambda p, x, c, m: gqa.decode_step(p, x[:, 0], c, -1), ValueError, "pos"),
    (lambda p, x, c, m: gqa.decode_step(p, x[:, 0], c, 1.0), TypeError, "pos"),
    (lambda p, x, c, m: gqa.decode_step(p, x[:4, 0], c, 0), ValueError, "cache"),
    (lambda p, x, c, m: gqa.decode_step(p, x[:, 0], {"k": c["k"]}, 0), TypeError, "cache"),
    (lambda p, x, c, m: gqa.decode_step(p | {"wv": p["wv"][:, :1]}, x[:, 0], c, 0), ValueError,
     "wv"),
    (lambda p, x, c, m: gqa.decode_step({"wq": p["wq"]}, x[:, 0], c, 0), TypeError, "params"),
    (lambda p, x, c, m: gqa.init_cache(p, batch=0, max_len=4), ValueError, "batch"),
    (lambda p, x, c, m: gqa.make_mesh(8, n_heads=8, n_kv_heads=2, layout="split_batch"),
     TypeError, "devices"),
    (lambda p, x, c, m: gqa.make_mesh(["cpu"] * 8, n_heads=8, n_kv_heads=2,
                                      layout="split_batch"), TypeError, "devices"),
    (lambda p, x, c, m: gqa.init_cache(p, batch=8, max_len=np.float64(4)), TypeError,
     "max_len"),
    (lambda p, x, c, m: gqa.sharded_decode_step(p, x[:, 0], c, 0, "mesh"), TypeError, "mesh"),
    (lambda p, x, c, m: gqa.sharded_decode_step(
        p, x[:, 0], c, 0, jax.make_mesh((2,), ("model",), devices=DEVICES[:2])), ValueError,
     "batch"),
    (lambda p, x, c, m: gqa.sharded_decode_step(
        p, x[:6, 0], gqa.init_cache(p, batch=6, max_len=4), 0, m), ValueError, "batch"),
    (lambda p, x, c, m: gqa.costs(p, batch=6, max_len=4, mesh=m), ValueError, "batch"),
])
def test_bad_input_is_refused_by_name(call, error, word):
    params, x, _ = _data()
    mesh, _ = gqa.make_mesh(DEVICES[:8], n_heads=8, n_kv_heads=2, layout="split_batch")
    cache = gqa.init_cache(params, batch=8, max_len=4)
    with pytest.raises(error, match=word):
        call(params, x, cache, mesh)
