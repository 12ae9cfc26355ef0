"""Guard classes of bad input for every public profiling function: each numeric argument runs
through a battery (bool, NaN, inf, negative, zero, float-for-int, strings, NumPy and JAX
scalars), a trace of another device count, events that are not a trace, and what is not an
HLO opcode (the path arguments: test_events.py). Every answer is the package's InputError
naming the argument, or the right answer."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES, mesh_of

from spmd_guide.core import checks
from spmd_guide.profiling import annotations, measure, tracing

BAD_INTS = [True, False, math.nan, math.inf, -1, 2.5, "2", None, [2]]
BAD_REALS = [True, math.nan, math.inf, -math.inf, "1.0", None]


def _trace():
    ops = [tracing.Op(d, "f", "compute", float(r), 1.0, r) for d in (0, 1) for r in (0, 1)]
    return tracing.Trace(ops, [0, 1], 2, "jit_f")


def _count_calls():
    """(argument name, call taking the value, its minimum, the answer for a valid value)."""
    trace = _trace()
    x = jnp.ones(4)
    return [
        ("repeats", lambda v: tracing.capture(jnp.sin, x, repeats=v), 1,
         lambda v: tracing.capture(jnp.sin, x, repeats=v).runs),
        ("run", lambda v: trace.run_ops(v), 0, lambda v: len(trace.run_ops(v))),
        ("run", lambda v: trace.lanes(v), 0, lambda v: len(trace.lanes(v))),
        ("runs", lambda v: tracing.Trace(trace.ops, [0, 1], v), 1, None),
        ("repeats", lambda v: measure.counts_row("r", jnp.sin, x, repeats=v), 1, None),
        ("calls", lambda v: measure.call_times(jnp.sin, x, calls=v), 1,
         lambda v: len(measure.call_times(jnp.sin, x, calls=v))),
        ("rows", lambda v: measure.straggler_program(mesh_of(2), "x", [1, 1], rows=v), 1,
         None),
        ("width", lambda v: measure.straggler_program(mesh_of(2), "x", [1, 1], width=v), 1,
         None),
        ("seed", lambda v: measure.straggler_program(mesh_of(2), "x", [1, 1], seed=v), 0,
         None),
        ("work[1]", lambda v: measure.straggler_program(mesh_of(2), "x", [1, v]), 0, None),
        ("device", lambda v: tracing.Op(v, "f", "compute", 0.0, 1.0, 0), 0,
         lambda v: tracing.Op(v, "f", "compute", 0.0, 1.0, 0).device),
        ("run", lambda v: tracing.Op(0, "f", "compute", 0.0, 1.0, v), 0,
         lambda v: tracing.Op(0, "f", "compute", 0.0, 1.0, v).run),
    ]


@pytest.mark.parametrize("index", range(len(_count_calls())))
def test_every_integer_argument_refuses_the_battery(index):
    name, call, minimum, answer = _count_calls()[index]
    for value in BAD_INTS + ([0] if minimum > 0 else []) + [minimum - 1]:
        with pytest.raises(checks.InputError, match=name.replace("[", r"\[")):
            call(value)
    valid = minimum + 1
    for scalar in (np.int64(valid), np.int32(valid)):
        result = call(scalar)  # a NumPy integer is an integer
        if answer is not None:
            assert answer(scalar) == answer(valid)
    try:  # a JAX integer scalar: refused clearly, or the same answer
        result = call(jnp.int32(valid))
    except checks.InputError as error:
        assert name.split("[")[0] in str(error)
    else:
        if answer is not None:
            assert answer(jnp.int32(valid)) == answer(valid)
    del result


def _real_calls():
    return [
        ("times[1]", lambda v: measure.steady_ratio([1.0, v]), True),
        ("delay_ms[0]", lambda v: measure.straggler_program(mesh_of(2), "x", [1, 1],
                                                             delay_ms=[v, 0.0]), False),
        ("start_us", lambda v: tracing.Op(0, "f", "compute", v, 1.0, 0), False),
        ("dur_us", lambda v: tracing.Op(0, "f", "compute", 0.0, v, 0), False),
    ]


@pytest.mark.parametrize("index", range(len(_real_calls())))
def test_every_real_argument_refuses_the_battery(index):
    name, call, positive = _real_calls()[index]
    bad = BAD_REALS + ([0.0, -1.0] if positive else []) + ([-1.0] if name != "start_us" else [])
    for value in bad:
        with pytest.raises(checks.InputError, match=name.replace("[", r"\[")):
            call(value)
    for value in (np.float32(2.0), np.int64(2), jnp.float32(2.0), 2):
        call(value)
    assert measure.steady_ratio([4.0, jnp.float32(2.0), np.float64(2.0)]) == 2.0


def test_a_trace_of_the_program_on_another_device_count_is_refused():
    """The same function compiled on 1 device and on 4: the 1-device trace must not be
    read as the 4-device program's (it would say 1 device, no collectives)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def f(a):
        return jnp.sum(a * 2)

    one = jax.device_put(np.ones(16, np.float32), DEVICES[0])
    four = jax.device_put(np.ones(16, np.float32), NamedSharding(mesh_of(4), P("x")))
    small = tracing.capture(jax.jit(f), one, repeats=1)
    assert small.devices == [0]
    compiled4 = jax.jit(f).lower(four).compile()
    assert tracing.device_count_of(compiled4) == 4
    import tempfile
    folder = tempfile.mkdtemp()
    compiled1 = jax.jit(f).lower(one).compile()
    with jax.profiler.trace(folder):
        jax.block_until_ready(compiled1(one))
    events = tracing.read_events(folder)
    with pytest.raises(tracing.TraceInputError, match="ran on 1 device.*spans 4.*another mesh"):
        tracing.Trace.from_events(events, compiled4)


