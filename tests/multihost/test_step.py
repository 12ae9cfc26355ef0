"""step: one training step in every process against the one-device reference (in this one
process too, where it must agree and refuse bad input before doing anything), and the sharded
checkpoint every process then saves and restores."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import problem as problems
from spmd_guide.multihost import step
from spmd_guide.multihost.multihost import launch


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return problems.save_problem(tmp_path_factory.mktemp("problem") / "problem.npz")


def test_a_strategy_with_a_2d_batch_layout_steps_like_one_device(problem):
    strategies = ["tp"]  # its batch layout is 2-D; the ids are 1-D
    reference = step.single_process_step(problem=problem)
    value = step.data_parallel_step(problem=problem, strategies=strategies)
    assert sorted(value["steps"]) == sorted(strategies) and "saved" not in value
    assert value["ids"] == reference["ids"]
    for got in value["steps"].values():
        assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5)


def test_reference_table_prints_rounded_numbers(problem):
    """multihost.md: the table shows losses to 6 decimals and the gap as 1.0e-06, never a raw
    float such as 28.501689910888672."""
    reference = step.single_process_step(problem=problem)
    value = step.data_parallel_step(problem=problem, strategies=["dp"])
    results = [SimpleNamespace(process_id=0, value=value)]
    raw = step.compare_to_reference(results, reference)
    (row,) = step.reference_table(results, reference).rows
    assert row["loss"] == f"{raw[0]['loss']:.6f}" and len(row["loss"].split(".")[1]) == 6
    assert row["1-process loss"] == f"{reference['loss']:.6f}"
    assert row["largest |gradient difference|"] == f"{raw[0]['max |grad diff|']:.1e}"
    assert row["process"] == 0 and row["strategy"] == "dp"


@pytest.mark.slow
def test_data_parallel_step_over_two_processes_equals_one_process_and_saves(tmp_path,
                                                                          nothing_left):
    problem = problems.save_problem(tmp_path / "problem.npz")
    results = launch(step.data_parallel_step, num_processes=2, devices_per_process=4,
                     kwargs={"problem": problem, "strategies": ["dp", "fsdp"],
                             "checkpoint_dir": str(tmp_path / "saved")}, timeout=120)
    reference = step.single_process_step(problem=problem)
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
        saved = result.value["saved"]
        assert saved["restored_equal"] is True
        assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(saved["entries"])
    assert step.max_difference(results, reference) < 1e-4
    nothing_left(results)


@pytest.mark.slow
def test_the_naive_loader_runs_across_processes_when_every_process_has_the_batch(
        tmp_path, nothing_left):
    """sharded_data.md (P6-W2): passing the whole host batch, uncommitted, from every process
    works; it is wasteful (each process loads every example), not impossible."""
    problem = problems.save_problem(tmp_path / "problem.npz")
    results = launch(step.data_parallel_step, num_processes=2, devices_per_process=4,
                     kwargs={"problem": problem, "loader": "naive"}, timeout=120)
    reference = step.single_process_step(problem=problem)
    for result in results:
        assert result.value["ids"] == reference["ids"]  # each process loaded the whole batch
        np.testing.assert_allclose(result.value["steps"]["dp"]["loss"], reference["loss"],
                                   rtol=1e-5)
    nothing_left(results)


BAD_INPUT = [
    ("strategies a string", lambda p: step.data_parallel_step(problem=p, strategies="dp"),
     InputTypeError, r"\('dp',\)"),
    ("strategies empty", lambda p: step.data_parallel_step(problem=p, strategies=()),
     InputError, "at least one"),
    ("unknown strategy", lambda p: step.data_parallel_step(problem=p, strategies=["dq"]),
     InputError, "choose one of"),
    ("batch size 0", lambda p: step.data_parallel_step(problem=p, batch_size=0),
     InputError, "batch_size"),
    ("no problem file", lambda p: step.data_parallel_step(problem=p + ".missing"),
     InputError, "save_problem"),
    ("unknown loader", lambda p: step.data_parallel_step(problem=p, loader="fast"),
     InputError, "loader"),
    ("checkpoint dir ''", lambda p: step.data_parallel_step(problem=p, checkpoint_dir=""),
     InputError, "checkpoint_dir"),
    ("checkpoint dir 3", lambda p: step.data_parallel_step(problem=p, checkpoint_dir=3),
     InputTypeError, "checkpoint_dir"),
    ("compare a string", lambda p: step.compare_to_reference("r", {}), InputTypeError,
     "launch"),
    ("reference not a step", lambda p: step.compare_to_reference([], None), InputTypeError,
     "single_process_step"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(problem, call, error, word):
    with pytest.raises(error, match=word):
        call(str(problem))
