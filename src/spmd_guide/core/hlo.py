"""What the compiler did: the collectives in a compiled program, the bytes they move, the memory.

``jax.jit(fn).lower(*args).compile().as_text()`` is the optimized HLO that runs on each
device. :func:`compile` is the book's one compile step; :mod:`spmd_guide.core.hlo_text` is its one
parser. From the parsed program this module lists the collectives, once each: asynchronous
pairs (``all-gather-start``/``-done``, ``all-reduce-start``/``-done``,
``collective-permute-start``/``-done``) count once, from the ``-start``, and tuple-shaped ops
(all-to-all's tuple form, several arrays combined into one all-reduce) charge every operand.

**The cost model** (``bytes_sent``: bytes that *one* device sends, ring algorithms, over a
group of ``n`` devices):

=====================  ==============================================================
all-gather             (n-1)/n of the full, gathered (output) buffer
reduce-scatter         (n-1)/n of the full (input) buffer
all-reduce             2(n-1)/n of the buffer (a reduce-scatter, then an all-gather)
all-to-all             (n-1)/n of the operand (one of n chunks stays on the device)
collective-permute     the whole operand (0 if every pair sends to itself)
=====================  ==============================================================

``group_size`` is the size of one replica group; for a collective-permute it is the number
of devices in the largest connected set of its ``source_target_pairs`` (a ring of n: n).

A group of one device sends nothing (``n = 1`` gives 0 bytes). Each op's figure is rounded
down to whole bytes. Ops inside a loop body (``while``, e.g. from ``lax.scan``) are counted
once per appearance in the program text, not once per trip (and a computation called from
two places is read once): :mod:`spmd_guide.core.hlo_loops` lists each loop's collectives
per trip, with XLA's trip count when it knows one. The
model counts bytes on the wire, not time: it ignores latency, link topology and overlap
with compute.

Memory per device comes from ``compiled.memory_analysis()``; see :class:`MemoryStats`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from spmd_guide.core import checks, compile_cache
from spmd_guide.core.device_groups import (
    _attribute_value,
    _int_lists,
    parse_replica_groups,
    replica_groups_text,
)
from spmd_guide.core.display import Table, stack
from spmd_guide.core.hlo_text import (
    _OPCODES,
    KINDS,
    Buffer,
    Instruction,
    Module,
    parse_module,
    program_text,
    reachable,
)

__all__ = [
    "KINDS", "Collective", "MemoryStats", "Report", "collective_counts", "collectives",
    "collectives_in_text", "communication_bytes", "compile", "compiled_text", "count_kinds",
    "format_bytes", "memory_per_device", "report", "ring_bytes",
]

# --------------------------------------------------------------------------- formatting


def format_bytes(n: float) -> str:
    """A byte count for humans, in binary units: ``512 B``, ``1.5 KiB``, ``2 MiB``."""
    n = checks.real("format_bytes(n)", n, minimum=0)
    if n < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"


# --------------------------------------------------------------------------- collectives


@dataclass(frozen=True)
class Collective:
    """One collective op of a compiled program and what one device sends for it.

    ``buffers`` are the arrays the cost model charges (the gathered output of an all-gather,
    the operands otherwise); ``shape``/``dtype`` are those of the single buffer, or tuples of
    them for a tuple-shaped op. ``groups`` are the device groups (replica groups; for a
    collective-permute, its source-target pairs; empty when the op names every device), as
    HLO writes them: positions in the program's device list (``mesh.devices.flat``), which
    ``hlo_text.device_ids`` maps to ``jax.Device.id`` s. ``line`` is the op's HLO text.
    """

    kind: str
    buffers: tuple[Buffer, ...]
    group_size: int
    bytes_sent: int
    name: str = ""
    computation: str = ""
    groups: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    line: str = field(default="", repr=False)

    @property
    def shape(self) -> tuple[int, ...] | tuple[tuple[int, ...], ...]:
        shapes = tuple(b.shape for b in self.buffers)
        return shapes[0] if len(shapes) == 1 else shapes

    @property
    def dtype(self) -> str | tuple[str, ...]:
        dtypes = tuple(b.dtype for b in self.buffers)
        return dtypes[0] if len(set(dtypes)) == 1 else dtypes

    @property
    def buffer_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @property
    def shape_text(self) -> str:
        texts = [str(b) for b in self.buffers]
        if len(texts) > 1 and len(set(texts)) == 1:
            return f"{len(texts)} x {texts[0]}"
        return ", ".join(texts)

    def row(self) -> dict[str, Any]:
        return {
            "op": self.kind,
            "buffer": self.shape_text,
            "group size": self.group_size,
            "bytes sent": self.bytes_sent,
            "sent": format_bytes(self.bytes_sent),
        }


def ring_bytes(kind: str, buffer_bytes: int, group_size: int) -> int:
    """Bytes one device sends for a collective of ``kind`` under the ring model.

    ``buffer_bytes`` is the full buffer (gathered output for all-gather, input for
    reduce-scatter, the operand for the others).
    """
    checks.one_of("collective kind", kind, KINDS)
    buffer_bytes = checks.count("buffer_bytes", buffer_bytes, minimum=0)
    n = checks.count("group_size", group_size)
    if kind == "collective-permute":
        return buffer_bytes
    factor = 2 if kind == "all-reduce" else 1
    return factor * (n - 1) * buffer_bytes // n


def _replica_groups(instruction: Instruction, module: Module
                    ) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """(group size, groups) of a collective; ``{}`` or no groups means one group of all."""
    attrs = instruction.attributes
    value = replica_groups_text(attrs)
    groups = parse_replica_groups(value) if value is not None else ()
    if groups:
        sizes = {len(g) for g in groups}
        if len(sizes) > 1:
            raise ValueError(f"replica groups of unequal sizes {sorted(sizes)} in "
                             f"{instruction.line[:200]}")
        return sizes.pop(), groups
    if "use_global_device_ids=true" in attrs:
        return module.num_partitions * module.replica_count, ()
    if "channel_id=" in attrs:
        return module.num_partitions, ()
    return module.replica_count, ()


def _largest_cycle(pairs: Sequence[Sequence[int]]) -> int:
    """Devices in the largest connected set of a permute's pairs (a ring of n gives n)."""
    parent: dict[int, int] = {}

    def root(d: int) -> int:
        while parent.setdefault(d, d) != d:
            d = parent[d]
        return d

    for src, dst in pairs:
        parent[root(src)] = root(dst)
    sizes: dict[int, int] = {}
    for d in list(parent):
        sizes[root(d)] = sizes.get(root(d), 0) + 1
    return max(sizes.values(), default=1)


