"""Tests of spmd_guide.automatic.closures: a closed-over array is a whole constant on every
device (JAX 0.12, XLA:CPU); passed as an argument, each device gets only its block."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.automatic import closures
from spmd_guide.core import checks
from spmd_guide.core.hlo_text import Buffer


@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_closure_is_a_whole_constant_and_the_argument_is_not(k):
    state = closures.host_array((16 * k, 24), seed=k)
    rows = NamedSharding(mesh_of(k), P("x", None))
    from_closure = closures.init_from_closure(state, rows)
    from_argument = closures.init_from_argument(rows)
    assert jax.config.jax_use_simplified_jaxpr_constants is False  # the default this pins
    assert closures.constants(from_closure.lower().compile()) == [Buffer("f32", state.shape)]
    assert closures.constants(from_argument.lower(state).compile()) == []
    assert closures.lowered_size(from_closure) > 2 * state.nbytes  # hex-encoded in the text
    assert closures.lowered_size(from_argument, state) < 2000
    for out in (from_closure(), from_argument(state)):
        np.testing.assert_array_equal(np.asarray(out), state)
        assert out.sharding == rows
        assert out.addressable_shards[0].data.shape == (16, 24)


def test_small_constants_are_left_out():
    f = jax.jit(lambda a: a * 2.0 + 1.0)
    assert closures.constants(f.lower(np.ones(4, np.float32)).compile()) == []


def test_bad_input_is_refused():
    rows = NamedSharding(mesh_of(2), P("x"))
    with pytest.raises(checks.InputTypeError):
        closures.init_from_closure(None, rows)
    with pytest.raises(checks.InputTypeError, match="NamedSharding"):
        closures.init_from_closure(np.ones(4), P("x"))
    with pytest.raises(checks.InputTypeError):
        closures.init_from_argument("rows")
    for bad in (-1, 1.5, True):
        with pytest.raises(checks.InputError):
            closures.constants("HloModule m\nENTRY %e () -> f32[] {\n}\n", min_bytes=bad)
    with pytest.raises(checks.InputError):
        closures.host_array((4, 0))
    with pytest.raises(checks.InputError):
        closures.host_array((4,), seed=-1)


def test_memory_analysis_does_not_see_the_constant():
    """The page says XLA:CPU's memory analysis does not count the constant: for the closure's
    program it reports the block as output and temporaries far below the constant (and no
    arguments, trivially): look for it in the program instead."""
    state = closures.host_array((256, 64))
    rows = NamedSharding(mesh_of(8), P("x", None))
    stats = closures.init_from_closure(state, rows).lower().compile().memory_analysis()
    assert stats.argument_size_in_bytes == 0
    assert stats.temp_size_in_bytes < state.nbytes // 8
    assert stats.output_size_in_bytes == state.nbytes // 8


def test_lowered_size_needs_a_function():
    with pytest.raises(checks.InputTypeError):
        closures.lowered_size("not a function")
