"""What the compiler did: the collectives in a compiled program, the bytes they move, the memory.

``jax.jit(fn).lower(*args).compile().as_text()`` is the optimized HLO that runs on each
device. This module reads that text properly rather than grepping it:

* It builds a name-to-shape table for every instruction of every computation, because an
  op's operands appear by *name* (``all-reduce(%wrapped_reduce)``), not by shape.
* It handles tuple-shaped ops (all-to-all's tuple form, or several arrays combined into one
  all-reduce) and asynchronous pairs: ``all-gather-start``/``-done``,
  ``all-reduce-start``/``-done`` and ``collective-permute-start``/``-done`` count once,
  from the ``-start``.
* It reads ``replica_groups`` in all three spellings: explicit lists
  ``{{0,1,2,3},{4,5,6,7}}``, iota ``[2,4]<=[8]`` (or ``[2,4]<=[4,2]T(1,0)``), and the
  partitioner's ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}``; collective-permute has
  ``source_target_pairs`` instead.
* It scans only computations reachable from ``ENTRY`` (through ``calls=``, ``to_apply=``,
  ``body=``, ``condition=``, branches, ...), each once, so no op is counted twice.

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
two places is read once): multiply by the trip count yourself when a loop matters. The
model counts bytes on the wire, not time: it ignores latency, link topology and overlap
with compute.

Memory per device comes from ``compiled.memory_analysis()``; see :class:`MemoryStats`.
"""

from __future__ import annotations

import html
import inspect
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

__all__ = [
    "KINDS", "Buffer", "Collective", "MemoryStats", "Report", "collective_counts",
    "collectives", "collectives_in_text", "communication_bytes", "compile", "compiled_text",
    "format_bytes", "memory_per_device", "parse_replica_groups", "parse_shape", "report",
    "ring_bytes",
]

KINDS: tuple[str, ...] = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "collective-permute",
    "all-to-all",
)
"""The five collective kinds this module counts, in a fixed order (the keys of the counts)."""

# HLO opcode -> collective kind. The -done halves of async pairs are deliberately absent.
_OPCODES: dict[str, str] = {
    **{kind: kind for kind in KINDS},
    "all-gather-start": "all-gather",
    "all-reduce-start": "all-reduce",
    "collective-permute-start": "collective-permute",
}


# --------------------------------------------------------------------------- formatting


