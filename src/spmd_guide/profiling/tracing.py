"""A ``jax.profiler`` trace of a compiled step, read per device and checked against the
compiled program.

:func:`capture` runs a function under ``jax.profiler.trace`` and parses the TraceEvent file
the profiler writes (``plugins/profile/<time>/<host>.trace.json.gz``, gzipped JSON, read with
the standard library; the ``.xplane.pb`` beside it holds the same events as a protobuf, for
XProf). On XLA:CPU (JAX 0.12) the file has, for every HLO op a device executes, an event
whose ``args`` carry ``device_ordinal`` (a string), ``hlo_module``, ``hlo_op`` (the
instruction's name) and ``run_id`` (shared by the devices of one execution; may be
negative). A ``Rendezvous`` event, with no device, sits inside a collective's event on the
same thread while that device waits for the others to arrive.

What this module makes of it (:class:`Trace`):

* Only the events of ``fn``'s own HLO module are kept (an input not yet on its devices adds
  a transfer program, ``jit__multi_slice``, that is not the step).
* An op's kind comes from the compiled program's opcode for that instruction name, never
  from the name (``psum_invariant.7`` is an all-reduce): ``"collective"`` (the five kinds of
  :data:`spmd_guide.core.hlo_text.KINDS`, and their ``-start``/``-done`` halves),
  ``"other"`` (``while``, ``conditional``, ``call``, ``async-*``: events that contain the ops
  they run, so their time is not counted again), ``"compute"`` (everything else: fusions,
  copies, slices, dots).
* Each ``Rendezvous`` becomes a ``"wait"`` record of the collective whose event contains it
  on the same thread (a thread is not a device: one thread runs several devices' programs
  over a trace), with that collective's device, name and run.
* Runs are numbered ``0 .. repeats-1`` in the order they started (not by ``run_id``).
* Ops inside a loop body appear once per trip: a ``fori_loop`` of 3 trips around a ``psum``
  executes 3 all-reduces per run, where the compiled program's text holds one.
"""

from __future__ import annotations

import bisect
import gzip
import json
import pathlib
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

from spmd_guide.core import checks, hlo
from spmd_guide.core.display import Table
from spmd_guide.core.hlo_text import _OPCODES, KINDS, parse_module, program_text
from spmd_guide.core.timeline import draw_timeline

__all__ = [
    "KINDS_OF_OP", "MAX_REPEATS", "Op", "Trace", "TraceError", "capture", "counts_text",
    "opcodes_of",
    "op_kind", "read_events", "trace_files",
]

#: What an op record can be, in the order the timeline draws them.
KINDS_OF_OP = ("other", "compute", "collective", "wait")
#: Ops whose event contains the events of the ops they run (time counted once, inside).
_CONTAINERS = frozenset({"while", "conditional", "call", "async-start", "async-update",
                         "async-done"})
#: More runs than this make a trace file of many megabytes for no better average.
MAX_REPEATS = 1000
_TOLERANCE_US = 0.01  # event times are rounded to ns: containment allows this much slack


class TraceError(RuntimeError):
    """The trace does not say what the check needs (devices or runs disagree, runs are
    missing, an op is not in the compiled program)."""


def op_kind(opcode: str) -> str:
    """``"collective"``, ``"other"`` or ``"compute"`` for an HLO opcode (see module docs)."""
    if not isinstance(opcode, str) or not opcode:
        raise checks.InputTypeError(f"an HLO opcode is a non-empty string, got "
                                    f"{checks.value_text(opcode)}.")
    if opcode in _OPCODES or (opcode.endswith("-done") and opcode[:-5] in KINDS):
        return "collective"
    if opcode in _CONTAINERS:
        return "other"
    return "compute"


def opcodes_of(program: str | jax.stages.Compiled) -> tuple[str, dict[str, str]]:
    """(HLO module name, ``{instruction name: opcode}`` over every computation) of a
    compiled program or its text."""
    text = program_text(program)
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if not first.startswith("HloModule "):
        raise checks.InputError("not an HLO module's text: it must start with 'HloModule'.")
    name = first.split()[1].rstrip(",")
    module = parse_module(text)
    return name, {i.name: i.opcode for body in module.computations.values() for i in body}