def _collective(instruction: Instruction, computation: str, table: dict[str, Instruction],
                module: Module) -> Collective:
    kind = _OPCODES[instruction.opcode]
    operands: list[Buffer] = []
    for operand in instruction.operands:
        if operand not in table:
            raise ValueError(f"operand %{operand} of {instruction.name} is not defined in "
                             f"computation {computation}")
        operands.extend(table[operand].result)
    if kind == "collective-permute":
        attrs = instruction.attributes
        start = attrs.find("source_target_pairs=")
        pairs = _int_lists(_attribute_value(attrs, start + len("source_target_pairs=")))\
            if start >= 0 else []
        groups = tuple(tuple(pair) for pair in pairs)
        group_size = _largest_cycle(pairs)
        moves = any(src != dst for src, dst in pairs)
        # The -start form may carry extra operands (output buffer, contexts): charge the first.
        buffers = tuple(operands[:1])
        sent = sum(b.nbytes for b in buffers) if moves else 0
    else:
        group_size, groups = _replica_groups(instruction, module)
        if kind == "all-gather":
            dims = re.search(r"dimensions=\{(\d+)\}", instruction.attributes)
            if dims is None:
                raise ValueError(f"all-gather without dimensions: {instruction.line[:200]}")
            d = int(dims.group(1))
            buffers = tuple(
                Buffer(b.dtype, b.shape[:d] + (b.shape[d] * group_size,) + b.shape[d + 1:])
                for b in operands
            )
        else:
            buffers = tuple(operands)
        sent = ring_bytes(kind, sum(b.nbytes for b in buffers), group_size)
    return Collective(kind, buffers, group_size, sent, instruction.name, computation,
                      groups, instruction.line)


def collectives_in_text(text: str | jax.stages.Compiled) -> list[Collective]:
    """Every collective op in an HLO module's text (or compiled program), once each, in
    program order."""
    module = parse_module(program_text(text))
    found = []
    for computation in reachable(module):
        instructions = module.computations[computation]
        table = {i.name: i for i in instructions}
        for instruction in instructions:
            if instruction.opcode in _OPCODES:
                found.append(_collective(instruction, computation, table, module))
    return found


