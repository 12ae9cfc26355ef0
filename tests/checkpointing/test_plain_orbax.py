"""plain_orbax: the plain Orbax calls save on 8 devices and restore, exactly and in the
target's layout, onto sub-meshes and in fresh processes with other device counts; a target
without shardings fails on fewer devices; every refused call leaves the disk as it was."""

from __future__ import annotations

import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import DEVICES, mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import plain_orbax as po
from spmd_guide.core.checks import InputError, InputTypeError


def _mesh(n: int, devices=None):
    devices = list(DEVICES if devices is None else devices)
    return jax.make_mesh((n // 2, 2), ("data", "model"), devices=devices[:n],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _state(width: int = 16):
    return jax.device_put(po.example_state(width=width), po.example_shardings(_mesh(8)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain") / "run"
    state = _state()
    po.save(directory, state, step=7,
            save_args=jax.tree.map(lambda _: ocp.SaveArgs(), state))
    return directory, state


def _check_equal_and_laid_out(restored, state, target):
    for got, want, wanted in zip(jax.tree.leaves(restored), jax.tree.leaves(state),
                                 jax.tree.leaves(target), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.dtype == want.dtype
        assert got.sharding.is_equivalent_to(wanted.sharding, got.ndim)


@pytest.mark.parametrize("n, start", [(4, 4), (2, 0), (8, 0)])
def test_restore_onto_sub_meshes(saved, n, start):
    directory, state = saved
    mesh = _mesh(n, DEVICES[start:])
    target = po.abstract_target(jax.eval_shape(lambda: po.example_state(width=16)),
                                po.example_shardings(mesh))
    restored = po.restore(directory, target)
    _check_equal_and_laid_out(restored, state, target)
    assert {d.id for a in jax.tree.leaves(restored) for d in a.sharding.device_set} == {
        d.id for d in DEVICES[start:start + n]}


def test_restore_in_a_fresh_process_with_4_devices(tmp_path):
    state = jax.device_put(po.example_state(), po.example_shardings(_mesh(8)))
    po.save(tmp_path / "run", state, step=7)
    report, values = po.restore_elsewhere(tmp_path / "run", n_devices=4)
    assert report["devices"] == 4 and report["mesh"] == {"data": 2, "model": 2}
    names = ["params.b", "params.w", "step"]
    for name, want in zip(names, jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(values[name], np.asarray(want))
        assert report["leaves"][name]["as the target says"]
        assert report["leaves"][name]["devices"] == 4
    assert report["leaves"]["params.w"]["piece"] == [32, 16]
    assert report["without shardings"].startswith("ValueError: Topology mismatch")


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 1])
def test_restore_in_fresh_processes_with_fewer_devices(tmp_path, n):
    state = jax.device_put(po.example_state(), po.example_shardings(_mesh(8)))
    po.save(tmp_path / "run", state, step=7)
    report, values = po.restore_elsewhere(tmp_path / "run", n_devices=n)
    assert report["devices"] == n
    for name, want in zip(["params.b", "params.w", "step"], jax.tree.leaves(state),
                          strict=True):
        np.testing.assert_array_equal(values[name], np.asarray(want))
        assert report["leaves"][name]["as the target says"]
    assert "Topology mismatch" in report["without shardings"]


def test_exercise_answer(saved):
    """A target without shardings, in the process that saved: the saved layout."""
    directory, state = saved
    bare = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    restored = po._restore(pathlib.Path(directory), bare, None)
    _check_equal_and_laid_out(restored, state, state)


# --------------------------------------------------------------------------- refusals


def _snapshot(path: pathlib.Path) -> list[tuple[str, int, int]]:
    if not path.exists():
        return []
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in path.rglob("*"))


def _target(n: int = 4, **changes):
    target = po.abstract_target(jax.eval_shape(lambda: po.example_state(width=16)),
                                po.example_shardings(_mesh(n)))
    target["params"].update(changes)
    return target


SAVE_BAD = {
    "directory ''": (lambda d, s: po.save("", s, step=1), InputError, "must not be empty"),
    "directory Path('')": (lambda d, s: po.save(pathlib.Path(""), s, step=1), InputError,
                           "must not be empty"),
    "directory None": (lambda d, s: po.save(None, s, step=1), InputTypeError, "directory"),
    "directory a file": (lambda d, s: po.save(d / "file.txt", s, step=1), InputError,
                         "is a file"),
    "step -1": (lambda d, s: po.save(d / "run", s, step=-1), InputError, "step must be at least 0"),
    "step True": (lambda d, s: po.save(d / "run", s, step=True), InputTypeError, "step"),
    "step 2.0": (lambda d, s: po.save(d / "run", s, step=2.0), InputTypeError, "step"),
    "step numpy 7 exists": (lambda d, s: po.save(d / "run", s, step=np.int64(7)), InputError,
                            "already"),
    "step exists": (lambda d, s: po.save(d / "run", s, step=7), InputError, "already"),
    "state empty": (lambda d, s: po.save(d / "new", {}, step=1), InputError, "at least one"),
    "state string leaf": (lambda d, s: po.save(d / "new", {"a": "x"}, step=1), InputTypeError,
                          "state"),
    "state abstract": (lambda d, s: po.save(d / "new", jax.eval_shape(lambda: s), step=1),
                       InputTypeError, "ShapeDtypeStruct"),
    "save_args structure": (lambda d, s: po.save(d / "new", s, step=1, save_args={
        "params": ocp.SaveArgs()}), InputError, "save_args"),
    "save_args leaf": (lambda d, s: po.save(d / "new", s, step=1, save_args=jax.tree.map(
        lambda _: "bf16", s)), InputTypeError, "save_args"),
}


@pytest.mark.parametrize("case", SAVE_BAD)
def test_refused_saves_change_nothing(saved, tmp_path, case):
    directory, state = saved
    root = tmp_path
    (root / "file.txt").write_text("not a checkpoint")
    (root / "run").symlink_to(directory)
    call, error, words = SAVE_BAD[case]
    before, before_saved = _snapshot(root), _snapshot(directory)
    with pytest.raises(error, match=words):
        call(root, state)
    assert _snapshot(root) == before and _snapshot(directory) == before_saved
    assert not (root / "new").exists()


RESTORE_BAD = {
    "no sharding": (lambda d: po.restore(d, jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _target())), InputError,
        "no sharding.*Topology mismatch"),
    "leaf an int": (lambda d: po.restore(d, _target(b=3)), InputTypeError, "params.b"),
    "wrong shape": (lambda d: po.restore(d, _target(b=jax.ShapeDtypeStruct(
        (4,), jnp.float32, sharding=NamedSharding(_mesh(4), P())))), InputError,
        r"\(4,\)"),
    "wrong dtype": (lambda d: po.restore(d, _target(b=jax.ShapeDtypeStruct(
        (8,), jnp.bfloat16, sharding=NamedSharding(_mesh(4), P())))), InputError,
        "target leaf 'params.b'"),
    "missing leaf": (lambda d: po.restore(d, {"step": _target()["step"]}), InputError,
                     "target lacks"),
    "uneven sharding": (lambda d: po.restore(d, _target(b=jax.ShapeDtypeStruct(
        (8,), jnp.float32, sharding=NamedSharding(mesh_of(3), P("x"))))), InputError,
        "cannot be laid out"),
    "step missing": (lambda d: po.restore(d, _target(), step=3), InputError,
                     "step 3 is not a complete"),
    "step -1": (lambda d: po.restore(d, _target(), step=-1), InputError, "step"),
    "directory missing": (lambda d: po.restore(d.parent / "nothing", _target()), InputError,
                          "does not exist"),
    "directory ''": (lambda d: po.restore("", _target()), InputError, "must not be empty"),
    "elsewhere 3 devices": (lambda d: po.restore_elsewhere(d, n_devices=3), InputError,
                            "1 or even"),
    "elsewhere 0 devices": (lambda d: po.restore_elsewhere(d, n_devices=0), InputError,
                            "n_devices"),
    "elsewhere True": (lambda d: po.restore_elsewhere(d, n_devices=True), InputTypeError,
                       "n_devices"),
    "elsewhere timeout nan": (lambda d: po.restore_elsewhere(d, n_devices=2,
                                                             timeout=float("nan")),
                              InputError, "timeout"),
    "abstract structure": (lambda d: po.abstract_target({"a": jnp.ones(2)}, {}), InputError,
                           "shardings"),
    "abstract leaf not a sharding": (lambda d: po.abstract_target(
        {"a": jnp.ones(2)}, {"a": P()}), InputTypeError, "sharding"),
    "example width 1": (lambda d: po.example_state(width=1), InputError, "width"),
    "example mesh axes": (lambda d: po.example_shardings(mesh_of(2)), InputError, "'data'"),
}


@pytest.mark.parametrize("case", RESTORE_BAD)
def test_refused_restores_change_nothing(saved, case):
    directory, _ = saved
    call, error, words = RESTORE_BAD[case]
    before = _snapshot(directory)
    with pytest.raises(error, match=words):
        call(directory)
    assert _snapshot(directory) == before


def test_no_stray_files_left_by_the_child(tmp_path):
    """restore_elsewhere writes its report to a temporary folder that it removes."""
    state = jax.device_put(po.example_state(width=4), po.example_shardings(_mesh(8)))
    po.save(tmp_path / "run", state, step=1)
    before = _snapshot(tmp_path)
    po.restore_elsewhere(tmp_path / "run", n_devices=2, width=4)
    assert _snapshot(tmp_path) == before
    assert os.listdir(tmp_path) == ["run"]


@pytest.mark.parametrize("directory", ["", ".", pathlib.Path(""), pathlib.Path(".")])
def test_the_current_directory_unnamed_is_refused_by_both_saves(directory):
    """Path('') is Path('.'): a save there would write into whatever the working directory
    is. plain_orbax.save and the book's checkpoint.save share the refusal."""
    from spmd_guide.checkpointing import checkpoint

    before = sorted(os.listdir("."))
    for save in (po.save, checkpoint.save):
        with pytest.raises(InputError, match="must not be empty"):
            save(directory, {"a": jnp.ones(2)}, step=1)
    assert sorted(os.listdir(".")) == before
