"""worker: the module each launched process runs (its exit code follows how its target ended).

Its setup (CPU devices, gloo on the loopback address, ``jax.distributed.initialize``) runs in
every launch of tests/multihost/test_multihost.py (run as ``python -m``, as the launcher runs
it); here are the parts one process can check.
"""

from __future__ import annotations

import importlib

import pytest

from spmd_guide.multihost import multihost, worker


def test_the_launcher_runs_this_module():
    assert importlib.import_module(multihost.WORKER) is worker
    assert callable(worker.process_main)


@pytest.mark.parametrize("error, code", [
    (SystemExit(), 0), (SystemExit(0), 0), (SystemExit(3), 3), (SystemExit("bye"), 1),
    (ValueError("boom"), 1), (KeyboardInterrupt(), 1),
])
def test_a_process_exit_code_follows_how_its_target_ended(error, code, capsys):
    try:
        raise error
    except BaseException as caught:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        assert worker._report(caught) == code
    if code and not isinstance(error, SystemExit):
        assert type(error).__name__ in capsys.readouterr().err
