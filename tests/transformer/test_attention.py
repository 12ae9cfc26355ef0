"""Ring attention equals the reference, causal and not, contiguous and zig-zag."""

from __future__ import annotations

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


def test_mismatched_and_wrong_axis():
    x = np.zeros((1, 8, 1, 2), np.float32)
    with pytest.raises(ValueError, match="shape"):
        reference_attention(x, x[:, :4], x, causal=False)
    with pytest.raises(ValueError, match="axis"):
        ring_attention(x, x, x, mesh_of(2, ("seq",)), "model", causal=True)
    assert len(DEVICES) == 8


def test_exercise_answer():
    assert int((attention.causal_work(64, 8, "contiguous")[2] > 0).sum()) == 3


def test_ring_figure_has_a_colour_bar_for_the_share_kept():
    import matplotlib.pyplot as plt

    fig = attention.draw_ring(4, 32, layout="contiguous")
    image_ax, bar_ax = fig.axes
    assert bar_ax.get_ylabel() == "share of scores kept"
    assert bar_ax.get_ylim() == (0, 1)
    assert [t.get_text() for t in image_ax.texts][:2] == ["KV0", "KV3"]
    plt.close(fig)
