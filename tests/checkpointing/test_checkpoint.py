"""save / restore / latest_step: values come back identical in any asked layout (8, 4, 2, 1
devices, other strategies, Auto and Explicit axes), and every bad input is refused clearly
with nothing on disk changed."""

from __future__ import annotations

import functools
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES, mesh_of, run_python
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import anatomy, checkpoint
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.transformer import lm, transformer

CONFIG = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)


@functools.cache
def _params():
    return lm.init_params(jax.random.key(0), CONFIG)


def _placed(strategy: str, n: int):
    s = transformer.STRATEGIES[strategy]
    mesh = s.mesh(DEVICES[:n])
    params = _params()
    return jax.device_put(params, s.shardings(params, mesh))


def _state(strategy: str = "fsdp_tp", n: int = 8):
    params = _placed(strategy, n)
    opt = lm.optimizer()
    return {"params": params, "opt_state": opt.init(params), "step": np.int32(7)}


def _like(state, strategy: str, n: int, *, explicit: bool = False):
    """``state``'s structure laid out by ``strategy`` on the first ``n`` devices."""
    s = transformer.STRATEGIES[strategy]
    mesh = s.mesh(DEVICES[:n])
    if explicit:
        mesh = jax.make_mesh(tuple(mesh.shape.values()), mesh.axis_names,
                             axis_types=(jax.sharding.AxisType.Explicit,) * len(mesh.shape),
                             devices=DEVICES[:n])
    p_sh = s.shardings(_params(), mesh)
    s_sh = transformer.state_shardings(state["opt_state"], _params(), p_sh, mesh)

    def sds(x, sh):
        return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype if not hasattr(x, "dtype")
                                    else x.dtype, sharding=sh)

    return {"params": jax.tree.map(sds, state["params"], p_sh),
            "opt_state": jax.tree.map(sds, state["opt_state"], s_sh),
            "step": jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))}