# --------------------------------------------------------------------------- compiling


def _compile(fn: Callable[..., Any] | Any, args: tuple[Any, ...],
             compiler_options: dict[str, Any] | None = None) -> Any:
    """Compile ``fn`` (plain, jitted, or already lowered/compiled) on ``args``.

    ``args`` are arrays or ``jax.ShapeDtypeStruct(shape, dtype, sharding=...)``: the latter
    compile a program for shapes too big to allocate. JAX caches the compilation, so asking
    several questions of the same function and arguments compiles once.
    """
    if isinstance(fn, jax.stages.Compiled):
        return fn
    if isinstance(fn, jax.stages.Lowered):
        return _compile_lowered(fn, compiler_options)
    if not callable(fn):
        raise checks.InputTypeError(
            f"expected a function (plain or jitted) to compile, got {type(fn).__name__}.")
    _check_arguments(fn, args)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        lowered = jitted.lower(*args)
    except TypeError as error:
        if "abstract array" not in str(error) and "not a valid JAX type" not in str(error):
            raise
        kinds = sorted({type(a).__name__ for a in jax.tree.leaves(args)
                        if not isinstance(a, (jax.Array, np.ndarray, np.generic, int, float,
                                              complex, bool, jax.ShapeDtypeStruct))})
        raise checks.InputTypeError(
            f"cannot compile {getattr(fn, '__name__', 'fn')}: its arguments must be arrays "
            f"(got {', '.join(kinds) or 'a non-array'}). Bind non-array arguments with "
            "functools.partial, e.g. collective_counts(functools.partial(f, axis='x'), x)."
        ) from None
    return _compile_lowered(lowered, compiler_options)


def _compile_lowered(lowered: jax.stages.Lowered,
                     compiler_options: dict[str, Any] | None) -> jax.stages.Compiled:
    """``lowered.compile(compiler_options)``; a compile that asks XLA for a dump compiles
    afresh (:func:`spmd_guide.core.compile_cache.disabled`): a program loaded from the
    persistent cache runs no pass, so XLA would write nothing (the dump options are not part
    of the cache's key)."""
    if any(key.startswith("xla_dump") for key in compiler_options or {}):
        with compile_cache.disabled():
            return lowered.compile(compiler_options)
    return lowered.compile(compiler_options)


def _check_arguments(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError as error:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(
            f"cannot compile {name}{signature} with {len(args)} argument(s) ({error}). "
            "Pass the example arguments after the function, e.g. collective_counts(f, x, y); "
            "bind static or non-array arguments first with functools.partial."
        ) from None


#: Compiler options for programs compiled to be read (collectives, memory, FLOPs) or run
#: once on small shapes: XLA's HLO passes, buffer assignment and schedule run in full; only
#: LLVM's optimization of the CPU machine code is skipped, which halves a compile on XLA:CPU.
#: Tests check that the counts and the memory analysis are unchanged by it.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def compile(fn: Callable[..., Any], *args: Any,  # noqa: A001
            compiler_options: dict[str, Any] | None = None) -> jax.stages.Compiled:
    """The one compile step of the book: ``fn`` (plain, jitted, lowered or compiled) on
    ``args``, as a ``jax.stages.Compiled`` (ask it ``.as_text()``, ``.memory_analysis()``,
    ``.cost_analysis()``). ``args`` may be ``jax.ShapeDtypeStruct``s; ``compiler_options``
    go to XLA (e.g. ``{"xla_dump_to": "dir"}``)."""
    return _compile(fn, args, compiler_options)


def compiled_text(fn: Callable[..., Any], *args: Any) -> str:
    """The optimized HLO text of ``fn`` compiled on ``args`` (what each device runs)."""
    return _compile(fn, args).as_text()


def collectives(fn: Callable[..., Any], *args: Any) -> list[Collective]:
    """The collective ops in the compiled program of ``fn`` on ``args``, in program order."""
    return collectives_in_text(compiled_text(fn, *args))


def count_kinds(ops: Iterable[Collective]) -> dict[str, int]:
    """How many of ``ops`` are of each kind; all five keys of :data:`KINDS` always present."""
    counts = dict.fromkeys(KINDS, 0)
    for op in ops:
        counts[op.kind] += 1
    return counts


def collective_counts(fn: Callable[..., Any], *args: Any) -> dict[str, int]:
    """How many ops of each kind the compiled program holds; all five keys always present."""
    return count_kinds(collectives(fn, *args))


