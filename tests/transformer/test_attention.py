"""Ring attention equals the reference, causal and not, contiguous and zig-zag."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_guide.transformer import attention
from spmd_guide.transformer.attention import reference_attention, ring_attention

_reference = jax.jit(reference_attention, static_argnames="causal")


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(n=st.sampled_from([2, 4, 8]), blocks=st.integers(1, 2), batch=st.integers(1, 2),
       heads=st.integers(1, 3), head_dim=st.sampled_from([3, 5]), causal=st.booleans(),
       layout=st.sampled_from(attention.LAYOUTS))
def test_ring_equals_reference(n, blocks, batch, heads, head_dim, causal, layout):
    seq = 2 * n * blocks  # every length divisible by twice the ring size is accepted
    q, k, v = jax.random.normal(jax.random.key(seq + heads), (3, batch, seq, heads, head_dim))
    mesh = mesh_of(n, ("seq",))
    out = jax.jit(lambda q, k, v: ring_attention(q, k, v, mesh, "seq", causal=causal,
                                                 layout=layout))(q, k, v)
    np.testing.assert_allclose(out, _reference(q, k, v, causal=causal),
                               rtol=1e-5, atol=1e-5)
    assert out.sharding.is_equivalent_to(jax.NamedSharding(mesh, jax.P(None, "seq")), 4)


def test_explicit_mesh_input_already_sharded():
    mesh = mesh_of(4, ("seq",), explicit=True)
    x = jax.random.normal(jax.random.key(0), (1, 8, 2, 4))
    q = jax.device_put(x, jax.NamedSharding(mesh, jax.P(None, "seq")))
    out = jax.jit(lambda q: ring_attention(q, q, q, mesh, "seq", causal=True))(q)
    np.testing.assert_allclose(out, _reference(x, x, x, causal=True), atol=1e-5)


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("layout", attention.LAYOUTS)
def test_eager_call_on_unplaced_inputs_on_auto_and_explicit_axes(explicit, layout):
    """A reader's call: NumPy inputs nobody placed, a mesh of either axis type, no jit."""
    mesh = mesh_of(2, ("seq",), explicit=explicit)
    x = np.asarray(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    out = ring_attention(x, x, x, mesh, "seq", causal=True, layout=layout)
    np.testing.assert_allclose(out, _reference(x, x, x, causal=True), atol=1e-5)
    assert out.sharding.is_equivalent_to(jax.NamedSharding(mesh, jax.P(None, "seq")), 4)


@pytest.mark.parametrize("explicit", [False, True])
def test_ring_attention_in_layout_on_auto_and_explicit_axes(explicit):
    mesh = mesh_of(2, ("seq",), explicit=explicit)
    x = jax.random.normal(jax.random.key(2), (1, 8, 1, 4))
    out = jax.jit(lambda x: attention.ring_attention_in_layout(
        x, x, x, mesh, "seq", causal=False, layout="contiguous"))(x)
    np.testing.assert_allclose(out, _reference(x, x, x, causal=False), atol=1e-5)


def test_manual_axes_are_refused():
    mesh = jax.make_mesh((2,), ("seq",), devices=DEVICES[:2],
                         axis_types=(jax.sharding.AxisType.Manual,))
    x = np.zeros((1, 4, 1, 2), np.float32)
    with pytest.raises(ValueError, match="Manual"):
        ring_attention(x, x, x, mesh, "seq", causal=True)


@functools.cache
def _saved(n, explicit=False):
    mesh = mesh_of(n, ("seq",), explicit=explicit)
    q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 16, 2, 4))
    return {r["saved for the backward"]: r for r in
            attention.saved_for_backward(q, k, v, mesh, "seq", causal=True)}, k.nbytes


