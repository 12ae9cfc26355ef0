"""multihost: the launcher of N local JAX processes over gloo, their output, and clean-up when
one misbehaves (what the processes run is tested beside its own module).

Each launch starts fresh Python processes (about 1-3 s each on 2 cores), so the launches are
few and slow-marked: one raising and one hanging process (2 x 2), a partial start, and one
script.
"""

from __future__ import annotations

import math
import socket
import time

import pytest

from spmd_guide.multihost import failures
from spmd_guide.multihost.multihost import (
    LOOPBACK,
    ProcessFailed,
    ProcessResult,
    ProcessTimeout,
    free_port,
    launch,
    service_verdict,
    still_running,
)

EXAMPLES = "spmd_guide.multihost.failures"


# ------------------------------------------------------------------ arguments, before any launch


@pytest.mark.parametrize("options, message", [
    ({"num_processes": 0}, "num_processes must be"),
    ({"num_processes": 1.5}, "num_processes must be"),
    ({"num_processes": True}, "num_processes must be"),
    ({"devices_per_process": 0}, "devices_per_process must be"),
    ({"timeout": 0}, r"timeout \(seconds\) must be"),
    ({"timeout": -1.0}, r"timeout \(seconds\) must be"),
    ({"timeout": math.inf}, r"timeout \(seconds\) must be"),
    ({"timeout": math.nan}, r"timeout \(seconds\) must be"),
    ({"heartbeat_timeout": 0}, "heartbeat_timeout must be"),
    ({"heartbeat_timeout": 1.5}, "heartbeat_timeout must be"),
    ({"initialization_timeout": 0}, "initialization_timeout must be"),
    ({"initialization_timeout": 0.5}, "initialization_timeout must be"),
    ({"start": [2]}, "start must be"),
    ({"start": [-1]}, "start must be"),
    ({"start": [0, 0]}, "twice"),
    ({"start": []}, "at least one process"),
    ({"start": [True]}, "start must be"),
])
def test_bad_counts_and_time_limits_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        launch(f"{EXAMPLES}:misbehave", **options)


def _nested():
    def inner():
        return 1
    return inner


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz:main", "cannot import module 'no_such_module_xyz'"),
    (f"{EXAMPLES}:no_such_function", "has no function 'no_such_function'"),
    (f"{EXAMPLES}:LOOPBACK_NOT_THERE", "has no function"),
    ("spmd_guide.multihost.multihost:LOOPBACK", "has no function 'LOOPBACK'"),
    ("misbehave", "target must be a function, 'package.module:function'"),
    (42, "target must be a function"),
    ("/no/such/script.py", "does not exist"),
    (lambda: 1, "cannot be imported by the other processes"),
    (_nested(), "cannot be imported by the other processes"),
])
def test_targets_that_other_processes_cannot_import_are_refused(target, message):
    with pytest.raises(ValueError, match=message):
        launch(target)


