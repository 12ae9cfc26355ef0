"""multihost: N local JAX processes over gloo, their output, and clean-up when one misbehaves.

Each launch starts fresh Python processes (about 1-3 s each on 2 cores), so the launches are
few: the chapter's two examples (2 processes x 4 CPU devices), one raising and one hanging
process (2 x 2), one single-process run of the chapter's exercise and one script.
"""

from __future__ import annotations

import math
import os
import socket
import time

import numpy as np
import pytest

from spmd_guide.multihost import multihost_examples
from spmd_guide.multihost.multihost import (
    LOOPBACK,
    WORKER,
    ProcessFailed,
    ProcessResult,
    ProcessTimeout,
    free_port,
    launch,
    service_verdict,
    still_running,
)

EXAMPLES = "spmd_guide.multihost.multihost_examples"


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
        launch(multihost_examples.misbehave, kwargs={"raise_on": object()})
    with pytest.raises(TypeError, match="script takes its inputs from args"):
        launch(script, kwargs={"a": 1})
    with pytest.raises(TypeError, match="pass a function's inputs as kwargs"):
        launch(multihost_examples.misbehave, args=["--x"])
    with pytest.raises(TypeError, match="sequence of strings"):
        launch(script, args=[1])


def test_free_port_is_a_bindable_loopback_port():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind((LOOPBACK, port))


# ------------------------------------------------------------------ the chapter's examples


@pytest.fixture(scope="module")
def described():
    return launch(multihost_examples.describe_process, num_processes=2, devices_per_process=4,
                  timeout=120)


@pytest.mark.slow
def test_two_processes_share_eight_global_devices(described):
    values = [r.value for r in described]
    assert [v["process_index"] for v in values] == [0, 1]
    assert all(v["process_count"] == 2 and len(v["local_devices"]) == 4 for v in values)
    global_ids = values[0]["global_devices"]
    assert len(global_ids) == 8 and values[1]["global_devices"] == global_ids
    assert sorted(values[0]["local_devices"] + values[1]["local_devices"]) == sorted(global_ids)
    for v in values:
        assert {v["device_process"][str(d)] for d in v["local_devices"]} == {v["process_index"]}
    assert_nothing_left(described)


def test_each_process_holds_only_its_rows_of_the_global_array(described):
    for result in described:
        v, p = result.value, result.process_id
        assert v["global_shape"] == [16] and v["fully_addressable"] is False
        rows = [i for s in v["shards"] for i in s["data"]]
        assert rows == list(range(8 * p, 8 * p + 8))
        assert [s["device"] for s in v["shards"]] == v["local_devices"]
        assert all(s["stop"] - s["start"] == 2 for s in v["shards"])
        assert v["other_devices"] == described[1 - p].value["local_devices"]
        assert v["sum"] == sum(range(16))  # computed by one program over both processes
        assert "non-addressable" in v["fetch_error"]
        assert f"process {p} of 2" in result.stdout
        assert "fully addressable: False" in result.stdout
        assert "[Gloo]" not in result.stdout  # native chatter goes to stderr


def test_the_hybrid_mesh_puts_one_process_per_row(described):
    v = described[0].value
    assert v["hybrid_mesh"] == [described[0].value["local_devices"],
                                described[1].value["local_devices"]]


def test_processes_listen_only_on_loopback(described):
    for result in described:
        listening = result.value["listening"]
        if listening is None:
            pytest.skip("no /proc to read sockets from")
        assert listening, "the gloo and coordinator sockets should be listed"
        assert all(a.rsplit(":", 1)[0] == LOOPBACK for a in listening), listening
    assert len(described[0].value["listening"]) > len(described[1].value["listening"])


