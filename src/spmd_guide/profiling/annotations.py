"""Marking steps and regions in a trace, and lining them up with what the devices ran.

``jax.profiler.StepTraceAnnotation(name, step_num=i)`` and ``jax.profiler.TraceAnnotation(
name)`` record a span on the **host thread** that enters them: on XLA:CPU (JAX 0.12) an
``X`` event named ``name`` whose ``args`` hold ``step_num`` (a string) for a step, no device
and no run. What the devices ran during it has to be matched by time:

- :func:`host_spans`: the spans of one annotation name, in time order; :func:`steps`: every
  ``StepTraceAnnotation`` span (those with a ``step_num``).
- :func:`align_steps`: step ``i`` next to run ``i`` of a :class:`~spmd_guide.profiling.
  tracing.Trace`: when the devices started and ended against the host's step. A step whose
  code does not wait for its results ends when dispatch returns, before the devices finish.
- :func:`scopes_of` and :func:`time_in_scopes`: ``jax.named_scope`` names reach the
  ``op_name`` metadata of the compiled program's instructions, which the trace names; a
  ``TraceAnnotation`` *inside* a jitted function runs once, while JAX traces it, and never
  while the compiled program runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from spmd_guide.core import checks
from spmd_guide.core.hlo_text import program_text
from spmd_guide.profiling.events import TraceInputError, check_events, event_time
from spmd_guide.profiling.tracing import Trace

__all__ = ["Span", "StepAlignment", "align_steps", "alignment_rows", "host_spans", "scopes_of",
           "steps", "time_in_scopes"]


@dataclass(frozen=True)
class Span:
    """One annotation's span on the host: ``start_us`` on the trace clock (the events'
    ``ts``), ``step_num`` for a ``StepTraceAnnotation`` (``None`` otherwise)."""

    name: str
    start_us: float
    dur_us: float
    step_num: int | None = None

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def _span(e: Mapping[str, Any], i: int) -> Span:
    args = e.get("args") if isinstance(e.get("args"), Mapping) else {}
    step = args.get("step_num")
    return Span(str(e["name"]), event_time(e, "ts", i), event_time(e, "dur", i),
                int(step) if step is not None and str(step).lstrip("-").isdigit() else None)


def _is_host_span(e: Mapping[str, Any]) -> bool:
    """A complete event (``ph`` X) that is not an op of a device."""
    args = e.get("args") if isinstance(e.get("args"), Mapping) else {}
    return e.get("ph") == "X" and "hlo_op" not in args


def host_spans(events: Sequence[Mapping[str, Any]], name: str) -> list[Span]:
    """The spans of every annotation called ``name`` (``TraceAnnotation`` or
    ``StepTraceAnnotation``), in time order."""
    check_events(events)
    name = checks.text("name", name)
    return sorted((_span(e, i) for i, e in enumerate(events)
                   if e.get("name") == name and _is_host_span(e)), key=lambda s: s.start_us)


def steps(events: Sequence[Mapping[str, Any]]) -> list[Span]:
    """Every ``StepTraceAnnotation`` span (an event with a ``step_num``), in time order."""
    check_events(events)
    found = [_span(e, i) for i, e in enumerate(events) if _is_host_span(e)
             and isinstance(e.get("args"), Mapping) and "step_num" in e["args"]]
    return sorted((s for s in found if s.step_num is not None), key=lambda s: s.start_us)


@dataclass(frozen=True)
class StepAlignment:
    """Step ``step`` (a host span) against the run it launched: the devices' first op
    started ``start_lag_us`` after the step began, their last op ended ``end_lag_us``
    after the step ended (negative: before), over ``devices`` devices."""

    step: int
    host_us: float
    start_lag_us: float
    end_lag_us: float
    devices: int

    @property
    def inside(self) -> bool:
        """Whether the run lies within the step's span (what a step time should cover)."""
        return self.start_lag_us >= 0 and self.end_lag_us <= 0


def align_steps(trace: Trace, spans: Sequence[Span]) -> list[StepAlignment]:
    """Step ``i`` of ``spans`` (by time) next to run ``i`` of ``trace``: each step must
    launch one run of the traced program, so there must be as many steps as runs."""
    checks.instance("trace", trace, Trace, example="a tracing.Trace (Trace.from_events)")
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
        raise checks.InputTypeError(f"spans must be a list of Span (steps(events)), got "
                                    f"{checks.value_text(spans)}.")
    for i, s in enumerate(spans):
        checks.instance(f"spans[{i}]", s, Span, example="a Span (steps(events))")
    if len(spans) != trace.runs:
        raise TraceInputError(
            f"spans has {len(spans)} steps but the trace holds {trace.runs} runs of "
            f"{trace.module!r}: each step must launch one run (annotate every call, and "
            "only those).")
    rows = []
    for run, span in enumerate(sorted(spans, key=lambda s: s.start_us)):
        mine = [op for op in trace.ops if op.run == run]
        first = min(op.start_us for op in mine) + trace.origin_us
        last = max(op.end_us for op in mine) + trace.origin_us
        rows.append(StepAlignment(span.step_num if span.step_num is not None else run,
                                  span.dur_us, first - span.start_us, last - span.end_us,
                                  len({op.device for op in mine})))
    return rows


def alignment_rows(alignments: Sequence[StepAlignment]) -> list[dict[str, str]]:
    """:func:`align_steps` as table rows (µs)."""
    return [{"step": str(a.step), "host span (µs)": f"{a.host_us:,.0f}",
             "devices start after it begins (µs)": f"{a.start_lag_us:,.0f}",
             "devices end after it ends (µs)": f"{a.end_lag_us:,.0f}",
             "run inside the step": "yes" if a.inside else "no"} for a in alignments]


_OP_NAME = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*\bop_name="([^"]*)"')


def scopes_of(program: str | jax.stages.Compiled) -> dict[str, str]:
    """``{instruction name: op_name}`` of a compiled program: the ``op_name`` metadata that
    JAX writes (``jit(f)/<named scopes>/<primitive>``) for each instruction that has it."""
    found = {}
    for line in program_text(program).splitlines():
        if m := _OP_NAME.match(line):
            found[m.group(1)] = m.group(2)
    return found


def time_in_scopes(trace: Trace, program: str | jax.stages.Compiled,
                   scopes: Sequence[str]) -> dict[str, float]:
    """Microseconds per run and device (averaged) of the compute and collective ops whose
    ``op_name`` holds ``/<scope>/`` for each of ``scopes`` (the first that matches), and the
    rest under ``"(no scope)"``. A collective's time includes its waits; loop and
    conditional events are left out. A fusion has its root instruction's ``op_name``, so ops
    fused across scopes count under the root's (``jax.lax.optimization_barrier`` between
    scopes keeps them apart)."""
    checks.instance("trace", trace, Trace, example="a tracing.Trace (tracing.capture(...))")
    if isinstance(scopes, (str, bytes)) or not isinstance(scopes, Sequence) or not scopes:
        raise checks.InputTypeError(f"scopes must be a non-empty list of jax.named_scope "
                                    f"names, got {checks.value_text(scopes)}.")
    scopes = [checks.text(f"scopes[{i}]", s) for i, s in enumerate(scopes)]
    names = scopes_of(program)
    totals = dict.fromkeys([*scopes, "(no scope)"], 0.0)
    for op in trace.ops:
        if op.kind not in ("compute", "collective"):
            continue
        path = f"/{names.get(op.name, '')}/"
        scope = next((s for s in scopes if f"/{s}/" in path), "(no scope)")
        totals[scope] += op.dur_us
    per = trace.runs * len(trace.devices)
    return {k: v / per for k, v in totals.items()}
