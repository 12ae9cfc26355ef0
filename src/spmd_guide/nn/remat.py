"""What the compiler does with FSDP's rematerialization: are the backward pass's re-gathers
kept, and what do they cost and save?

``jax.checkpoint`` (with :data:`spmd_guide.nn.strategies.FSDP_REMAT_POLICY`) makes JAX hand
the compiler a backward pass that gathers each weight again, fenced by optimization barriers
so that the compiler does not merge the copies with the forward pass's gathers. Whether the
fences hold is the compiler's business, and it changed between releases: XLA:CPU of jaxlib
0.10 lifted them before its last common-subexpression pass, which merged the re-gathers away;
jaxlib 0.12 lifts them after scheduling, and keeps the re-gathers.

* :func:`compare` compiles the FSDP step with remat and without and reads, from each program,
  the all-gathers JAX handed to XLA, those the compiled program kept, which of those are
  re-gathers (:func:`is_regather`), the temporaries and the bytes sent.
* :func:`pass_trace` follows one program through XLA's passes (XLA's own dump of the HLO after
  each pass) and lists the passes that change the number of barriers or all-gathers: where
  the fences are lifted, and whether a later pass merges the gathers.
"""

from __future__ import annotations

import pathlib
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from spmd_guide.core import checks, hlo
from spmd_guide.nn.mlp import Batch, Params
from spmd_guide.nn.strategies import FSDP


def is_regather(op: hlo.Collective) -> bool:
    """Whether ``op`` is an all-gather that remat's recomputation issued: JAX names the
    backward pass ``transpose(...)`` and the recomputed region ``rematted_computation`` in
    the op's ``op_name`` metadata, which the compiled program keeps."""
    if not isinstance(op, hlo.Collective):
        raise checks.InputTypeError(
            f"op must be a Collective from spmd_guide.core.hlo.collectives, got {op!r}.")
    return (op.kind == "all-gather" and "transpose(" in op.line
            and "rematted_computation" in op.line)


def op_name(op: hlo.Collective) -> str:
    """The ``op_name`` metadata of ``op`` (``jit(step)/transpose(jvp())/.../all_gather``):
    where in the traced program JAX emitted it; empty if the compiled program dropped it."""
    if not isinstance(op, hlo.Collective):
        raise checks.InputTypeError(
            f"op must be a Collective from spmd_guide.core.hlo.collectives, got {op!r}.")
    match = _OP_NAME.search(op.line)
    return match[1] if match else ""


_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclass(frozen=True)
class RematStep:
    """One compiled FSDP step, with or without remat: what JAX handed XLA, what XLA kept."""

    remat: bool
    handed: int
    report: hlo.Report

    @property
    def gathers(self) -> int:
        """All-gathers in the compiled program."""
        return self.report.counts["all-gather"]

    @property
    def regathers(self) -> list[hlo.Collective]:
        """The compiled all-gathers that re-gather a weight for the backward pass."""
        return [op for op in self.report.ops if is_regather(op)]

    @property
    def temp_bytes(self) -> int:
        return self.report.memory.temp_bytes

    @property
    def sent_bytes(self) -> int:
        return self.report.total_bytes

    def row(self) -> dict[str, Any]:
        return {
            "FSDP step": "with remat" if self.remat else "without remat",
            "all-gathers handed to XLA": self.handed,
            "compiled": self.gathers,
            "of them re-gathers": len(self.regathers),
            "temporaries": hlo.format_bytes(self.temp_bytes),
            "bytes sent": hlo.format_bytes(self.sent_bytes),
        }


def compare(params: Params, batch: Batch, *, devices: Sequence[jax.Device] | None = None,
            learning_rate: float = 0.01) -> tuple[RematStep, RematStep]:
    """The FSDP SGD step on ``devices`` (default: all) compiled with remat, then without.

    ``handed`` counts the all-gathers of the lowered program (StableHLO, before XLA runs);
    the rest is read from the compiled program (:func:`spmd_guide.core.hlo.report`; compiled
    with :data:`spmd_guide.core.hlo.FAST_COMPILE`, which skips only LLVM's optimization).
    """
    steps = []
    for remat in (True, False):
        strategy = FSDP(remat=remat)
        mesh = strategy.mesh(devices)
        placed, placed_batch = strategy.shard(params, batch, mesh)
        step = strategy.sgd_step(mesh, placed, learning_rate=learning_rate)
        lowered = step.lower(placed, placed_batch)
        handed = lowered.as_text().count("stablehlo.all_gather")
        compiled = hlo.compile(lowered, compiler_options=hlo.FAST_COMPILE)  # to be read
        steps.append(RematStep(remat, handed, hlo.report(compiled)))
    return steps[0], steps[1]


_BARRIER = re.compile(r"\bopt-barrier\(")
_GATHER = re.compile(r"\ball-gather(?:-start)?\(")
#: XLA names each dump ``module_NNNN.<name>.NNNN.<pipeline>.after_<pass>.before_<next>.txt``.
_DUMP = re.compile(r"^module_\d+\.(?P<module>.+?)\.(?P<index>\d{4})\.(?P<pipeline>[^.]+)"
                   r"\.after_(?P<pass>[^.]+)\.before_[^.]+\.txt$")


@dataclass(frozen=True)
class PassStep:
    """The HLO after one of XLA's passes: its barriers and all-gathers."""

    index: int
    pipeline: str
    name: str
    barriers: int
    gathers: int

    def row(self) -> dict[str, Any]:
        return {"after pass": self.name, "in pipeline": self.pipeline,
                "optimization barriers": self.barriers, "all-gathers": self.gathers}


def pass_trace(fn: Callable[..., Any], *args: Any) -> list[PassStep]:
    """Compile ``fn`` on ``args`` with XLA dumping the HLO after every pass, and return the
    first pass and each pass that changes the number of optimization barriers or all-gathers,
    in pipeline order.

    The dump goes to a temporary folder that is removed afterwards. Pass and pipeline names
    are XLA's own (they differ between releases; that is the point).
    """
    with tempfile.TemporaryDirectory() as folder:
        options = {"xla_dump_to": folder, "xla_dump_hlo_pass_re": ".*", **hlo.FAST_COMPILE}
        lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)
        hlo.compile(lowered, compiler_options=options)
        dumps = [(m, path) for path in pathlib.Path(folder).iterdir()
                 if (m := _DUMP.match(path.name))]
        if not dumps:
            raise RuntimeError(f"XLA wrote no per-pass dumps to {folder}; this backend or "
                               "jaxlib may not support xla_dump_hlo_pass_re.")
        # The program of interest is the module with the most passes dumped.
        modules = [m["module"] for m, _ in dumps]
        main = max(set(modules), key=modules.count)
        trace, last = [], None
        for match, path in sorted(dumps, key=lambda d: int(d[0]["index"])):
            if match["module"] != main:
                continue
            text = path.read_text()
            counts = (len(_BARRIER.findall(text)), len(_GATHER.findall(text)))
            if counts != last:
                trace.append(PassStep(int(match["index"]), match["pipeline"], match["pass"],
                                      *counts))
                last = counts
    return trace
