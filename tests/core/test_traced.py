"""Reading the traced program: primitive and collective counts in a jaxpr."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import mesh_of

from spmd_guide.core import checks, traced


def test_primitive_counts_include_nested_jaxprs():
    def f(x):
        return jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x) * 2

    counts = traced.primitive_counts(f, jnp.ones(4))
    assert counts["cond"] == 1 and counts["sin"] == 1 and counts["cos"] == 1
    assert counts["mul"] == 1


def test_traced_collectives_in_program_order():
    mesh = mesh_of(8)

    def kernel(block):
        gathered = jax.lax.all_gather(block, "x", tiled=True)
        return jax.lax.psum(gathered.sum(), "x")

    f = jax.shard_map(kernel, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P())
    found = traced.traced_collectives(f, jnp.arange(8.0))
    assert [name for _, name, _ in found] == ["all_gather", "psum_invariant"]
    shapes_in, shapes_out = found[0][2].split(" -> ")
    assert shapes_in.startswith("float32[1]") and shapes_out.startswith("float32[8]")


def test_bad_input():
    with pytest.raises(checks.InputTypeError, match="function"):
        traced.primitive_counts(3, jnp.ones(2))
