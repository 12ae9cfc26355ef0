"""problems: the worked problems' and exercises' answers, and bad input."""

from __future__ import annotations

import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import problems

NAN = float("nan")

def test_worked_problems_answers():
    answers = {p.key: p.value for p in problems.problems()}
    assert len(answers) >= 8
    assert answers["ridge"] == pytest.approx(9.89e14 / 3.35e12)
    assert answers["matmul_batch"] == pytest.approx(250, abs=1)
    assert answers["dp_nvlink"] == pytest.approx(7 / 8 * 9.89e14 / 4.5e11)
    assert answers["dp_network"] == pytest.approx(9.89e14 / 5e10 / 8)  # NIC: 1/8 of the gradient
    network = next(p for p in problems.problems() if p.key == "dp_network")
    assert "flat" in network.answer and "every library" not in network.answer  # review B6
    assert answers["fsdp_fit"] == 7
    assert answers["train_step"] == pytest.approx(6 * 7e9 * 1e6 / (256 * 4.59e14))
    assert answers["tp_ways"] == 12
    assert answers["allgather"] == pytest.approx(7 / 8 * 8192 * 28672 * 2 / 4.5e11)
    assert answers["overlap"] == pytest.approx(4 * 1.97e14 / 9e10)  # per-block balance
    overlap = next(p for p in problems.problems() if p.key == "overlap")
    assert "speedup 1.75" in overlap.answer
    assert answers["decode"] == pytest.approx(14e9 / 4.8e12)
    for p in problems.problems():
        assert p.question.endswith("?") and p.answer


def test_rooflines_exercises_answers():
    answers = {p.key: p.value for p in problems.intensity_exercises()}
    assert answers["f32_intensity"] == pytest.approx(
        2 * 256 * 4096**2 / (2 * (256 * 4096 * 2 + 4096**2)))
    assert answers["b200_batch"] == pytest.approx(2.25e15 / 8e12)


@pytest.mark.parametrize("call, error, word", [
    (lambda: problems.Problem("k", "q?", "a", NAN), InputError, "value"),
    (lambda: problems.Problem("k", "q?", "a", True), InputTypeError, "value"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
