"""The loops of a compiled program and the collectives each one runs on every trip.

:mod:`spmd_guide.core.hlo` counts a collective once per appearance in the program text. A
collective inside a ``while`` loop (from ``lax.while_loop``, ``fori_loop``, ``scan``) runs once
per *trip* instead, so a count of 1 can be a thousand messages at run time. This module finds
each ``while`` instruction and reads, separately, the collectives of its **condition** (the
computation that decides whether to go on: a predicate that reads sharded data is reduced
here, so that every device takes the same decision) and of its **body**.

A trip runs the condition once and the body once (the condition runs one extra time, to
stop), so :attr:`Loop.per_trip` adds the two. Collectives of a loop nested in the body are
not charged to the outer loop's trip: they are listed with their own :class:`Loop`.
``trip_count`` is the count XLA proved and wrote on the instruction (``known_trip_count``),
``None`` when the loop stops on data (then only running it tells how many trips it made).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from spmd_guide.core.hlo import Collective, _collective, _compile, count_kinds
from spmd_guide.core.hlo_text import Module, parse_module, program_text

__all__ = ["Loop", "loops", "loops_in_text"]

_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?')


@dataclass(frozen=True)
class Loop:
    """One ``while`` instruction: where it is, its trip count if known, its collectives.

    ``condition`` and ``body`` hold the collectives that run once per trip in the loop's
    condition and body computations (and what they call, nested loops excepted).
    """

    name: str
    computation: str
    condition_name: str
    body_name: str
    trip_count: int | None
    condition: tuple[Collective, ...]
    body: tuple[Collective, ...]

    @property
    def per_trip(self) -> dict[str, int]:
        """Collectives of each kind that one trip runs (condition and body); all five keys."""
        return count_kinds(self.condition + self.body)

    def total(self, trips: int | None = None) -> dict[str, int]:
        """Collectives of each kind over ``trips`` trips (default: XLA's known trip count)."""
        n = self.trip_count if trips is None else trips
        if n is None:
            raise ValueError(
                f"loop {self.name} stops on data, so XLA knows no trip count: pass trips=, "
                "the number of trips a run made.")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(f"trips must be a count (an int >= 0), got {n!r}.")
        return {kind: count * n for kind, count in self.per_trip.items()}


def _attribute(instruction_attributes: str, key: str) -> str:
    match = re.search(rf"\b{key}=%?([\w.\-]+)", instruction_attributes)
    if match is None:
        raise ValueError(f"a while instruction without {key}=: {instruction_attributes[:200]}")
    return match.group(1)


def _collectives_under(module: Module, root: str) -> tuple[Collective, ...]:
    """Collectives in ``root`` and the computations it calls, not entering nested loops."""
    found: list[Collective] = []
    todo, seen = [root], {root}
    while todo:
        name = todo.pop(0)
        instructions = module.computations[name]
        table = {i.name: i for i in instructions}
        for instruction in instructions:
            if instruction.is_collective:
                found.append(_collective(instruction, name, table, module))
            if instruction.opcode == "while":
                continue  # its condition and body run per *its* trips: listed separately
            for called in re.findall(r"%?([\w.\-]+)", instruction.attributes):
                if called in module.computations and called not in seen:
                    seen.add(called)
                    todo.append(called)
    return tuple(found)


def loops_in_text(text: str | jax.stages.Compiled) -> list[Loop]:
    """Every ``while`` loop of a compiled program (or its HLO text), in program order."""
    module = parse_module(program_text(text))
    found = []
    for computation, instructions in module.computations.items():
        for instruction in instructions:
            if instruction.opcode != "while":
                continue
            condition = _attribute(instruction.attributes, "condition")
            body = _attribute(instruction.attributes, "body")
            trips = _TRIPS.search(instruction.line)
            found.append(Loop(
                name=instruction.name, computation=computation, condition_name=condition,
                body_name=body, trip_count=int(trips.group(1)) if trips else None,
                condition=_collectives_under(module, condition),
                body=_collectives_under(module, body)))
    return found


def loops(fn: Callable[..., Any], *args: Any) -> list[Loop]:
    """The ``while`` loops of ``fn`` compiled on ``args`` (plain, jitted or compiled)."""
    return loops_in_text(_compile(fn, args).as_text())
