"""Tests of spmd_guide.automatic.hidden_collectives: sorts that gather, shuffles that do not.

The collective kinds are what XLA:CPU emits on JAX 0.12 (the page states them); values are
checked against NumPy on meshes of 2, 4 and 8 devices and on shapes other than the page's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of, run_python
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.automatic import hidden_collectives as hc
from spmd_guide.core import checks, hlo

sort = jax.jit(hc.sort_along, static_argnums=1)


def kinds(fn, *args):
    return [op.kind for op in hlo.collectives(fn, *args)]


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)])
def test_sorting_along_the_sharded_axis_gathers(k):
    mesh = mesh_of(k)
    host = np.random.default_rng(k).standard_normal(6 * k).astype(np.float32)
    vector = jax.device_put(host, NamedSharding(mesh, P("x")))
    assert kinds(sort, vector, 0) == ["all-gather"]
    np.testing.assert_array_equal(np.asarray(sort(vector, 0)), np.sort(host))
    matrix_host = np.random.default_rng(1).standard_normal((2 * k, 3 * k)).astype(np.float32)
    matrix = jax.device_put(matrix_host, NamedSharding(mesh, P("x", None)))
    assert kinds(sort, matrix, 0) == ["all-to-all", "all-to-all"]
    assert kinds(sort, matrix, 1) == []
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(np.asarray(sort(matrix, axis)),
                                      np.sort(matrix_host, axis=axis))


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)])
def test_shuffling_rows_is_local_and_shard_map_gives_the_same_rows(k):
    mesh = mesh_of(k)
    rows, cols = 3 * k, 10
    x_host = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    x = jax.device_put(x_host, NamedSharding(mesh, P("x", None)))
    keys = jax.device_put(jax.random.split(jax.random.key(k), rows), NamedSharding(mesh, P("x")))
    by_jit = jax.jit(hc.shuffle_rows)
    local = jax.jit(functools.partial(hc.shuffle_rows_local, mesh=mesh, axis_name="x"))
    assert kinds(by_jit, keys, x) == []
    assert kinds(local, keys, x) == []
    one_device = hc.shuffle_rows(jax.random.split(jax.random.key(k), rows), jnp.asarray(x_host))
    np.testing.assert_array_equal(np.asarray(by_jit(keys, x)), np.asarray(one_device))
    np.testing.assert_array_equal(np.asarray(local(keys, x)), np.asarray(one_device))
    np.testing.assert_array_equal(np.sort(np.asarray(one_device), axis=1), x_host)  # permutations
    assert not np.array_equal(np.asarray(one_device), x_host)


@pytest.mark.slow
def test_the_issue_20381_program_has_no_all_gather_with_either_partitioner():
    out = run_python("""
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from spmd_guide.core import hlo
        def func(rng, inputs):
            return jax.vmap(jax.random.permutation)(jax.random.split(rng, inputs.shape[0]), inputs)
        for shardy in (True, False):
            jax.config.update("jax_use_shardy_partitioner", shardy)
            mesh = jax.make_mesh((8,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
            rs, ins = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp", None, None))
            f = jax.jit(func, in_shardings=(rs, ins), out_shardings=ins)
            args = (jax.device_put(jax.random.key(0), rs), jax.device_put(jnp.zeros((24, 64, 16)), ins))
            print(shardy, sum(hlo.collective_counts(f, *args).values()))
    """, devices=8)
    assert out.split() == ["True", "0", "False", "0"]


def test_bad_input_is_refused():
    mesh = mesh_of(4)
    x = jnp.ones(8)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(checks.InputError):
            hc.double_until(x, bad)
    with pytest.raises(checks.InputError, match="axis_name='y'"):
        hc.double_until_local(x, 10.0, mesh, "y")
    with pytest.raises(checks.InputTypeError):
        hc.double_until_local(x, 10.0, "mesh", "x")
    with pytest.raises(checks.InputError, match="not divisible by 4"):
        hc.double_until_local(jnp.ones(6), 10.0, mesh, "x")
    for bad in (-1, 2.5, True):
        with pytest.raises(checks.InputError):
            hc.double_n(x, bad)
    for axis in (1, -2, 0.0, True):
        with pytest.raises(checks.InputError, match="axis"):
            hc.sort_along(x, axis)
    with pytest.raises(checks.InputTypeError, match="keys"):
        hc.shuffle_rows(jnp.zeros((4, 2), jnp.float32), jnp.ones((4, 3)))
    typed = jax.random.split(jax.random.key(0), 4)  # legacy raw keys are keys too
    rows = jnp.arange(12.0).reshape(4, 3)
    assert (hc.shuffle_rows(jax.random.key_data(typed), rows) == hc.shuffle_rows(typed, rows)
            ).all()
    with pytest.raises(checks.InputError, match="one key per row"):
        hc.shuffle_rows(jax.random.split(jax.random.key(0), 3), jnp.ones((4, 3)))
    with pytest.raises(checks.InputError, match="not divisible by 4"):
        hc.shuffle_rows_local(jax.random.split(jax.random.key(0), 6), jnp.ones((6, 3)), mesh, "x")


@pytest.mark.parametrize("k", [2, 8])
def test_the_pages_other_claims_cond_vmap_loop_and_permutation(k):
    """The page says: a cond on sharded data all-reduces its predicate; a vmap-ed while loop
    all-reduces "does any example go on?" per trip; permuting a sharded vector all-gathers."""
    from spmd_guide.core import hlo_loops

    x = jax.device_put(jnp.arange(1.0, 4 * k + 1), NamedSharding(mesh_of(k), P("x")))
    cond = jax.jit(lambda v: jax.lax.cond(jnp.any(v > 3), lambda a: 2 * a, lambda a: a - 1, v))
    (reduce,) = hlo.collectives(cond, x)
    assert reduce.kind == "all-reduce"          # of the predicate alone: one pred[] scalar
    assert [(b.dtype, b.shape) for b in reduce.buffers] == [("pred", ())]
    np.testing.assert_array_equal(np.asarray(cond(x)), 2 * np.asarray(x))

    def one(v):
        return jax.lax.while_loop(lambda a: a < 100.0, lambda a: 2 * a, v)

    # one loop for the whole batch, its "does any example go on?" all-reduced in the
    # condition: every device runs the trips of the slowest example anywhere
    (loop,) = hlo_loops.loops(jax.jit(jax.vmap(one)), x)
    assert [op.kind for op in loop.condition] == ["all-reduce"] and loop.body == ()
    assert loop.trip_count is None
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(one))(x)),
                                  np.asarray(jax.vmap(one)(np.asarray(x))))
    permute = jax.jit(lambda v: jax.random.permutation(jax.random.key(1), v))
    assert kinds(permute, x) == ["all-gather"]
    np.testing.assert_array_equal(np.sort(np.asarray(permute(x))), np.asarray(x))