def _snapshot(path: pathlib.Path) -> list[tuple[str, int, int]]:
    out = []
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = pathlib.Path(root) / name
            st = full.stat()
            out.append((str(full.relative_to(path)), st.st_size, st.st_mtime_ns))
    return sorted(out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One fsdp_tp state on 8 devices, saved as step 3."""
    directory = tmp_path_factory.mktemp("ckpt")
    state = _state()
    checkpoint.save(directory, state, step=3)
    return directory, state


def _assert_identical(restored, like, original):
    for r, want, o in zip(jax.tree.leaves(restored), jax.tree.leaves(like),
                          jax.tree.leaves(original), strict=True):
        assert isinstance(r, jax.Array)
        assert r.dtype == want.dtype and r.shape == want.shape
        assert r.sharding.is_equivalent_to(want.sharding, r.ndim), (r.sharding, want.sharding)
        np.testing.assert_array_equal(np.asarray(r), np.asarray(o))


# ---------------------------------------------------------------------------- the contract


@pytest.mark.parametrize(("strategy", "n"), [("fsdp_tp", 8), ("tp", 4), ("fsdp", 2), ("dp", 1),
                                             ("tp_sp", 4), ("cp", 8)])
def test_restore_gives_identical_values_in_the_asked_layout(saved, strategy, n):
    directory, state = saved
    like = _like(state, strategy, n)
    restored = checkpoint.restore(directory, like=like)
    _assert_identical(restored, like, state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert {d.id for x in jax.tree.leaves(restored) for d in x.sharding.device_set} == \
        set(range(n))


def test_restore_onto_explicit_axes_and_from_arrays(saved):
    directory, state = saved
    like = _like(state, "tp", 4, explicit=True)
    restored = checkpoint.restore(directory, like=like)
    _assert_identical(restored, like, state)
    assert jax.typeof(restored["params"]["embed"]).sharding.mesh.axis_types[0] == \
        jax.sharding.AxisType.Explicit
    # like may be arrays: their shardings are the layout, their values are ignored
    arrays = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype, device=x.sharding), like)
    _assert_identical(checkpoint.restore(directory, like=arrays), like, state)


def test_latest_step_and_steps(tmp_path):
    assert checkpoint.latest_step(tmp_path / "missing") is None
    assert checkpoint.latest_step(tmp_path) is None and checkpoint.steps(tmp_path) == []
    state = {"w": jax.device_put(np.arange(8.0), NamedSharding(mesh_of(8), P("x")))}
    for step in (5, 2, 10):
        assert checkpoint.save(tmp_path, state, step=step) == tmp_path / str(step)
    (tmp_path / "11.orbax-checkpoint-tmp").mkdir()  # an unfinished save does not count
    assert checkpoint.steps(tmp_path) == [2, 5, 10]
    assert checkpoint.latest_step(str(tmp_path)) == 10
    # the latest is the default; an older step on request; NumPy integers are steps
    like = {"w": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh_of(2),
                                                                                P("x")))}
    np.testing.assert_array_equal(checkpoint.restore(tmp_path, like=like, step=np.int64(2))["w"],
                                  np.arange(8.0))


def test_start_save_returns_with_the_arrays_copied_and_commits_on_wait(tmp_path):
    x = jax.device_put(np.arange(16.0), NamedSharding(mesh_of(8), P("x")))
    pending = checkpoint.start_save(tmp_path, {"x": x}, step=1)
    x = x.delete()  # the save holds its own host copy: deleting the array is safe
    assert pending.wait() == tmp_path / "1" and pending.done()
    assert checkpoint.latest_step(tmp_path) == 1
    like = {"x": jax.ShapeDtypeStruct((16,), jnp.float32,
                                      sharding=NamedSharding(mesh_of(1), P()))}
    np.testing.assert_array_equal(checkpoint.restore(tmp_path, like=like)["x"], np.arange(16.0))


def test_saved_arrays_and_saved_layout_describe_the_checkpoint(saved):
    directory, state = saved
    found = checkpoint.saved_arrays(directory)
    wq = state["params"]["blocks"][0]["wq"]
    assert found["params.blocks.0.wq"].shape == wq.shape
    assert found["params.blocks.0.wq"].chunk_shape == wq.sharding.shard_shape(wq.shape)
    layout = checkpoint.saved_layout(directory)
    assert layout["params"]["blocks"][0]["wq"].sharding.is_equivalent_to(wq.sharding, 3)
    restored = checkpoint.restore(directory, like=layout)
    np.testing.assert_array_equal(restored["opt_state"][0]["mu"]["embed"],
                                  state["opt_state"][0].mu["embed"])


@pytest.mark.slow
def test_restore_in_processes_with_fewer_devices(saved):
    """A fresh process with 4, 2 or 1 devices (another machine) restores the 8-device save."""
    directory, state = saved
    total = float(sum(np.sum(np.asarray(x, np.float64)) for x in jax.tree.leaves(state)))
    for n, strategy in ((4, "tp"), (2, "fsdp"), (1, "dp")):
        out = run_python(f"""
            from spmd_guide import ensure_devices; ensure_devices({n})
            import jax, numpy as np
            from spmd_guide.checkpointing import checkpoint, training
            from spmd_guide.transformer import lm
            config = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)
            like = training.state_like(config, strategy={strategy!r}, n_devices={n})
            like = {{"params": like["params"], "opt_state": like["opt_state"],
                     "step": like["data"]["seed"]}}
            r = checkpoint.restore({str(directory)!r}, like=like)
            print(len(jax.devices()), sum(float(np.sum(np.asarray(x, np.float64)))
                                          for x in jax.tree.leaves(r)))
        """, devices=n)
        devices, value = out.split()
        assert int(devices) == n
        assert float(value) == pytest.approx(total, rel=0, abs=1e-9)


# ---------------------------------------------------------------------------- bad input


def _unchanged(directory, call, error, words):
    before = _snapshot(directory)
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert _snapshot(directory) == before


def test_a_like_that_differs_from_the_checkpoint_is_refused(saved):
    directory, state = saved
    like = _like(state, "tp", 4)
    bf16 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, jnp.bfloat16 if x.dtype == jnp.float32 else x.dtype, sharding=x.sharding), like)
    _unchanged(directory, lambda: checkpoint.restore(directory, like=bf16), InputError,
               ["dtype bfloat16", "float32", "cast"])
    wide = dict(like, params=dict(like["params"], embed=jax.ShapeDtypeStruct(
        (32, 16), jnp.float32, sharding=like["params"]["embed"].sharding)))
    _unchanged(directory, lambda: checkpoint.restore(directory, like=wide), InputError,
               ["params.embed", "(32, 16)", "(16, 16)"])
    fewer = {"params": like["params"]}
    _unchanged(directory, lambda: checkpoint.restore(directory, like=fewer), InputError,
               ["structure", "opt_state.0.count", "like lacks"])
    more = dict(like, extra=like["step"])
    _unchanged(directory, lambda: checkpoint.restore(directory, like=more), InputError,
               ["extra", "checkpoint lacks"])
    no_layout = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)
    _unchanged(directory, lambda: checkpoint.restore(directory, like=no_layout), InputTypeError,
               ["sharding"])
    _unchanged(directory, lambda: checkpoint.restore(directory, like={}), InputError,
               ["at least one array"])
    uneven = dict(like, params=dict(like["params"], norm_f=jax.ShapeDtypeStruct(
        (16,), jnp.float32, sharding=NamedSharding(mesh_of(3), P("x")))))  # 16 over 3
    _unchanged(directory, lambda: checkpoint.restore(directory, like=uneven), InputError,
               ["params.norm_f", "cannot be laid out"])


def test_missing_empty_and_unfinished_directories_and_steps(saved, tmp_path):
    directory, state = saved
    like = _like(state, "dp", 1)
    with pytest.raises(InputError, match="does not exist"):
        checkpoint.restore(tmp_path / "nowhere", like=like)
    assert not (tmp_path / "nowhere").exists()
    _unchanged(tmp_path, lambda: checkpoint.restore(tmp_path, like=like), InputError,
               ["no complete checkpoint"])
    (tmp_path / "4.orbax-checkpoint-tmp").mkdir()
    _unchanged(tmp_path, lambda: checkpoint.restore(tmp_path, like=like), InputError,
               ["no complete checkpoint", "unfinished", "4.orbax-checkpoint-tmp"])
    _unchanged(directory, lambda: checkpoint.restore(directory, like=like, step=9), InputError,
               ["step 9", "complete steps: [3]"])
    (tmp_path / "file").write_text("x")
    _unchanged(tmp_path, lambda: checkpoint.restore(tmp_path / "file", like=like), InputError,
               ["is a file"])
    _unchanged(directory, lambda: checkpoint.restore(3, like=like), InputTypeError, ["path"])
    _unchanged(directory, lambda: checkpoint.restore(directory, like=like, step=-1), InputError,
               ["step"])


def test_bad_saves_are_refused_before_touching_the_disk(saved, tmp_path):
    directory, state = saved
    _unchanged(directory, lambda: checkpoint.save(directory, state, step=3), InputError,
               ["step 3 is already saved", "never overwritten"])
    target = tmp_path / "new"
    for bad, error, word in [({}, InputError, "at least one array"),
                             ({"a": "text"}, InputTypeError, "'a'"),
                             ({"a": jax.ShapeDtypeStruct((2,), jnp.float32)}, InputTypeError,
                              "no values")]:
        with pytest.raises(error, match=word):
            checkpoint.save(target, bad, step=1)
        assert not target.exists()
    for step, error in [(-1, InputError), (1.5, InputTypeError), (True, InputTypeError)]:
        with pytest.raises(error, match="step"):
            checkpoint.save(target, state, step=step)
        assert not target.exists()
    with pytest.raises(InputTypeError, match="directory"):
        checkpoint.save(None, state, step=1)


def test_python_and_numpy_scalars_are_saved_as_jax_would_type_them(tmp_path):
    checkpoint.save(tmp_path, {"a": 3, "b": np.float32(2.5), "c": 1.5}, step=0)
    found = checkpoint.saved_arrays(tmp_path)
    assert {k: v.dtype for k, v in found.items()} == {
        "a": np.dtype(np.int32), "b": np.dtype(np.float32), "c": np.dtype(np.float32)}


def _x(n=4):
    return np.arange(float(n), dtype=np.float32)


def test_a_python_int_that_int32_cannot_hold_is_refused(tmp_path):
    with pytest.raises(InputError, match="does not fit int32"):
        checkpoint.save(tmp_path / "new", {"step": 2**31}, step=1)
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------- typed keys


def test_typed_prng_keys_round_trip_on_one_and_several_devices(tmp_path):
    mesh = mesh_of(8)
    keys = jax.device_put(jax.random.split(jax.random.key(1), 8), NamedSharding(mesh, P("x")))
    state = {"key": jax.random.key(7), "keys": keys, "w": _x(8)}
    checkpoint.save(tmp_path, state, step=1)
    for n in (1, 4):
        like = {"key": jax.ShapeDtypeStruct((), keys.dtype, sharding=NamedSharding(
                    mesh_of(n), P())),
                "keys": jax.ShapeDtypeStruct((8,), keys.dtype, sharding=NamedSharding(
                    mesh_of(n), P("x"))),
                "w": jax.ShapeDtypeStruct((8,), np.float32, sharding=NamedSharding(
                    mesh_of(n), P()))}
        back = checkpoint.restore(tmp_path, like=like)
        for name in ("key", "keys"):
            assert back[name].dtype == keys.dtype
            np.testing.assert_array_equal(jax.random.key_data(back[name]),
                                          jax.random.key_data(state[name]))
        assert back["keys"].sharding.is_equivalent_to(like["keys"].sharding, 1)
    # the saved layout says keys, and restores them on the devices that saved
    layout = checkpoint.saved_layout(tmp_path)
    assert layout["keys"].dtype == keys.dtype and layout["keys"].shape == (8,)
    np.testing.assert_array_equal(jax.random.key_data(checkpoint.restore(
        tmp_path, like=layout)["keys"]), jax.random.key_data(keys))
    assert checkpoint.saved_arrays(tmp_path)["keys"].key_impl == "threefry2x32"
    # and a like that asks for something else is refused, naming the leaf
    for bad, words in [
            (dict(like, key=jax.ShapeDtypeStruct((2,), np.uint32, sharding=like["w"].sharding)),
             ["'key'", "not a typed PRNG key"]),
            (dict(like, key=jax.ShapeDtypeStruct((), jax.random.key(0, impl="rbg").dtype,
                                                 sharding=like["w"].sharding)),
             ["'key'", "threefry2x32"]),
            (dict(like, keys=jax.ShapeDtypeStruct((4,), keys.dtype,
                                                  sharding=like["w"].sharding)),
             ["'keys'", "shape (4,)", "(8,)"]),
            (dict(like, w=jax.ShapeDtypeStruct((8,), keys.dtype, sharding=like["w"].sharding)),
             ["'w'", "is a typed PRNG key"])]:
        _unchanged(tmp_path, lambda bad=bad: checkpoint.restore(tmp_path, like=bad), InputError,
                   words)


# ---------------------------------------------------------------------------- steps


def _committed(directory, step):
    checkpoint.save(directory, {"w": jax.device_put(_x(256))}, step=step)
    return directory / str(step)


def test_only_complete_steps_named_by_a_number_count(tmp_path):
    _committed(tmp_path, 2)
    (tmp_path / "backup_99").mkdir()               # Orbax's own rule would take it for 99
    shutil.copytree(tmp_path / "2", tmp_path / "backup_98")
    (tmp_path / "3").mkdir()                       # empty
    half = shutil.copytree(tmp_path / "2", tmp_path / "4")  # a copy that stopped halfway
    (half / checkpoint.COMMIT_MARKER).unlink()
    (half / "default" / "_METADATA").unlink()
    assert checkpoint.steps(tmp_path) == [2] and checkpoint.latest_step(tmp_path) == 2
    like = {"w": jax.ShapeDtypeStruct((256,), np.float32, sharding=NamedSharding(mesh_of(1),
                                                                                  P()))}
    np.testing.assert_array_equal(checkpoint.restore(tmp_path, like=like)["w"], _x(256))
    for step in (3, 4):
        _unchanged(tmp_path, lambda step=step: checkpoint.restore(tmp_path, like=like,
                                                                  step=step),
                   InputError, [f"step {step} is not a complete", "commit_success.txt",
                                "complete steps: [2]"])
        _unchanged(tmp_path, lambda step=step: checkpoint.save(tmp_path, {"w": _x()},
                                                               step=step),
                   InputError, [f"{step}'", "not a complete step", "Delete it"])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "5").mkdir()
    _unchanged(empty, lambda: checkpoint.restore(empty, like=like), InputError,
               ["no complete checkpoint", "'5'"])


HARMS = {
    "missing _METADATA": lambda p: (p / "default" / "_METADATA").unlink(),
    "truncated _METADATA": lambda p: (p / "default" / "_METADATA").write_text(
        (p / "default" / "_METADATA").read_text()[:40]),
    "truncated array metadata": lambda p: (p / "default" / "array_metadatas" /
                                           "process_0").write_text("{"),
    "junk data files": lambda p: [f.write_bytes(b"junk" * 8) for f in p.rglob("*")
                                  if f.parent.name == "d"],
    "only the commit marker": lambda p: [shutil.rmtree(p / "default"),
                                         (p / "_CHECKPOINT_METADATA").unlink()],
}


@pytest.mark.parametrize("harm", HARMS)
def test_a_damaged_step_says_so_with_its_step_and_directory(tmp_path, harm):
    _committed(tmp_path, 1)
    HARMS[harm](_committed(tmp_path, 2))
    assert checkpoint.steps(tmp_path) == [1, 2]  # marked complete
    like = {"w": jax.ShapeDtypeStruct((256,), np.float32, sharding=NamedSharding(mesh_of(2),
                                                                                  P("x")))}
    words = ["step 2", str(tmp_path), "damaged", "Restore another step ([1])"]
    for call in (lambda: checkpoint.restore(tmp_path, like=like),
                 lambda: checkpoint.saved_arrays(tmp_path),
                 lambda: checkpoint.saved_layout(tmp_path),
                 lambda: anatomy.read_plan(tmp_path, like=like),
                 lambda: anatomy.read_summary(tmp_path, like=like)):
        before = _snapshot(tmp_path)
        with pytest.raises(checkpoint.DamagedCheckpointError) as info:
            call()
        for word in words:
            assert word in str(info.value), (word, str(info.value))
        assert info.value.__cause__ is not None and _snapshot(tmp_path) == before
    # the step before is untouched and restores
    np.testing.assert_array_equal(checkpoint.restore(tmp_path, like=like, step=1)["w"],
                                  _x(256))


# ---------------------------------------------------------------------------- paths


@pytest.mark.parametrize("bad", ["", "   ", b"/tmp", 3, None, ["a"]])
def test_a_directory_must_be_a_real_path(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    state = {"w": _x()}
    like = {"w": jax.ShapeDtypeStruct((4,), np.float32, sharding=NamedSharding(mesh_of(1),
                                                                                P()))}
    for call in (lambda: checkpoint.save(bad, state, step=1),
                 lambda: checkpoint.start_save(bad, state, step=1),
                 lambda: checkpoint.restore(bad, like=like),
                 lambda: checkpoint.steps(bad), lambda: checkpoint.latest_step(bad),
                 lambda: checkpoint.saved_arrays(bad), lambda: checkpoint.saved_layout(bad),
                 lambda: anatomy.files(bad), lambda: anatomy.listing(bad),
                 lambda: anatomy.read_plan(bad, like=like),
                 lambda: anatomy.read_summary(bad, like=like)):
        with pytest.raises(InputError, match="path|directory"):
            call()
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_files_and_listing_take_one_step_not_the_root(saved):
    directory, _ = saved
    for call in (anatomy.files, anatomy.listing):
        _unchanged(directory, lambda call=call: call(directory), InputError,
                   ["not one step's directory", "holds steps [3]", str(directory / "3")])
