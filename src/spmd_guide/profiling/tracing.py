"""A ``jax.profiler`` trace of a compiled step, read per device and checked against the
compiled program.

:func:`capture` runs a function under ``jax.profiler.trace`` and parses the TraceEvent file
the profiler writes (``plugins/profile/<time>/<host>.trace.json.gz``, gzipped JSON, read with
the standard library; the ``.xplane.pb`` beside it holds the same events as a protobuf, for
XProf). On XLA:CPU (JAX 0.12) the file has, for every HLO op a device executes, an event
whose ``args`` carry ``device_ordinal`` (a string), ``hlo_module``, ``hlo_op`` (the
instruction's name) and ``run_id`` (shared by the devices of one execution; may be
negative). Each op's event ends with an ``end: <name>`` event inside its span, with no
device. A ``Rendezvous`` event sits inside a collective's event on the same thread while
that device waits for the others to arrive; it has no ``device_ordinal`` or ``run_id``
field (its ``name`` arg holds the run id and the group's devices, not which device waited),
so its device and run come from the collective around it.

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
  executes 3 all-reduces per run, where the compiled program's text holds one; a
  ``conditional``'s ops appear only for the branch taken.
* A trace is checked against the program it is read with: the devices that ran it must be
  the program's device count (``num_partitions`` x ``replica_count`` of its text), every op
  name must be one of its instructions; a trace of another compilation is refused.
"""

from __future__ import annotations

import bisect
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
from spmd_guide.profiling.events import (
    TraceError,
    TraceInputError,
    check_events,
    event_time,
    read_events,
    trace_files,
)

__all__ = [
    "HLO_OPCODES", "KINDS_OF_OP", "MAX_REPEATS", "Op", "Trace", "TraceError", "TraceInputError",
    "capture", "check_events", "counts_text", "device_count_of", "event_time", "opcodes_of", "op_kind", "read_events",
    "trace_files",
]

#: What an op record can be, in the order the timeline draws them.
KINDS_OF_OP = ("other", "compute", "collective", "wait")
#: Ops whose event contains the events of the ops they run (time counted once, inside).
_CONTAINERS = frozenset({"while", "conditional", "call", "async-start", "async-update",
                         "async-done"})
#: More runs than this make a trace file of many megabytes for no better average.
MAX_REPEATS = 1000
_TOLERANCE_US = 0.01  # event times are rounded to ns: containment allows this much slack


#: Every HLO opcode XLA defines (``HLO_OPCODE_LIST`` in openxla/xla
#: ``xla/hlo/ir/hlo_opcode.h``): what :func:`op_kind` accepts.
HLO_OPCODES = frozenset("""
abs acos acosh add add-dependency after-all all-gather all-gather-done all-gather-start
all-reduce all-reduce-done all-reduce-start all-to-all and asin asinh async-done async-start
async-update atan atan2 atanh batch-norm-grad batch-norm-inference batch-norm-training bitcast
bitcast-convert broadcast call cbrt ceil cholesky clamp count-leading-zeros
collective-broadcast collective-permute collective-permute-done collective-permute-start
collective-reduce compare complex concatenate conditional constant convert convolution copy
copy-done copy-start cosine cosh custom-call divide domain dot dynamic-reshape dynamic-slice
dynamic-update-slice erf exponential exponential-minus-one fft floor fusion gather
get-dimension-size get-tuple-element imag infeed iota is-finite log log-plus-one logistic map
maximum minimum mulhi multiply negate not opt-barrier or outfeed pad parameter partition-id
popcnt power ragged-all-to-all ragged-dot real recv recv-done reduce reduce-precision
reduce-scatter reduce-window remainder replica-id reshape reverse rng rng-bit-generator
rng-get-and-update-state round-nearest-afz round-nearest-even rsqrt scaled-dot scan scatter
select select-and-scatter send send-done set-dimension-size shift-left shift-right-arithmetic
shift-right-logical shuffle sign sine sinh slice sort sqrt stochastic-convert subtract tan
tanh topk transpose triangular-solve tuple while xor
""".split())


def op_kind(opcode: str) -> str:
    """``"collective"``, ``"other"`` or ``"compute"`` for an HLO opcode (see module docs).

    Only XLA's opcodes (:data:`HLO_OPCODES`) are taken: an instruction name
    (``all-reduce.3``) or a JAX primitive (``psum``) is refused, not called compute.
    """
    if not isinstance(opcode, str) or not opcode:
        raise checks.InputTypeError(f"opcode must be an HLO opcode, a non-empty string, got "
                                    f"{checks.value_text(opcode)}.")
    if opcode not in HLO_OPCODES:
        base = re.sub(r"\.\d+$", "", opcode)
        hint = (f"; {opcode!r} looks like an instruction's name: pass its opcode, {base!r}"
                if base != opcode and base in HLO_OPCODES else
                " (a JAX primitive such as 'psum' compiles to an opcode such as 'all-reduce'; "
                "opcodes_of(program) maps a program's instruction names to their opcodes)")
        raise checks.InputError(f"opcode {opcode!r} is not an HLO opcode{hint}.")
    return _kind(opcode)


def _kind(opcode: str) -> str:
    """The kind of an opcode read from a compiled program (no check: a newer XLA may have
    opcodes :data:`HLO_OPCODES` lacks; they count as compute)."""
    if opcode in _OPCODES or (opcode.endswith("-done") and opcode[:-5] in KINDS):
        return "collective"
    if opcode in _CONTAINERS:
        return "other"
    return "compute"


