"""Tests of spmd_guide.automatic.uneven: JAX 0.12's behaviour on uneven shapes, asserted.

If a JAX release changes what placement or ``with_sharding_constraint`` does with a length the
mesh does not divide, these fail, and the page (Part II, "Uneven shapes inside jit") and the
appendix "When it goes wrong" must be updated with it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of, run_python
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.automatic import uneven
from spmd_guide.core import checks, hlo


def raised(fn):
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - the type is what the test asserts
        return type(error).__name__, str(error)
    return None, ""


def test_placing_an_uneven_array_is_refused_everywhere():
    mesh = mesh_of(4)
    s = NamedSharding(mesh, P("x"))
    six = jnp.arange(6.0)
    assert raised(lambda: jax.device_put(six, s))[0] == "IndivisibleError"
    assert raised(lambda: jax.jit(lambda a: a, in_shardings=s)(six))[0] == "IndivisibleError"
    assert raised(lambda: jax.jit(lambda a: a, out_shardings=s)(six))[0] == "IndivisibleError"
    assert raised(lambda: jax.shard_map(lambda a: a, mesh=mesh, in_specs=P("x"),
                                        out_specs=P("x"))(six))[0] == "ValueError"
    explicit = mesh_of(4, explicit=True)
    placed = jax.device_put(six, NamedSharding(explicit, P()))
    kind, text = raised(lambda: jax.reshard(placed, NamedSharding(explicit, P("x"))))
    assert kind == "ValueError" and "does not evenly divide" in text


def test_a_constrained_intermediate_is_padded_and_right():
    s = NamedSharding(mesh_of(4), P("x"))
    x = jnp.arange(6.0)
    f = jax.jit(uneven.constrained_sum, static_argnums=1)
    text = hlo.compiled_text(f, x, s)
    assert "f32[8]{0} pad(" in text and "f32[2]{0} dynamic-slice(" in text
    assert " select(" in text and " all-reduce(" in text
    np.testing.assert_allclose(float(f(x, s)), float(np.sum(np.sin(2 * np.arange(6.0)))),
                               rtol=1e-6)


@pytest.mark.parametrize(("k", "lengths"), [(4, (5, 6, 8)), (8, (9, 12, 16, 2))])
def test_the_rule_for_returned_constraints(k, lengths):
    for n in lengths:
        assert uneven.observed_layout(n, mesh_of(k), "x") == uneven.returned_layout(n, k)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_rule_on_every_length_to_24(k):
    mesh = mesh_of(k)
    for n in range(1, 25):
        assert uneven.observed_layout(n, mesh, "x") == uneven.returned_layout(n, k), n


def test_the_error_names_the_tiling_and_17_by_16_comes_back_replicated():
    six = jnp.arange(6.0)
    s4 = NamedSharding(mesh_of(4), P("x"))
    kind, text = raised(lambda: jax.jit(lambda a: jax.lax.with_sharding_constraint(a, s4))(six))
    assert kind == "IndivisibleError" and "shape=[2, 2] is incompatible" in text
    s8 = NamedSharding(mesh_of(8), P("x", None))
    out = jax.jit(lambda a: jax.lax.with_sharding_constraint(a, s8))(jnp.ones((17, 16)))
    assert out.sharding.is_fully_replicated
    assert out.addressable_shards[0].data.shape == (17, 16)


@pytest.mark.slow
def test_gspmd_replicates_every_uneven_returned_constraint():
    out = run_python("""
        import jax
        jax.config.update("jax_use_shardy_partitioner", False)
        from spmd_guide.automatic import uneven
        from spmd_guide.automatic.partitioning import auto_mesh
        mesh = auto_mesh((4,), ("x",))
        print(*[uneven.observed_layout(n, mesh, "x") for n in (6, 7, 8)])
    """, devices=4)
    assert out.split() == ["replicated", "replicated", "sharded"]


def test_padded_and_fsdp_spec():
    x, n = uneven.padded(jnp.arange(30.0).reshape(10, 3), 4)
    assert (x.shape, n) == ((12, 3), 10)
    np.testing.assert_array_equal(np.asarray(x[:10]), np.arange(30.0).reshape(10, 3))
    assert not np.asarray(x[10:]).any()
    y, m = uneven.padded(jnp.ones((2, 5)), 5, axis=-1)
    assert (y.shape, m) == ((2, 5), 5)
    assert uneven.fsdp_spec((30, 10), 8, "x") == P()
    assert uneven.fsdp_spec((17, 24), 8, "x") == P(None, "x")
    assert uneven.fsdp_spec((16, 24), 8, "x") == P(None, "x")  # the largest that divides
    assert uneven.fsdp_spec((24, 24), 8, "x") == P("x")  # ties: the first
    assert uneven.fsdp_spec((4,), 8, "x") == P()
    assert uneven.fsdp_spec((), 8, "x") == P()
    for n, k, want in [(6, 4, "IndivisibleError"), (7, 4, "replicated"), (8, 4, "sharded"),
                       (1, 1, "sharded"), (3, 8, "replicated")]:
        assert uneven.returned_layout(n, k) == want


def test_bad_input_is_refused():
    for bad in (0, -1, 2.0, True, np.nan):
        with pytest.raises(checks.InputError):
            uneven.returned_layout(bad, 4)
        with pytest.raises(checks.InputError):
            uneven.returned_layout(4, bad)
        with pytest.raises(checks.InputError):
            uneven.padded(jnp.ones(3), bad)
        with pytest.raises(checks.InputError):
            uneven.fsdp_spec((8,), bad, "x")
    with pytest.raises(checks.InputError):
        uneven.observed_layout(6, mesh_of(4), "y")
    with pytest.raises(checks.InputError, match="axis"):
        uneven.padded(jnp.ones(3), 2, axis=1)
    with pytest.raises(checks.InputError):
        uneven.padded(jnp.ones(()), 2)
    with pytest.raises(checks.InputError):
        uneven.fsdp_spec((8, -1), 2, "x")
    with pytest.raises(checks.InputError):
        uneven.fsdp_spec((8,), 2, "")
    with pytest.raises(checks.InputTypeError):
        uneven.constrained_sum(jnp.ones(4), P("x"))


def test_over_two_axes_the_split_is_named_by_leading_axes_or_not_at_all():
    """The page's 2 x 4 mesh: six elements constrained to P(('a', 'b')) come back P('a');
    constrained to P('b') they come back with a GSPMDSharding that has no PartitionSpec."""
    mesh = mesh_of(8, ("a", "b"), (2, 4))
    six = jnp.arange(6.0)

    def returned(spec):
        return jax.jit(lambda v: jax.lax.with_sharding_constraint(
            2 * v, NamedSharding(mesh, spec)))(six)

    both = returned(P(("a", "b")))
    assert isinstance(both.sharding, NamedSharding) and both.sharding.spec == P("a")
    only_b = returned(P("b"))
    assert not isinstance(only_b.sharding, NamedSharding)
    assert type(only_b.sharding).__name__ == "GSPMDSharding"
    for out in (both, only_b):
        assert out.addressable_shards[0].data.shape == (3,)
        np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(6.0))
