"""What ``jax.profiler.trace(folder)`` writes, read back: the trace folder
(``plugins/profile/<time>/``), its files, and the TraceEvents of its gzipped JSON, each
checked, so a folder that holds no trace or a damaged file is refused by name
(:class:`TraceInputError`), never read as an empty or wrong trace.
"""

from __future__ import annotations

import gzip
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from spmd_guide.core import checks

__all__ = ["TraceError", "TraceInputError", "check_events", "event_time", "read_events",
           "trace_files"]


class TraceError(RuntimeError):
    """The trace does not say what the check needs (devices or runs disagree, runs are
    missing, an op is not in the compiled program)."""


class TraceInputError(TraceError, checks.InputError):
    """What the caller gave does not make a trace of the program: events or a file that are
    not a trace, a trace of another compilation or of another device count."""


def check_events(events: Any) -> Sequence[Mapping[str, Any]]:
    """``events`` if it is a list of TraceEvent dicts (what :func:`read_events` returns)."""
    if isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Sequence):
        raise checks.InputTypeError(
            f"events must be a list of TraceEvent dicts (read_events(folder)), got "
            f"{checks.value_text(events)}.")
    for i, e in enumerate(events):
        if not isinstance(e, Mapping):
            raise checks.InputTypeError(
                f"events[{i}] must be a TraceEvent dict, got {checks.value_text(e)}.")
    return events


def event_time(e: Mapping[str, Any], key: str, i: int) -> float:
    """A finite ``ts``/``dur`` of event ``i``, or a :class:`TraceInputError` naming it."""
    try:
        value = float(e[key])
    except (KeyError, TypeError, ValueError):
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")) or (key == "dur" and value < 0):
        raise TraceInputError(f"events[{i}] ({e.get('name')!r}) has {key}="
                              f"{checks.value_text(e.get(key))}, not a time in µs: is this a "
                              "trace jax.profiler wrote?")
    return value


def _trace_folder(folder: Any) -> pathlib.Path:
    """``folder`` as a path to an existing folder that holds a trace
    (``plugins/profile/``): '' and Path('') (the current directory, unnamed), a file or a
    folder no trace was written to are refused."""
    root = checks.path("folder", folder, what="the folder given to jax.profiler.trace")
    if not root.parts:  # Path('') and '.' are both Path('.')
        raise checks.InputError(
            f"folder must name a folder, got {checks.value_text(folder)}, the current directory "
            "unnamed; pass it explicitly (os.getcwd()) if the trace is there.")
    if root.is_file():
        raise checks.InputError(f"folder {str(folder)!r} is a file; give the folder that was "
                                "passed to jax.profiler.trace.")
    if not root.is_dir():
        raise checks.InputError(f"folder {str(folder)!r} is not a folder.")
    if not (root / "plugins" / "profile").is_dir():
        raise TraceInputError(f"folder {str(folder)!r} holds no plugins/profile/: was "
                              "jax.profiler.trace given this folder?")
    return root


def trace_files(folder: str | pathlib.Path) -> list[tuple[str, int]]:
    """``(path relative to folder, bytes)`` of every file a trace wrote under ``folder``
    (its ``plugins/profile/`` tree)."""
    root = _trace_folder(folder)
    return sorted((str(p.relative_to(root)), p.stat().st_size)
                  for p in (root / "plugins" / "profile").rglob("*") if p.is_file())


def read_events(folder: str | pathlib.Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of the newest ``*.trace.json.gz`` under ``folder`` (what
    ``jax.profiler.trace(folder)`` wrote; the perfetto copy holds the same events).

    A file that is not gzipped JSON with a ``traceEvents`` list of dicts is refused with a
    :class:`TraceInputError` naming it."""
    root = _trace_folder(folder)
    files = sorted(root.glob("plugins/profile/*/*.trace.json.gz"),
                   key=lambda p: p.stat().st_mtime)
    if not files:
        raise TraceInputError(f"no plugins/profile/*/*.trace.json.gz under {str(folder)!r}: "
                              "was jax.profiler.trace given this folder?")
    try:
        with gzip.open(files[-1], "rt") as handle:
            data = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as error:
        raise TraceInputError(f"the trace file {str(files[-1])!r} is damaged: it is not "
                              f"gzipped JSON ({type(error).__name__}: {error}).") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise TraceInputError(f"the trace file {str(files[-1])!r} is damaged: it has no "
                              "traceEvents list of event dicts.")
    return events