@pytest.mark.slow
def test_data_parallel_step_over_two_processes_equals_one_process(tmp_path):
    problem = multihost_examples.save_problem(tmp_path / "problem.npz")
    results = launch(multihost_examples.data_parallel_step, num_processes=2, devices_per_process=4,
                     kwargs={"problem": problem, "strategies": ["dp", "fsdp"]}, timeout=120)
    reference = multihost_examples.single_process_step(problem=problem)
    ids = [r.value["ids"] for r in results]
    assert not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == reference["ids"]
    for result in results:
        for strategy in ("dp", "fsdp"):
            got = result.value["steps"][strategy]
            np.testing.assert_allclose(got["loss"], reference["loss"], rtol=1e-5)
            for got_layer, ref_layer in zip(got["grads"], reference["grads"], strict=True):
                for g, r in zip(got_layer, ref_layer, strict=True):
                    np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-5)
            assert f"{strategy} loss" in result.stdout
        assert "loaded examples" in result.stdout
    assert multihost_examples.max_difference(results, reference) < 1e-4
    assert_nothing_left(results)


@pytest.mark.slow
def test_the_naive_loader_runs_across_processes_when_every_process_has_the_batch(tmp_path):
    """sharded_data.md (P6-W2): passing the whole host batch, uncommitted, from every process
    works; it is wasteful (each process loads every example), not impossible."""
    problem = multihost_examples.save_problem(tmp_path / "problem.npz")
    results = launch(multihost_examples.data_parallel_step, num_processes=2, devices_per_process=4,
                     kwargs={"problem": problem, "loader": "naive"}, timeout=120)
    reference = multihost_examples.single_process_step(problem=problem)
    for result in results:
        assert result.value["ids"] == reference["ids"]  # each process loaded the whole batch
        np.testing.assert_allclose(result.value["steps"]["dp"]["loss"], reference["loss"],
                                   rtol=1e-5)
    assert_nothing_left(results)


# ------------------------------------------------------------------ failures


