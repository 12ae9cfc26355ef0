"""What a compiled collective matmul costs, and the ring it runs on (Part III).

:mod:`spmd_guide.shard_map.collective_matmul` writes the six matmuls; this module compiles them once
and reads the program: the bytes one device sends against the ring's lower bound, those
bytes split by the direction they travel round the ring, and the schedule of which block
each device holds at each step, which :func:`draw_ring` draws.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from spmd_guide.core import checks
from spmd_guide.core.display import listed
from spmd_guide.shard_map.collective_matmul import FAMILY_SPECS, as_operand, check_shapes, variant
from spmd_guide.shard_map.collectives import axis_size


@dataclass(frozen=True)
class CompiledMatmul:
    """One variant compiled for one mesh, shape and dtype, with its inputs
    already laid out. Calling it runs the compiled program on them: nothing
    is placed or compiled on the way, and the collectives read from
    ``program`` are exactly those that run."""

    name: str
    program: Any  # jax.stages.Compiled
    lhs: jax.Array
    rhs: jax.Array

    def __call__(self) -> jax.Array:
        return self.program(self.lhs, self.rhs)


def is_bidi(name: str) -> bool:
    """Whether variant ``name`` sends half of each block each way round (its blocks are
    halves: twice as many as the ring has devices)."""
    variant(name)  # an unknown name is refused, not called one-way
    return "_bidi" in name


def compile_variant(name: str, lhs: Any, rhs: Any, mesh: Mesh,
                    axis_name: str) -> CompiledMatmul:
    """Lay out ``lhs`` and ``rhs`` as variant ``name`` needs; compile it."""
    matmul = variant(name)
    ring = axis_size(mesh, axis_name)
    bidi = 2 if is_bidi(name) else 1
    check_shapes(lhs, rhs, rows_by=ring * (bidi if name.startswith("reduce") else 1),
                 contraction_by=ring * (bidi if name.startswith("allgather") else 1))
    lhs_spec, rhs_spec = FAMILY_SPECS[name](axis_name)
    lhs = jax.device_put(as_operand(lhs), NamedSharding(mesh, lhs_spec))
    rhs = jax.device_put(as_operand(rhs), NamedSharding(mesh, rhs_spec))
    jitted = jax.jit(functools.partial(matmul, mesh=mesh, axis_name=axis_name))
    return CompiledMatmul(name, jitted.lower(lhs, rhs).compile(), lhs, rhs)


#: Bytes per element of the dtypes a matmul runs in (float8 to float64).
ITEMSIZES = (1, 2, 4, 8)


def ring_bound_bytes(name: str, m: int, k: int, n: int, itemsize: int,
                     ring: int) -> int:
    """Bytes one device must send, under the ring model, for variant
    ``name`` on ``(m, k) @ (k, n)`` with elements of ``itemsize`` bytes.

    All-gather family: each device must receive the ``ring - 1`` rhs blocks
    it lacks, and in a ring it forwards as many as it receives:
    ``(ring - 1) / ring`` of rhs, ``k * n`` elements. Reduce-scatter family:
    the same fraction of the output, ``m * n`` elements. The split the variant makes must
    be even (as :func:`compile_variant` requires): ``k`` over the ring for the all-gather
    family, ``m`` for the reduce-scatter family, twice as many blocks for the ``bidi`` ones.
    """
    variant(name)
    m, k, n = (checks.count(what, v) for what, v in (("m", m), ("k", k), ("n", n)))
    itemsize = checks.one_of("itemsize (bytes per element)",
                             checks.count("itemsize", itemsize), ITEMSIZES)
    ring = checks.count("ring", ring, maximum=checks.MAX_DEVICES)
    blocks = ring * (2 if is_bidi(name) else 1)
    if name.startswith("allgather"):
        checks.divisible("k (rows of rhs)", k, blocks, why=f"into the blocks of {name} on {ring}")
    else:
        checks.divisible("m (rows of lhs)", m, blocks, why=f"into the blocks of {name} on {ring}")
    elements = k * n if name.startswith("allgather") else m * n
    return (ring - 1) * elements * itemsize // ring


def collective_rows(ops: Sequence[Any]) -> list[dict[str, Any]]:
    """Collectives of a program (``spmd_guide.core.hlo.collectives``) grouped by
    kind and buffer: how many, bytes one device sends for each, in all."""
    from spmd_guide.core.hlo import format_bytes

    _check_ops(ops)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for op in ops:
        row = rows.setdefault((op.kind, op.shape_text), {
            "collective": op.kind, "buffer": op.shape_text,
            "group": op.group_size, "count": 0,
            "sent per op": format_bytes(op.bytes_sent), "bytes sent": 0,
        })
        row["count"] += 1
        row["bytes sent"] += op.bytes_sent
    return list(rows.values())


def bytes_by_direction(ops: Sequence[Any], ring: int) -> dict[str, int]:
    """Bytes one device sends to its next neighbour (``forward``) and to
    its previous one (``backward``) in the collective-permutes of ``ops``;
    other collectives count as ``other``. (On a ring of 2 both neighbours
    are the same device; everything then counts as ``forward``.)

    A send is a step round the ring when its positions (in the program's
    device list, which the HLO pairs name) differ by one (or wrap from the
    last position to the first). Sends that go round a ring of
    another size than ``ring``, or ops none of whose collectives run over ``ring`` devices,
    raise ``InputError``: ``ring`` is wrong.
    """
    _check_ops(ops)
    ring = checks.count("ring", ring, maximum=checks.MAX_DEVICES)
    sizes = sorted({op.group_size for op in ops} - {1})
    others = sizes if ring not in sizes else []
    if others:
        raise checks.InputError(
            f"ring={ring}, but the collectives of ops run over groups of {others} devices: "
            f"pass ring={others[0]}, the size of the mesh axis the program's ring runs over.")
    totals = {"forward": 0, "backward": 0, "other": 0}
    for op in ops:
        steps = ({target - source for source, target in op.groups}
                 if op.kind == "collective-permute" else set())
        if steps and steps <= {1, 1 - ring}:
            totals["forward"] += op.bytes_sent
        elif steps and steps <= {-1, ring - 1}:
            totals["backward"] += op.bytes_sent
        else:
            other_ring = _ring_of(steps)
            if other_ring and other_ring != ring:
                raise checks.InputError(
                    f"a collective-permute sends round a ring of {other_ring} devices "
                    f"(steps {sorted(steps)}), but ring={ring}: pass ring={other_ring}, the "
                    "size of the mesh axis the program's ring runs over.")
            totals["other"] += op.bytes_sent
    return totals


def memory_row(compiled: CompiledMatmul) -> dict[str, Any]:
    """What one device holds for a compiled variant: the largest single array the program
    makes (from its HLO: the gathered ``rhs`` of ``allgather``, one block for a ring) and
    the compiler's memory analysis (temporaries, and the peak bound of
    :class:`spmd_guide.core.hlo.MemoryStats`).

    The largest array is what the *algorithm* needs at once; the temporaries add up every
    buffer the compiler's schedule keeps alive together, which may be more.
    """
    from spmd_guide.core.hlo import format_bytes, memory_per_device
    from spmd_guide.core.hlo_text import entry_instructions

    if not isinstance(compiled, CompiledMatmul):
        raise checks.InputTypeError(
            f"compiled must come from compile_variant(name, lhs, rhs, mesh, axis_name), "
            f"got {compiled!r:.60}.")
    made = [(b.nbytes, str(b)) for ins in entry_instructions(compiled.program)
            if ins.opcode != "parameter" for b in ins.result]
    largest_bytes, largest = max(made)
    memory = memory_per_device(compiled.program, compiled.lhs, compiled.rhs)
    return {"variant": compiled.name, "largest array": largest,
            "largest bytes": largest_bytes, "temporaries": memory.temp_bytes,
            "peak bound": memory.peak_bytes,
            "temporaries (readable)": format_bytes(memory.temp_bytes)}


def _matmul_steps(compiled: CompiledMatmul) -> list[tuple[Any, bool]]:
    """The entry computation's instructions in the order they run (compiled modules are
    scheduled, ``is_scheduled=true``), each with whether it is a matmul (a ``dot``, or a
    fusion that calls one)."""
    from spmd_guide.core.hlo_text import parse_module, program_text

    if not isinstance(compiled, CompiledMatmul):
        raise checks.InputTypeError(
            f"compiled must come from compile_variant(name, lhs, rhs, mesh, axis_name), "
            f"got {compiled!r:.60}.")
    module = parse_module(program_text(compiled.program))

    @functools.cache
    def has_dot(computation: str) -> bool:
        return any(ins.opcode == "dot" or any(
            has_dot(c) for c in re.findall(r"calls=%?([\w.\-]+)", ins.attributes)
            if c in module.computations) for ins in module.computations[computation])

    def is_matmul(ins: Any) -> bool:
        called = re.findall(r"calls=%?([\w.\-]+)", ins.attributes)
        return ins.opcode == "dot" or any(has_dot(c) for c in called if c in module.computations)

    return [(ins, is_matmul(ins)) for ins in module.computations[module.entry]]


def dot_shapes(compiled: CompiledMatmul) -> list[str]:
    """The matmuls of a compiled variant, one ``"(a, b) @ (b, c)"`` per ``dot`` instruction
    of its program (fused or not), read from the program's HLO: how many matmuls it runs
    and how big each is."""
    from spmd_guide.core.hlo_text import parse_module, program_text

    if not isinstance(compiled, CompiledMatmul):
        raise checks.InputTypeError(
            f"compiled must come from compile_variant(name, lhs, rhs, mesh, axis_name), "
            f"got {compiled!r:.60}.")
    module = parse_module(program_text(compiled.program))
    found = []
    for instructions in module.computations.values():
        table = {ins.name: ins for ins in instructions}
        for ins in instructions:
            if ins.opcode == "dot":
                a, b = (table[name].result[0].shape for name in ins.operands[:2])
                found.append(f"{tuple(a)} @ {tuple(b)}")
    return found


def matmuls_before_first_transfer(compiled: CompiledMatmul) -> tuple[int, int]:
    """``(before, total)``: how many of the program's matmuls its schedule runs before the
    first transfer, and how many it has. Compiled modules are scheduled
    (``is_scheduled=true``): the entry computation's text lists instructions in the order
    they run. A ring built to overlap runs one matmul per transfer; a compiler free to
    reorder may run every matmul that does not wait for a transfer first."""
    before, total, transferred = 0, 0, False
    for ins, is_matmul in _matmul_steps(compiled):
        if is_matmul:
            total += 1
            before += not transferred
        transferred = transferred or ins.is_collective
    return before, total


def summed_at_end(compiled: CompiledMatmul) -> tuple[int, int]:
    """``(count, bytes)``: the matmul results that the program's last instruction reads,
    and their bytes in all. XLA may turn a running sum ``out += a @ b`` into one addition of
    every product at the end; then each product stays alive until that addition, however
    early it was computed. ``(0, 0)`` when the last instruction reads no matmul result."""
    steps = _matmul_steps(compiled)
    results = {ins.name: ins for ins, is_matmul in steps if is_matmul}
    read = [results[name] for name in dict.fromkeys(steps[-1][0].operands) if name in results]
    return len(read), sum(b.nbytes for ins in read for b in ins.result)


_COUNT_WORDS = {2: "both", 3: "all three", 4: "all four"}


def amounts_in_words(named: Mapping[str, int], *, unit: str = "bytes") -> str:
    """Several named amounts in a clause, saying once what they share.

    ``{"a": 5, "b": 5, "c": 5}`` -> ``"all three need 5 bytes"``; different amounts are
    listed: ``"`a` needs 5 bytes, `b` 6 and `c` 7"``. Names are written as code.
    """
    if isinstance(named, (str, bytes)) or not isinstance(named, Mapping) or not named:
        raise checks.InputTypeError(
            f"named must be a non-empty dict of name: amount, got {named!r:.60}.")
    if not all(isinstance(name, str) and name for name in named):
        raise checks.InputTypeError(
            f"the names in named must be non-empty strings (they are written as code), got "
            f"{list(named)!r:.60}.")
    if not isinstance(unit, str) or not unit:
        raise checks.InputTypeError(f"unit must be a word such as 'bytes', got {unit!r:.60}.")
    amounts = {name: checks.count(f"named[{name!r}]", value, minimum=0)
               for name, value in named.items()}
    values = list(amounts.values())
    if len(values) > 1 and len(set(values)) == 1:
        who = _COUNT_WORDS.get(len(values), f"all {len(values)}")
        return f"{who} need {values[0]:,} {unit}"
    (first, amount), *others = amounts.items()
    parts = [f"`{first}` needs {amount:,} {unit}"] + [f"`{name}` {value:,}"
                                                     for name, value in others]
    return listed(parts)


def _ring_of(steps: set[int]) -> int | None:
    """The size of the ring whose one-step sends differ by ``steps``, or None."""
    for sign in (1, -1):
        wrap = [s for s in steps if s != sign]
        if len(wrap) == 1 and sign * wrap[0] < 0 and sign in steps:
            return 1 + abs(wrap[0])
    return None


def _check_ops(ops: Any) -> None:
    from spmd_guide.core.hlo import Collective

    if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence) or not all(
            isinstance(op, Collective) for op in ops):
        raise checks.InputTypeError(
            f"ops must be a list of collectives from spmd_guide.core.hlo.collectives(fn, *args), "
            f"got {ops!r:.60}.")


# ---------------------------------------------------------------------------
# Ring diagrams: which block each device holds, step by step.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RingStep:
    """One step of a ring schedule.

    ``blocks[d]`` lists the blocks device d multiplies (all-gather family:
    rhs blocks) or adds its share to (reduce-scatter family: output row
    blocks) at this step; the bidirectional rings have two entries, for the
    two halves. ``sends`` are the (source, destination) pairs of the
    transfers that follow the step, ``label`` names them.
    """

    title: str
    blocks: tuple[tuple[int, ...], ...]
    sends: tuple[tuple[int, int], ...] = ()
    label: str = ""


def _ring_sends(ring: int, direction: int) -> tuple[tuple[int, int], ...]:
    return tuple((d, (d + direction) % ring) for d in range(ring))


def ring_schedule(name: str, ring: int) -> list[RingStep]:
    """The steps of variant ``name`` on ``ring`` devices, with the block
    indices of its per-device code (the one-collective variants: before and
    after their collective)."""
    variant(name)
    ring = checks.count("ring", ring, maximum=64)  # a diagram, one row per device
    devices = range(ring)
    every_block = tuple(range(ring))
    if name == "allgather":
        return [RingStep("start", tuple((d,) for d in devices),
                         label="all-gather"),
                RingStep("after all_gather",
                         tuple(every_block for _ in devices))]
    if name == "reduce_scatter":
        return [RingStep("after local matmul",
                         tuple(every_block for _ in devices),
                         label="reduce-scatter"),
                RingStep("after psum_scatter", tuple((d,) for d in devices))]
    forward, backward = _ring_sends(ring, +1), _ring_sends(ring, -1)
    steps = []
    for s in range(ring):
        if name == "allgather_overlapped":
            blocks = tuple(((d - s) % ring,) for d in devices)
            sends = forward
        elif name.startswith("allgather_bidi"):
            blocks = tuple(((d - s) % ring, (d + s) % ring) for d in devices)
            sends = forward + backward
        elif name == "reduce_scatter_overlapped":
            blocks = tuple(((d + s + 1) % ring,) for d in devices)
            sends = backward
        else:  # reduce_scatter_bidi: top halves backward, bottom forward
            blocks = tuple(((d + s + 1) % ring, (d - s - 1) % ring)
                           for d in devices)
            sends = backward + forward
        last = s == ring - 1
        steps.append(RingStep(f"step {s}", blocks, () if last else sends,
                              "" if last else "ppermute"))
    return steps


def draw_ring(name: str, ring: int, **options: Any) -> Any:
    """Draw ``ring_schedule(name, ring)`` with
    :func:`spmd_guide.core.drawing.draw_panels`; return the Figure.

    One panel per step, one row per device; a cell is a block number,
    coloured as the device the block starts on (all-gather family) or ends
    on (reduce-scatter family). Arrows are the sends between steps.
    """
    import inspect

    from spmd_guide.core.drawing import Panel, draw_panels

    allowed = set(inspect.signature(draw_panels).parameters) - {"panels", "arrows", "gap_labels"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise checks.InputTypeError(
            f"draw_ring has no option {', '.join(map(repr, unknown))}; its options are "
            f"{', '.join(sorted(allowed))} (the arrows and gap labels come from the schedule).")
    steps = ring_schedule(name, ring)
    gather = name.startswith("allgather")
    if name == "reduce_scatter":
        what = "partial sums of all row blocks, then one summed block each"
    elif gather:
        what = "the rhs block each device multiplies"
    else:
        what = "the output row block each device adds to"
    if is_bidi(name):
        what += (" (forward half, backward half)" if gather
                 else " (top half, bottom half)")
    panels = [Panel(step.title, [list(b) for b in step.blocks],
                    [list(b) for b in step.blocks]) for step in steps]
    options.setdefault("title", f"{name}, {ring} devices: {what}")
    options.setdefault("fmt", "R{:g}" if gather else "O{:g}")
    options.setdefault("alt", f"{name} on a ring of {ring} devices, step by step: {what}; "
                       "arrows are the blocks each device sends to the next.")
    return draw_panels(
        panels, arrows=[list(step.sends) or None for step in steps[:-1]],
        gap_labels=[step.label for step in steps[:-1]], **options)
