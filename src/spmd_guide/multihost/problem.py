"""The Part IV regression task as files that every process reads, as the hosts of a cluster
read the same files: the dataset (``x``, ``y`` and each example's ``id``) and the MLP's
initial parameters, written once by :func:`save_problem` and read by :func:`load_problem`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np

from spmd_guide.core import checks
from spmd_guide.nn import Params, init_mlp, make_regression_batch


def example_problem(*, layer_sizes: Sequence[int] = (8, 16, 8), num_examples: int = 64,
                    seed: int = 0) -> tuple[dict[str, np.ndarray], Params]:
    """The Part IV regression task as a dataset (``x``, ``y`` and each example's ``id``) and
    the MLP's initial parameters, both from ``seed``."""
    layer_sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    num_examples = checks.count("num_examples", num_examples)
    seed = checks.count("seed", seed, minimum=0)
    (x, y), params = _make_problem(seed, sizes=tuple(layer_sizes), num_examples=num_examples)
    dataset = {"x": np.asarray(x), "y": np.asarray(y),
               "id": np.arange(num_examples, dtype=np.int32)}
    return dataset, params


@partial(jax.jit, static_argnames=("sizes", "num_examples"))  # one compilation, not one per op
def _make_problem(seed: int, *, sizes: tuple[int, ...], num_examples: int):
    data = make_regression_batch(jax.random.key(seed), num_examples, sizes[0], sizes[-1])
    return data, init_mlp(jax.random.key(seed + 1), sizes)


def save_problem(path: str | os.PathLike[str], **options: Any) -> str:
    """Write :func:`example_problem` (``options`` are its arguments) to an ``.npz`` file; return
    its path. The launched processes read it, as the hosts of a cluster read the same files."""
    path = checks.path("path", path, what="a file name")
    dataset, params = example_problem(**options)
    layers = {f"{kind}{i}": np.asarray(array) for i, layer in enumerate(params)
              for kind, array in zip("wb", layer, strict=True)}
    np.savez(path, **dataset, **layers)
    return os.fspath(path)


def load_problem(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], Params]:
    """The dataset and parameters written by :func:`save_problem`, as NumPy arrays."""
    path = checks.path("path", path, what="a file name")
    if not Path(path).is_file():
        raise checks.InputError(f"no problem file {os.fspath(path)!r}: write it with "
                                "save_problem(path) first.")
    with np.load(path) as saved:
        dataset = {key: saved[key] for key in ("x", "y", "id")}
        params = [(saved[f"w{i}"], saved[f"b{i}"])
                  for i in range(sum(key.startswith("w") for key in saved.files))]
    return dataset, params
