"""spmd_guide.profiling.tracing: a jax.profiler trace read per device, its collectives equal to
the compiled program's (jit-sharded and shard_map programs, Auto and Explicit meshes, 1, 2, 4
and 8 devices), waits attributed by thread and time, runs ordered by time, bad input refused."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.nn import STRATEGIES, init_mlp
from spmd_guide.profiling import tracing

# --------------------------------------------------------------------------- programs


def _jit_program(k: int, explicit: bool):
    """A jit-sharded program: rows split over 'x', weights replicated, summed (all-reduce);
    on more than one device a gather of the rows too (all-gather)."""
    mesh = mesh_of(k, explicit=explicit)
    x = jax.device_put(np.arange(8 * k * 16, dtype=np.float32).reshape(8 * k, 16) / 100,
                       NamedSharding(mesh, P("x")))
    w = jax.device_put(np.ones((16, 16), np.float32) / 16, NamedSharding(mesh, P()))

    @jax.jit
    def step(x, w):
        y = jnp.tanh(x @ w)
        whole = jax.sharding.reshard(y, NamedSharding(mesh, P())) if explicit else \
            lax.with_sharding_constraint(y, NamedSharding(mesh, P()))
        return jnp.sum(y), whole[:2]

    return step, (x, w)


def _zoo(a, *, n):
    """Every collective kind once: all-gather, reduce-scatter, collective-permute,
    all-to-all, all-reduce."""
    g = lax.all_gather(a, "x", tiled=True)
    s = lax.psum_scatter(g, "x", scatter_dimension=0, tiled=True)
    p = lax.ppermute(s, "x", [(i, (i + 1) % n) for i in range(n)])
    t = lax.all_to_all(p, "x", 0, 0, tiled=True)
    return t + lax.psum(jnp.sum(t), "x")


def _shard_map_program(k: int, explicit: bool):
    mesh = mesh_of(k, explicit=explicit)
    x = jax.device_put(np.arange(4 * k * k * 8, dtype=np.float32).reshape(4 * k * k, 8),
                       NamedSharding(mesh, P("x")))
    fn = jax.jit(jax.shard_map(functools.partial(_zoo, n=k), mesh=mesh, in_specs=P("x"),
                               out_specs=P("x")))
    return fn, (x,)


def _strategy_step(name: str, k: int, explicit: bool):
    strategy = STRATEGIES[name]
    mesh = strategy.mesh(DEVICES[:k])
    if explicit:
        mesh = jax.make_mesh(mesh.devices.shape, mesh.axis_names, devices=DEVICES[:k],
                             axis_types=(jax.sharding.AxisType.Explicit,) * mesh.devices.ndim)
    params = init_mlp(jax.random.key(0), [16, 32, 8])
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((16, 16), dtype=np.float32),
             rng.standard_normal((16, 8), dtype=np.float32))
    params, batch = strategy.shard(params, batch, mesh)
    step = jax.jit(jax.value_and_grad(strategy.loss(mesh)))
    return step, (params, batch)


def _check_against_program(fn, args, k: int, repeats: int = 2):
    trace = tracing.capture(fn, *args, repeats=repeats)
    assert trace.collective_counts() == hlo.collective_counts(fn, *args)
    assert trace.devices == list(range(k))
    assert trace.runs == repeats
    assert {op.run for op in trace.ops} == set(range(repeats))
    assert {op.kind for op in trace.ops} <= {"collective", "compute", "wait", "other"}
    summary = trace.device_summary()
    assert [row["device"] for row in summary] == list(range(k))
    assert all(set(row) == {"device", "compute_us", "collective_us", "wait_us"}
               for row in summary)
    assert all(v >= 0 for row in summary for v in row.values())
    return trace


# --------------------------------------------------------------------------- quick


def test_a_jit_sharded_training_step_on_8_devices_matches_its_program():
    step, args = _strategy_step("auto_dp", 8, explicit=False)
    trace = _check_against_program(step, args, 8)
    assert trace.collective_counts()["all-reduce"] >= 1
    op = trace.ops[0]
    assert isinstance(op.device, int) and isinstance(op.name, str) and op.dur_us >= 0
    assert op["device"] == op.device and op["run"] == op.run
    waits = [o for o in trace.ops if o.kind == "wait"]
    assert waits and all(w.device in trace.devices for w in waits)
    # Each wait sits inside a collective of its own device and run, and carries its name.
    for w in waits:
        assert any(c.kind == "collective" and c.device == w.device and c.run == w.run
                   and c.name == w.name and c.start_us <= w.start_us + 0.02
                   and w.end_us <= c.end_us + 0.02 for c in trace.ops)
    rows = trace.device_summary()
    collective = {d: sum(o.dur_us for o in trace.ops if o.device == d and o.kind ==
                         "collective") / 2 for d in trace.devices}
    for row in rows:  # collective_us excludes the waits inside the collectives
        assert row["collective_us"] + row["wait_us"] == pytest.approx(collective[row["device"]])


def test_every_collective_kind_in_a_shard_map_program_on_an_explicit_mesh():
    fn, args = _shard_map_program(4, explicit=True)
    trace = _check_against_program(fn, args, 4)
    counts = trace.collective_counts()
    assert counts["reduce-scatter"] == 1 and counts["all-to-all"] == 1
    assert counts["collective-permute"] == 1 and counts["all-gather"] == 1
    # Named by instruction, kinded by opcode: psum_scatter's op is not called reduce-scatter.
    names = {o.name for o in trace.ops if o.opcode == "reduce-scatter"}
    assert names and "reduce-scatter" not in names
    assert {o.kind for o in trace.ops if o.name in names} == {"collective", "wait"}


def test_a_loop_body_s_collectives_count_once_per_trip():
    mesh = mesh_of(2)

    def body(a):
        return lax.fori_loop(0, 3, lambda _, c: c * 0.5 + lax.psum(jnp.sum(c), "x"), a)

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = jax.device_put(np.ones((4, 4), np.float32), NamedSharding(mesh, P("x")))
    trace = tracing.capture(fn, x, repeats=1)
    assert hlo.collective_counts(fn, x)["all-reduce"] == 1
    assert trace.collective_counts()["all-reduce"] == 3
    assert any(o.kind == "other" and o.opcode == "while" for o in trace.ops)


def test_one_device_and_a_plain_function_is_jitted():
    x = jax.device_put(np.ones((8, 8), np.float32), DEVICES[0])
    trace = tracing.capture(lambda a: jnp.sum(a @ a), x, repeats=1)
    assert trace.devices == [0] and trace.runs == 1
    assert trace.collective_counts() == dict.fromkeys(hlo.KINDS, 0)
    assert trace.module.startswith("jit_")
    assert any(path.endswith(".trace.json.gz") for path, _ in trace.folder_files)


@pytest.mark.parametrize("repeats", [0, -1, 1.5, "3", True, None])
def test_bad_repeats_are_refused(repeats):
    with pytest.raises(checks.InputError, match="repeats"):
        tracing.capture(jnp.sin, jnp.ones(2), repeats=repeats)


@pytest.mark.parametrize("fn", [None, 3, "jnp.sin", jnp.ones(2)])
def test_a_non_callable_fn_is_refused(fn):
    with pytest.raises(checks.InputError, match="fn must be a function"):
        tracing.capture(fn, jnp.ones(2))


def test_shape_structs_and_donated_arguments_are_refused():
    with pytest.raises(checks.InputError, match="ShapeDtypeStruct"):
        tracing.capture(jnp.sin, jax.ShapeDtypeStruct((2,), jnp.float32))
    donating = jax.jit(lambda a: a + 1, donate_argnums=0)
    with pytest.raises(checks.InputError, match="donated"):
        tracing.capture(donating, jnp.ones(4))


def test_reading_a_folder_without_a_trace_fails_clearly(tmp_path):
    with pytest.raises(tracing.TraceError, match="plugins/profile"):
        tracing.read_events(tmp_path)
    (tmp_path / "plugins" / "profile" / "run").mkdir(parents=True)
    with pytest.raises(tracing.TraceError, match="trace.json.gz"):
        tracing.read_events(tmp_path)
    with pytest.raises(checks.InputError, match="not a folder"):
        tracing.trace_files(tmp_path / "missing")
    for empty in ("", pathlib.Path("")):  # not the current directory
        with pytest.raises(checks.InputError, match="folder must not be empty"):
            tracing.trace_files(empty)


# --------------------------------------------------------------------------- parsing

_PROGRAM = """HloModule jit_f, entry_computation_layout={(f32[8]{0})->f32[8]{0}}, num_partitions=2

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %fusion.1 = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%fc
  %psum_invariant.7 = f32[8]{0} all-reduce(f32[8]{0} %fusion.1), channel_id=1, replica_groups={{0,1}}
  ROOT %reduce_scatter.3 = f32[4]{0} reduce-scatter(f32[8]{0} %psum_invariant.7), channel_id=2, replica_groups={{0,1}}, dimensions={0}
}
"""


def _op(name, device, run_id, ts, dur, tid, module="jit_f"):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name,
            "args": {"device_ordinal": str(device), "hlo_module": module, "hlo_op": name,
                     "run_id": str(run_id)}}


def _wait(ts, dur, tid):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": "Rendezvous",
            "args": {"id": "1"}}


def _events():
    """Two runs (run ids -5 then -9, in that time order) on devices 0 and 1; thread 7 runs
    device 1 in the first run and device 0 in the second."""
    events = []
    for run_id, t0, threads in ((-5, 0.0, {0: 6, 1: 7}), (-9, 100.0, {0: 7, 1: 6})):
        for device, tid in threads.items():
            events += [_op("fusion.1", device, run_id, t0, 5.0, tid),
                       {"ph": "X", "pid": 1, "tid": tid, "ts": t0 + 5, "dur": 0.1,
                        "name": "end: fusion.1", "args": {}},
                       _op("psum_invariant.7", device, run_id, t0 + 6, 20.0, tid),
                       _op("reduce_scatter.3", device, run_id, t0 + 30, 4.0, tid)]
        events += [_wait(t0 + 7, 10.0, 6), _wait(t0 + 8, 2.0, 6)]
    events += [_op("copy", 0, 99, 50.0, 1.0, 6, module="jit__multi_slice"),
               _wait(60.0, 5.0, 6)]  # a wait in no collective of ours
    return events


def test_parsing_orders_runs_by_time_and_attributes_waits_by_thread_and_time():
    trace = tracing.Trace.from_events(_events(), _PROGRAM, runs=2)
    assert trace.devices == [0, 1] and trace.runs == 2 and trace.module == "jit_f"
    first = [o for o in trace.ops if o.run == 0]
    assert min(o.start_us for o in first) == 0.0
    assert {o.name for o in trace.ops} == {"fusion.1", "psum_invariant.7", "reduce_scatter.3"}
    waits = [o for o in trace.ops if o.kind == "wait"]
    # thread 6 ran device 0 in run 0 and device 1 in run 1; the nested wait is not counted.
    assert [(w.run, w.device, w.dur_us) for w in waits] == [(0, 0, 10.0), (1, 1, 10.0)]
    assert all(w.name == "psum_invariant.7" for w in waits)
    assert trace.collective_counts() == {"all-gather": 0, "all-reduce": 1,
                                         "reduce-scatter": 1, "collective-permute": 0,
                                         "all-to-all": 0}
    rows = {r["device"]: r for r in trace.device_summary()}
    assert rows[0] == {"device": 0, "compute_us": 5.0, "collective_us": 19.0, "wait_us": 5.0}
    assert trace.step_us() == [34.0, 34.0]
    assert list(trace.lanes(1)) == ["device 0", "device 1"]


def test_disagreeing_devices_or_runs_raise():
    events = [e for e in _events() if not (e["args"].get("hlo_op") == "reduce_scatter.3"
                                           and e["args"].get("run_id") == "-9"
                                           and e["args"].get("device_ordinal") == "1")]
    with pytest.raises(tracing.TraceError, match="disagree"):
        tracing.Trace.from_events(events, _PROGRAM).collective_counts()
    missing = [e for e in _events() if not (e["args"].get("run_id") == "-9"
                                            and e["args"].get("device_ordinal") == "1")]
    with pytest.raises(tracing.TraceError, match="devices"):
        tracing.Trace.from_events(missing, _PROGRAM).collective_counts()
    with pytest.raises(tracing.TraceError, match="runs=3 runs of 'jit_f' were expected"):
        tracing.Trace.from_events(_events(), _PROGRAM, runs=3)
    with pytest.raises(tracing.TraceError, match="does not hold"):
        tracing.Trace.from_events(_events(), _PROGRAM.replace("fusion.1", "fusion.2"))
    with pytest.raises(tracing.TraceError, match="no op"):
        tracing.Trace.from_events(_events(), _PROGRAM.replace("jit_f", "jit_g"))


def test_kinds_come_from_opcodes():
    assert tracing.op_kind("all-reduce") == tracing.op_kind("all-gather-start") == \
        tracing.op_kind("all-gather-done") == "collective"
    assert tracing.op_kind("while") == tracing.op_kind("conditional") == "other"
    assert tracing.op_kind("fusion") == tracing.op_kind("copy") == "compute"
    with pytest.raises(checks.InputError):
        tracing.op_kind("")
    with pytest.raises(checks.InputError, match="HloModule"):
        tracing.opcodes_of("ENTRY %main {}")


# --------------------------------------------------------------------------- sweeps


@pytest.mark.slow
@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("program", ["jit", "shard_map", "auto_dp_tp", "dp", "fsdp"])
def test_trace_counts_equal_the_compiled_program_s(program, k, explicit):
    if program == "jit":
        fn, args = _jit_program(k, explicit)
    elif program == "shard_map":
        fn, args = _shard_map_program(k, explicit)
    else:
        if program == "auto_dp_tp" and k == 1:
            pytest.skip("auto_dp_tp needs a 2-axis mesh of at least 2 devices")
        fn, args = _strategy_step(program, k, explicit)
    _check_against_program(fn, args, k, repeats=2)


def test_a_trace_built_by_hand_counts_and_checks_too():
    def op(device, run, name="all-reduce.1", kind="collective"):
        return tracing.Op(device=device, name=name, kind=kind, start_us=0.0, dur_us=1.0,
                          run=run)

    ops = [op(d, r) for d in (0, 1) for r in (0, 1)] + [op(0, 0, "fusion", "compute")]
    trace = tracing.Trace(ops, [0, 1], 2)
    assert trace.collective_counts()["all-reduce"] == 1
    with pytest.raises(tracing.TraceError, match="disagree"):
        tracing.Trace(ops + [op(1, 1, "all-gather")], [0, 1], 2).collective_counts()


def test_only_the_step_s_own_program_is_kept():
    """An input not yet laid out adds a transfer program (jit__multi_slice) to the trace."""
    mesh = mesh_of(4)
    f = jax.jit(lambda a: jnp.sum(a * 2), in_shardings=NamedSharding(mesh, P("x")))
    x = jnp.arange(16.0)  # on the default device, uncommitted
    trace = tracing.capture(f, x, repeats=2)
    assert trace.module == "jit__lambda" and trace.devices == [0, 1, 2, 3]
    assert trace.collective_counts() == hlo.collective_counts(f, x)


def test_xla_cpu_facts_the_pages_state():
    """jit on XLA:CPU emits no asynchronous -start/-done pairs, and keeps an all-reduce where
    a reduce-scatter would do (auto_fsdp); shard_map's psum_scatter is a real one (fsdp)."""
    texts = {}
    for name in ("auto_fsdp", "fsdp"):
        step, args = _strategy_step(name, 4, explicit=False)
        texts[name] = hlo.compiled_text(step, *args)
    auto = hlo.collectives_in_text(texts["auto_fsdp"])
    assert not any(line.split("=")[1].split("(")[0].strip().endswith("-start")
                   for line in texts["auto_fsdp"].splitlines() if " = " in line)
    assert hlo.count_kinds(auto)["reduce-scatter"] == 0
    assert hlo.count_kinds(auto)["all-reduce"] >= 1
    assert hlo.count_kinds(hlo.collectives_in_text(texts["fsdp"]))["reduce-scatter"] >= 1


