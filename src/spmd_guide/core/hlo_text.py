"""Reading HLO text: the one parser of compiled programs in this book.

``jax.jit(fn).lower(*args).compile().as_text()`` is the optimized HLO that runs on each
device. This module parses that text properly rather than grepping it, and
:mod:`spmd_guide.core.hlo` asks it what a program holds:

* Each line ``name = shape opcode(operands), attributes`` becomes an :class:`Instruction`;
  brackets are matched (balanced parentheses, braces and brackets, quotes skipped), so
  operands and tuple shapes that contain parentheses are read whole.
* Shapes become :class:`Buffer` s (``f32[4,8]``, tuples flattened).
* Device groups (``replica_groups``, in their three spellings) and GSPMD's tile
  assignments are read by :mod:`spmd_guide.core.device_groups`, re-exported here. Their
  numbers are *positions* in the compiled program's device list (for a program over one
  mesh, ``mesh.devices.flat``), not ``jax.Device.id`` s; :func:`device_ids` maps them.
* Only computations reachable from ``ENTRY`` (through ``calls=``, ``to_apply=``, ``body=``,
  ``condition=``, branches, ...) are visited, each once.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

from spmd_guide.core import checks
from spmd_guide.core.device_groups import (  # re-exported: hlo_text is where readers look
    parse_replica_groups,
    parse_tile_assignment,
    replica_groups_text,
)

__all__ = [
    "KINDS", "Buffer", "Instruction", "Module", "device_ids", "entry_computation",
    "entry_instructions",
    "lines_with", "parse_module", "same_program", "parse_replica_groups", "parse_shape",
    "differing_lines", "parse_tile_assignment", "program_text", "reachable",
    "replica_groups_text",
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


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Buffer:
    """One array in an HLO shape: its element type (``f32``, ``bf16``, ...) and dimensions."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        _dtype_bits(self.dtype)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in self.shape):
            raise checks.InputError(
                f"a buffer's dimensions must be non-negative integers, got {self.shape}.")

    @property
    def nbytes(self) -> int:
        return math.ceil(math.prod(self.shape) * _dtype_bits(self.dtype) / 8)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


_ARRAY_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
#: HLO element types: pred, s8..s64, u8..u64, f16/f32/f64, bf16, c64/c128, the f8/f4 kinds.
_ELEMENT_TYPE = re.compile(r"^(?:[suf](\d+)|bf(16)|c(64|128)|f(\d)e\d+m\d+\w*)$")


def _dtype_bits(dtype: str) -> int:
    """Bits per element of an HLO element type (``pred`` is stored as a byte)."""
    if dtype == "pred":
        return 8
    if dtype in ("token", "opaque"):
        return 0
    match = _ELEMENT_TYPE.match(dtype) if isinstance(dtype, str) else None
    if not match:
        raise checks.InputError(
            f"unknown HLO element type {dtype!r}; HLO spells them f32, bf16, s32, pred, ... "
            "(not NumPy's float32).")
    return int(next(g for g in match.groups() if g))


def parse_shape(text: str) -> tuple[Buffer, ...]:
    """The arrays in an HLO shape, tuples flattened: ``(f32[4]{0}, s32[])`` -> two buffers.

    Layouts (``{1,0}``) are ignored; a dynamic bound ``<=16`` counts as 16. NumPy spellings
    such as ``float32[4]`` are refused: they are not HLO.
    """
    if not isinstance(text, str):
        raise checks.InputTypeError(f"parse_shape needs HLO shape text, got {text!r:.60}.")
    buffers = []
    for dtype, dims in _ARRAY_SHAPE.findall(text):
        sizes = tuple(int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip())
        buffers.append(Buffer(dtype, sizes))
    return tuple(buffers)


# --------------------------------------------------------------------------- HLO text


