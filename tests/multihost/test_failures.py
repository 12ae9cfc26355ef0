"""failures: a process that freezes, exits (process 1, and process 0, which hosts the
coordination service), hangs alive, or never starts; and the checks before any of it."""

from __future__ import annotations

import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import failures
from spmd_guide.multihost.multihost import (
    ProcessFailed,
    ProcessTimeout,
    launch,
    service_verdict,
)


@pytest.mark.slow
def test_a_frozen_process_is_declared_dead_and_the_others_terminated(nothing_left):
    """multihost.md: a process that stops sending heartbeats (SIGSTOP: connections open,
    nothing sent) makes JAX's coordination service terminate the others after the heartbeat
    timeout, long before the launcher's time limit."""
    with pytest.raises(ProcessFailed) as caught:
        launch(failures.freeze, num_processes=2, devices_per_process=2,
               heartbeat_timeout=1, timeout=60)
    error = caught.value
    assert error.process_id == 0 and error.results[0].ended == "signal 6 (SIGABRT)"
    assert error.results[0].seconds < 30
    verdict = service_verdict(error.stderr)
    assert verdict.startswith("Terminating process because the JAX distributed service")
    assert verdict.endswith("(stopped sending heartbeats): 1.")
    assert error.results[1].row()["last line printed"] == "process 1 freezes"
    nothing_left(error.results)


@pytest.mark.slow
def test_an_exit_is_noticed_like_a_freeze_unless_process_0_exits(nothing_left):
    """multihost.md (review B1, N3): process 1 exiting without shutting down (os._exit, a
    crash) does not make process 0 fail at once; it waits in the collective until the
    coordination service finds the heartbeats overdue, as for a frozen process. Process 0
    exiting takes the service with it: process 1 is terminated at once. The three runs go
    at once, as on the page, with a 1 s heartbeat timeout."""
    ended = failures.failure_modes((("stop", 1), ("exit", 1), ("exit", 0)), heartbeat_timeout=1)
    assert sorted(ended) == [("exit", 0), ("exit", 1), ("stop", 1)]
    exited = ended[("exit", 1)]
    assert isinstance(exited, ProcessFailed) and exited.process_id == 0
    survivor, gone = exited.results
    assert gone.ended == "exit code 0" and gone.row()["last line printed"] == "process 1 exits"
    assert survivor.ended == "signal 6 (SIGABRT)"
    assert survivor.row()["last line printed"] == "process 0 waits in the second sum"
    assert service_verdict(exited.stderr).endswith("(stopped sending heartbeats): 1.")
    assert gone.seconds < survivor.seconds < 30  # it waited past the exit, then was aborted
    assert ended[("stop", 1)].results[0].ended == "signal 6 (SIGABRT)"

    first_gone, other = ended[("exit", 0)].results
    assert first_gone.ended == "exit code 0"
    # Its all-reduce fails ("Connection closed by peer": exit code 1) as the runtime aborts
    # it for the lost service (SIGABRT): whichever comes first, it comes at once.
    assert other.ended in ("exit code 1", "signal 6 (SIGABRT)")
    assert service_verdict(other.stderr) is None  # nobody declared dead: the service is gone
    assert failures.short_verdict(other.stderr).startswith("UNAVAILABLE: ")
    assert other.seconds - first_gone.seconds < 1.0  # at once, not after a heartbeat timeout

    table = failures.failure_table(ended).rows
    assert [row["why"] for row in table if row["case"].startswith("process 1")
            and row["process"] == 0] == ["service: process 1 stopped heartbeats"] * 2
    for failed in ended.values():
        nothing_left(failed.results)


@pytest.mark.slow
def test_a_process_hanging_alive_keeps_the_others_waiting(nothing_left):
    """multihost.md: a live but stuck process keeps sending heartbeats, so even a 1 s
    heartbeat timeout never fires; only the launcher's time limit ends the run."""
    with pytest.raises(ProcessTimeout) as caught:
        launch(failures.freeze, num_processes=2, devices_per_process=2,
               heartbeat_timeout=1, timeout=8, kwargs={"how": "hang"})
    error = caught.value
    assert sorted(error.still_running) == [0, 1]
    assert service_verdict(error.results[0].stderr) is None
    nothing_left(error.results)