@dataclass(frozen=True)
class Op:
    """One op one device executed in one run (or one wait inside a collective).

    ``start_us`` counts from the start of the trace's first run; ``opcode`` is the HLO
    opcode (for a wait, that of the collective it waits in, whose ``name`` it carries).
    ``op["device"]`` reads a field like ``op.device``.
    """

    device: int
    name: str
    kind: str
    start_us: float
    dur_us: float
    run: int
    opcode: str = ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)


@dataclass
class Trace:
    """A trace of ``runs`` executions of one compiled program, per device.

    ``ops`` are sorted by run, device and start; ``devices`` are the sorted device ordinals
    (``jax.Device.id``), ``runs`` the number of runs, ``module`` the HLO module's name.
    """

    ops: list[Op]
    devices: list[int]
    runs: int
    module: str = ""
    folder_files: list[tuple[str, int]] = field(default_factory=list, repr=False)

    # -- per run and device -------------------------------------------------------------

    def _by_run_device(self) -> dict[tuple[int, int], list[Op]]:
        groups: dict[tuple[int, int], list[Op]] = {}
        for op in self.ops:
            groups.setdefault((op.run, op.device), []).append(op)
        return groups

    def _check_complete(self) -> dict[tuple[int, int], list[Op]]:
        groups = self._by_run_device()
        for run in range(self.runs):
            seen = sorted(d for r, d in groups if r == run)
            if seen != self.devices:
                raise TraceError(
                    f"run {run} has ops on devices {seen}, but the trace has devices "
                    f"{self.devices}: the devices disagree.")
        return groups

    def collective_counts(self) -> dict[str, int]:
        """Collectives one device executes in one run, by kind (all five keys of
        :data:`~spmd_guide.core.hlo_text.KINDS`); asynchronous pairs count once.

        Raises :class:`TraceError` if any two devices, or any two runs, disagree. A loop's
        collectives count once per trip.
        """
        groups = self._check_complete()
        found: dict[tuple[int, int], dict[str, int]] = {}
        for key, ops in groups.items():
            counts = dict.fromkeys(KINDS, 0)
            for op in ops:
                kind = _collective_of(op)
                if kind:
                    counts[kind] += 1
            found[key] = counts
        (first_key, first), *rest = sorted(found.items())
        for key, counts in rest:
            if counts != first:
                raise TraceError(
                    f"run {key[0]} device {key[1]} executed {counts_text(counts)}, but run "
                    f"{first_key[0]} device {first_key[1]} executed {counts_text(first)}: the "
                    "devices or runs disagree.")
        return first

    def device_summary(self) -> list[dict[str, Any]]:
        """Per device, microseconds per run (averaged over the runs) spent in compute, in
        collectives and waiting; one dict per device, sorted by device.

        ``collective_us`` does **not** include the waits: it is the collectives' time minus
        the ``Rendezvous`` waits inside them, and ``wait_us`` is those waits, so the three
        never overlap. Ops of kind ``"other"`` (loops, conditionals) contain the ops they
        run and are left out.
        """
        totals = {d: Counter() for d in self.devices}
        for op in self.ops:
            totals[op.device][op.kind] += op.dur_us
        rows = []
        for device in self.devices:
            t = totals[device]
            rows.append({
                "device": device,
                "compute_us": t["compute"] / self.runs,
                "collective_us": max(t["collective"] - t["wait"], 0.0) / self.runs,
                "wait_us": t["wait"] / self.runs,
            })
        return rows

    def run_ops(self, run: int) -> list[Op]:
        """The ops of one run, their times counted from that run's first op."""
        run = checks.count("run", run, minimum=0, maximum=self.runs - 1)
        mine = [op for op in self.ops if op.run == run]
        start = min(op.start_us for op in mine)
        return [Op(op.device, op.name, op.kind, op.start_us - start, op.dur_us, op.run,
                   op.opcode) for op in mine]

    def step_us(self) -> list[float]:
        """Each run's length: from its first op's start to its last op's end, any device."""
        spans = []
        for run in range(self.runs):
            mine = [op for op in self.ops if op.run == run]
            spans.append(max(op.end_us for op in mine) - min(op.start_us for op in mine))
        return spans

    def lanes(self, run: int = 0) -> dict[str, list[tuple[float, float, str]]]:
        """``{"device d": [(start_us, dur_us, kind), ...]}`` of one run, for a timeline."""
        lanes: dict[str, list[tuple[float, float, str]]] = {
            f"device {d}": [] for d in self.devices}
        for op in self.run_ops(run):
            lanes[f"device {op.device}"].append((op.start_us, op.dur_us, op.kind))
        return lanes

    def timeline(self, run: int = 0, *, alt: str | None = None, title: str = "") -> Any:
        """One run drawn by :func:`spmd_guide.core.timeline.draw_timeline`: a lane per
        device, its ops coloured by kind."""
        alt = alt or (f"Timeline of run {run} of {self.module} on {len(self.devices)} "
                      "devices, one lane per device; bars show when each device computed, "
                      "ran a collective or waited for the others.")
        return draw_timeline(self.lanes(run), alt=alt, title=title)

    def table(self, *, title: str = "") -> Table:
        """:meth:`device_summary` as a table (microseconds per run)."""
        rows = [{"device": str(r["device"]), "compute (µs)": f"{r['compute_us']:,.0f}",
                 "collectives (µs)": f"{r['collective_us']:,.0f}",
                 "waiting (µs)": f"{r['wait_us']:,.0f}"} for r in self.device_summary()]
        return Table(rows, title=title, align={k: "right" for k in rows[0] if k != "device"})

    @classmethod
    def from_events(cls, events: Sequence[Mapping[str, Any]],
                    program: str | jax.stages.Compiled, *, runs: int | None = None) -> Trace:
        """Parse TraceEvents (the ``traceEvents`` of a trace file) of ``program``'s runs."""
        module, opcodes = opcodes_of(program)
        return _parse(events, module, opcodes, runs)


