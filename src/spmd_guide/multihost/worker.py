"""What each process that :func:`~spmd_guide.multihost.multihost.launch` starts runs:
``python -m spmd_guide.multihost.worker SPEC PROCESS_ID``.

It sets JAX up as one host of a cluster would be set up: its CPU devices, CPU collectives over
gloo listening on the loopback address, and ``jax.distributed.initialize`` with every argument
spelled out (the coordinator, the number of processes, this process's id; no cluster
detection). Then it runs the target (a function named ``"package.module:function"``, whose
JSON-able return value it writes beside ``SPEC``, or a script run as ``__main__``) and leaves
with the others through ``jax.distributed.shutdown``, or at once, with an exit code, if the
target failed, so that no process waits on a dead one.

The page multihost/multihost shows what these processes see and do; the launcher's side
(starting, watching and stopping them) is :mod:`spmd_guide.multihost.multihost`.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from spmd_guide.multihost.multihost import LOOPBACK


def _separate_native_stdout() -> None:
    """Keep Python's prints on stdout and send native libraries' chatter (fd 1) to stderr."""
    python_stdout = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = open(python_stdout, "w", buffering=1, closefd=True)


def _use_loopback_gloo() -> None:
    """Make gloo listen on the loopback address, not on the host name's.

    ``jax.distributed.initialize`` has no argument for it, so the CPU
    backend factory is replaced by one that builds gloo's TCP collectives
    with ``hostname=LOOPBACK``. The backend starts lazily, after
    ``initialize`` made the distributed client that gloo needs.
    """
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    def cpu_client_on_loopback():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client,
            hostname=LOOPBACK)
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory(
        "cpu", cpu_client_on_loopback, priority=0, fail_quietly=False)


def process_main(spec_path: str, process_id: int) -> None:
    """What each launched process runs: set up JAX, join the others, run
    the target, and leave together (or at once, if the target failed)."""
    spec = json.loads(Path(spec_path).read_text())
    _separate_native_stdout()
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", spec["devices_per_process"])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _use_loopback_gloo()
    port = spec["coordinator"].rsplit(":", 1)[1]
    heartbeat = ({} if spec.get("heartbeat_timeout") is None
                 else {"heartbeat_timeout_seconds": spec["heartbeat_timeout"]})
    jax.distributed.initialize(
        coordinator_address=spec["coordinator"],
        coordinator_bind_address=f"{LOOPBACK}:{port}",
        num_processes=spec["num_processes"],
        process_id=process_id,
        initialization_timeout=spec.get("initialization_timeout")
        or max(1, math.ceil(spec["timeout"])),
        cluster_detection_method="deactivate",  # not SLURM's, not a TPU's
        **heartbeat,
    )
    try:
        _run_target(spec, spec_path, process_id)
    except BaseException as error:  # noqa: BLE001 - an exception, or sys.exit() in a script
        code = _report(error)
        if code != 0:
            _exit_now(code)
    sys.stdout.flush()
    jax.distributed.shutdown()


def _run_target(spec: dict[str, Any], spec_path: str, process_id: int) -> None:
    if spec["function"] is not None:
        module_name, name = spec["function"].split(":")
        function = getattr(importlib.import_module(module_name), name)
        value = function(**spec["kwargs"])
        try:
            encoded = json.dumps(value)
        except TypeError as error:
            raise TypeError(f"{spec['function']} must return a JSON-serializable value "
                            f"(numbers, strings, lists, dicts, None): {error}.") from None
        Path(spec_path).with_name(f"{process_id}.json").write_text(encoded)
    else:
        import runpy

        sys.argv = [spec["script"], *spec["args"]]
        runpy.run_path(spec["script"], run_name="__main__")


def _report(error: BaseException) -> int:
    """Print what went wrong to stderr; return the exit code it calls for (0: none)."""
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            return error.code or 0
        print(error.code, file=sys.stderr)
        return 1
    traceback.print_exc()
    return 1


def _exit_now(code: int) -> None:
    """Leave at once. A normal exit would run JAX's shutdown, which waits (minutes) for every
    other process to reach it: a failed process must not sit there while the others wait too."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    process_main(sys.argv[1], int(sys.argv[2]))