def test_inputs_of_the_wrong_kind_are_refused(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    with pytest.raises(TypeError, match="JSON-serializable"):
        launch(failures.misbehave, kwargs={"raise_on": object()})
    with pytest.raises(TypeError, match="script takes its inputs from args"):
        launch(script, kwargs={"a": 1})
    with pytest.raises(TypeError, match="pass a function's inputs as kwargs"):
        launch(failures.misbehave, args=["--x"])
    with pytest.raises(TypeError, match="sequence of strings"):
        launch(script, args=[1])
    with pytest.raises(TypeError, match="list of process ids"):
        launch(script, start="0")


def test_free_port_is_a_bindable_loopback_port():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind((LOOPBACK, port))


# ------------------------------------------------------------------ failures


@pytest.mark.slow
def test_a_raising_process_stops_the_others_and_reports_its_output(nothing_left):
    start = time.monotonic()
    with pytest.raises(ProcessFailed) as caught:
        # process 1 raises while process 0 would wait forever: the launcher must stop it.
        launch(failures.misbehave, num_processes=2, devices_per_process=2, timeout=120,
               kwargs={"raise_on": 1, "hang_on": 0})
    elapsed = time.monotonic() - start
    error = caught.value
    assert not isinstance(error, ProcessTimeout) and elapsed < 60
    assert error.process_id == 1 and error.returncode == 1
    assert "gives up on purpose" in error.stderr and "gives up on purpose" in str(error)
    assert str(error).splitlines()[0].endswith("the other processes were stopped.")
    assert "process 1 of 2" in str(error) and "exited with code 1" in str(error)
    assert "process 1 started" in error.stdout
    assert error.results[0].returncode == -9  # process 0 was killed, not left waiting
    nothing_left(error.results)


@pytest.mark.slow
def test_a_hanging_process_is_stopped_at_the_time_limit(nothing_left):
    start = time.monotonic()
    with pytest.raises(ProcessTimeout) as caught:
        launch(failures.misbehave, num_processes=2, devices_per_process=2, timeout=3,
               kwargs={"hang_on": 1})
    elapsed = time.monotonic() - start
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert 3 <= elapsed < 20
    assert 1 in error.still_running and "at the 3 s time limit" in str(error)
    assert all(r.returncode is not None for r in error.results)
    nothing_left(error.results)


def test_how_a_process_ended_reads_as_words():
    killed = ProcessResult(0, -6, "a\nlast words\n", "", seconds=2.04)
    assert killed.ended == "signal 6 (SIGABRT)" and ProcessResult(1, 3, "", "").ended == "exit code 3"
    assert killed.row() == {"process": 0, "ended": "signal 6 (SIGABRT)", "after (s)": "2.0",
                            "last line printed": "last words"}
    assert ProcessResult(0, -200, "", "").ended == "signal 200"
    text = ("E1 ... Terminating process because the JAX distributed service detected fatal "
            "errors. This most likely ... absl::Status: UNAVAILABLE: The following tasks are "
            "unhealthy (stopped sending heartbeats):\n1, 2\nThe tasks have crashed.")
    assert service_verdict(text) == (
        "Terminating process because the JAX distributed service detected fatal errors. The "
        "following tasks are unhealthy (stopped sending heartbeats): 1, 2.")
    assert service_verdict("Traceback: ValueError") is None
    with pytest.raises(InputTypeError, match="stderr"):
        service_verdict(None)


# ------------------------------------------------------------------ one process, a script


@pytest.mark.slow
def test_a_script_runs_as_main_with_its_args(tmp_path, nothing_left):
    script = tmp_path / "hello.py"
    script.write_text(
        "import sys, jax\n"
        "if __name__ == '__main__':\n"
        "    print('args', sys.argv[1:], 'devices', jax.device_count(),\n"
        "          'processes', jax.process_count())\n"
        "    sys.exit(0)  # a clean exit is not a failure\n")
    (result,) = launch(script, num_processes=1, devices_per_process=3, args=["--flag", "x"],
                       timeout=120)
    assert result.returncode == 0 and result.value is None
    assert result.stdout.strip() == "args ['--flag', 'x'] devices 3 processes 1"
    nothing_left([result])


# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402

BAD_INPUT = [
    ("still_running of a hand-made result", lambda: still_running(
        [ProcessResult(process_id=0, returncode=0, stdout="", stderr="")]), InputError,
     "os_pid"),
    ("still_running of one result", lambda: still_running(
        ProcessResult(process_id=0, returncode=0, stdout="", stderr="", os_pid=1)),
     InputTypeError, "list of ProcessResult"),
    ("still_running of ints", lambda: still_running([1234]), InputTypeError, "ProcessResult"),
    ("kwargs a list", lambda: launch(failures.misbehave, kwargs=[("raise_on", 0)]),
     InputTypeError, "dict"),
    ("kwargs with nan", lambda: launch(failures.misbehave, kwargs={"raise_on": float("nan")}),
     InputTypeError, "JSON"),
    ("timeout a string", lambda: launch(failures.misbehave, timeout="60"), InputTypeError,
     "timeout"),
    ("too many processes", lambda: launch(failures.misbehave, num_processes=10**6),
     InputError, "at most"),
    ("missing script", lambda: launch("no/such/script.py"), InputError, "does not exist"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()



@pytest.mark.slow
def test_a_partial_start_names_the_started_process_and_leaves_nothing(nothing_left):
    """start=[1]: process 1 of 2 runs alone; its initialize gives up after 1 s, and the
    error names it as started alone."""
    with pytest.raises(ProcessFailed) as caught:
        launch(failures.misbehave, num_processes=2, devices_per_process=2, start=[1],
               initialization_timeout=1, timeout=60)
    error = caught.value
    assert [r.process_id for r in error.results] == [1] and error.process_id == 1
    assert "process 1 of 2 (started: [1])" in str(error)
    assert error.results[0].stdout == ""  # it never got past initialize
    nothing_left(error.results)
