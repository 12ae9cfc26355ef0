"""spmd_guide.profiling.annotations: step and region annotations read from a real trace and
lined up with the devices' runs (XLA:CPU); named scopes reach the ops the trace names; a
TraceAnnotation inside a jitted function never shows at run time; bad input refused."""

import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.profiling import annotations, tracing


def _program(k):
    mesh = mesh_of(k)
    x = jax.device_put(np.ones((16 * k, 256), np.float32), NamedSharding(mesh, P("x")))
    w = jnp.full((256, 256), 0.01)

    @jax.jit
    def step(a):  # long enough (20 matmuls) that XLA:CPU runs it after dispatch returns
        with jax.profiler.TraceAnnotation("inside_jit"):  # runs while JAX traces, only
            for scope in ("layer1", "layer2"):
                with jax.named_scope(scope):
                    for _ in range(10):
                        a = jnp.tanh(a @ w)
                # A fusion carries its root's op_name: keep the scopes in fusions of their own.
                a = jax.lax.optimization_barrier(a)
        return a.sum()

    return step, x


def _traced(step, x, *, block):
    jax.block_until_ready(step(x))
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        outs = []
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                with jax.profiler.TraceAnnotation("dispatch"):
                    out = step(x)
                if block:
                    jax.block_until_ready(out)
            outs.append(out)
        jax.block_until_ready(outs)
    return tracing.read_events(folder)


@pytest.fixture(scope="module")
def traced():
    step, x = _program(4)
    compiled = hlo.compile(step, x)
    return step, x, compiled, _traced(step, x, block=True), _traced(step, x, block=False)


def test_steps_hold_their_numbers_and_regions_sit_inside_them(traced):
    *_, blocked, _ = traced
    found = annotations.steps(blocked)
    assert [(s.name, s.step_num) for s in found] == [("train", 0), ("train", 1), ("train", 2)]
    regions = annotations.host_spans(blocked, "dispatch")
    assert len(regions) == 3
    for step, region in zip(found, regions, strict=True):
        assert step.start_us <= region.start_us and region.end_us <= step.end_us + 0.01
    assert annotations.host_spans(blocked, "inside_jit") == []  # traced once, before


def test_a_step_that_waits_holds_its_run_and_one_that_does_not_ends_first(traced):
    step, x, compiled, blocked, unblocked = traced
    rows = annotations.align_steps(tracing.Trace.from_events(blocked, compiled),
                                   annotations.steps(blocked))
    assert [r.step for r in rows] == [0, 1, 2] and all(r.devices == 4 for r in rows)
    assert all(r.inside for r in rows), rows
    rows = annotations.align_steps(tracing.Trace.from_events(unblocked, compiled),
                                   annotations.steps(unblocked))
    # Without a wait the step ends when dispatch returns; the runs queue behind each other,
    # so some end after their step (on XLA:CPU, for this 20-matmul program).
    assert any(r.end_lag_us > 0 and not r.inside for r in rows), rows
    table = annotations.alignment_rows(rows)
    assert table[0]["step"] == "0" and set(table[0]) >= {"run inside the step"}


def test_named_scopes_reach_the_ops_the_trace_names(traced):
    step, x, compiled, blocked, _ = traced
    scopes = annotations.scopes_of(compiled)
    assert any("/layer1/" in v for v in scopes.values())
    assert any("/layer2/" in v for v in scopes.values())
    trace = tracing.Trace.from_events(blocked, compiled)
    times = annotations.time_in_scopes(trace, compiled, ["layer1", "layer2"])
    assert list(times) == ["layer1", "layer2", "(no scope)"]
    assert times["layer1"] > 0 and times["layer2"] > 0
    total = sum(op.dur_us for op in trace.ops if op.kind in ("compute", "collective"))
    assert sum(times.values()) == pytest.approx(total / (trace.runs * 4))


def test_more_steps_than_runs_is_refused(traced):
    step, x, compiled, blocked, _ = traced
    trace = tracing.Trace.from_events(blocked, compiled)
    spans = annotations.steps(blocked)
    with pytest.raises(tracing.TraceInputError, match="2 steps but the trace holds 3 runs"):
        annotations.align_steps(trace, spans[:2])


@pytest.mark.parametrize("call, match", [
    (lambda: annotations.host_spans("events", "x"), "events must be a list"),
    (lambda: annotations.host_spans([{"ph": "X"}], ""), "name"),
    (lambda: annotations.host_spans([{"ph": "X", "name": "s", "ts": "soon"}], "s"), "ts="),
    (lambda: annotations.steps([1, 2]), r"events\[0\]"),
    (lambda: annotations.align_steps("trace", []), "trace must be"),
    (lambda: annotations.time_in_scopes("trace", "", ["a"]), "trace must be"),
])
def test_bad_input_is_refused(call, match):
    with pytest.raises(checks.InputError, match=match):
        call()


def test_bad_spans_and_scopes_are_refused():
    trace = tracing.Trace([tracing.Op(0, "f", "compute", 0.0, 1.0, 0)], [0], 1)
    with pytest.raises(checks.InputError, match="spans"):
        annotations.align_steps(trace, "train")
    with pytest.raises(checks.InputError, match=r"spans\[0\]"):
        annotations.align_steps(trace, [("train", 0)])
    for scopes in ("layer1", [], [""], [3]):
        with pytest.raises(checks.InputError, match="scopes"):
            annotations.time_in_scopes(trace, "HloModule m\n", scopes)