@pytest.mark.slow
@pytest.mark.parametrize("explicit", [False, True])
def test_backward_keeps_every_kv_block(explicit):
    """ring_attention.md (review M1): the autodiff ring keeps the device's own K and V and
    the 2(n-1) blocks it received, the bytes of the whole sequence's K and V; the rows add up
    to the compiled forward program's outputs, plus the 8-byte pointer per output that the
    compiled program's output tuple holds."""
    saved, kv = _saved(4, explicit)
    received = saved["K or V block received round the ring"]
    assert received["arrays"] == 2 * (4 - 1)
    own = saved["own k block"]["bytes"] + saved["own v block"]["bytes"]
    assert own + received["bytes"] == 2 * kv
    rows = [r for name, r in saved.items() if name != "compiled forward program's outputs"]
    total = saved["compiled forward program's outputs"]["bytes"]
    assert total == sum(r["bytes"] for r in rows) + 8 * sum(r["arrays"] for r in rows)


@pytest.mark.slow
def test_backward_memory_by_ring_size():
    """More devices shrink the score blocks per device, not the K/V blocks: 2n blocks of
    1/n of the sequence, the whole K and V, on every ring size."""
    scores = []
    for n in (2, 4, 8):
        saved, kv = _saved(n)
        kept = sum(saved[name]["bytes"] for name in
                   ("own k block", "own v block", "K or V block received round the ring"))
        assert kept == 2 * kv
        scores.append(saved["score-sized block (scores, weights, masks)"]["bytes"])
    assert scores[0] > scores[1] > scores[2]


def test_causal_work_imbalance_and_zigzag_balance():
    contiguous = attention.causal_work(16, 4, "contiguous").sum(1)
    zigzag = attention.causal_work(16, 4, "zigzag").sum(1)
    assert list(contiguous) == [10, 26, 42, 58]
    assert len(set(zigzag)) == 1 and zigzag.sum() == contiguous.sum() == 16 * 17 // 2
    assert attention.ring_schedule(4)[1].tolist() == [1, 0, 3, 2]


@pytest.mark.parametrize(("shape", "n", "layout", "error", "word"), [
    ((1, 6, 1, 2), 4, "contiguous", ValueError, "divisible by 4"),
    ((1, 12, 1, 2), 4, "zigzag", ValueError, "divisible by 8"),
    ((6, 1, 2), 2, "contiguous", ValueError, "4 dimension"),
    ((1, 8, 1, 2), 2, "spiral", ValueError, "layout"),
])
def test_bad_shapes(shape, n, layout, error, word):
    x = np.zeros(shape, np.float32)
    with pytest.raises(error, match=word):
        ring_attention(x, x, x, mesh_of(n, ("seq",)), "seq", causal=True, layout=layout)


