"""Reading HLO text: the one parser of compiled programs in this book.

``jax.jit(fn).lower(*args).compile().as_text()`` is the optimized HLO that runs on each
device. This module parses that text properly rather than grepping it, and
:mod:`spmd_guide.core.hlo` asks it what a program holds:

* Each line ``name = shape opcode(operands), attributes`` becomes an :class:`Instruction`;
  brackets are matched (balanced parentheses, braces and brackets, quotes skipped), so
  operands and tuple shapes that contain parentheses are read whole.
* Shapes become :class:`Buffer` s (``f32[4,8]``, tuples flattened).
* ``replica_groups`` are read in all three spellings: explicit lists
  ``{{0,1,2,3},{4,5,6,7}}``, iota ``[2,4]<=[8]`` (or ``[2,4]<=[4,2]T(1,0)``), and mesh axes
  ``mesh['a'=4,'b'=2] {'a'}`` (sub-axes ``{'a':(2)2}``, a device order ``device_ids=(...)``).
  In JAX 0.10 only the partitioner's own collectives used the mesh spelling and
  ``shard_map``'s printed explicit lists; in JAX 0.12 both print mesh axes wherever the
  groups follow them (explicit lists remain for groups that do not, such as
  ``axis_index_groups``).
* GSPMD's tile notation for a sharding, ``{devices=[2,4]<=[4,2]T(1,0)}``, is read by
  :func:`parse_tile_assignment`: which device holds which tile.
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

__all__ = [
    "KINDS", "Buffer", "Instruction", "Module", "entry_computation", "entry_instructions",
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


def replica_groups_text(attributes: str) -> str | None:
    """The value of ``replica_groups=`` in an instruction's attributes, whatever its
    spelling (a mesh value runs through its ``{axes}``), or None when there is none."""
    if not isinstance(attributes, str):
        raise checks.InputTypeError(
            f"replica_groups_text needs an instruction's attribute text, got {attributes!r:.60}.")
    match = re.search(r"replica_groups=", attributes)
    if match is None:
        return None
    if attributes.startswith("mesh[", match.end()):  # through `, device_ids=(...) {axes}`
        return attributes[match.end():attributes.index("}", match.end()) + 1]
    return _attribute_value(attributes, match.end())


_TILES = re.compile(
    r"^\{?\s*devices=\[(?P<dims>[\d,]+)\](?P<ids>[^ }]*)(?P<rest>[^}]*)\}?$")


def parse_tile_assignment(text: str) -> np.ndarray:
    """Which device holds which tile, from GSPMD's sharding notation.

    ``{devices=[2,4]<=[4,2]T(1,0)}`` cuts the array into 2 x 4 tiles. The part after
    ``<=`` is not a list of devices: it says how to write the device ids 0..n-1 (an *iota*):
    reshape ``arange(8)`` to ``[4,2]`` and transpose it by ``(1,0)``; that array, read in
    order, fills the ``[2,4]`` grid of tiles. Older programs list the ids instead
    (``devices=[2,4]0,2,4,6,1,3,5,7``). With ``last_tile_dim_replicate`` the last entry of
    the dimensions counts copies of each tile. Returns an integer array of the tile grid's
    shape (copies last).

    >>> parse_tile_assignment("{devices=[2,4]<=[4,2]T(1,0)}").tolist()
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    if not isinstance(text, str):
        raise checks.InputTypeError(
            f"parse_tile_assignment needs HLO sharding text, got {text!r:.60}.")
    match = _TILES.match(text.strip())
    if not match:
        raise ValueError(
            f"cannot read the tile assignment {text!r}: expected GSPMD's notation such as "
            "{devices=[2,4]<=[4,2]T(1,0)} ({replicated} and {maximal ...} have no tiles).")
    dims = _ints(match["dims"])
    ids = match["ids"].strip()
    if ids.startswith("<="):
        devices = _device_list(ids[2:], math.prod(dims))
    else:
        devices = np.array(_ints(ids))
        if devices.size != math.prod(dims):
            raise ValueError(
                f"the tile assignment {text!r} lists {devices.size} devices for "
                f"{math.prod(dims)} tiles.")
    return devices.reshape(dims)


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
