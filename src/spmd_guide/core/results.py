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
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spmd_guide.core import checks
from spmd_guide.core.devices import Environment, environment_summary
from spmd_guide.core.display import Table, listed

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

    def table(self, columns: Sequence[str] | str | None = None) -> Table:
        """The rows as a :class:`~spmd_guide.core.display.Table`, optionally only ``columns``
        (a list of column names, or one name)."""
        if columns is None:
            return Table(self.rows)
        if isinstance(columns, str):
            columns = [columns]
        if not isinstance(columns, Sequence) or not columns:
            raise checks.InputTypeError(
                f"columns must be a list of column names such as ['strategy'], got "
                f"{columns!r:.60}.")
        for column in columns:
            checks.one_of("column", column, list(self.rows[0]))
        if len(set(columns)) != len(columns):
            raise checks.InputError(f"columns names a column twice: {list(columns)}.")
        return Table([{c: row[c] for c in columns} for row in self.rows])

    def settings_text(self) -> str:
        """The run's settings in words: ``"batch 1,024, sizes 256, 512 and 1,024"`` (integers
        with separators, a list as a list: it may hold sizes tried one after another)."""
        def shown(value: Any) -> str:
            if isinstance(value, int) and not isinstance(value, bool):
                return f"{value:,}"
            if isinstance(value, list) and value:
                return listed([shown(v) for v in value])
            return str(value)

        return ", ".join(f"{key} {shown(value)}" for key, value in self.settings.items())

    def provenance(self) -> str:
        """One sentence: what ran, on what, with which JAX, when.

        A run whose settings name ``"processes"`` and ``"devices per process"`` launched
        processes of its own (a multi-process launch from one script): its environment is
        the launching process's, so the devices are said from those settings instead."""
        env = self.environment
        processes = self.settings.get("processes")
        per = self.settings.get("devices per process")
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (processes, per)):
            where = (f"{processes} processes x {per} {env.device_kind} devices each, launched "
                     f"from one process on {env.host_cores} host cores")
        else:
            where = env.hardware
        return f"`{self.command}` on {where}, JAX {env.jax_version}, run on {self.date[:10]}."




def _plain(name: str, value: Any) -> Any:
    """``value`` as JSON can hold it: NumPy and JAX scalars and arrays become Python numbers
    and lists; anything JSON cannot hold is refused, naming where it sits."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {_key(name, k): _plain(f"{name}[{k!r}]", v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if hasattr(value, "__array__") and not isinstance(value, type):
        array = np.asarray(value)
        if array.dtype.kind in "biuf":
            return array.tolist()
    raise checks.InputTypeError(
        f"{name} is {value!r:.60} ({type(value).__name__}), which a JSON results file cannot "
        "hold: use numbers, strings, booleans, None, lists or dicts of them.")


def _key(name: str, key: Any) -> str:
    if not isinstance(key, str):
        raise checks.InputTypeError(
            f"the keys of {name} must be strings (column or setting names), got {key!r:.60}.")
    return key


def save(path: str | pathlib.Path, *, benchmark: str, command: Sequence[str] | str,
         settings: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> pathlib.Path:
    """Write ``rows`` and their provenance as JSON to ``path`` (a ``.json`` file, which
    :func:`load_all` finds); returns the path.

    ``command`` is how the run was started: the words of ``sys.argv`` (stored after
    ``python``), or the whole command line as a string (``"python benchmarks/strategies.py
    --runs 3"``; a string without the interpreter, ``"run.py"``, is refused rather than
    stored rewritten); ``--json PATH`` is left out.
    NumPy scalars and arrays in ``settings`` and ``rows`` are stored as numbers and lists;
    a NaN (a run that measured nothing) propagates: stored as ``NaN``, loaded back as NaN.
    Every row must have the same columns.
    """
    path = checks.path("path", path)
    if path.suffix != ".json":
        raise checks.InputError(
            f"path must name a .json file (load_all reads *.json), got {str(path)!r}.")
    if not isinstance(benchmark, str) or not benchmark.strip():
        raise checks.InputTypeError(f"benchmark must be a non-empty name, got {benchmark!r}.")
    if isinstance(command, str):
        words = shlex.split(command)
        if not words or not re.fullmatch(r"python[0-9.]*", pathlib.Path(words[0]).name):
            raise checks.InputError(
                f"command={command!r} as a string must be the whole command line, starting "
                "with the interpreter ('python benchmarks/run.py --runs 3'); or pass the "
                "arguments as a list, as sys.argv holds them (python is then added).")
        command = words[1:]
    if not isinstance(command, Sequence) or not all(isinstance(w, str) for w in command):
        raise checks.InputTypeError(
            f"command must be the run's command line, as a string or a list of strings such "
            f"as sys.argv, got {command!r:.60}.")
    if not isinstance(settings, Mapping):
        raise checks.InputTypeError(
            f"settings must be a dict of setting name: value, got {settings!r:.60}.")
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence) or not rows \
            or not all(isinstance(r, Mapping) for r in rows):
        raise checks.InputTypeError("rows must be a non-empty list of dicts, one per row.")
    columns = list(rows[0])
    for i, row in enumerate(rows):
        if list(row) != columns:
            raise checks.InputError(
                f"rows[{i}] has columns {list(row)}, but rows[0] has {columns}: every row of a "
                "table needs the same columns, in the same order.")
    record = {
        "benchmark": benchmark,
        "command": " ".join(["python", *_without_json(command)]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": dataclasses.asdict(environment_summary()),
        "settings": _plain("settings", settings),
        "rows": [_plain(f"rows[{i}]", r) for i, r in enumerate(rows)],
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
    path = checks.path("path", path)
    if not path.is_file():
        raise checks.InputError(
            f"path {str(path)!r} holds no benchmark results"
            f"{' (it is a directory)' if path.is_dir() else ''}: run the benchmark with "
            f"--json {path} first.")
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
    for field, kind in (("benchmark", str), ("command", str), ("date", str),
                        ("settings", dict), ("rows", list)):
        if not isinstance(record[field], kind):
            raise checks.InputError(
                f"{path} is not a benchmark result as save writes it: its {field!r} is a "
                f"{type(record[field]).__name__}, not a {kind.__name__}.")
    if not record["rows"]:
        raise checks.InputError(f"{path} holds no rows.")
    rows = record["rows"]
    if not all(isinstance(r, dict) and list(r) == list(rows[0]) for r in rows):
        raise checks.InputError(
            f"{path} is not a benchmark result as save writes it: its rows are not dicts "
            "with the same columns.")
    return Results(record["benchmark"], record["command"], record["date"], environment,
                   record["settings"], record["rows"])


def load_all(folder: str | pathlib.Path, *, script: str | None = None) -> list[Results]:
    """Every run saved in ``folder`` (``*.json``, by file name), or only those ``script``
    made; a clear error if there is none, so a page never shows an empty section."""
    folder = checks.path("folder", folder)
    if folder.exists() and not folder.is_dir():
        raise checks.InputError(f"folder {str(folder)!r} is a file, not a directory of results.")
    if script is not None and (not isinstance(script, str) or not script):
        raise checks.InputTypeError(
            f"script must be the script's path as saved, such as 'benchmarks/strategies.py', "
            f"or None, got {script!r:.60}.")
    runs = [load(path) for path in sorted(folder.glob("*.json"))]
    if script is not None:
        runs = [run for run in runs if run.script == script]
    if not runs:
        raise checks.InputError(
            f"folder {str(folder)!r} holds no benchmark results"
            f"{f' from {script}' if script else ''}: run "
            f"the benchmark with --json {folder}/NAME.json first.")
    return runs