@dataclass(frozen=True)
class Instruction:
    """One instruction of an HLO computation: ``name = result opcode(operands), attributes``.

    ``operands`` are the names the instruction reads (literal operands such as
    ``constant(1)``'s ``1`` included: look names up in the computation to tell them apart).
    """

    name: str
    result: tuple[Buffer, ...]
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    line: str

    @property
    def shape_text(self) -> str:
        """The result's shape without layouts: ``f32[4,8]`` or ``(f32[4], s32[])``."""
        texts = [str(b) for b in self.result]
        return texts[0] if len(texts) == 1 else "(" + ", ".join(texts) + ")"

    @property
    def is_collective(self) -> bool:
        return self.opcode in _OPCODES


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


def _parse_instruction(line: str) -> Instruction | None:
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
    return Instruction(name, parse_shape(shape_text), op.group(1), operands, attributes,
                        line.strip())


@dataclass(frozen=True)
class Module:
    """A parsed HLO module: its computations by name, the entry's name, partition counts."""

    computations: dict[str, list[Instruction]]
    entry: str
    num_partitions: int
    replica_count: int


def parse_module(text: str) -> Module:
    """The computations of an HLO module's text, its entry and partition counts.

    A page asks several questions of one compiled program (its collectives, its entry, its
    memory rows), so the last few parses are kept: the same text is read once. Treat the
    result as read-only.
    """
    if not isinstance(text, str):
        raise checks.InputTypeError(f"parse_module needs HLO text, got {text!r:.60}.")
    return _parse_module(text)


@functools.lru_cache(maxsize=32)
def _parse_module(text: str) -> Module:
    computations: dict[str, list[Instruction]] = {}
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
    return Module(computations, entry, int(partitions.group(1)) if partitions else 1,
                   int(replicas.group(1)) if replicas else 1)


def reachable(module: Module) -> list[str]:
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


def program_text(program: str | jax.stages.Compiled | jax.stages.Lowered) -> str:
    """HLO text from text itself, a compiled program or a lowered one (which is compiled)."""
    if isinstance(program, str):
        return program
    if isinstance(program, jax.stages.Lowered):
        program = program.compile()
    if isinstance(program, jax.stages.Compiled):
        return program.as_text()
    raise checks.InputTypeError(
        f"expected HLO text or a compiled program, got {type(program).__name__}; for a "
        "function, call compiled_text(fn, *args) first.")


# --------------------------------------------------------------------------- reading the entry


#: ``, metadata={...}`` and friends: a value in braces or quotes that adds nothing to reading
#: the program (one level of nested braces).
_NOISE = re.compile(
    r",\s*(?:metadata|backend_config|frontend_attributes)="
    r"(?:\{(?:[^{}]|\{[^{}]*\})*\}|\"[^\"]*\")"
)


def entry_instructions(text: str | jax.stages.Compiled) -> list[Instruction]:
    """The instructions of the ``ENTRY`` computation, in program order (the same parser as
    :func:`collectives_in_text`). Fused computations appear as one ``fusion`` each."""
    module = parse_module(program_text(text))
    return list(module.computations[module.entry])


def entry_computation(text: str | jax.stages.Compiled) -> str:
    """The ``ENTRY`` computation as text, without metadata and backend configs.

    This is the per-device program's top level, short enough to read; the fused
    computations it calls and the source-location tables are left out.
    """
    lines, inside = [], False
    for line in program_text(text).splitlines():
        if line.startswith("ENTRY"):
            inside = True
        if inside:
            lines.append(_NOISE.sub("", line))
            if line.startswith("}"):
                break
    if not lines:
        raise checks.InputError("no ENTRY computation found in the HLO text.")
    return "\n".join(lines)


def _groups_written_out(line: str) -> str:
    """``line`` with its ``replica_groups=`` value, in whatever spelling, written as the
    explicit list of device groups it names."""
    value = replica_groups_text(line)
    if value is None:
        return line
    groups = parse_replica_groups(value)
    explicit = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    return line.replace(f"replica_groups={value}", f"replica_groups={explicit}", 1)


def same_program(first: str | jax.stages.Compiled, second: str | jax.stages.Compiled) -> bool:
    """Whether two compiled programs have the same entry computation: the same instructions
    on the same device groups, up to the numbering XLA gives names (``%all-gather.1`` vs
    ``%all-gather.3``) and the spelling of replica groups (``mesh['x'=4,'y'=2] {'x'}``,
    ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}`` and ``{{0,2,4,6},{1,3,5,7}}`` name the
    same groups)."""
    number = re.compile(r"(?<=[\w\-])\.\d+\b")

    def canonical(program: str | jax.stages.Compiled) -> list[str]:
        return [number.sub("", _groups_written_out(line))
                for line in entry_computation(program).splitlines()]

    return canonical(first) == canonical(second)