@pytest.mark.slow
@pytest.mark.parametrize("missing", [0, 1])
def test_a_process_that_never_starts_fails_the_other_in_initialize(missing, nothing_left):
    """multihost.md: with one process missing, initialize waits initialization_timeout, then
    the process is terminated (SIGABRT), its RegisterTask call past its deadline."""
    failed = failures.partial_start(missing=missing, initialization_timeout=1)
    (alone,) = failed.results
    assert alone.process_id == 1 - missing and alone.ended == "signal 6 (SIGABRT)"
    assert alone.stdout == ""  # misbehave never ran: initialize did not return
    assert failures.short_verdict(alone.stderr) == (
        "DEADLINE_EXCEEDED: Deadline Exceeded (/xla.coordination.CoordinationService/"
        "RegisterTask)")
    nothing_left(failed.results)


def test_short_verdicts_read_the_runtime_s_words():
    heartbeats = ("Terminating process because the JAX distributed service detected fatal "
                  "errors. absl::Status: UNAVAILABLE: The following tasks are unhealthy "
                  "(stopped sending heartbeats):\n1\nThe tasks have crashed.")
    assert failures.short_verdict(heartbeats) == "service: process 1 stopped heartbeats"
    lost = ("x absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either "
            "the leader died.\nmore")
    assert failures.short_verdict(lost) == (
        "UNAVAILABLE: Failed to send RPC to coordination service.")
    assert failures.short_verdict("Traceback: ValueError") == ""
    raised = ("jax.errors.JaxRuntimeError: UNKNOWN: Gloo context initialization failed: "
              "DEADLINE_EXCEEDED: GetKeyValue() timed out [type.googleapis.com/x='']")
    assert failures.short_verdict(raised) == (
        "UNKNOWN: Gloo context initialization failed: DEADLINE_EXCEEDED: GetKeyValue() timed "
        "out")


BAD_INPUT = [
    ("frozen beyond the processes", lambda: failures.freeze(frozen=1), InputError, "frozen"),
    ("freeze how", lambda: failures.freeze(frozen=0, how="sleep"), InputError, "how"),
    ("cases a string", lambda: failures.failure_modes("exit"), InputTypeError, "cases"),
    ("cases of strings", lambda: failures.failure_modes(["exit"]), InputTypeError, "cases"),
    ("case way unknown", lambda: failures.failure_modes([("crash", 1)]), InputError,
     "choose one of"),
    ("case process 2", lambda: failures.failure_modes([("exit", 2)]), InputError,
     "frozen process"),
    ("case twice", lambda: failures.failure_modes([("exit", 1), ("exit", 1)]), InputError,
     "twice"),
    ("heartbeat 0 s", lambda: failures.failure_modes(heartbeat_timeout=0), InputError,
     "heartbeat_timeout"),
    ("missing 2", lambda: failures.partial_start(missing=2), InputError, "missing"),
    ("init timeout 0", lambda: failures.partial_start(initialization_timeout=0), InputError,
     "initialization_timeout"),
    ("raise_on '0'", lambda: failures.misbehave(raise_on="0"), InputTypeError, "raise_on"),
    ("hang_on -1", lambda: failures.misbehave(hang_on=-1), InputError, "hang_on"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_the_kept_run_of_the_slow_cases_says_what_the_page_reads():
    """multihost.md shows benchmarks/results/multihost_edges.json (benchmarks/multihost_edges.py):
    a partial start ends in SIGABRT on RegisterTask's deadline whichever process is missing,
    a save by process 0 alone leaves nothing on disk and one by both a step, and process 0's
    exit ends process 1 at once even at the default heartbeat timeout of 100 s."""
    from pathlib import Path

    from spmd_guide.core import results

    kept = results.load(Path(__file__).parents[2] / "benchmarks/results/multihost_edges.json")
    rows = {(r["case"].split(" (")[0], r["process"]): r for r in kept.rows}
    for missing in (0, 1):
        alone = rows[(f"partial start: process {missing} never starts", 1 - missing)]
        assert alone["ended"] == "signal 6 (SIGABRT)"
        assert alone["why"].startswith("DEADLINE_EXCEEDED") and "RegisterTask" in alone["why"]
    assert all(rows[("Orbax save by process 0 alone", p)]["why"].endswith("nothing on disk")
               for p in (0, 1))
    assert all(rows[("Orbax save by every process", p)]["why"] == "step on disk"
               for p in (0, 1))
    first, other = (rows[("process 0 exits, heartbeat timeout 100 s", p)] for p in (0, 1))
    assert other["after (s)"] - first["after (s)"] < 1.0
    assert other["why"].startswith("UNAVAILABLE")
