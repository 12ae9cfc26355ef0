"""ring_costs: what a compiled collective matmul costs, and its ring schedule."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide import checks, hlo, ring_costs


@pytest.mark.parametrize("name", ["allgather", "reduce_scatter_bidi"])
def test_compiled_bytes_meet_the_ring_bound(name):
    m, k, n = 16, 32, 8
    lhs, rhs = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    compiled = ring_costs.compile_variant(name, lhs, rhs, mesh_of(4), "x")
    np.testing.assert_allclose(np.asarray(compiled()), lhs @ rhs)
    sent = sum(op.bytes_sent for op in hlo.collectives(compiled.program))
    assert sent == ring_costs.ring_bound_bytes(name, m, k, n, 4, 4)


def test_schedule_visits_every_block_once():
    for name in ("allgather_overlapped", "reduce_scatter_bidi"):
        steps = ring_costs.ring_schedule(name, 4)
        held = {d: set() for d in range(4)}
        for step in steps:
            for device, blocks in enumerate(step.blocks):
                held[device] |= set(blocks)
        assert all(blocks == set(range(4)) for blocks in held.values())


def test_bad_input():
    with pytest.raises(checks.InputError):
        ring_costs.ring_bound_bytes("allgather", -1, 4, 4, 4, 8)
    with pytest.raises(checks.InputError):
        ring_costs.ring_schedule("nope", 4)
