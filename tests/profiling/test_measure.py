"""spmd_guide.profiling.measure: a straggler makes the others wait, the first call is not the
step, live bytes per device read from the memory profile match the arrays and the compiled
program's outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.nn import STRATEGIES, init_mlp
from spmd_guide.profiling import measure, tracing


def test_the_devices_with_less_work_wait_for_the_straggler():
    mesh = mesh_of(4, explicit=True)
    step, args = measure.straggler_program(mesh, "x", [2, 2, 200, 2])
    trace = tracing.capture(step, *args, repeats=1)
    assert trace.collective_counts() == hlo.collective_counts(step, *args)
    assert trace.collective_counts()["all-reduce"] == 2
    rows = {r["device"]: r for r in trace.device_summary()}
    assert max(rows, key=lambda d: rows[d]["compute_us"]) == 2
    lined_up, last = measure.waits_per_collective(trace).values()
    assert set(last) == {0, 1, 2, 3}
    # At the last all-reduce the others wait for the straggler's loop, more than it waits;
    # each waits the gap between its arrival and the straggler's: of the order of the
    # straggler's compute, not equal to it on shared cores (the page's stated range).
    others = sorted(last[d] for d in (0, 1, 3))
    assert others[1] > last[2], last
    assert 0.25 * rows[2]["compute_us"] < others[1] < 2 * rows[2]["compute_us"] + 1000, (
        last, rows[2])


def test_a_straggler_that_takes_no_cpu_makes_the_others_wait_its_delay():
    """Device 2 sleeps 40 ms in a host callback: the other devices wait about 40 ms at the
    last all-reduce, however loaded the cores are (the sleeping thread takes no CPU)."""
    mesh = mesh_of(4)
    step, args = measure.straggler_program(mesh, "x", [1] * 4, delay_ms=[0, 0, 40, 0])
    trace = tracing.capture(step, *args, repeats=1)
    last = list(measure.waits_per_collective(trace).values())[-1]
    others = sorted(last[d] for d in (0, 1, 3))
    assert others[0] > last[2], last
    assert 0.7 * 40e3 < others[1] < 1.5 * 40e3, last  # the median, as the page states


def test_the_straggler_program_computes_the_sum_of_every_device_s_loop():
    mesh = mesh_of(2)
    step, (x, w, work) = measure.straggler_program(mesh, "x", [0, 2], rows=2, width=4)
    xs = np.asarray(x) / 2  # divided by the total work
    expected = xs[:2].sum() + np.tanh(np.tanh(xs[2:] @ np.asarray(w)) @ np.asarray(w)).sum()
    assert float(step(x, w, work)) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("work, match", [([1, 2, 3], "one entry per device"),
                                         ([1, -1], "at least 0"), ("12", "sequence")])
def test_straggler_bad_work_is_refused(work, match):
    with pytest.raises(checks.InputError, match=match):
        measure.straggler_program(mesh_of(2), "x", work)


@pytest.mark.parametrize("delay, match", [([1.0], "one entry per device"),
                                          ([0, -1], "at least 0"), ([0, float("nan")], "finite"),
                                          ([0, 1e9], "at most"), ("12", "sequence"),
                                          ([0, True], "real number")])
def test_straggler_bad_delay_is_refused(delay, match):
    with pytest.raises(checks.InputError, match=match):
        measure.straggler_program(mesh_of(2), "x", [1, 1], delay_ms=delay)


def test_straggler_bad_axis_or_mesh_is_refused():
    with pytest.raises(checks.InputError):
        measure.straggler_program(mesh_of(2), "y", [1, 1])
    with pytest.raises(checks.InputError):
        measure.straggler_program("mesh", "x", [1, 1])


def test_the_first_call_includes_compiling():
    x = jnp.ones((32, 32))
    times = measure.call_times(lambda a: jnp.tanh(a @ a).sum(), x, calls=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert measure.steady_ratio(times) > 1
    jitted = jax.jit(lambda a: jnp.sin(a) @ a)
    for _ in range(2):  # the second time too: a fresh jit, never a cache hit
        stages = measure.stage_times(jitted, x)
        assert list(stages) == ["trace and lower", "compile", "first run", "second run"]
        assert stages["compile"] > stages["second run"] > 0
    with pytest.raises(checks.InputError, match="calls"):
        measure.call_times(jnp.sin, x, calls=0)
    with pytest.raises(checks.InputError, match="two call times"):
        measure.steady_ratio([1.0])
    with pytest.raises(checks.InputError, match="not a compiled"):
        measure.stage_times(jax.jit(jnp.sin).lower(x).compile(), x)


def test_live_bytes_per_device_follow_a_sharded_array():
    mesh = mesh_of(4)
    before = measure.live_bytes()
    x = jax.device_put(np.ones((4 * 256,), np.float32), NamedSharding(mesh, P("x")))
    after = measure.live_bytes()
    for d in range(4):
        assert after[d] - before.get(d, 0) == 256 * 4
    del x
    with pytest.raises(checks.InputError, match="device_memory_profile"):
        measure.live_bytes("profile")


def test_after_a_step_each_device_holds_the_outputs_more():
    strategy = STRATEGIES["auto_dp"]
    mesh = strategy.mesh(DEVICES[:4])
    params = init_mlp(jax.random.key(0), [16, 32, 8])
    batch = (np.ones((8, 16), np.float32), np.ones((8, 8), np.float32))
    params, batch = strategy.shard(params, batch, mesh)
    step = strategy.sgd_step(mesh, params, learning_rate=0.1)
    found = measure.memory_after_step(step, params, batch)
    outputs = jax.eval_shape(step, params, batch)
    leaves = jax.tree.leaves(outputs)
    grew = {d: found.after[d] - found.before.get(d, 0) for d in range(4)}
    array_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)  # replicated
    assert set(grew.values()) == {array_bytes}
    # The analysis also counts the output tuple's table: one 8-byte pointer per output.
    assert found.compiled.output_bytes - array_bytes == 8 * len(leaves)
    assert len(found.rows()) >= 4 and found.compiled.temp_bytes > 0


def test_a_counts_row_compares_the_program_with_the_trace():
    mesh = mesh_of(2)
    x = jax.device_put(np.ones((4, 4), np.float32), NamedSharding(mesh, P("x")))
    once = jax.jit(jax.shard_map(lambda a: a + jax.lax.psum(a.sum(), "x"), mesh=mesh,
                                 in_specs=P("x"), out_specs=P("x")))
    row = measure.counts_row("once", once, x, repeats=1)
    assert row == {"program": "once", "compiled program holds": "1 all-reduce",
                   "each device ran, per step": "1 all-reduce", "equal": "yes"}
    looped = jax.jit(jax.shard_map(
        lambda a: jax.lax.fori_loop(0, 2, lambda _, c: c + jax.lax.psum(c.sum(), "x"), a),
        mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    row = measure.counts_row("looped", looped, x, repeats=1)
    assert row["each device ran, per step"] == "2 all-reduce" and row["equal"] == "no"


def test_thread_sharing_counts_threads_that_ran_several_devices():
    def op(tid, device):
        return {"pid": 1, "tid": tid, "args": {"hlo_op": "f", "device_ordinal": str(device)}}

    events = [op(1, 0), op(1, 1), op(2, 1), {"tid": 3, "name": "Rendezvous"}]
    assert measure.thread_sharing(events) == {"devices": 2, "threads": 2,
                                              "threads with several devices": 1}
    assert measure.thread_sharing([]) == {"devices": 0, "threads": 0,
                                          "threads with several devices": 0}