def _collective_of(op: Op) -> str:
    """The collective kind an op record counts as ("" for none): from its opcode; a record
    built by hand without one falls back to its name (``all-reduce.3``)."""
    if op.kind != "collective":
        return ""
    opcode = op.opcode or re.sub(r"\.\d+$", "", op.name)
    return _OPCODES.get(opcode, "")


def counts_text(counts: Mapping[str, int]) -> str:
    """``"2 all-reduce, 1 all-gather"``: the non-zero counts in words."""
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no collectives"


def _parse(events: Sequence[Mapping[str, Any]], module: str, opcodes: Mapping[str, str],
           runs: int | None) -> Trace:
    raw = []
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and args.get("hlo_module") == module and "hlo_op" in args \
                and "device_ordinal" in args and "run_id" in args:
            raw.append(e)
    if not raw:
        raise TraceError(f"the trace holds no op of the HLO module {module!r}.")
    starts: dict[str, float] = {}
    for e in raw:
        run_id = str(e["args"]["run_id"])
        starts[run_id] = min(starts.get(run_id, float("inf")), float(e["ts"]))
    order = {run_id: i for i, run_id in enumerate(sorted(starts, key=starts.__getitem__))}
    if runs is not None and len(order) != runs:
        raise TraceError(f"expected {runs} runs of {module!r} in the trace, found "
                         f"{len(order)}.")
    t0 = min(starts.values())
    missing = sorted({e["args"]["hlo_op"] for e in raw} - set(opcodes))
    if missing:
        raise TraceError(f"the trace names ops the compiled program does not hold: "
                         f"{missing[:5]}; was the trace taken of another compilation?")
    ops: list[Op] = []
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, Op]]] = {}
    for e in raw:
        name = e["args"]["hlo_op"]
        opcode = opcodes[name]
        op = Op(int(e["args"]["device_ordinal"]), name, op_kind(opcode), float(e["ts"]) - t0,
                float(e["dur"]), order[str(e["args"]["run_id"])], opcode)
        ops.append(op)
        if op.kind == "collective":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(
                (float(e["ts"]), float(e["ts"]) + float(e["dur"]), op))
    ops += _waits(events, by_thread, t0)
    ops.sort(key=lambda op: (op.run, op.device, op.start_us, KINDS_OF_OP.index(op.kind)))
    return Trace(ops, sorted({op.device for op in ops}), len(order), module)


