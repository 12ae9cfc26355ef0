"""train_lm: a run stopped, saved and resumed under another strategy and device count gives
the losses of the run that never stopped (exactly under the same strategy, up to float
rounding across strategies), across epoch boundaries; bad input refused with the disk
untouched."""

from __future__ import annotations

import functools
import os
import pathlib

import jax
import numpy as np
import pytest
from helpers import run_python

from spmd_guide.checkpointing import checkpoint, training
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.transformer import lm

CONFIG = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)
# 3 batches per epoch: a run of 8 steps crosses two epoch boundaries
KW = {"batch": 8, "examples": 24}
#: How close losses of one run under two strategies stay (float32 sums in another order).
TOLERANCE = 1e-5


@functools.cache
def straight(strategy: str, n: int, steps: int = 8) -> tuple[float, ...]:
    return tuple(training.train_lm(CONFIG, strategy=strategy, n_devices=n, steps=steps, **KW))


def _resumed(tmp_path, first: tuple[str, int], second: tuple[str, int], k: int,
             steps: int = 8, save_every: int | None = None) -> list[float]:
    a = training.train_lm(CONFIG, strategy=first[0], n_devices=first[1], steps=k,
                          checkpoint_dir=tmp_path, save_every=save_every, **KW)
    b = training.train_lm(CONFIG, strategy=second[0], n_devices=second[1], steps=steps - k,
                          checkpoint_dir=tmp_path, resume=True, **KW)
    return a + b


@pytest.mark.slow
def test_resume_under_the_same_strategy_is_exact(tmp_path):
    losses = _resumed(tmp_path, ("fsdp", 8), ("fsdp", 8), 4, save_every=1)
    assert tuple(losses) == straight("fsdp", 8)
    assert checkpoint.steps(tmp_path) == [1, 2, 3, 4, 8]
    # the loss falls: it is training, not replaying one batch
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(("first", "second", "k"), [
    pytest.param(("fsdp_tp", 8), ("tp", 4), 4, marks=pytest.mark.slow),
    pytest.param(("fsdp", 8), ("dp", 1), 5, marks=pytest.mark.slow),
    pytest.param(("tp", 4), ("fsdp_tp", 8), 2, marks=pytest.mark.slow),
    pytest.param(("dp", 2), ("tp_sp", 4), 3, marks=pytest.mark.slow),
])
def test_resume_on_another_strategy_and_device_count_equals_never_stopping(
        tmp_path, first, second, k):
    losses = _resumed(tmp_path, first, second, k)
    reference = straight(*first)
    assert training.max_abs_difference(losses, reference) < TOLERANCE
    # the first k losses come from the same program: identical
    assert tuple(losses[:k]) == reference[:k]


@pytest.mark.slow
def test_the_checkpoint_holds_the_data_position(tmp_path):
    training.train_lm(CONFIG, strategy="dp", n_devices=2, steps=4, checkpoint_dir=tmp_path, **KW)
    state = checkpoint.restore(tmp_path, like=training.state_like(CONFIG, strategy="dp",
                                                                   n_devices=1))
    where = {k: int(v) for k, v in state["data"].items()}
    # 4 batches of 3 per epoch: epoch 1, one batch taken
    assert where == {"seed": 0, "epoch": 1, "position": 1, "batch": 8, "examples": 24}
    assert int(state["opt_state"][0].count) == 4


def test_state_like_is_the_layout_the_training_step_keeps():
    run = training.prepare(CONFIG, strategy="fsdp_tp", n_devices=8, batch=8)
    like = training.state_like(CONFIG, strategy="fsdp_tp", n_devices=8)
    assert jax.tree.structure(like) == jax.tree.structure(training.abstract_state(run))
    for a, b in zip(jax.tree.leaves(like), jax.tree.leaves(training.abstract_state(run)),
                    strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert a.sharding.is_equivalent_to(b.sharding, len(a.shape))


@pytest.mark.slow
def test_resume_in_a_process_with_another_device_count(tmp_path):
    """Stopped on 8 devices here, resumed in a fresh process that has only 2."""
    first = training.train_lm(CONFIG, strategy="fsdp_tp", n_devices=8, steps=3,
                              checkpoint_dir=tmp_path, **KW)
    out = run_python(f"""
        from spmd_guide import ensure_devices; ensure_devices(2)
        from spmd_guide.checkpointing import training
        from spmd_guide.transformer import lm
        config = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)
        print(training.train_lm(config, strategy="fsdp", n_devices=2, steps=5, batch=8,
                                examples=24, checkpoint_dir={str(tmp_path)!r}, resume=True))
    """, devices=2)
    rest = [float(x) for x in out.strip().strip("[]").split(",")]
    assert training.max_abs_difference(first + rest, straight("fsdp_tp", 8)) < TOLERANCE


# ---------------------------------------------------------------------------- bad input


def _snapshot(path: pathlib.Path):
    return sorted((str(p), p.stat().st_mtime_ns) for p in path.rglob("*")) if path.exists() \
        else None


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"strategy": "zero"}, InputError, ["strategy", "'fsdp_tp'"]),
    ({"n_devices": 9}, InputError, ["n_devices", "at most 8"]),
    ({"strategy": "tp", "n_devices": 8}, InputError, ["n_heads", "8", "'model'"]),
    ({"strategy": "cp", "n_devices": 8, "config": lm.Config(seq_len=12)}, InputError,
     ["seq_len", "12"]),
    ({"batch": 6}, InputError, ["batch", "6"]),
    ({"steps": 0}, InputError, ["steps"]),
    ({"seed": -1}, InputError, ["seed"]),
    ({"config": {"vocab": 16}}, InputTypeError, ["Config"]),
    ({"save_every": 2}, InputError, ["checkpoint_dir"]),
    ({"resume": True}, InputError, ["checkpoint_dir"]),
    ({"resume": "yes"}, InputTypeError, ["resume"]),
])
def test_bad_arguments_are_refused_before_anything_runs(kwargs, error, words):
    call = {"config": CONFIG, "strategy": "fsdp", "n_devices": 4, "steps": 2, "batch": 8} | kwargs
    with pytest.raises(error) as info:
        training.train_lm(**call)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.slow
