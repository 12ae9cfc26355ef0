"""Where a scheduled program starts each collective and where it waits for it (Part XIV,
tpu/overlap).

A compiled program's ``ENTRY`` computation lists its instructions in the order they run
(``is_scheduled=true``). XLA:TPU runs most collectives asynchronously, as a chain of fusions
sharing one ``chain_id`` (:func:`spmd_guide.core.hlo.chain_id`): an ``async-collective-start``
fusion, ``async_collective_fusion`` s that compute while the transfer is in flight (a matmul
fused with the collective it overlaps: the collective matmul of Part III, written by the
compiler), then an ``async-collective-done`` fusion where the program waits. Other backends
spell the same idea ``all-gather-start`` / ``all-gather-done``. :func:`async_collectives`
reads either form; a collective with neither is synchronous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jax

from spmd_guide.core import hlo
from spmd_guide.core.hlo_text import _OPCODES, Instruction, Module, parse_module, program_text

__all__ = ["Overlap", "async_collectives", "overlap_summary"]

_MATMULS = ("convolution", "dot")
_DONES = ("all-gather-done", "all-reduce-done", "collective-permute-done")
_CALLS = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")


@dataclass(frozen=True)
class Overlap:
    """One collective of a scheduled program: where it starts and where the program waits.

    ``start`` and ``done`` are positions in ``ENTRY``'s schedule (equal for a synchronous
    collective); ``matmuls_between`` counts the instructions between them that do a matmul
    (a ``convolution`` or ``dot``, alone or inside a fusion); ``fused_matmuls`` counts those
    that XLA fused with the collective itself (``async_collective_fusion`` s)."""

    kind: str
    buffer: str
    start: int
    done: int
    matmuls_between: int
    fused_matmuls: int

    @property
    def overlapped(self) -> bool:
        return self.matmuls_between > 0

    def row(self) -> dict[str, Any]:
        return {"collective": self.kind, "buffer": self.buffer, "starts at": self.start,
                "waits at": self.done, "matmuls in between": self.matmuls_between,
                "fused with it": self.fused_matmuls}


def _called(instruction: Instruction, module: Module) -> list[str]:
    return [c for c in _CALLS.findall(instruction.attributes) if c in module.computations]


def _has_matmul(name: str, module: Module, seen: set[str] | None = None) -> bool:
    seen = set() if seen is None else seen
    if name in seen:
        return False
    seen.add(name)
    for i in module.computations[name]:
        if i.opcode in _MATMULS or any(_has_matmul(c, module, seen) for c in _called(i, module)):
            return True
    return False


def _chains_in(instruction: Instruction, module: Module
               ) -> list[tuple[str, Instruction, str, str]]:
    """(chain key, collective op, role, kind) for each collective this ENTRY instruction
    holds. XLA:TPU's reduce-scatter fusion (:func:`spmd_guide.core.hlo.is_reduce_scatter_fusion`)
    is one synchronous reduce-scatter."""
    if instruction.opcode in _OPCODES:
        role = "start" if instruction.opcode.endswith("-start") else "sync"
        return [(hlo.chain_id(instruction) or instruction.name, instruction, role,
                 _OPCODES[instruction.opcode])]
    if instruction.opcode in _DONES and instruction.operands:
        return [(instruction.operands[0], instruction, "done", instruction.opcode[:-5])]
    found = []
    for called in _called(instruction, module):
        body = module.computations[called]
        root = body[-1].line if body else ""
        for op in body:
            if op.opcode in _OPCODES:
                kind = _OPCODES[op.opcode]
                if kind == "all-reduce" and hlo.is_reduce_scatter_fusion(called):
                    found.append((op.name, op, "sync", "reduce-scatter"))
                    continue
                role = ("start" if "AsyncCollectiveStart" in root else
                        "done" if "AsyncCollectiveDone" in root else "fused")
                found.append((hlo.chain_id(op) or op.name, op, role, kind))
    return found


def async_collectives(program: str | jax.stages.Compiled) -> list[Overlap]:
    """Every collective of ``ENTRY`` (in schedule order of its start) with where it starts,
    where the program waits for it, and the matmuls in between."""
    module = parse_module(program_text(program))
    entry = module.computations[module.entry]
    table = {i.name: i for i in entry}
    starts: dict[str, tuple[int, Instruction, str]] = {}
    dones: dict[str, int] = {}
    fused: dict[str, int] = {}
    for position, instruction in enumerate(entry):
        for key, op, role, kind in _chains_in(instruction, module):
            if role in ("start", "sync") or key not in starts:
                starts.setdefault(key, (position, op, kind))
            if role in ("done", "sync"):
                dones[key] = position
            if role == "fused" and _has_matmul_instr(instruction, module):
                fused[key] = fused.get(key, 0) + 1
    matmul_at = [_has_matmul_instr(i, module) for i in entry]
    found = []
    for key, (start, op, kind) in starts.items():
        done = dones.get(key, start)
        buffer = ", ".join(str(b) for b in op.result[:1]) if op.opcode in _OPCODES else ""
        if op.opcode.endswith("-start") and op.operands and op.operands[0] in table:
            buffer = ", ".join(str(b) for b in table[op.operands[0]].result[:1])
        found.append(Overlap(kind, buffer, start, done, sum(matmul_at[start:done + 1]),
                             fused.get(key, 0)))
    return sorted(found, key=lambda o: o.start)


def _has_matmul_instr(instruction: Instruction, module: Module) -> bool:
    return instruction.opcode in _MATMULS or any(
        _has_matmul(c, module) for c in _called(instruction, module))


def overlap_summary(program: str | jax.stages.Compiled) -> dict[str, int]:
    """How many collectives the schedule runs asynchronously with matmuls in flight, how
    many of those have a matmul fused with them, and how many run alone."""
    ops = async_collectives(program)
    return {"collectives": len(ops),
            "overlapped with a matmul": sum(o.overlapped for o in ops),
            "with a matmul fused into the transfer": sum(o.fused_matmuls > 0 for o in ops),
            "waited for with no matmul in between": sum(not o.overlapped for o in ops)}
