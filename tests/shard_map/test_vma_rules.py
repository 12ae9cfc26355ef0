"""Tests of spmd_guide.shard_map.vma_rules: JAX 0.12's typing rules inside shard_map, asserted.

If a JAX release changes what a psum of an invariant value gives, whether mixing varying and
invariant operands needs a pcast, or the shapes all_to_all returns, these fail, and Part III's
section "Three rules of the types that surprise" must change with them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.shard_map import vma_rules


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)])
def test_psum_of_a_psum_is_k_times_the_total(k):
    x = np.arange(3 * k, dtype=np.float32)
    for check_vma in (True, False):
        assert float(vma_rules.psum_twice(x, mesh_of(k), "x", check_vma=check_vma)) == k * x.sum()
    assert vma_rules.summed_jaxpr(mesh_of(k), "x") == [
        "reduce_sum", "psum_invariant", "pvary", "psum_invariant"]
    mesh = mesh_of(k)
    one = jax.shard_map(lambda: jax.lax.psum(1, "x"), mesh=mesh, in_specs=(), out_specs=P())()
    assert int(one) == k
    pmean = jax.shard_map(lambda b: jax.lax.pmean(jax.lax.psum(b.sum(), "x"), "x"), mesh=mesh,
                          in_specs=P("x"), out_specs=P())(x)
    assert float(pmean) == x.sum()


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)])
def test_mixing_varying_and_invariant_needs_pcast_without_auto_pcast(k):
    mesh = mesh_of(k)
    x = np.arange(2 * k, dtype=np.float32)
    want = x + x.sum()
    assert jax.config.jax_auto_pcast is True  # JAX 0.12's default
    np.testing.assert_array_equal(np.asarray(vma_rules.mix(x, mesh, "x", pcast=False)), want)
    jax.config.update("jax_auto_pcast", False)
    try:
        with pytest.raises(ValueError, match="requires varying manual axes to match"):
            vma_rules.mix(x, mesh, "x", pcast=False)
        np.testing.assert_array_equal(np.asarray(vma_rules.mix(x, mesh, "x", pcast=True)), want)
    finally:
        jax.config.update("jax_auto_pcast", True)


def test_an_invariant_loop_carry_that_becomes_varying_fails_by_auto_pcast():
    mesh = mesh_of(4)

    def bad(b):
        return jax.lax.fori_loop(0, 3, lambda i, c: c + b, jnp.zeros(2))

    def fixed(b):
        start = jax.lax.pcast(jnp.zeros(2), "x", to="varying")
        return jax.lax.fori_loop(0, 3, lambda i, c: c + b, start)

    x = jnp.arange(8.0)
    # With jax_auto_pcast on (the default): scan's TypeError, which suggests pcast, not
    # check_vma=False (loops.py's _check_carry_type).
    with pytest.raises(TypeError, match="carry input and carry output must have equal types"
                       ) as error:
        jax.shard_map(bad, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    assert "jax.lax.pcast(" in str(error.value) and "check_vma" not in str(error.value)
    # With it off, the add in the body fails first: core.py's ValueError, whose message
    # suggests check_vma=False "as a temporary workaround".
    jax.config.update("jax_auto_pcast", False)
    try:
        with pytest.raises(ValueError, match="Primitive add requires varying manual axes to "
                           "match.*temporary workaround pass the check_vma=False"):
            jax.shard_map(bad, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    finally:
        jax.config.update("jax_auto_pcast", True)
    out = jax.shard_map(fixed, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    np.testing.assert_array_equal(np.asarray(out), 3 * np.arange(8.0))


@pytest.mark.parametrize("k", [2, 4, 8])
def test_all_to_all_shapes(k):
    mesh = mesh_of(k)

    def shape(block, split, concat, tiled):
        return vma_rules.all_to_all_block_shape(block, mesh, "x", split_axis=split,
                                                concat_axis=concat, tiled=tiled)

    assert shape((k, 3, 5), 0, 1, False) == (3, k, 5)
    assert shape((k, 3, 5), 0, 2, False) == (3, 5, k)
    assert shape((3, k), 1, 0, False) == (k, 3)
    assert shape((2 * k, 5), 0, 1, True) == (2, 5 * k)
    assert shape((2 * k, 5), 0, 0, True) == (2 * k, 5)


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4])  # 2: slow sweep
def test_untiled_all_to_all_moves_slot_d_to_device_d(k):
    mesh = mesh_of(k)
    x = np.arange(k * k * 3, dtype=np.float32).reshape(k, k, 3)  # device i holds x[i]

    def kernel(block):
        return jax.lax.all_to_all(block[0], "x", 0, 0, tiled=False)[None]

    out = np.asarray(jax.shard_map(kernel, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x))
    np.testing.assert_array_equal(out, x.transpose(1, 0, 2))  # device d: slot d of everyone


def test_bad_input_is_refused():
    mesh = mesh_of(4)
    with pytest.raises(checks.InputError, match="axis_name='y'"):
        vma_rules.psum_twice(jnp.ones(4), mesh, "y")
    with pytest.raises(checks.InputError, match="not divisible by 4"):
        vma_rules.mix(jnp.ones(6), mesh, "x", pcast=True)
    with pytest.raises(checks.InputError):
        vma_rules.mix(jnp.ones(4), mesh, "x", pcast="yes")
    with pytest.raises(checks.InputTypeError):
        vma_rules.psum_twice(jnp.ones(4), "mesh", "x")
    with pytest.raises(checks.InputError, match="one slot per device"):
        vma_rules.all_to_all_block_shape((3, 5), mesh, "x", split_axis=0, concat_axis=1,
                                         tiled=False)
    with pytest.raises(checks.InputError, match="not divisible by 4"):
        vma_rules.all_to_all_block_shape((6, 5), mesh, "x", split_axis=0, concat_axis=1,
                                         tiled=True)
    for bad in (-1, 2, 1.0, True):
        with pytest.raises(checks.InputError):
            vma_rules.all_to_all_block_shape((4, 5), mesh, "x", split_axis=bad, concat_axis=0,
                                             tiled=True)
    with pytest.raises(checks.InputError):
        vma_rules.all_to_all_block_shape((4, 0), mesh, "x", split_axis=0, concat_axis=1,
                                         tiled=True)