def format_bytes(n: float) -> str:
    """A byte count for humans, in binary units: ``512 B``, ``1.5 KiB``, ``2 MiB``."""
    if n < 0:
        raise ValueError(f"format_bytes needs a non-negative byte count, got {n}")
    if n < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Buffer:
    """One array in an HLO shape: its element type (``f32``, ``bf16``, ...) and dimensions."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.ceil(math.prod(self.shape) * _dtype_bits(self.dtype) / 8)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


_ARRAY_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")


def _dtype_bits(dtype: str) -> int:
    """Bits per element of an HLO element type (``pred`` is stored as a byte)."""
    if dtype == "pred":
        return 8
    if dtype in ("token", "opaque"):
        return 0
    match = re.match(r"[a-z]+(\d+)", dtype)
    if not match:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return int(match.group(1))


def parse_shape(text: str) -> tuple[Buffer, ...]:
    """The arrays in an HLO shape, tuples flattened: ``(f32[4]{0}, s32[])`` -> two buffers.

    Layouts (``{1,0}``) are ignored; a dynamic bound ``<=16`` counts as 16.
    """
    buffers = []
    for dtype, dims in _ARRAY_SHAPE.findall(text):
        sizes = tuple(int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip())
        buffers.append(Buffer(dtype, sizes))
    return tuple(buffers)


# --------------------------------------------------------------------------- replica groups


def _int_lists(text: str) -> list[list[int]]:
    """``{{0,1},{2,3}}`` -> ``[[0, 1], [2, 3]]`` (also ``{}`` -> ``[]``)."""
    return [[int(v) for v in inner.split(",") if v.strip()]
            for inner in re.findall(r"\{([^{}]*)\}", text) if inner.strip()]


def _iota(reshape: Sequence[int], transpose: Sequence[int] | None) -> np.ndarray:
    devices = np.arange(math.prod(reshape)).reshape(tuple(reshape))
    return devices.transpose(tuple(transpose)) if transpose is not None else devices


_IOTA_GROUPS = re.compile(
    r"^\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?$"
)
_MESH_GROUPS = re.compile(
    r"^mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>[^)]*(?:\([^)]*\))?[^)]*)\))?"
    r"\s*\{(?P<grouped>[^}]*)\}$"
)
_MESH_AXIS = re.compile(r"^'?([^'=]+)'?=(\d+)$")
_GROUP_AXIS = re.compile(r"^'?([^':]+)'?(?::\((\d+)\)(\d+))?$")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _mesh_groups(match: re.Match[str]) -> tuple[tuple[int, ...], ...]:
    """Expand ``mesh[...] {axes}``: each group varies the named (sub-)axes, the rest fixed."""
    names, sizes = [], []
    for item in match["axes"].split(","):
        axis = _MESH_AXIS.match(item.strip())
        if not axis:
            raise ValueError(f"cannot read mesh axis {item!r} in replica_groups")
        names.append(axis.group(1))
        sizes.append(int(axis.group(2)))
    ids = match["ids"]
    if ids is None:
        devices = np.arange(math.prod(sizes))
    else:
        devices = _device_list(ids.strip(), math.prod(sizes))
    grouped: list[tuple[str, int | None, int]] = []  # (axis, sub-axis pre-size, size)
    for item in match["grouped"].split(","):
        if not item.strip():
            continue
        ref = _GROUP_AXIS.match(item.strip())
        if not ref or ref.group(1) not in names:
            raise ValueError(f"replica_groups names axis {item!r}, not in mesh {names}")
        if ref.group(2) is None:
            grouped.append((ref.group(1), None, sizes[names.index(ref.group(1))]))
        else:
            grouped.append((ref.group(1), int(ref.group(2)), int(ref.group(3))))
    # Split each axis into pieces: a sub-axis ":(pre)size" is the `size` devices that
    # follow the `pre` major ones along that axis.
    dims: list[int] = []
    index_of: dict[tuple[str, int | None], int] = {}
    for name, size in zip(names, sizes, strict=True):
        subs = sorted((pre, sub) for n, pre, sub in grouped if n == name and pre is not None)
        cursor = 1
        for pre, sub in subs:
            if pre > cursor:
                dims.append(pre // cursor)
            index_of[(name, pre)] = len(dims)
            dims.append(sub)
            cursor = pre * sub
        if size % cursor:
            raise ValueError(f"sub-axes of {name!r} (size {size}) do not divide it")
        if cursor == 1:
            index_of[(name, None)] = len(dims)
            dims.append(size)
        elif size // cursor > 1:
            dims.append(size // cursor)
    keep = [index_of[(name, pre)] for name, pre, _ in grouped]
    rest = [i for i in range(len(dims)) if i not in keep]
    group_size = math.prod(dims[i] for i in keep)
    array = devices.reshape(dims).transpose(rest + keep).reshape(-1, group_size)
    return tuple(tuple(int(d) for d in row) for row in array)


def _device_list(text: str, count: int) -> np.ndarray:
    """Device ids of a mesh, printed as an iota (``[4,2]T(1,0)``, optionally after
    ``[dims]<=``) or as a list of ids (optionally after its ``[dims]``)."""
    iota = re.match(r"^(?:\[[\d,]+\]<=)?\[([\d,]+)\](?:T\(([\d,]+)\))?$", text)
    if iota:
        perm = _ints(iota.group(2)) if iota.group(2) else None
        devices = _iota(_ints(iota.group(1)), perm).reshape(-1)
    else:
        devices = np.array([int(v) for v in re.findall(r"\d+", re.sub(r"^\[[\d,]*\]", "", text))])
    if devices.size != count:
        raise ValueError(f"cannot read mesh device_ids=({text}) for {count} devices")
    return devices


def parse_replica_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """The device groups an HLO ``replica_groups=`` value names, in any of its three spellings.

    >>> parse_replica_groups("{{0,2},{1,3}}")
    ((0, 2), (1, 3))
    >>> parse_replica_groups("[2,2]<=[2,2]T(1,0)")
    ((0, 2), (1, 3))
    >>> parse_replica_groups("mesh['a'=2,'b'=2] {'a'}")
    ((0, 2), (1, 3))

    ``{}`` (every device in one group) gives ``()``: the caller knows the device count.
    """
    text = text.strip()
    if text.startswith("{"):
        return tuple(tuple(group) for group in _int_lists(text))
    iota = _IOTA_GROUPS.match(text)
    if iota:
        n_groups, size = int(iota.group(1)), int(iota.group(2))
        perm = _ints(iota.group(4)) if iota.group(4) else None
        devices = _iota(_ints(iota.group(3)), perm).reshape(n_groups, size)
        return tuple(tuple(int(d) for d in row) for row in devices)
    mesh = _MESH_GROUPS.match(text)
    if mesh:
        return _mesh_groups(mesh)
    raise ValueError(f"cannot read replica_groups={text!r}")


# --------------------------------------------------------------------------- HLO text


@dataclass(frozen=True)
class _Instruction:
    name: str
    result: tuple[Buffer, ...]
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    line: str


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*)?\{\s*$")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group that opens at ``text[start]`` (quotes skipped)."""
    closing = {"(": ")", "{": "}", "[": "]"}
    stack: list[str] = []
    i = start
    while i < len(text):
        c = text[i]
        if c == '"':
            i = text.find('"', i + 1)
            if i < 0:
                break
        elif c in closing:
            stack.append(closing[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced brackets in HLO line: {text[:200]}")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not nested in brackets."""
    parts, depth, current = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    if current:
        parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _parse_instruction(line: str) -> _Instruction | None:
    match = _DEF.match(line)
    if not match:
        return None
    name, rest = match.group(1), match.group(2).strip()
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.find(" ")
        if end < 0:
            return None
    shape_text, rest = rest[:end], rest[end:].strip()
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    close = _balanced(rest, op.end() - 1)
    operand_text = re.sub(r"/\*.*?\*/", "", rest[op.end():close - 1])
    operands = tuple(
        part.split()[-1].lstrip("%") for part in _split_top(operand_text) if part.split()
    )
    # Quoted strings (metadata, backend configs) are dropped so that no name or attribute
    # written inside them is mistaken for a real one.
    attributes = _QUOTED.sub('""', rest[close:])
    return _Instruction(name, parse_shape(shape_text), op.group(1), operands, attributes,
                        line.strip())


@dataclass(frozen=True)
class _Module:
    computations: dict[str, list[_Instruction]]
    entry: str
    num_partitions: int
    replica_count: int


def _parse_module(text: str) -> _Module:
    computations: dict[str, list[_Instruction]] = {}
    entry, current = None, None
    for raw in text.splitlines():
        line = raw.rstrip()
        header = _HEADER.match(line)
        if header and not line.startswith(" ") and "=" not in line.split("(")[0]:
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is not None:
            instruction = _parse_instruction(line)
            if instruction is not None:
                computations[current].append(instruction)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    partitions = re.search(r"num_partitions=(\d+)", text)
    replicas = re.search(r"replica_count=(\d+)", text)
    return _Module(computations, entry, int(partitions.group(1)) if partitions else 1,
                   int(replicas.group(1)) if replicas else 1)


def _reachable(module: _Module) -> list[str]:
    """Computations reachable from ENTRY, each once, in discovery order."""
    order, todo, seen = [], [module.entry], {module.entry}
    while todo:
        name = todo.pop()
        order.append(name)
        for instruction in module.computations[name]:
            for called in re.findall(r"%?([\w.\-]+)", instruction.attributes):
                if called in module.computations and called not in seen:
                    seen.add(called)
                    todo.append(called)
    return order


# --------------------------------------------------------------------------- collectives


@dataclass(frozen=True)
class Collective:
    """One collective op of a compiled program and what one device sends for it.

    ``buffers`` are the arrays the cost model charges (the gathered output of an all-gather,
    the operands otherwise); ``shape``/``dtype`` are those of the single buffer, or tuples of
    them for a tuple-shaped op. ``groups`` are the device groups (replica groups; for a
    collective-permute, its source-target pairs; empty when the op names every device),
    ``line`` the op's HLO text.
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
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {KINDS}")
    n = group_size
    if n < 1:
        raise ValueError(f"group size must be at least 1, got {n}")
    if kind == "collective-permute":
        return buffer_bytes
    factor = 2 if kind == "all-reduce" else 1
    return factor * (n - 1) * buffer_bytes // n


def _replica_groups(instruction: _Instruction, module: _Module
                    ) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """(group size, groups) of a collective; ``{}`` or no groups means one group of all."""
    attrs = instruction.attributes
    match = re.search(r"replica_groups=", attrs)
    if match is None:
        groups: tuple[tuple[int, ...], ...] = ()
    elif attrs.startswith("mesh[", match.end()):  # runs through `, device_ids=(...) {axes}`
        groups = parse_replica_groups(attrs[match.end():attrs.index("}", match.end()) + 1])
    else:
        groups = parse_replica_groups(_attribute_value(attrs, match.end()))
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


def _attribute_value(attrs: str, start: int) -> str:
    """The text of an attribute value starting at ``start`` (up to the next top-level comma)."""
    depth = 0
    for i in range(start, len(attrs)):
        c = attrs[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return attrs[start:i]
    return attrs[start:]


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


def _collective(instruction: _Instruction, computation: str, table: dict[str, _Instruction],
                module: _Module) -> Collective:
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


def collectives_in_text(text: str) -> list[Collective]:
    """Every collective op in an HLO module's text, once each, in program order."""
    module = _parse_module(text)
    found = []
    for computation in _reachable(module):
        instructions = module.computations[computation]
        table = {i.name: i for i in instructions}
        for instruction in instructions:
            if instruction.opcode in _OPCODES:
                found.append(_collective(instruction, computation, table, module))
    return found


# --------------------------------------------------------------------------- compiling


def _compile(fn: Callable[..., Any] | Any, args: tuple[Any, ...]) -> Any:
    """Compile ``fn`` (plain, jitted, or already lowered/compiled) on ``args``.

    ``args`` are arrays or ``jax.ShapeDtypeStruct(shape, dtype, sharding=...)``: the latter
    compile a program for shapes too big to allocate. JAX caches the compilation, so asking
    several questions of the same function and arguments compiles once.
    """
    if isinstance(fn, jax.stages.Compiled):
        return fn
    if isinstance(fn, jax.stages.Lowered):
        return fn.compile()
    if not callable(fn):
        raise TypeError(f"expected a function (plain or jitted), got {type(fn).__name__}")
    _check_arguments(fn, args)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args).compile()


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


def compile(fn: Callable[..., Any], *args: Any) -> jax.stages.Compiled:  # noqa: A001
    """The one compile step of the book: ``fn`` (plain, jitted, lowered or compiled) on
    ``args``, as a ``jax.stages.Compiled`` (ask it ``.as_text()``, ``.memory_analysis()``,
    ``.cost_analysis()``). ``args`` may be ``jax.ShapeDtypeStruct``s."""
    return _compile(fn, args)


def compiled_text(fn: Callable[..., Any], *args: Any) -> str:
    """The optimized HLO text of ``fn`` compiled on ``args`` (what each device runs)."""
    return _compile(fn, args).as_text()


def collectives(fn: Callable[..., Any], *args: Any) -> list[Collective]:
    """The collective ops in the compiled program of ``fn`` on ``args``, in program order."""
    return collectives_in_text(compiled_text(fn, *args))


def _counts(ops: Iterable[Collective]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for op in ops:
        counts[op.kind] += 1
    return counts


def collective_counts(fn: Callable[..., Any], *args: Any) -> dict[str, int]:
    """How many ops of each kind the compiled program holds; all five keys always present."""
    return _counts(collectives(fn, *args))


def communication_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Bytes one device sends in the compiled program, under the ring model (module docs)."""
    return sum(op.bytes_sent for op in collectives(fn, *args))


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryStats:
    """Memory one device needs for a compiled program, from ``compiled.memory_analysis()``.

    ``peak_bytes`` is an upper-bound estimate: arguments + outputs - aliased (donated)
    bytes + temporaries, as if all were live at once. ``xla_peak_bytes`` is XLA's own
    ``peak_memory_in_bytes`` where the backend reports it (0 otherwise); it comes from the
    buffer assignment's live ranges and can be lower than the bound.
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
            ("peak estimate (args + outputs - aliased + temps)", self.peak_bytes),
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
        return _counts(self.ops)

    @property
    def total_bytes(self) -> int:
        return sum(op.bytes_sent for op in self.ops)

    def _op_rows(self) -> list[list[str]]:
        rows = [[op.kind, op.shape_text, str(op.group_size), format_bytes(op.bytes_sent)]
                for op in self.ops]
        n = len(self.ops)
        total = ["total", f"{n} op" if n == 1 else f"{n} ops", "", format_bytes(self.total_bytes)]
        return rows + [total]

    def _summary(self) -> str:
        used = ", ".join(f"{n} {kind}" for kind, n in self.counts.items() if n) or "none"
        return f"collectives: {used}; bytes sent per device: {format_bytes(self.total_bytes)}"

    def __str__(self) -> str:
        from tabulate import tabulate

        parts = [self.title] if self.title else []
        if self.ops:
            parts.append(tabulate(self._op_rows(),
                                  headers=["op", "buffer", "group", "sent per device"],
                                  colalign=("left", "left", "right", "right")))
        parts.append(self._summary())
        parts.append(tabulate([(w, h) for w, _, h in self.memory.as_rows()],
                              headers=["memory per device", ""], colalign=("left", "right")))
        return "\n\n".join(parts)

    def _repr_html_(self) -> str:
        esc = html.escape
        cell = 'style="padding:2px 10px;text-align:{}"'
        out = ['<div class="spmd-hlo-report">']
        if self.title:
            out.append(f"<p><strong>{esc(self.title)}</strong></p>")
        if self.ops:
            out.append("<table><thead><tr>")
            for head, align in (("op", "left"), ("buffer", "left"), ("group", "right"),
                                ("sent per device", "right")):
                out.append(f"<th {cell.format(align)}>{head}</th>")
            out.append("</tr></thead><tbody>")
            rows = self._op_rows()
            for i, row in enumerate(rows):
                total = ' style="font-weight:bold"' if i == len(rows) - 1 else ""
                out.append(f"<tr{total}>" + "".join(
                    f"<td {cell.format(a)}>{esc(v)}</td>"
                    for v, a in zip(row, ("left", "left", "right", "right"), strict=True)
                ) + "</tr>")
            out.append("</tbody></table>")
        out.append(f"<p>{esc(self._summary())}</p>")
        out.append(f"<table><thead><tr><th {cell.format('left')}>memory per device</th>"
                   f"<th {cell.format('right')}></th></tr></thead><tbody>")
        for what, _, human in self.memory.as_rows():
            out.append(f"<tr><td {cell.format('left')}>{esc(what)}</td>"
                       f"<td {cell.format('right')}>{esc(human)}</td></tr>")
        out.append("</tbody></table></div>")
        return "".join(out)


def report(fn: Callable[..., Any], *args: Any, title: str = "") -> Report:
    """Compile ``fn`` on ``args`` once and summarize its collectives, bytes and memory."""
    compiled = _compile(fn, args)
    return Report(tuple(collectives_in_text(compiled.as_text())), _memory(compiled), title)
