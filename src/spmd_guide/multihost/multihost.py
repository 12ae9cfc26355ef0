"""Run one program in several JAX processes on this machine, as a pod or cluster would.

JAX's multi-controller runtime runs the *same* program in every process; the processes meet
through ``jax.distributed.initialize`` and then share one global set of devices. On a TPU pod
or a GPU cluster each process runs on its own host. Here :func:`launch` starts ``N`` local
processes instead, each with ``M`` CPU devices, a coordinator on a free loopback port and CPU
collectives over gloo, so ``N x M`` global devices behave like a small cluster.

The launcher owns the processes it starts: each runs in its own process group, its stdout and
stderr are captured, and if any process fails or the time limit passes, every process group is
killed before the call raises :class:`ProcessFailed` (or :class:`ProcessTimeout`) carrying the
guilty process's output. Nothing is left running.

What runs is either a function, named by an importable ``"package.module:function"`` (each
process imports it; nothing is pickled) whose JSON-able return value comes back, or a script
file run as ``__main__``. Both start with JAX already initialized for their process: each
process runs :mod:`spmd_guide.multihost.worker` (:data:`WORKER`), which sets JAX up, joins
the others and then runs the target. The page multihost/multihost launches its programs here.

POSIX only (Linux, macOS): it relies on process groups.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spmd_guide.core import checks

LOOPBACK = "127.0.0.1"
"""The only address the launcher uses: coordinator, its listening socket and gloo all stay on it."""

WORKER = "spmd_guide.multihost.worker"
"""The module each launched process runs, as ``python -m WORKER SPEC PROCESS_ID`` (named, not
imported: the worker imports this module's :data:`LOOPBACK`)."""

_POLL_SECONDS = 0.05
_TAIL_LINES = 12
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")
_FUNCTION_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class ProcessResult:
    """What one process left behind: its id, exit code, output and (for functions) return value.

    ``os_pid`` is the operating system's id of the (now finished) process; ``seconds`` is when
    it finished, counted from the launch.
    """

    process_id: int
    returncode: int
    stdout: str
    stderr: str
    value: Any = None
    seconds: float = 0.0
    os_pid: int = 0

    @property
    def ended(self) -> str:
        """``"exit code 0"``, or ``"signal 6 (SIGABRT)"`` for a process a signal ended."""
        if self.returncode >= 0:
            return f"exit code {self.returncode}"
        try:
            name = f" ({signal.Signals(-self.returncode).name})"
        except ValueError:
            name = ""
        return f"signal {-self.returncode}{name}"

    def row(self) -> dict[str, Any]:
        """A table row: how and when the process ended, and the last line it printed."""
        lines = self.stdout.strip().splitlines()
        return {"process": self.process_id, "ended": self.ended,
                "after (s)": f"{self.seconds:.1f}", "last line printed": lines[-1] if lines else ""}


_VERDICT = re.compile(r"(Terminating process because the JAX distributed service[^.]*\.)"
                      r"(?:.|\n)*?(The following tasks are unhealthy[^:]*:)\s*([\d, ]+)")


def service_verdict(stderr: str) -> str | None:
    """Why JAX's coordination service terminated a process, in one sentence, read from the
    process's ``stderr``; ``None`` if it did not."""
    if not isinstance(stderr, str):
        raise checks.InputTypeError(f"stderr must be a process's error output (a string), "
                                    f"got {stderr!r:.60}.")
    match = _VERDICT.search(stderr)
    if match is None:
        return None
    return f"{match[1]} {match[2]} {match[3].strip()}."


class ProcessFailed(RuntimeError):
    """A launched process failed; every other process was stopped.

    ``process_id``, ``returncode``, ``stdout`` and ``stderr`` describe the process that failed
    first; ``results`` holds what every process had written when they were stopped.
    """

    def __init__(self, message: str, *, process_id: int, returncode: int,
                 stdout: str, stderr: str, results: list[ProcessResult]):
        super().__init__(message)
        self.process_id = process_id
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.results = results


class ProcessTimeout(ProcessFailed, TimeoutError):
    """The time limit passed before every process finished; all of them were stopped.

    ``process_id`` is the first process still running at the limit; ``still_running`` lists all.
    """

    def __init__(self, message: str, *, still_running: list[int], **details: Any):
        super().__init__(message, **details)
        self.still_running = still_running


@dataclass(frozen=True)
class _Target:
    """A validated thing to run: a function ``module:name`` or a script path."""

    function: str | None = None
    script: str | None = None

    @property
    def label(self) -> str:
        return self.function or f"script {self.script}"


def free_port() -> int:
    """A TCP port on the loopback address that is free right now (the OS picks it: bind port 0).

    Another program could take it before the coordinator binds it; then process 0 fails to
    start and :func:`launch` raises :class:`ProcessFailed` saying so.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def launch(
    target: Callable[..., Any] | str | os.PathLike[str],
    *,
    num_processes: int = 2,
    devices_per_process: int = 4,
    timeout: float = 60.0,
    kwargs: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    heartbeat_timeout: int | None = None,
    initialization_timeout: int | None = None,
    start: Sequence[int] | None = None,
) -> list[ProcessResult]:
    """Run ``target`` in ``num_processes`` local JAX processes with ``devices_per_process`` CPU
    devices each; return one :class:`ProcessResult` per process, ordered by process id.

    ``target`` is a module-level function (or its name, ``"package.module:function"``), called
    in every process as ``function(**kwargs)`` with JSON-able ``kwargs``; its JSON-able return
    value comes back as ``ProcessResult.value``. Or it is the path of a ``.py`` script, run as
    ``__main__`` with ``sys.argv[1:] == args``. In each process, ``jax.distributed.initialize``
    has already run, so ``jax.devices()`` holds all ``num_processes * devices_per_process``
    devices. A Python ``print`` goes to that process's ``stdout``; messages of native libraries
    (gloo, XLA) go to its ``stderr``.

    Raises ``ValueError``/``TypeError`` for bad arguments before starting anything,
    :class:`ProcessFailed` if a process exits with an error, and :class:`ProcessTimeout` if the
    processes are not all done within ``timeout`` seconds. In every case all processes are
    stopped before the call returns or raises.

    ``heartbeat_timeout`` (whole seconds) is ``initialize``'s ``heartbeat_timeout_seconds``:
    how long JAX's coordination service waits for a silent process before it declares it
    dead and terminates the others. ``None`` keeps JAX's default.

    ``initialization_timeout`` (whole seconds) is how long ``initialize`` waits for every
    process to join; ``None``: ``timeout``, rounded up. ``start`` lists the process ids to
    start (default: all); the others never come, as in a job whose scheduler started only
    some hosts, and the started ones wait for them in ``initialize``.
    """
    num_processes = checks.count("num_processes", num_processes, maximum=256)
    if heartbeat_timeout is not None:
        heartbeat_timeout = checks.count("heartbeat_timeout", heartbeat_timeout)
    devices_per_process = checks.count("devices_per_process", devices_per_process,
                                       maximum=checks.MAX_DEVICES)
    timeout = checks.real("timeout (seconds)", timeout, positive=True)
    if initialization_timeout is not None:
        initialization_timeout = checks.count("initialization_timeout", initialization_timeout)
    started = _started("start", start, num_processes)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise checks.InputTypeError(
            f"kwargs must be a dict of the function's keyword arguments, got {kwargs!r:.60}.")
    resolved = _resolve_target(target)
    if resolved.function is None and kwargs:
        raise checks.InputTypeError("kwargs are passed to a function; a script takes its inputs from args.")
    if resolved.script is None and args:
        raise checks.InputTypeError("args are a script's command line; pass a function's inputs as kwargs.")
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise checks.InputTypeError(f"args must be a sequence of strings, got {args!r}.")
    try:
        kwargs_json = json.dumps(dict(kwargs or {}), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise checks.InputTypeError(f"kwargs must be JSON-serializable (numbers, strings, lists, dicts): "
                        f"{error}.") from None

    with tempfile.TemporaryDirectory(prefix="spmd_multihost_") as workdir:
        port = free_port()
        spec = {
            "function": resolved.function,
            "script": resolved.script,
            "args": list(args),
            "kwargs": json.loads(kwargs_json),
            "coordinator": f"{LOOPBACK}:{port}",
            "num_processes": num_processes,
            "devices_per_process": devices_per_process,
            "timeout": timeout,
            "heartbeat_timeout": heartbeat_timeout,
            "initialization_timeout": initialization_timeout,
        }
        spec_path = Path(workdir, "spec.json")
        spec_path.write_text(json.dumps(spec))
        return _run_all(spec_path, Path(workdir), resolved, num_processes, started,
                        devices_per_process, timeout)


def _started(name: str, start: Any, num_processes: int) -> list[int]:
    """The process ids to start: all of ``range(num_processes)``, or the distinct ids listed."""
    if start is None:
        return list(range(num_processes))
    if isinstance(start, (str, bytes)) or not isinstance(start, Sequence):
        raise checks.InputTypeError(
            f"{name} must be a list of process ids such as [0], got {start!r:.60}.")
    if not start:
        raise checks.InputError(f"{name} must name at least one process to start, got [].")
    ids = [checks.count(name, i, minimum=0, maximum=num_processes - 1) for i in start]
    if len(set(ids)) != len(ids):
        raise checks.InputError(f"{name} names a process twice: {list(start)}.")
    return sorted(ids)


def still_running(results: Sequence[ProcessResult]) -> list[int]:
    """The process ids among ``results`` of which any process (or child of it) is still alive.

    After :func:`launch` returns or raises this is always empty; the chapter and the tests
    check it. Only results from :func:`launch` carry the operating system's process id; a
    ``ProcessResult`` without one (``os_pid`` 0, the default) is refused, since probing
    process group 0 would ask about the caller's own group.
    """
    if isinstance(results, ProcessResult) or not isinstance(results, Sequence):
        raise checks.InputTypeError(
            f"results must be the list of ProcessResult that launch returned, got "
            f"{results!r:.60}.")
    for result in results:
        if not isinstance(result, ProcessResult):
            raise checks.InputTypeError(
                f"results must hold ProcessResult objects, got {result!r:.60}.")
        if isinstance(result.os_pid, bool) or not isinstance(result.os_pid, int) \
                or result.os_pid <= 0:
            raise checks.InputError(
                f"process {result.process_id} has os_pid={result.os_pid!r}: only results "
                "returned by launch carry the id of a process that ran; probing group 0 "
                "would ask about this very process.")
    alive = []
    for result in results:
        try:
            os.killpg(result.os_pid, 0)  # signal 0: only asks whether the group exists
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        alive.append(result.process_id)
    return alive


def _resolve_target(target: object) -> _Target:
    """Check that ``target`` names an importable module-level function or an existing script."""
    if isinstance(target, os.PathLike) or (isinstance(target, str) and target.endswith(".py")):
        path = Path(target).resolve()
        if not path.is_file():
            raise checks.InputError(f"script {str(target)!r} does not exist (resolved to {path}).")
        return _Target(script=str(path))
    if callable(target) and not isinstance(target, str):
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", "")
        if module in (None, "__main__") or "." in qualname or "<" in qualname:
            raise checks.InputError(
                f"{target!r} cannot be imported by the other processes: launch needs a function "
                "defined at the top level of an importable module (not in a notebook or script "
                "run as __main__, not a lambda, closure or method). Move it into a .py module "
                "and pass it, or its name 'package.module:function'.")
        target = f"{module}:{qualname}"
    if not isinstance(target, str) or not _FUNCTION_NAME.match(target):
        raise checks.InputError(f"target must be a function, 'package.module:function' or a path to a "
                         f".py script, got {target!r}.")
    module_name, name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise checks.InputError(f"cannot import module {module_name!r} of target {target!r}: "
                         f"{error}.") from None
    if not callable(getattr(module, name, None)):
        raise checks.InputError(
            f"module {module_name!r} has no function {name!r} (target {target!r}).")
    return _Target(function=target)


def _child_env(devices_per_process: int) -> dict[str, str]:
    """The parent's environment, set for CPU devices, with the parent's import path."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    flags = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join(
        [*flags, f"--xla_force_host_platform_device_count={devices_per_process}"])
    paths = [*sys.path, *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(p for p in paths if p and Path(p).is_dir()))
    env["PYTHONUNBUFFERED"] = "1"
    for variable in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_BIND_ADDRESS",
                     "JAX_LOCAL_DEVICE_IDS"):
        env.pop(variable, None)
    return env


