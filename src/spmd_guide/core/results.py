"""Benchmark results saved with where they came from, and read back for the book.

The scripts in ``benchmarks/`` run shapes too big for the book's build. With ``--json PATH``
each one saves its table with the command that made it, the date, and the environment
(:func:`spmd_guide.core.devices.environment_summary`), so a page that shows the table can say
exactly what hardware and JAX produced every number in it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spmd_guide.core import checks
from spmd_guide.core.devices import Environment, environment_summary
from spmd_guide.core.display import Table

FIELDS = ("benchmark", "command", "date", "environment", "settings", "rows")


@dataclass(frozen=True)
class Results:
    """One benchmark run: its rows, the command and settings, when and where it ran."""

    benchmark: str
    command: str
    date: str
    environment: Environment
    settings: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def script(self) -> str:
        """The script that produced the run, e.g. ``benchmarks/strategies.py``."""
        words = self.command.split()
        return words[1] if len(words) > 1 else ""

    def table(self, columns: Sequence[str] | None = None) -> Table:
        """The rows as a :class:`~spmd_guide.core.display.Table`, optionally only ``columns``."""
        if columns is None:
            return Table(self.rows)
        for column in columns:
            checks.one_of("column", column, list(self.rows[0]))
        return Table([{c: row[c] for c in columns} for row in self.rows])

    def settings_text(self) -> str:
        """The run's settings in words: ``"batch 1024, runs 5"`` (integers with separators)."""
        def shown(value: Any) -> str:
            if isinstance(value, int) and not isinstance(value, bool):
                return f"{value:,}"
            if isinstance(value, list):
                return " x ".join(shown(v) for v in value)
            return str(value)

        return ", ".join(f"{key} {shown(value)}" for key, value in self.settings.items())

    def provenance(self) -> str:
        """One sentence: what ran, on what, with which JAX, when."""
        env = self.environment
        return (f"`{self.command}` on {env.hardware}, JAX {env.jax_version}, "
                f"run on {self.date[:10]}.")


def save(path: str | pathlib.Path, *, benchmark: str, command: Sequence[str],
         settings: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> pathlib.Path:
    """Write ``rows`` and their provenance as JSON to ``path``; returns the path."""
    if not isinstance(benchmark, str) or not benchmark:
        raise checks.InputTypeError(f"benchmark must be a non-empty name, got {benchmark!r}.")
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        raise checks.InputTypeError("rows must be a non-empty list of dicts, one per row.")
    path = pathlib.Path(path)
    record = {
        "benchmark": benchmark,
        "command": " ".join(["python", *_without_json(command)]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": dataclasses.asdict(environment_summary()),
        "settings": dict(settings),
        "rows": [dict(r) for r in rows],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _without_json(command: Sequence[str]) -> list[str]:
    """The command without its ``--json PATH`` (where the result went is not how it ran)."""
    words, kept = list(command), []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--json":
            skip = True
        elif not word.startswith("--json="):
            kept.append(word)
    return kept


def load(path: str | pathlib.Path) -> Results:
    """Read a file :func:`save` wrote; a clear error if it is missing or not such a file."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise checks.InputError(
            f"no benchmark results at {path}: run the benchmark with --json {path} first.")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise checks.InputError(f"{path} is not JSON ({error}).") from None
    missing = [f for f in FIELDS if not isinstance(record, dict) or f not in record]
    if missing:
        raise checks.InputError(
            f"{path} is not a benchmark result: it lacks {', '.join(missing)}.")
    try:
        environment = Environment(**record["environment"])
    except TypeError as error:
        raise checks.InputError(f"{path}: its environment does not match ({error}).") from None
    if not record["rows"]:
        raise checks.InputError(f"{path} holds no rows.")
    return Results(record["benchmark"], record["command"], record["date"], environment,
                   record["settings"], record["rows"])


def load_all(folder: str | pathlib.Path, *, script: str | None = None) -> list[Results]:
    """Every run saved in ``folder`` (``*.json``, by file name), or only those ``script``
    made; a clear error if there is none, so a page never shows an empty section."""
    folder = pathlib.Path(folder)
    runs = [load(path) for path in sorted(folder.glob("*.json"))]
    if script is not None:
        runs = [run for run in runs if run.script == script]
    if not runs:
        raise checks.InputError(
            f"no benchmark results{f' from {script}' if script else ''} in {folder}: run "
            f"the benchmark with --json {folder}/NAME.json first.")
    return runs