_X = np.zeros((1, 8, 1, 2), np.float32)
BAD = {
    "ring_attention: causal 1": (lambda m: ring_attention(_X, _X, _X, m, "seq", causal=1),
                                 TypeError, "causal"),
    "ring_attention: int q": (lambda m: ring_attention(_X.astype(int), _X, _X, m, "seq",
                                                       causal=True), TypeError, "floating"),
    "ring_attention: mesh a list": (lambda m: ring_attention(_X, _X, _X, DEVICES, "seq",
                                                             causal=True), TypeError, "Mesh"),
    "ring_attention: axis 3": (lambda m: ring_attention(_X, _X, _X, m, 3, causal=True),
                               TypeError, "axis_name"),
    "ring_attention: v of another shape": (lambda m: ring_attention(_X, _X, _X[:, :4], m, "seq",
                                                                    causal=True),
                                           ValueError, "v has shape"),
    "ring_attention_in_layout: causal None": (
        lambda m: attention.ring_attention_in_layout(_X, _X, _X, m, "seq", causal=None,
                                                     layout="contiguous"), TypeError, "causal"),
    "reference_attention: causal 'yes'": (lambda m: reference_attention(_X, _X, _X,
                                                                        causal="yes"),
                                          TypeError, "causal"),
    "layout_positions: seq 2.5": (lambda m: attention.layout_positions(2.5, 2, "contiguous"),
                                  TypeError, "seq"),
    "layout_positions: 0 devices": (lambda m: attention.layout_positions(8, 0, "contiguous"),
                                    ValueError, "n must be at least 1"),
    "check_ring: 6 over 4": (lambda m: attention.check_ring(6, 4, "contiguous"), ValueError,
                             "divisible by 4"),
    "causal_work: n '4'": (lambda m: attention.causal_work(16, "4", "contiguous"), TypeError,
                           "n must be an integer"),
    "ring_schedule: n 0": (lambda m: attention.ring_schedule(0), ValueError, "n"),
    "draw_ring: n 0": (lambda m: attention.draw_ring(0, 16), ValueError, "n"),
    "saved_for_backward: zigzag length": (
        lambda m: attention.saved_for_backward(_X[:, :3], _X[:, :3], _X[:, :3], m, "seq",
                                               causal=True), ValueError, "divisible by 2"),
    "ring_attention_local: positions of the wrong shape": (
        lambda m: jax.shard_map(lambda q: attention.ring_attention_local(
            q, q, q, axis_name="seq", positions=np.zeros((3, 4), int), causal=True),
            mesh=m, in_specs=jax.P(None, "seq"), out_specs=jax.P(None, "seq"))(_X),
        ValueError, "positions must be"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_a_clear_error(case):
    call, error, words = BAD[case]
    with pytest.raises(error, match=words):
        call(mesh_of(2, ("seq",)))


def test_numpy_scalars_are_accepted():
    assert attention.layout_positions(np.int64(8), np.int32(2), "zigzag").tolist() == \
        [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert attention.causal_work(np.int64(8), np.int64(2), "contiguous").sum() == 36
    assert attention.ring_schedule(np.int16(3)).shape == (3, 3)


def test_mismatched_and_wrong_axis():
    x = np.zeros((1, 8, 1, 2), np.float32)
    with pytest.raises(ValueError, match="shape"):
        reference_attention(x, x[:, :4], x, causal=False)
    with pytest.raises(ValueError, match="axis"):
        ring_attention(x, x, x, mesh_of(2, ("seq",)), "model", causal=True)
    assert len(DEVICES) == 8


def test_exercise_answer():
    assert int((attention.causal_work(64, 8, "contiguous")[2] > 0).sum()) == 3
    assert attention.zigzag_plan(64, 8)[2, 5] == "q late\nK/V both"
    assert attention.ring_schedule(8)[2, 5] == 5


@pytest.mark.parametrize(("n", "seq"), [(2, 8), (4, 32), (8, 48)])
def test_zigzag_steps_match_the_mask(n, seq):
    """ring_attention.md: the three cases of the zig-zag ring (ring-flash-attention's
    step 0 / step <= rank / else), checked against the masks on 2, 4 and 8 devices."""
    rows = attention.zigzag_steps(seq, n)
    assert len(rows) == n * n
    work = attention.causal_work(seq, n, "zigzag")
    half = seq // (2 * n)
    for r in rows:
        i, s = r["device"], r["step"]
        assert r["K/V from"] == (i - s) % n
        assert r["scores kept"] == work[i, s]
        assert r["full"] + r["diagonal"] + r["skipped"] == 4
        if s == 0:
            assert (r["full"], r["diagonal"], r["skipped"]) == (1, 2, 1)
            assert r["scores kept"] == 2 * half * (half + 1) // 2 + half * half
        elif s <= i:
            assert (r["q halves"], r["K/V halves"], r["full"], r["skipped"]) == (
                "both", "early", 2, 2)
            assert r["scores kept"] == 2 * half * half
        else:
            assert (r["q halves"], r["K/V halves"], r["full"], r["skipped"]) == (
                "late", "both", 2, 2)
    plan = attention.zigzag_plan(seq, n)
    assert plan.shape == (n, n) and set(plan[:, 0]) == {"causal"}
    assert sum(r["skipped"] for r in rows) == 2 * n * n - n  # 2n - 1 of 4n per device


@pytest.mark.parametrize(("n", "explicit", "shape"), [
    (4, False, (2, 32, 3, 4)),
    pytest.param(2, True, (1, 8, 2, 4), marks=pytest.mark.slow),
    pytest.param(8, False, (2, 48, 1, 3), marks=pytest.mark.slow),
    pytest.param(8, True, (1, 16, 2, 4), marks=pytest.mark.slow)])
def test_skipping_ring_equals_reference(n, explicit, shape):
    """ring_attention.md: the zig-zag ring that computes only the quarters the mask keeps."""
    mesh = mesh_of(n, ("seq",), explicit=explicit)
    q, k, v = jax.random.normal(jax.random.key(n), (3, *shape))
    out = ring_attention(q, k, v, mesh, "seq", causal=True, layout="zigzag", skip_masked=True)
    np.testing.assert_allclose(out, _reference(q, k, v, causal=True), rtol=1e-5, atol=1e-5)
    inside = jax.jit(lambda q: ring_attention(q, k, v, mesh, "seq", causal=True,
                                              layout="zigzag", skip_masked=True))(q)
    np.testing.assert_allclose(inside, out, rtol=1e-6, atol=1e-6)


def test_skipping_ring_counts_fewer_flops():
    """ring_attention.md: fewer FLOPs per device, and at least the quarters' share
    (2n + 1) / 4n of the masked ring's (the program outside the score blocks is shared)."""
    mesh = mesh_of(4, ("seq",))
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 32, 4, 8))
    masked, skipping = (r["FLOPs per device"] for r in attention.zigzag_flops(q, k, v, mesh,
                                                                               "seq"))
    assert 9 / 16 * masked < skipping < 0.75 * masked


@pytest.mark.parametrize(("kwargs", "error", "word"), [
    ({"causal": False, "layout": "zigzag", "skip_masked": True}, ValueError, "causal=True"),
    ({"causal": True, "layout": "contiguous", "skip_masked": True}, ValueError, "zigzag"),
    ({"causal": True, "layout": "zigzag", "skip_masked": "yes"}, TypeError, "skip_masked"),
    ({"causal": True, "layout": "zigzag", "skip_masked": 1}, TypeError, "skip_masked")])
def test_skip_masked_bad_input(kwargs, error, word):
    mesh = mesh_of(2, ("seq",))
    x = np.zeros((1, 8, 1, 2), np.float32)
    with pytest.raises(error, match=word):
        ring_attention(x, x, x, mesh, "seq", **kwargs)
    with pytest.raises(error, match=word):
        attention.ring_attention_in_layout(x, x, x, mesh, "seq", **kwargs)
    with pytest.raises(TypeError, match="mesh"):
        attention.zigzag_flops(x, x, x, "mesh", "seq")


@pytest.mark.parametrize(("seq", "n", "error"), [
    (12, 4, ValueError), (0, 2, ValueError), (8, 0, ValueError), (8.0, 2, TypeError),
    (True, 2, TypeError), (8, np.float32(2), TypeError), (-8, 2, ValueError)])
def test_zigzag_steps_bad_input(seq, n, error):
    with pytest.raises(error):
        attention.zigzag_steps(seq, n)
    with pytest.raises(error):
        attention.zigzag_plan(seq, n)


def test_ring_figure_has_a_colour_bar_for_the_share_kept():
    import matplotlib.pyplot as plt

    fig = attention.draw_ring(4, 32, layout="contiguous")
    image_ax, bar_ax = fig.axes
    assert bar_ax.get_ylabel() == "share of scores kept"
    assert bar_ax.get_ylim() == (0, 1)
    assert [t.get_text() for t in image_ax.texts][:2] == ["KV0", "KV3"]
    plt.close(fig)


def test_nan_in_nan_out_is_documented_and_holds():
    q = np.ones((1, 4, 1, 2), np.float32)
    k = q.copy()
    k[0, 0, 0, 0] = np.nan
    out = np.asarray(reference_attention(q, k, q, causal=True))
    assert np.isnan(out).all()  # every query sees key 0
    assert "NaN" in reference_attention.__doc__


def test_ring_attention_local_outside_shard_map_says_where_to_call_it():
    from spmd_guide.core.checks import InputError
    q = np.ones((1, 4, 1, 2), np.float32)
    with pytest.raises(InputError, match="inside jax.shard_map"):
        attention.ring_attention_local(q, q, q, axis_name="x",
                                       positions=np.zeros((2, 4), np.int32), causal=True)
