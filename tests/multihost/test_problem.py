"""problem: the Part IV task written once and read back exactly by every process."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import problem


def test_saved_problem_loads_back_exactly(tmp_path):
    dataset, params = problem.example_problem(layer_sizes=[3, 5, 2], num_examples=8, seed=4)
    loaded, loaded_params = problem.load_problem(
        problem.save_problem(tmp_path / "p.npz", layer_sizes=[3, 5, 2], num_examples=8, seed=4))
    assert sorted(loaded) == ["id", "x", "y"] and len(loaded_params) == len(params) == 2
    assert loaded["x"].shape == (8, 3) and loaded["y"].shape == (8, 2)
    np.testing.assert_array_equal(loaded["id"], np.arange(8))
    for key in dataset:
        np.testing.assert_array_equal(loaded[key], dataset[key])
    for (w, b), (lw, lb) in zip(params, loaded_params, strict=True):
        np.testing.assert_array_equal(lw, np.asarray(w))
        np.testing.assert_array_equal(lb, np.asarray(b))


def test_another_seed_gives_another_problem():
    (a, _), (b, _) = problem.example_problem(seed=0), problem.example_problem(seed=1)
    assert not np.array_equal(a["x"], b["x"])


BAD_INPUT = [
    ("layer sizes of one", lambda p: problem.example_problem(layer_sizes=(8,)), InputError,
     "layer_sizes"),
    ("examples 0", lambda p: problem.example_problem(num_examples=0), InputError, "num_examples"),
    ("seed -1", lambda p: problem.example_problem(seed=-1), InputError, "seed"),
    ("save to None", lambda p: problem.save_problem(None), InputTypeError, "file name"),
    ("save to ''", lambda p: problem.save_problem(""), InputError, "path"),
    ("load a number", lambda p: problem.load_problem(3), InputTypeError, "file name"),
    ("no such file", lambda p: problem.load_problem(p / "missing.npz"), InputError,
     "save_problem"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(tmp_path, call, error, word):
    with pytest.raises(error, match=word):
        call(tmp_path)
