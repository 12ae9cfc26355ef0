"""multihost_examples: the Part VIII programs called in this one process (process 0 of 1), where
they must agree with the one-device reference and refuse bad input before doing anything."""

from __future__ import annotations

import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import multihost_examples


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return multihost_examples.save_problem(tmp_path_factory.mktemp("problem") / "problem.npz")


def test_a_strategy_with_a_2d_batch_layout_steps_like_one_device(problem):
    strategies = ["tp"]  # its batch layout is 2-D; the ids are 1-D
    reference = multihost_examples.single_process_step(problem=problem)
    value = multihost_examples.data_parallel_step(problem=problem, strategies=strategies)
    assert sorted(value["steps"]) == sorted(strategies)
    assert value["ids"] == reference["ids"]
    for step in value["steps"].values():
        assert step["loss"] == pytest.approx(reference["loss"], rel=1e-5)


BAD_INPUT = [
    ("strategies a string", lambda p: multihost_examples.data_parallel_step(problem=p, strategies="dp"),
     InputTypeError, r"\('dp',\)"),
    ("strategies empty", lambda p: multihost_examples.data_parallel_step(problem=p, strategies=()),
     InputError, "at least one"),
    ("unknown strategy", lambda p: multihost_examples.data_parallel_step(problem=p, strategies=["dq"]),
     InputError, "choose one of"),
    ("batch size 0", lambda p: multihost_examples.data_parallel_step(problem=p, batch_size=0),
     InputError, "batch_size"),
    ("no problem file", lambda p: multihost_examples.data_parallel_step(problem=p + ".missing"),
     InputError, "save_problem"),
    ("problem not a path", lambda p: multihost_examples.load_problem(3), InputTypeError, "file name"),
    ("rows_per_device 0", lambda p: multihost_examples.describe_process(rows_per_device=0), InputError,
     "rows_per_device"),
    ("frozen beyond the processes", lambda p: multihost_examples.freeze(frozen=1), InputError,
     "frozen"),
    ("freeze how", lambda p: multihost_examples.freeze(frozen=0, how="sleep"), InputError, "how"),
    ("failure ways a string", lambda p: multihost_examples.failure_modes("exit"), InputTypeError,
     "hows"),
    ("failure way unknown", lambda p: multihost_examples.failure_modes(["crash"]), InputError,
     "choose one of"),
    ("failure way twice", lambda p: multihost_examples.failure_modes(["exit", "exit"]),
     InputError, "twice"),
    ("heartbeat 0 s", lambda p: multihost_examples.failure_modes(heartbeat_timeout=0),
     InputError, "heartbeat_timeout"),
    ("unknown loader", lambda p: multihost_examples.data_parallel_step(problem=p, loader="fast"),
     InputError, "loader"),
    ("rows_per_device -1", lambda p: multihost_examples.describe_process(rows_per_device=-1),
     InputError, "rows_per_device"),
    ("raise_on '0'", lambda p: multihost_examples.misbehave(raise_on="0"), InputTypeError, "raise_on"),
    ("hang_on -1", lambda p: multihost_examples.misbehave(hang_on=-1), InputError, "hang_on"),
    ("layer sizes of one", lambda p: multihost_examples.example_problem(layer_sizes=(8,)), InputError,
     "layer_sizes"),
    ("examples 0", lambda p: multihost_examples.example_problem(num_examples=0), InputError,
     "num_examples"),
    ("save to None", lambda p: multihost_examples.save_problem(None), InputTypeError, "file name"),
    ("compare a string", lambda p: multihost_examples.compare_to_reference("r", {}), InputTypeError,
     "launch"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(problem, call, error, word):
    with pytest.raises(error, match=word):
        call(str(problem))


def test_reference_table_prints_rounded_numbers(problem):
    """multihost.md: the table shows losses to 6 decimals and the gap as 1.0e-06, never a raw
    float such as 28.501689910888672."""
    from types import SimpleNamespace

    reference = multihost_examples.single_process_step(problem=problem)
    value = multihost_examples.data_parallel_step(problem=problem, strategies=["dp"])
    results = [SimpleNamespace(process_id=0, value=value)]
    raw = multihost_examples.compare_to_reference(results, reference)
    (row,) = multihost_examples.reference_table(results, reference).rows
    assert row["loss"] == f"{raw[0]['loss']:.6f}" and len(row["loss"].split(".")[1]) == 6
    assert row["1-process loss"] == f"{reference['loss']:.6f}"
    assert row["largest |gradient difference|"] == f"{raw[0]['max |grad diff|']:.1e}"
    assert row["process"] == 0 and row["strategy"] == "dp"
