"""A process killed while it saves: the demonstration that a crash during a save loses nothing.

:func:`killed_save` starts a fresh Python on ``n_devices`` CPU devices that restores the
latest step of a checkpoint directory in the layout it was saved in, starts saving the next
step (:func:`spmd_guide.checkpointing.checkpoint.start_save`) and, as soon as the save is
under way, kills itself with ``SIGKILL`` (:func:`_child`): the signal no program can catch, the one a
preempted or out-of-memory machine ends with. What it leaves behind is a temporary step
directory that was never renamed, so the latest *complete* step is still the one before.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from spmd_guide.checkpointing import checkpoint
from spmd_guide.core import checks

__all__ = ["KilledSave", "killed_save"]


def _child(directory: str, step: int, n_devices: int) -> None:
    """What the killed process runs (in a fresh Python, so JAX starts with ``n_devices``)."""
    from spmd_guide import ensure_devices
    ensure_devices(n_devices)
    import jax

    try:
        state = checkpoint.restore(directory, like=checkpoint.saved_layout(directory))
    except Exception as error:  # noqa: BLE001 (reported to the parent, which raises it)
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
        sys.exit(3)
    checkpoint.start_save(directory, jax.tree.map(lambda x: x + 1, state), step=step)
    print(json.dumps(sorted(os.listdir(directory))), flush=True)  # what it sees, then:
    os.kill(os.getpid(), signal.SIGKILL)


_RUN_CHILD = "import sys; from spmd_guide.checkpointing.crash import _child; " \
             "_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))"


@dataclass(frozen=True)
class KilledSave:
    """What the killed process saw and how it ended."""

    signal: str                 # the signal that ended it ("SIGKILL")
    listing_when_killed: list[str]   # the directory's entries the moment before the kill


def killed_save(directory: Any, *, step: int, n_devices: int = 8,
                timeout: float = 120) -> KilledSave:
    """Run a process that starts saving ``step`` into ``directory`` and is killed (SIGKILL)
    mid-write; return how it ended. ``directory`` must hold a complete step (the child
    restores it to have arrays to save) and ``step`` must be new."""
    path = pathlib.Path(checkpoint._directory(directory, must_exist=True))
    step = checks.count("step", step, minimum=0)
    n_devices = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    timeout = checks.real("timeout", timeout, positive=True)
    if checkpoint.latest_step(path) is None:
        raise checks.InputError(
            f"directory {str(path)!r} holds no complete step for the child to start from.")
    if step in checkpoint.steps(path):
        raise checks.InputError(f"step {step} is already complete in {str(path)!r}.")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _RUN_CHILD, str(path), str(step),
                           str(n_devices)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode == 3 and proc.stdout.strip():
        found = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
        raise checks.InputError(
            f"the child process on {n_devices} device(s) could not restore the latest step "
            f"of {str(path)!r} in the layout it was saved in, so it had nothing to save: "
            f"{found}")
    if proc.returncode >= 0 or not proc.stdout.strip():
        raise RuntimeError(f"the child was expected to die by a signal mid-save; it exited "
                           f"with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return KilledSave(signal=signal.Signals(-proc.returncode).name,
                      listing_when_killed=json.loads(proc.stdout.strip().splitlines()[-1]))