def _run_all(spec_path: Path, workdir: Path, target: _Target, num_processes: int,
             started: list[int], devices_per_process: int,
             timeout: float) -> list[ProcessResult]:
    """Start the processes, watch them until all succeed, one fails or time runs out.

    ``procs[i]`` runs process id ``started[i]``; results carry the process ids."""
    of = f"of {num_processes}" + ("" if len(started) == num_processes
                                  else f" (started: {started})")
    num_processes = len(started)
    env = _child_env(devices_per_process)
    procs: list[subprocess.Popen] = []
    files = []
    start = time.monotonic()
    finished: dict[int, float] = {}
    try:
        for index in started:
            out = open(workdir / f"{index}.out", "w+b")
            err = open(workdir / f"{index}.err", "w+b")
            files.append((out, err))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", WORKER, str(spec_path), str(index)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                start_new_session=True))  # its own process group, killed as a whole
        while True:
            elapsed = time.monotonic() - start
            for index, proc in enumerate(procs):
                if index not in finished and proc.poll() is not None:
                    finished[index] = elapsed
            failed = [index for index in finished if procs[index].returncode != 0]
            if failed:
                first = min(failed, key=lambda p: (finished[p], p))
                _stop(procs)
                results = _collect(procs, files, workdir, finished, start, started)
                raise _failure(first, results, target, of, elapsed)
            if len(finished) == num_processes:
                return _collect(procs, files, workdir, finished, start, started)
            if elapsed > timeout:
                _stop(procs)
                results = _collect(procs, files, workdir, finished, start, started)
                running = [p for p in range(num_processes) if p not in finished]
                raise _timeout(running, results, target, started, of, timeout)
            time.sleep(_POLL_SECONDS)
    finally:
        _stop(procs)
        for out, err in files:
            out.close()
            err.close()


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill every process group we started (children included) and reap the processes."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        proc.wait()