def _waits(events: Iterable[Mapping[str, Any]],
           by_thread: dict[tuple[Any, Any], list[tuple[float, float, Op]]],
           t0: float) -> list[Op]:
    """A wait record per ``Rendezvous`` event inside one of our collectives (same thread);
    a Rendezvous inside another one of the same collective is not counted twice."""
    for spans in by_thread.values():
        spans.sort(key=lambda s: s[0])
    firsts = {key: [s[0] for s in spans] for key, spans in by_thread.items()}
    kept: dict[int, list[tuple[float, float]]] = {}
    owners: dict[int, Op] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("name") != "Rendezvous":
            continue
        thread = (e.get("pid"), e.get("tid"))
        spans = by_thread.get(thread)
        if not spans:
            continue
        start = float(e["ts"])
        end = start + float(e.get("dur", 0.0))
        i = bisect.bisect_right(firsts[thread], start + _TOLERANCE_US) - 1
        if i < 0 or end > spans[i][1] + _TOLERANCE_US:
            continue
        owner = spans[i][2]
        kept.setdefault(id(owner), []).append((start, end))
        owners[id(owner)] = owner
    waits = []
    for key, intervals in kept.items():
        owner = owners[key]
        last_end = -float("inf")
        for start, end in sorted(intervals):
            if end <= last_end + _TOLERANCE_US:
                continue  # nested in the previous wait
            start = max(start, last_end)
            waits.append(Op(owner.device, owner.name, "wait", start - t0, end - start,
                            owner.run, owner.opcode))
            last_end = end
    return waits


# --------------------------------------------------------------------------- files


def trace_files(folder: str | pathlib.Path) -> list[tuple[str, int]]:
    """``(path relative to folder, bytes)`` of every file a trace wrote under ``folder``."""
    root = checks.path("folder", folder, what="a path to a folder")
    if not root.is_dir():
        raise checks.InputError(f"folder {str(folder)!r} is not a folder.")
    return sorted((str(p.relative_to(root)), p.stat().st_size)
                  for p in root.rglob("*") if p.is_file())


def read_events(folder: str | pathlib.Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of the newest ``*.trace.json.gz`` under ``folder`` (what
    ``jax.profiler.trace(folder)`` wrote; the perfetto copy holds the same events)."""
    root = pathlib.Path(folder)
    files = sorted(root.glob("plugins/profile/*/*.trace.json.gz"),
                   key=lambda p: p.stat().st_mtime)
    if not files:
        raise TraceError(f"no plugins/profile/*/*.trace.json.gz under {str(folder)!r}: "
                         "was jax.profiler.trace given this folder?")
    with gzip.open(files[-1], "rt") as handle:
        return list(json.load(handle)["traceEvents"])


# --------------------------------------------------------------------------- capture


def capture(fn: Callable[..., Any], *args: Any, repeats: int = 3) -> Trace:
    """Trace ``repeats`` runs of ``fn(*args)`` and return them parsed, per device.

    ``fn`` is jitted if it is not, compiled on ``args`` and run once outside the trace
    (compilation and the first run's warm-up stay out of it); then it runs ``repeats``
    times inside ``jax.profiler.trace`` into a temporary folder, each run waited for, and
    the trace file is read back (:func:`read_events`) and parsed against the compiled
    program's text (the very executable that ran). ``fn`` must not donate its arguments:
    it runs ``repeats + 1`` times on the same ones. Keep ``repeats`` small: the JSON export
    keeps a bounded number of events, and a run it dropped is a :class:`TraceError`, not a
    silently shorter trace.
    """
    repeats = checks.count("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
    checks.function("fn", fn)
    if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(args)):
        raise checks.InputTypeError(
            "capture runs fn, so its arguments must be arrays, not jax.ShapeDtypeStruct.")
    compiled = hlo.compile(fn, *args)
    jax.block_until_ready(compiled(*args))
    if any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(args)):
        raise checks.InputError(
            "fn donated its arguments (they were deleted by its first run); capture runs it "
            "several times on the same arguments: trace a version without donate_argnums.")
    with tempfile.TemporaryDirectory(prefix="spmd_trace_") as folder:
        with jax.profiler.trace(folder):
            for _ in range(repeats):
                jax.block_until_ready(compiled(*args))
        events = read_events(folder)
        files = trace_files(folder)
    trace = Trace.from_events(events, compiled, runs=repeats)
    trace.folder_files = files
    return trace
