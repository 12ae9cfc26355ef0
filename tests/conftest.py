"""Test setup: one process with 8 CPU mock devices (see ``helpers``), and its fixtures.

The CPU device count is fixed once JAX's backends start, so ``helpers`` sets it on import,
before any test module imports JAX. Most "on 1, 2, 4 and 8 devices" checks need no new
process: build a mesh over the first k of the 8 devices (``helpers.mesh_of(k)``). A check
whose subject *is* the process's device count uses ``helpers.run_python``.
"""

from __future__ import annotations

import sys

import pytest
from helpers import DEVICES

# pytest rewrites each test module's asserts on import and caches the result in __pycache__,
# unless Python is told not to write bytecode (PYTHONDONTWRITEBYTECODE, set on some machines):
# then every run pays the rewrite again (about 4 s of the suite). Test modules are imported
# after this file, so their rewritten code is cached from here on.
sys.dont_write_bytecode = False


def pytest_configure(config):
    """``SPMD_COMPILE_COUNTS=<file>``: record each test's XLA compiles (``compile_counts``)."""
    import os

    path = os.environ.get("SPMD_COMPILE_COUNTS")
    if path:
        from compile_counts import Plugin

        config.pluginmanager.register(Plugin(path), "spmd_compile_counts")


@pytest.fixture(scope="session")
def devices():
    """The session's 8 CPU devices."""
    return DEVICES
