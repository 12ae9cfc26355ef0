"""How a job of several processes fails: one raises or hangs, one dies in the middle of a
collective (frozen, exited, or hanging alive), or one never starts.

Every function that takes part runs in *each* process that
:func:`spmd_guide.multihost.multihost.launch` starts; :func:`failure_modes` and
:func:`partial_start` run launches from the caller's process and return how they ended. The
page multihost/multihost shows them.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.display import Table
from spmd_guide.multihost import multihost


def misbehave(*, raise_on: int | None = None,
              hang_on: int | None = None) -> int:
    """Fail on purpose: process ``raise_on`` raises, ``hang_on`` hangs."""
    raise_on = _process_id("raise_on", raise_on)
    hang_on = _process_id("hang_on", hang_on)
    me = jax.process_index()
    print(f"process {me} started", flush=True)
    if me == raise_on:
        raise RuntimeError(f"process {me} gives up on purpose")
    if me == hang_on:
        print(f"process {me} hangs on purpose", flush=True)
        while True:
            time.sleep(1)
    return me


def freeze(*, frozen: int = 1, how: str = "stop") -> float:
    """Process ``frozen`` stops taking part after a first collective with the others; they
    enter a second collective, which waits for it. Returns, in a process that gets out, how
    many seconds it waited.

    ``how="stop"``: as on a host that loses power, it stops itself (``SIGSTOP``): its
    connections stay open but it sends nothing, heartbeats included, and JAX's coordination
    service terminates the others once the heartbeats are overdue. ``how="exit"``: as a
    crash, it ends at once (``os._exit(0)``: no shutdown, no goodbye to the service; exit
    code 0 so that the launcher, which stops everything when a process fails, does not step
    in). Its heartbeats stop too, and the others are terminated the same way, after the
    heartbeat timeout; unless it is process 0, which hosts the coordination service: then
    the others lose the service at once. ``how="hang"``: it stays alive in a Python loop;
    its heartbeats go on, and the others wait until something else (a time limit) ends them.
    """
    frozen = checks.count("frozen", frozen, minimum=0, maximum=jax.process_count() - 1)
    how = checks.one_of("how", how, ("stop", "exit", "hang"))
    me = jax.process_index()
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), np.ones(jax.local_device_count(), np.float32))
    print(f"process {me}: first sum = {float(jax.jit(jnp.sum)(x)):g}", flush=True)
    if me == frozen:
        print(f"process {me} {'exits' if how == 'exit' else 'freezes'}", flush=True)
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if how == "exit":
            os._exit(0)
        while True:
            time.sleep(0.1)
    start = time.monotonic()
    print(f"process {me} waits in the second sum", flush=True)
    float(jax.jit(jnp.sum)(x + 1))
    return time.monotonic() - start


FAILURE_WAYS = {"stop": "freezes (SIGSTOP)", "exit": "exits (os._exit)",
                "hang": "hangs alive"}


def failure_modes(cases: Sequence[tuple[str, int]] = (("stop", 1), ("exit", 1)), *,
                  heartbeat_timeout: int = 1, timeout: float = 60.0
                  ) -> dict[tuple[str, int], Any]:
    """Run :func:`freeze` once for each ``(how, frozen)`` case, all at the same time (two
    processes of two devices each, ``initialize``'s heartbeat timeout set to
    ``heartbeat_timeout`` seconds), and return how each run ended: the ``ProcessFailed`` (or
    ``ProcessTimeout``) the launcher raised, by case. Process ``frozen`` is the one that
    stops, exits or hangs; the other waits in a collective with it.
    """
    if isinstance(cases, str) or not isinstance(cases, Sequence) or not cases or not all(
            isinstance(case, tuple) and len(case) == 2 for case in cases):
        raise checks.InputTypeError(
            f"cases must be a non-empty list of (how, process) pairs such as [('exit', 1)], "
            f"how from {sorted(FAILURE_WAYS)}; got {cases!r:.60}.")
    cases = [(checks.one_of("how", how, FAILURE_WAYS),
              checks.count("frozen process", frozen, minimum=0, maximum=1))
             for how, frozen in cases]
    if len(set(cases)) != len(cases):
        raise checks.InputError(f"cases names a case twice: {cases}.")
    heartbeat_timeout = checks.count("heartbeat_timeout", heartbeat_timeout)

    def run(case: tuple[str, int]) -> Any:
        how, frozen = case
        try:
            multihost.launch(freeze, num_processes=2, devices_per_process=2,
                             heartbeat_timeout=heartbeat_timeout, timeout=timeout,
                             kwargs={"how": how, "frozen": frozen})
        except multihost.ProcessFailed as failed:
            return failed
        raise RuntimeError(f"freeze(how={how!r}, frozen={frozen}) ended without a failure")

    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        return dict(zip(cases, pool.map(run, cases), strict=True))


def failure_table(ended: dict[tuple[str, int], Any]) -> Table:
    """One row per case and process of :func:`failure_modes`: how it ended, when, and why
    (the coordination service's verdict, in short)."""
    rows = []
    for (how, frozen), failed in ended.items():
        for result in failed.results:
            rows.append({"case": f"process {frozen} {FAILURE_WAYS[how]}", **result.row(),
                         "why": short_verdict(result.stderr)})
    return Table(rows)


def short_verdict(stderr: str) -> str:
    """What ended a process, in a few words, from its ``stderr``: which process the
    coordination service declared dead, else the first sentence of the status JAX's
    distributed runtime gave (and the call it gave it for), else that of the
    ``JaxRuntimeError`` it raised, else ``""``."""
    verdict = multihost.service_verdict(stderr)
    if verdict is not None:
        return f"service: process {verdict.rsplit(':', 1)[1].strip(' .')} stopped heartbeats"
    status = _STATUS.search(stderr) or _RAISED.search(stderr)
    if status is None:
        return ""
    rpc = _RPC.search(stderr)
    first = re.match(r".*?\.(?=\s|$)", status[2].strip())  # its first sentence
    said = first.group(0) if first else status[2].strip()
    return f"{status[1]}: {said}" + (f" ({rpc[1]})" if rpc else "")


_STATUS = re.compile(r"absl::Status: ([A-Z_]+): ([^\n]*)")
_RPC = re.compile(r"RPC: (\S+)")
_RAISED = re.compile(r"JaxRuntimeError: ([A-Z_]+): ([^\n\[]*)")


def partial_start(*, missing: int = 1, initialization_timeout: int = 1,
                  timeout: float = 60.0) -> Any:
    """Launch two processes of which only one starts (process ``missing`` never comes), with
    ``initialize`` waiting ``initialization_timeout`` seconds for it; return the
    ``ProcessFailed`` the launcher raised when the started process gave up."""
    missing = checks.count("missing", missing, minimum=0, maximum=1)
    initialization_timeout = checks.count("initialization_timeout", initialization_timeout)
    try:
        multihost.launch(misbehave, num_processes=2, devices_per_process=2, timeout=timeout,
                         start=[1 - missing], initialization_timeout=initialization_timeout)
    except multihost.ProcessFailed as failed:
        return failed
    raise RuntimeError(f"a launch without process {missing} ended without a failure")


def _process_id(name: str, value: Any) -> int | None:
    """``None``, or a process id (an integer >= 0; not the string ``'0'``)."""
    return None if value is None else checks.count(name, value, minimum=0)
