"""Fixtures of the Part VIII tests: the one launch of the quick suite (the page's
``describe_process``, 2 processes x 4 CPU devices), shared by the modules that read it, and the
check that a launch leaves nothing running."""

from __future__ import annotations

import os

import pytest

from spmd_guide.multihost import describe
from spmd_guide.multihost.multihost import WORKER, ProcessResult, launch, still_running


@pytest.fixture(scope="session")
def described():
    return launch(describe.describe_process, num_processes=2, devices_per_process=4,
                  timeout=120)


@pytest.fixture
def nothing_left():
    """The check that no launched process is left: call it on a launch's results."""
    return assert_nothing_left


def assert_nothing_left(results: list[ProcessResult]) -> None:
    """No launched process, nor anything in its process group, is still running or a zombie."""
    assert results and all(r.os_pid > 0 for r in results)
    assert still_running(results) == []
    for result in results:
        with pytest.raises(ProcessLookupError):
            os.killpg(result.os_pid, 0)
        with pytest.raises(ProcessLookupError):
            os.kill(result.os_pid, 0)
    if os.path.isdir("/proc"):
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():  # fields[1] is the parent's pid
                with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                    children.append(cmd.read().replace(b"\0", b" ").decode())
        assert not [c for c in children if WORKER in c], children