@pytest.mark.parametrize("events, match", [
    ("events", "events must be a list"), ({"traceEvents": []}, "events must be a list"),
    ([1], r"events\[0\]"),
    ([{"ph": "X", "ts": "x", "dur": 1, "name": "f", "args": {
        "hlo_module": "jit_f", "hlo_op": "f", "device_ordinal": "0", "run_id": "1"}}], "ts="),
    ([{"ph": "X", "ts": 1, "dur": 1, "name": "f", "args": {
        "hlo_module": "jit_f", "hlo_op": "f", "device_ordinal": "cpu", "run_id": "1"}}],
     "device_ordinal"),
])
def test_events_that_are_not_a_trace_are_refused(events, match):
    program = "HloModule jit_f\n\nENTRY %main () -> f32[] {\n  ROOT %f = f32[] constant(0)\n}\n"
    with pytest.raises(checks.InputError, match=match):
        tracing.Trace.from_events(events, program)


def test_runs_given_as_text_is_refused_by_name():
    with pytest.raises(checks.InputTypeError, match="runs must be an integer"):
        tracing.Trace.from_events([], "HloModule m\n", runs="2")


@pytest.mark.parametrize("opcode", ["psum", "all-reduce.3", "fusion.1", "All-Reduce", " add"])
def test_op_kind_refuses_what_is_not_an_opcode(opcode):
    with pytest.raises(checks.InputError, match="not an HLO opcode"):
        tracing.op_kind(opcode)


def test_op_kind_knows_every_opcode_the_collective_tables_use():
    from spmd_guide.core.hlo_text import _OPCODES
    assert set(_OPCODES) <= tracing.HLO_OPCODES
    assert tracing.op_kind("all-reduce") == "collective"
    assert tracing.op_kind("collective-permute-done") == "collective"
    assert tracing.op_kind("all-reduce.3".split(".")[0]) == "collective"


def test_a_hand_built_trace_checks_its_fields():
    op = tracing.Op(0, "f", "compute", 0.0, 1.0, 0)
    for kwargs, match in [({"ops": "ops"}, "ops must be"), ({"ops": [("f", 0)]}, r"ops\[0\]"),
                          ({"devices": [1, 0]}, "sorted"), ({"devices": [1]}, r"ops\[0\]"),
                          ({"module": 3}, "module"), ({"origin_us": math.nan}, "origin_us")]:
        fields = {"ops": [op], "devices": [0], "runs": 1, **kwargs}
        with pytest.raises(checks.InputError, match=match):
            tracing.Trace(**fields)
    with pytest.raises(checks.InputError, match="kind"):
        tracing.Op(0, "f", "computing", 0.0, 1.0, 0)
    with pytest.raises(checks.InputError, match="name"):
        tracing.Op(0, "", "compute", 0.0, 1.0, 0)
    with pytest.raises(checks.InputError, match="trace must be"):
        measure.waits_per_collective("trace")
    with pytest.raises(checks.InputError, match="label"):
        measure.counts_row(3, jnp.sin, jnp.ones(2))
    assert annotations.steps([]) == []


def test_a_trace_on_fewer_devices_than_the_program_spans_is_refused():
    """Same names, same module: only the device count tells the two compilations apart."""
    from .test_tracing import _PROGRAM, _events

    assert tracing.device_count_of(_PROGRAM) == 2
    assert tracing.Trace.from_events(_events(), _PROGRAM).devices == [0, 1]
    four = _PROGRAM.replace("num_partitions=2", "num_partitions=4")
    with pytest.raises(tracing.TraceInputError, match="ran on 2 device.*spans 4"):
        tracing.Trace.from_events(_events(), four)
    replicas = _PROGRAM.replace("num_partitions=2", "replica_count=2, num_partitions=2")
    assert tracing.device_count_of(replicas) == 4