@pytest.mark.slow
def test_a_raising_process_stops_the_others_and_reports_its_output():
    start = time.monotonic()
    with pytest.raises(ProcessFailed) as caught:
        # process 1 raises while process 0 would wait forever: the launcher must stop it.
        launch(multihost_examples.misbehave, num_processes=2, devices_per_process=2, timeout=120,
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
    assert_nothing_left(error.results)


@pytest.mark.slow
def test_a_hanging_process_is_stopped_at_the_time_limit():
    start = time.monotonic()
    with pytest.raises(ProcessTimeout) as caught:
        launch(multihost_examples.misbehave, num_processes=2, devices_per_process=2, timeout=3,
               kwargs={"hang_on": 1})
    elapsed = time.monotonic() - start
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert 3 <= elapsed < 20
    assert 1 in error.still_running and "at the 3 s time limit" in str(error)
    assert all(r.returncode is not None for r in error.results)
    assert_nothing_left(error.results)


@pytest.mark.slow
def test_a_frozen_process_is_declared_dead_and_the_others_terminated():
    """multihost.md: a process that stops sending heartbeats (SIGSTOP: connections open,
    nothing sent) makes JAX's coordination service terminate the others after the heartbeat
    timeout, long before the launcher's time limit."""
    with pytest.raises(ProcessFailed) as caught:
        launch(multihost_examples.freeze, num_processes=2, devices_per_process=2,
               heartbeat_timeout=1, timeout=60)
    error = caught.value
    assert error.process_id == 0 and error.results[0].ended == "signal 6 (SIGABRT)"
    assert error.results[0].seconds < 30
    verdict = service_verdict(error.stderr)
    assert verdict.startswith("Terminating process because the JAX distributed service")
    assert verdict.endswith("(stopped sending heartbeats): 1.")
    assert error.results[1].row()["last line printed"] == "process 1 freezes"
    assert_nothing_left(error.results)


@pytest.mark.slow
def test_a_process_that_exits_is_noticed_like_a_frozen_one():
    """multihost.md (review B1): a process that exits without shutting down (os._exit, a
    crash) does not make the others fail at once over gloo; they wait in the collective
    until the coordination service finds its heartbeats overdue, as for a frozen process.
    Both runs go at once, as on the page, with a 1 s heartbeat timeout."""
    ended = multihost_examples.failure_modes(("stop", "exit"), heartbeat_timeout=1)
    assert sorted(ended) == ["exit", "stop"]
    exited = ended["exit"]
    assert isinstance(exited, ProcessFailed) and exited.process_id == 0
    survivor, gone = exited.results
    assert gone.ended == "exit code 0" and gone.row()["last line printed"] == "process 1 exits"
    assert survivor.ended == "signal 6 (SIGABRT)"
    assert survivor.row()["last line printed"] == "process 0 waits in the second sum"
    assert service_verdict(exited.stderr).endswith("(stopped sending heartbeats): 1.")
    assert gone.seconds < survivor.seconds < 30  # it waited past the exit, then was aborted
    assert ended["stop"].results[0].ended == "signal 6 (SIGABRT)"
    table = multihost_examples.failure_table(ended).rows
    assert [row["coordination service"] for row in table if row["process"] == 0] == [
        "declared 1 dead"] * 2
    for failed in ended.values():
        assert_nothing_left(failed.results)


@pytest.mark.slow
def test_a_process_hanging_alive_keeps_the_others_waiting():
    """multihost.md: a live but stuck process keeps sending heartbeats, so even a 1 s
    heartbeat timeout never fires; only the launcher's time limit ends the run."""
    with pytest.raises(ProcessTimeout) as caught:
        launch(multihost_examples.freeze, num_processes=2, devices_per_process=2,
               heartbeat_timeout=1, timeout=8, kwargs={"how": "hang"})
    error = caught.value
    assert sorted(error.still_running) == [0, 1]
    assert service_verdict(error.results[0].stderr) is None
    assert_nothing_left(error.results)


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
def test_exercise_one_process_of_eight_devices_is_fully_addressable():
    (result,) = launch(multihost_examples.describe_process, num_processes=1, devices_per_process=8,
                       timeout=120)
    v = result.value
    assert v["process_count"] == 1 and len(v["local_devices"]) == 8
    assert v["fully_addressable"] is True and v["fetch_error"] is None
    assert v["other_devices"] == [] and v["sum"] == sum(range(16))
    assert_nothing_left([result])


@pytest.mark.slow
def test_a_script_runs_as_main_with_its_args(tmp_path):
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
    assert_nothing_left([result])


# ------------------------------------------------------------------ the other exercises


def test_saved_problem_loads_back_exactly(tmp_path):
    dataset, params = multihost_examples.example_problem(layer_sizes=[3, 5, 2], num_examples=8, seed=4)
    loaded, loaded_params = multihost_examples.load_problem(
        multihost_examples.save_problem(tmp_path / "p.npz", layer_sizes=[3, 5, 2], num_examples=8, seed=4))
    assert sorted(loaded) == ["id", "x", "y"] and len(loaded_params) == len(params) == 2
    for key in dataset:
        np.testing.assert_array_equal(loaded[key], dataset[key])
    for (w, b), (lw, lb) in zip(params, loaded_params, strict=True):
        np.testing.assert_array_equal(lw, np.asarray(w))
        np.testing.assert_array_equal(lb, np.asarray(b))


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
    ("kwargs a list", lambda: launch(multihost_examples.misbehave, kwargs=[("raise_on", 0)]),
     InputTypeError, "dict"),
    ("kwargs with nan", lambda: launch(multihost_examples.misbehave, kwargs={"raise_on": float("nan")}),
     InputTypeError, "JSON"),
    ("timeout a string", lambda: launch(multihost_examples.misbehave, timeout="60"), InputTypeError,
     "timeout"),
    ("too many processes", lambda: launch(multihost_examples.misbehave, num_processes=10**6),
     InputError, "at most"),
    ("missing script", lambda: launch("no/such/script.py"), InputError, "does not exist"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()