def communication_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Bytes one device sends in the compiled program, under the ring model (module docs)."""
    return sum(op.bytes_sent for op in collectives(fn, *args))


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryStats:
    """Memory one device needs for a compiled program, from ``compiled.memory_analysis()``.

    Every field is XLA's own figure for one device: ``argument_bytes`` (the inputs: here
    the parameters and the batch shard), ``output_bytes`` (new parameters, loss),
    ``alias_bytes`` (outputs written into donated inputs, counted once), ``temp_bytes``
    (everything the program allocates in between: activations, gradients, gathered
    weights, collective buffers). ``peak_bytes`` is their sum as if all were live at once,
    arguments + outputs - aliased + temporaries: an upper bound on what the device must
    hold, and the figure to compare across programs.

    ``xla_peak_bytes`` is XLA's ``peak_memory_in_bytes`` (0 where not reported). On XLA:CPU
    in JAX 0.10 it equals arguments + outputs and leaves the temporaries out (a test pins
    this), so it is not the peak on this backend.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    xla_peak_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def as_rows(self) -> list[tuple[str, int, str]]:
        """``(what, bytes, human-readable)`` rows for a table."""
        items = [
            ("arguments", self.argument_bytes),
            ("outputs", self.output_bytes),
            ("aliased (donated)", self.alias_bytes),
            ("temporaries", self.temp_bytes),
            ("generated code", self.generated_code_bytes),
            ("peak, upper bound (args + outputs - aliased + temps)", self.peak_bytes),
        ]
        return [(what, n, format_bytes(n)) for what, n in items]


def _memory(compiled: Any) -> MemoryStats:
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend reports no memory analysis for compiled programs")
    return MemoryStats(
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        alias_bytes=int(stats.alias_size_in_bytes),
        temp_bytes=int(stats.temp_size_in_bytes),
        generated_code_bytes=int(stats.generated_code_size_in_bytes),
        xla_peak_bytes=int(getattr(stats, "peak_memory_in_bytes", 0) or 0),
    )


def memory_per_device(fn: Callable[..., Any], *args: Any) -> MemoryStats:
    """Bytes one device holds for the compiled program of ``fn`` on ``args``."""
    return _memory(_compile(fn, args))


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Report:
    """Collectives, their bytes and memory per device of one compiled program.

    Displays as an HTML table in a notebook (``_repr_html_``) and as text with ``str()``.
    """

    ops: tuple[Collective, ...]
    memory: MemoryStats
    title: str = ""

    @property
    def counts(self) -> dict[str, int]:
        return count_kinds(self.ops)

    @property
    def total_bytes(self) -> int:
        return sum(op.bytes_sent for op in self.ops)

    def summary(self) -> str:
        """One line: the collectives by kind and the bytes one device sends."""
        used = ", ".join(f"{n} {kind}" for kind, n in self.counts.items() if n) or "none"
        return f"collectives: {used}; bytes sent per device: {format_bytes(self.total_bytes)}"

    def tables(self) -> list[Any]:
        """The report as display parts: the ops table (if any), the summary, the memory."""
        parts: list[Any] = []
        if self.ops:
            n = len(self.ops)
            rows = [{"op": op.kind, "buffer": op.shape_text, "group": str(op.group_size),
                     "sent per device": format_bytes(op.bytes_sent)} for op in self.ops]
            rows.append({"op": "total", "buffer": f"{n} op" if n == 1 else f"{n} ops",
                         "group": "", "sent per device": format_bytes(self.total_bytes)})
            parts.append(Table(rows, title=self.title, bold_last=True,
                               align={"group": "right", "sent per device": "right"}))
        elif self.title:
            parts.append(self.title)
        parts.append(self.summary())
        parts.append(Table([{"memory per device": what, "bytes": human}
                            for what, _, human in self.memory.as_rows()],
                           align={"bytes": "right"}))
        return parts

    def __str__(self) -> str:
        return "\n\n".join(str(part) for part in self.tables())

    def _repr_html_(self) -> str:
        return stack(*self.tables())._repr_html_()


def report(fn: Callable[..., Any], *args: Any, title: str = "") -> Report:
    """Compile ``fn`` on ``args`` once and summarize its collectives, bytes and memory."""
    compiled = _compile(fn, args)
    return Report(tuple(collectives_in_text(compiled.as_text())), _memory(compiled), title)