def _collect(procs, files, workdir: Path, finished: dict[int, float],
             start: float, started: list[int]) -> list[ProcessResult]:
    results = []
    for index, (proc, (out, err)) in enumerate(zip(procs, files, strict=True)):
        value_path = workdir / f"{started[index]}.json"
        try:
            value = json.loads(value_path.read_text())
        except (OSError, ValueError):  # no value: a script, or a process stopped before the end
            value = None
        results.append(ProcessResult(
            process_id=started[index],
            returncode=proc.returncode,
            stdout=_read(out),
            stderr=_read(err),
            value=value,
            seconds=round(finished.get(index, time.monotonic() - start), 2),
            os_pid=proc.pid,
        ))
    return results


def _read(file) -> str:
    file.flush()
    file.seek(0)
    return file.read().decode(errors="replace")


def _tail(text: str) -> str:
    lines = text.rstrip().splitlines()[-_TAIL_LINES:]
    return "\n".join("    " + line for line in lines) if lines else "    (empty)"


def _failure(index: int, results: list[ProcessResult], target: _Target, of: str,
             elapsed: float) -> ProcessFailed:
    bad = results[index]
    how = (f"was killed by signal {-bad.returncode}" if bad.returncode < 0
           else f"exited with code {bad.returncode}")
    message = (f"process {bad.process_id} {of} running {target.label} {how} after "
               f"{elapsed:.1f} s; "
               f"the other processes were stopped.\nLast lines of its stderr:\n{_tail(bad.stderr)}")
    return ProcessFailed(message, process_id=bad.process_id, returncode=bad.returncode,
                         stdout=bad.stdout,
                         stderr=bad.stderr, results=results)


def _timeout(running: list[int], results: list[ProcessResult], target: _Target,
             started: list[int], of: str, timeout: float) -> ProcessTimeout:
    first = results[running[0]]
    running = [started[i] for i in running]
    who = (f"process {running[0]} {of} running {target.label} was" if len(running) == 1
           else f"processes {running} {of} running {target.label} were")
    message = (f"{who} still running at the {timeout:g} s time limit; all processes were "
               f"stopped.\nLast lines of process {first.process_id}'s stdout:\n"
               f"{_tail(first.stdout)}")
    return ProcessTimeout(message, still_running=running, process_id=first.process_id,
                          returncode=first.returncode, stdout=first.stdout,
                          stderr=first.stderr, results=results)