def test_resuming_refuses_what_cannot_continue_the_run(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no complete checkpoint"):
        training.train_lm(CONFIG, strategy="dp", n_devices=1, steps=1, checkpoint_dir=empty,
                          resume=True, **KW)
    assert list(empty.iterdir()) == []
    run = tmp_path / "run"
    training.train_lm(CONFIG, strategy="dp", n_devices=1, steps=2, checkpoint_dir=run, **KW)
    before = _snapshot(run)
    with pytest.raises(InputError, match="resume=True"):  # a fresh run into a used directory
        training.train_lm(CONFIG, strategy="dp", n_devices=1, steps=1, checkpoint_dir=run, **KW)
    with pytest.raises(InputError, match="seed=0"):
        training.train_lm(CONFIG, strategy="dp", n_devices=1, steps=1, checkpoint_dir=run,
                          resume=True, seed=1, **KW)
    with pytest.raises(InputError, match="batch=8"):
        training.train_lm(CONFIG, strategy="dp", n_devices=1, steps=1, checkpoint_dir=run,
                          resume=True, batch=4, examples=24)
    with pytest.raises(InputError, match="shape"):  # another model
        training.train_lm(lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=64, n_layers=1,
                                    seq_len=8), strategy="dp", n_devices=1, steps=1,
                          checkpoint_dir=run, resume=True, **KW)
    assert _snapshot(run) == before
    assert checkpoint.steps(run) == [2]


@pytest.mark.slow
def test_exercise_save_every(tmp_path):
    training.train_lm(CONFIG, strategy="fsdp", n_devices=8, steps=10, save_every=4,
                      checkpoint_dir=tmp_path, **KW)
    assert checkpoint.steps(tmp_path) == [4, 8, 10]


def test_max_abs_difference_and_steps_per_epoch():
    assert training.max_abs_difference([1.0, 2.0], [1.0, 2.5]) == 0.5
    with pytest.raises(InputError, match="same length"):
        training.max_abs_difference([1.0], [1.0, 2.0])
    assert training.steps_per_epoch(batch=8, examples=24) == 3
    assert training.steps_per_epoch(batch=np.int64(8), examples=30) == 3


def test_the_loss_is_a_python_float_per_step(tmp_path):
    losses = straight("fsdp", 8)
    assert len(losses) == 8 and all(isinstance(x, float) for x in losses)
    assert os.path.isdir(tmp_path)


def test_helpers_refuse_what_is_not_theirs():
    with pytest.raises(InputTypeError, match="run"):
        training.abstract_state("a run")
    with pytest.raises((InputError, InputTypeError), match="a"):
        training.max_abs_difference("abc", [1.0, 2.0, 3.0])
    with pytest.raises(InputError, match="a\\[1\\]"):
        training.max_abs_difference([1.0, float("nan")], [1.0, 2.0])
    assert training.max_abs_difference(np.array([1.0, 2.0]), [1.0, 2.5]) == 0.5


def test_what_would_fail_at_the_save_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call = {"config": CONFIG, "strategy": "dp", "n_devices": 1, "steps": 1, "batch": 8}
    for kwargs, error, words in [
            ({"seed": 2**31, "checkpoint_dir": tmp_path / "run"}, InputError,
             ["seed", "at most 2147483647"]),
            ({"examples": 2**31}, InputError, ["examples", "at most"]),
            ({"checkpoint_dir": ""}, InputError, ["checkpoint_dir", "current directory"]),
            ({"checkpoint_dir": "  "}, InputError, ["checkpoint_dir"]),
            ({"checkpoint_dir": 3}, InputTypeError, ["checkpoint_dir", "path"]),
            ({"examples": 4}, InputError, ["batch=8", "examples=4"])]:
        with pytest.raises(error) as info:
            training.train_lm(**call | kwargs)
        for word in words:
            assert word in str(info.value), (word, str(info.value))
    assert list(tmp_path.iterdir()) == []


def test_empty_curves_are_refused():
    with pytest.raises(InputError, match="empty"):
        training.max_abs_difference([], [])