def test_a_rendezvous_names_its_run_but_not_its_device(tmp_path):
    """What the page says of XLA:CPU's Rendezvous events: no device_ordinal or run_id field;
    the run id sits in the name arg and equals the run of the collective around it."""
    fn, args = _shard_map_program(4, explicit=False)
    compiled = hlo.compile(fn, *args)
    jax.block_until_ready(compiled(*args))
    with jax.profiler.trace(str(tmp_path)):
        jax.block_until_ready(compiled(*args))
    events = tracing.read_events(tmp_path)
    module = tracing.opcodes_of(compiled)[0]
    collectives = [e for e in events if (e.get("args") or {}).get("hlo_module") == module
                   and e["args"]["hlo_op"] in {o for o, k in
                                               tracing.opcodes_of(compiled)[1].items()
                                               if tracing.op_kind(k) == "collective"}]
    waits = [e for e in events if e.get("name") == "Rendezvous"]
    assert waits and collectives
    matched = 0
    for w in waits:
        assert "device_ordinal" not in w["args"] and "run_id" not in w["args"]
        around = [c for c in collectives if c["tid"] == w["tid"]
                  and c["ts"] <= w["ts"] + 0.01 and w["ts"] + w["dur"] <= c["ts"] + c["dur"] + 0.01]
        if around:
            assert f"run_id=RunId: {around[0]['args']['run_id']}," in w["args"]["name"]
            matched += 1
    assert matched >= len(waits) // 2
