"""The last kept TPU results, for a machine that cannot compile for TPUs (Part XIV).

``libtpu`` is published for Linux on x86_64 only. There the pages compile their TPU programs
as they run; elsewhere (macOS, Linux on ARM) :func:`rows` returns the rows that
``benchmarks/tpu_programs.py --json`` kept in ``benchmarks/results/`` instead, with a note
that says so and where they came from (:mod:`spmd_guide.core.results`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from spmd_guide.core import checks, results
from spmd_guide.tpu.topology import unavailable

__all__ = ["FILES", "FOLDER", "rows"]

#: Each table of Part XIV and the file its last kept result lives in.
FILES: dict[str, str] = {
    "fit": "tpu_fit.json", "strategies": "tpu_strategies.json", "costs": "tpu_costs.json",
    "compare": "tpu_compare.json", "overlap": "tpu_overlap.json",
}


#: Where ``benchmarks/tpu_programs.py`` keeps its tables in a checkout of the book.
FOLDER = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def rows(table: str, compute: Callable[[], Sequence[dict[str, Any]]], *,
         folder: str | pathlib.Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """``(rows, note)``: ``compute()`` and ``""`` where XLA:TPU is available; otherwise the
    kept rows of ``table`` from ``folder`` (the checkout's ``benchmarks/results`` unless
    given) and a note that says why, and which run made them (the command, its date, JAX's
    version)."""
    name = checks.one_of("table", table, FILES)
    checks.function("compute", compute)
    where = FOLDER if folder is None else checks.path("folder", folder)
    why = unavailable()
    if not why:
        return list(compute()), ""
    run = results.load(where / FILES[name])
    env = run.environment
    libtpu = run.settings.get("libtpu", "?")
    return list(run.rows), (
        f"Not compiled here: {why} The table is the last kept result, compiled by XLA:TPU "
        f"(libtpu {libtpu}, JAX {env.jax_version}) with `{run.command}` on {run.date[:10]}.")
