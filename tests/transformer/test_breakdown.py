"""breakdown: each collective of a compiled program by pass, source line and mesh axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core.devices import build_mesh
from spmd_guide.transformer import breakdown


def _matmul_loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def test_collective_breakdown_reads_pass_source_and_axis():
    """A row-parallel matmul: one all-reduce, in the forward pass, at `x @ w`, over 'a'."""
    mesh = build_mesh((2, 2), ("a", "b"), devices=DEVICES[:4])
    w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("a", None)))
    x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P(None, "a")))
    text = jax.jit(jax.grad(_matmul_loss)).lower(w, x).compile().as_text()
    rows = breakdown.collective_breakdown(text, mesh, by=("pass", "where", "axis"),
                                            module="test_breakdown.py")
    assert rows == [{"pass": "forward", "where": "x @ w", "axis": "a",
                     "collective": "all-reduce", "ops": 1, "each carries": "f32[4,4]",
                     "bytes sent": 64}]
    assert breakdown._pass("jit(f)/transpose(jvp())/dot_general") == "backward"
    assert breakdown._pass("jit(f)/(jvp()/gather:transpose(jvp())/reduce_sum)") == \
        "forward + backward"
    with pytest.raises(ValueError, match="breakdown key"):
        breakdown.collective_breakdown(text, mesh, by=("carries",))
