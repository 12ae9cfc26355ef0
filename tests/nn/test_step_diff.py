"""Tests of spmd_guide.nn.step_diff: a one-key shard_map dropout draws one mask on every
device; jit and fold_in draw one per device (asserted on JAX 0.12, XLA:CPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.nn import step_diff


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4,
                               pytest.param(8, marks=pytest.mark.slow)])
def test_one_key_gives_every_device_the_same_mask(k):
    mesh = mesh_of(k)
    acts = jax.device_put(jnp.ones((16 * k, 24)), NamedSharding(mesh, P("x")))
    key = jax.random.key(k)
    steps = step_diff.dropout_steps(mesh, "x", rate=0.25)
    outs = {name: np.asarray(step(acts, key)) for name, step in steps.items()}
    assert step_diff.distinct_blocks(outs["shard_map, one key"], k) == 1
    assert step_diff.distinct_blocks(outs["jit"], k) == k
    assert step_diff.distinct_blocks(outs["shard_map, fold_in"], k) == k
    # jit draws the one-device mask: the layout does not change the bits.
    one_device = np.asarray(step_diff.dropout(jnp.ones((16 * k, 24)), key, rate=0.25))
    np.testing.assert_array_equal(outs["jit"], one_device)
    for out in outs.values():
        assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
        assert 0.5 < (out != 0).mean() < 0.95
    facts = {name: step_diff.program_facts(step, acts, key) for name, step in steps.items()}
    assert facts["jit"].reads_position and facts["shard_map, fold_in"].reads_position
    assert not facts["shard_map, one key"].reads_position
    for f in facts.values():
        assert sum(f.collectives.values()) == 0
        assert f.flops > 0
    assert facts["shard_map, one key"].flops == pytest.approx(facts["jit"].flops, rel=0.05)


def test_bad_input_is_refused():
    mesh = mesh_of(2)
    for bad in (1.0, -0.1, float("nan"), True, "0.5"):
        with pytest.raises(checks.InputError):
            step_diff.dropout_steps(mesh, "x", rate=bad)
        with pytest.raises(checks.InputError):
            step_diff.dropout(jnp.ones(4), jax.random.key(0), rate=bad)
    with pytest.raises(checks.InputError, match="axis_name='y'"):
        step_diff.dropout_steps(mesh, "y")
    with pytest.raises(checks.InputTypeError):
        step_diff.dropout_steps("mesh", "x")
    with pytest.raises(checks.InputError, match="not divisible by 4"):
        step_diff.distinct_blocks(np.ones((6, 2)), 4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(checks.InputError):
            step_diff.distinct_blocks(np.ones((4, 2)), bad)