def differing_lines(first: str | jax.stages.Compiled, second: str | jax.stages.Compiled
                    ) -> list[tuple[str, str]]:
    """The pairs of entry-computation lines (numbering of names aside) that two programs
    spell differently, in order; ``[]`` when the texts agree line for line."""
    number = re.compile(r"(?<=[\w\-])\.\d+\b")
    a, b = (entry_computation(p).splitlines() for p in (first, second))
    if len(a) != len(b):
        return list(zip(a, b, strict=False)) or [("\n".join(a), "\n".join(b))]
    return [(x.strip(), y.strip()) for x, y in zip(a, b, strict=True)
            if number.sub("", x) != number.sub("", y)]


def lines_with(text: str | jax.stages.Compiled, *needles: str) -> list[str]:
    """The stripped lines of the program text that contain any of ``needles``."""
    if not needles or not all(isinstance(n, str) and n for n in needles):
        raise checks.InputError("lines_with needs at least one non-empty string to look for.")
    return [line.strip() for line in program_text(text).splitlines()
            if any(n in line for n in needles)]


def device_ids(positions: np.ndarray | Sequence[Sequence[int]],
               devices: jax.sharding.Mesh | Sequence[jax.Device]
               ) -> np.ndarray | tuple[tuple[int, ...], ...]:
    """The ``jax.Device.id`` s that HLO device numbers stand for.

    The numbers in a tile assignment (:func:`parse_tile_assignment`), in replica groups
    (:func:`parse_replica_groups`, ``hlo.Collective.groups``) and in source-target pairs are
    positions in the compiled program's device list, not device ids. For a program over one
    mesh that list is ``mesh.devices.flat``; it is in id order only when the mesh is (as on
    CPU mock devices; not, in general, for ``jax.make_mesh`` on a TPU). ``devices`` is that
    mesh, or the device list itself (a sequence of ``jax.Device``). Returns ``positions``
    with each number replaced by the id of the device at that position: an integer array of
    the same shape for an array (a tile grid), tuples of tuples for groups.

    >>> import jax, numpy as np
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:2][::-1]), ("x",))
    >>> device_ids(((0, 1),), mesh) == ((jax.devices()[1].id, jax.devices()[0].id),)
    True
    """
    if isinstance(devices, jax.sharding.Mesh):
        listed = list(devices.devices.flat)
    elif isinstance(devices, (list, tuple)) and all(isinstance(d, jax.Device) for d in devices):
        listed = list(devices)
    else:
        raise checks.InputTypeError(
            f"device_ids needs a Mesh or the program's device list (a sequence of "
            f"jax.Device), got {checks.value_text(devices)}.")
    ids = np.array([d.id for d in listed])
    table = positions if isinstance(positions, np.ndarray) else None
    if table is None:
        if not isinstance(positions, (list, tuple)) or not all(
                isinstance(g, (list, tuple)) for g in positions):
            raise checks.InputTypeError(
                "device_ids needs a tile grid (an integer array) or groups (a sequence of "
                f"sequences of positions), got {checks.value_text(positions)}.")
        flat = [v for g in positions for v in g]
    else:
        if not np.issubdtype(table.dtype, np.integer):
            raise checks.InputTypeError(
                f"device_ids needs integer positions, got an array of {table.dtype}.")
        flat = table.reshape(-1).tolist()
    bad = [v for v in flat if not isinstance(v, (int, np.integer)) or not 0 <= v < len(ids)]
    if bad:
        raise checks.InputError(
            f"device_ids: position {bad[0]!r} is not in the program's device list "
            f"({len(ids)} devices, positions 0 to {len(ids) - 1}).")
    if table is not None:
        return ids[table]
    return tuple(tuple(int(ids[v]) for v in g) for g in positions)