def device_count_of(program: str | jax.stages.Compiled) -> int:
    """Devices one run of a compiled program spans: ``num_partitions`` x ``replica_count``
    of its ``HloModule`` line (each 1 when absent)."""
    text = program_text(program)
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    sizes = [int(m.group(1)) if (m := re.search(rf"\b{key}=(\d+)", first)) else 1
             for key in ("num_partitions", "replica_count")]
    return sizes[0] * sizes[1]


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

    def __post_init__(self) -> None:
        fixed = {
            "device": checks.count("device", self.device, minimum=0),
            "name": checks.text("name", self.name),
            "kind": checks.one_of("kind", self.kind, KINDS_OF_OP),
            "start_us": checks.real("start_us", self.start_us),
            "dur_us": checks.real("dur_us", self.dur_us, minimum=0.0),
            "run": checks.count("run", self.run, minimum=0),
            "opcode": checks.text("opcode", self.opcode, empty=True),
        }
        for key, value in fixed.items():
            object.__setattr__(self, key, value)

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
    (``jax.Device.id``), ``runs`` the number of runs, ``module`` the HLO module's name,
    ``origin_us`` the trace clock's time (``ts`` of the events) at which ``start_us`` 0 lies.
    Built by hand, every field is checked: each op an :class:`Op` of a listed device and a
    run below ``runs``.
    """

    ops: list[Op]
    devices: list[int]
    runs: int
    module: str = ""
    folder_files: list[tuple[str, int]] = field(default_factory=list, repr=False)
    origin_us: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.ops, (str, bytes, Mapping)) or not isinstance(self.ops, Sequence):
            raise checks.InputTypeError(f"ops must be a list of Op, got "
                                        f"{checks.value_text(self.ops)}.")
        self.ops = list(self.ops)
        for i, op in enumerate(self.ops):
            checks.instance(f"ops[{i}]", op, Op, example="a tracing.Op")
        devices = checks.counts("devices", self.devices, minimum=0)
        if list(devices) != sorted(set(devices)):
            raise checks.InputError(f"devices must be sorted and distinct, got {list(devices)}.")
        self.devices = list(devices)
        self.runs = checks.count("runs", self.runs, maximum=MAX_REPEATS)
        self.module = checks.text("module", self.module, empty=True)
        self.origin_us = checks.real("origin_us", self.origin_us)
        for i, op in enumerate(self.ops):
            if op.device not in self.devices or op.run >= self.runs:
                raise checks.InputError(
                    f"ops[{i}] is of device {op.device}, run {op.run}: the trace has devices "
                    f"{self.devices} and runs 0..{self.runs - 1}.")

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
        """Parse TraceEvents (the ``traceEvents`` of a trace file) of ``program``'s runs.

        Refused (:class:`TraceInputError`): events that are not a list of dicts, ``runs``
        runs expected and another number found, an op name ``program`` does not hold, and
        ops on another number of devices than ``program`` spans (a trace of the same
        function compiled for another mesh)."""
        if runs is not None:
            runs = checks.count("runs", runs, maximum=MAX_REPEATS)
        check_events(events)
        module, opcodes = opcodes_of(program)
        return _parse(events, module, opcodes, runs, device_count_of(program))


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
           runs: int | None, n_devices: int = 0) -> Trace:
    raw = []  # (index, event, device, name, run id, ts, dur)
    for i, e in enumerate(events):
        args = e.get("args") or {}
        if not (e.get("ph") == "X" and isinstance(args, Mapping)
                and args.get("hlo_module") == module and "hlo_op" in args
                and "device_ordinal" in args and "run_id" in args):
            continue
        try:
            device = int(str(args["device_ordinal"]))
        except ValueError:
            device = -1
        if device < 0:
            raise TraceInputError(f"events[{i}] has device_ordinal="
                                  f"{checks.value_text(args['device_ordinal'])}, not a device id.")
        raw.append((i, e, device, str(args["hlo_op"]), str(args["run_id"]),
                    event_time(e, "ts", i), event_time(e, "dur", i)))
    if not raw:
        raise TraceInputError(f"the trace holds no op of the HLO module {module!r}.")
    starts: dict[str, float] = {}
    for _, _, _, _, run_id, ts, _ in raw:
        starts[run_id] = min(starts.get(run_id, float("inf")), ts)
    order = {run_id: i for i, run_id in enumerate(sorted(starts, key=starts.__getitem__))}
    if runs is not None and len(order) != runs:
        raise TraceInputError(f"runs={runs} runs of {module!r} were expected in the trace, "
                              f"it holds {len(order)}.")
    t0 = min(starts.values())
    missing = sorted({r[3] for r in raw} - set(opcodes))
    if missing:
        raise TraceInputError(f"the trace names ops the compiled program does not hold: "
                              f"{missing[:5]}; was the trace taken of another compilation?")
    seen = sorted({r[2] for r in raw})
    if n_devices and len(seen) != n_devices:
        raise TraceInputError(
            f"the trace's ops of {module!r} ran on {len(seen)} device(s) {seen[:8]}, but the "
            f"program spans {n_devices}: was the trace taken of the function compiled for "
            "another mesh?")
    ops: list[Op] = []
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, Op]]] = {}
    for _, e, device, name, run_id, ts, dur in raw:
        opcode = opcodes[name]
        op = Op(device, name, _kind(opcode), ts - t0, dur, order[run_id], opcode)
        ops.append(op)
        if op.kind == "collective":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, op))
    ops += _waits(events, by_thread, t0)
    ops.sort(key=lambda op: (op.run, op.device, op.start_us, KINDS_OF_OP.index(op.kind)))
    return Trace(ops, seen, len(order), module, origin_us=t0)


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
    for index, e in enumerate(events):
        if e.get("ph") != "X" or e.get("name") != "Rendezvous":
            continue
        thread = (e.get("pid"), e.get("tid"))
        spans = by_thread.get(thread)
        if not spans:
            continue
        start = event_time(e, "ts", index)
        end = start + event_time(e, "dur", index)
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
