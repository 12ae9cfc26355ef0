"""Tests of spmd_guide.core.hlo_loops: the collectives each ``while`` loop runs per trip.

Literal HLO pins the parser (nested loops, XLA's known trip count); compiled programs on
meshes of 1, 2, 4 and 8 devices pin what XLA:CPU does with a predicate that reads sharded
data, and the results are checked against a NumPy reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.automatic import hidden_collectives as hc
from spmd_guide.core import checks, hlo_loops

NESTED = """HloModule m, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%inner_cond (p: f32[4]) -> pred[] {
  %p = f32[4]{0} parameter(0)
  ROOT %t = pred[] constant(true)
}

%inner_body (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %g = f32[4]{0} collective-permute(%q), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
}

%outer_cond (c: f32[4]) -> pred[] {
  %c = f32[4]{0} parameter(0)
  %r = f32[] constant(0)
  %ar = f32[] all-reduce(%r), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  ROOT %lt = pred[] compare(%ar, %r), direction=LT
}

%outer_body (d: f32[4]) -> f32[4] {
  %d = f32[4]{0} parameter(0)
  %ag = f32[4]{0} all-gather(%d), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  ROOT %w = f32[4]{0} while(%ag), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %loop = f32[4]{0} while(%x), condition=%outer_cond, body=%outer_body
}
"""


def test_literal_program_separates_condition_body_and_nested_loops():
    outer, inner = sorted(hlo_loops.loops_in_text(NESTED), key=lambda lp: lp.name)
    assert (inner.name, outer.name) == ("w", "loop")
    assert [op.kind for op in outer.condition] == ["all-reduce"]
    assert [op.kind for op in outer.body] == ["all-gather"]  # the permute is the inner loop's
    assert outer.trip_count is None
    assert inner.trip_count == 3
    assert inner.per_trip["collective-permute"] == 1
    assert inner.total() == {**dict.fromkeys(inner.per_trip, 0), "collective-permute": 3}
    assert outer.total(5)["all-reduce"] == 5


def test_total_needs_a_trip_count():
    (outer,) = [lp for lp in hlo_loops.loops_in_text(NESTED) if lp.name == "loop"]
    with pytest.raises(ValueError, match="stops on data"):
        outer.total()
    for bad in (-1, 2.0, True, "3", np.nan):
        with pytest.raises(TypeError, match="trips"):
            outer.total(bad)


def test_bad_program_is_refused():
    with pytest.raises(checks.InputTypeError):
        hlo_loops.loops_in_text(42)
    with pytest.raises(ValueError, match="ENTRY"):
        hlo_loops.loops_in_text("HloModule m\n")


def reference_double_until(values: np.ndarray, limit: float) -> tuple[np.ndarray, int]:
    values, trips = values.copy(), 0
    while (values < limit).any():
        values = np.where(values < limit, 2 * values, values)
        trips += 1
    return values, trips


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_sharded_predicate_is_one_all_reduce_per_trip(k):
    mesh = mesh_of(k)
    host = np.linspace(0.5, 40.0, 8 * k, dtype=np.float32) ** 2  # not the page's numbers
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    grow = jax.jit(functools.partial(hc.double_until, limit=500.0))
    (loop,) = hlo_loops.loops(grow, x)
    want_values, want_trips = reference_double_until(host, 500.0)
    values, trips = grow(x)
    np.testing.assert_array_equal(np.asarray(values), want_values)
    assert int(trips) == want_trips
    assert loop.trip_count is None
    expected = 1 if k > 1 else 0  # over one device the reduction needs no message
    assert loop.per_trip == {**dict.fromkeys(loop.per_trip, 0), "all-reduce": expected}
    assert [op.kind for op in loop.condition] == ["all-reduce"] * expected
    assert loop.body == ()


@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_loop_inside_shard_map_sends_nothing_and_stops_per_device(k):
    mesh = mesh_of(k)
    host = np.linspace(0.5, 40.0, 4 * k, dtype=np.float32) ** 2
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    local = jax.jit(functools.partial(hc.double_until_local, limit=500.0, mesh=mesh,
                                      axis_name="x"))
    (loop,) = hlo_loops.loops(local, x)
    assert sum(loop.per_trip.values()) == 0
    values, trips = local(x)
    blocks = host.reshape(k, 4)
    want = [reference_double_until(b, 500.0) for b in blocks]
    np.testing.assert_array_equal(np.asarray(values), np.concatenate([w[0] for w in want]))
    assert np.asarray(trips).tolist() == [w[1] for w in want]


@pytest.mark.parametrize("k", [2, 8])
def test_a_counted_loop_has_a_known_trip_count_and_no_collective(k):
    x = jax.device_put(jnp.ones(2 * k), NamedSharding(mesh_of(k), P("x")))
    fixed = jax.jit(functools.partial(hc.double_n, trips=7))
    (loop,) = hlo_loops.loops(fixed, x)
    assert loop.trip_count == 7
    assert sum(loop.total().values()) == 0
    np.testing.assert_array_equal(np.asarray(fixed(x)), np.full(2 * k, 128.0))


def test_a_psum_in_a_scan_body_counts_once_per_trip():
    mesh = mesh_of(4)

    def kernel(block):
        return jax.lax.scan(lambda c, _: (c + jax.lax.psum(c, "x"), None), block, None,
                            length=6)[0]

    f = jax.jit(jax.shard_map(kernel, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    (loop,) = hlo_loops.loops(f, jnp.arange(8.0))
    assert loop.trip_count == 6
    assert loop.per_trip["all-reduce"] == 1
    assert loop.total()["all-reduce"] == 6
