"""The anatomy of a checkpoint, pinned against Orbax: the pieces each device writes are the
ones Orbax's save picks, they tile every array once, the chunks on disk have their shapes,
the files add up, and the read and memory accounting is the layouts' arithmetic."""

from __future__ import annotations

import functools
import math
import os

import jax
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint._src.serialization import replica_slices

from spmd_guide.checkpointing import anatomy, checkpoint, training
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines.hardware import CHIPS
from spmd_guide.transformer import lm, transformer

CONFIG = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)


@functools.cache
def _state():
    s = transformer.STRATEGIES["fsdp_tp"]
    mesh = s.mesh(DEVICES)
    params = lm.init_params(jax.random.key(0), CONFIG)
    params = jax.device_put(params, s.shardings(params, mesh))
    return {"params": params, "opt_state": lm.optimizer().init(params)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("anatomy")
    checkpoint.save(directory, _state(), step=1)
    return directory


def _orbax_pieces(x, parallel):
    found = replica_slices.get_replica_slices(x, replica_id=0, use_replica_parallel=parallel)
    return sorted((r.unsliced_data.device.id,
                   tuple(s.indices(n)[:2] for s, n in zip(r.index, x.shape, strict=False)))
                  for r in found.replica_slices)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [True, False])
def test_written_pieces_are_orbaxs_and_tile_each_array_once(parallel):
    arrays = jax.tree.leaves(_state()) + [
        jax.device_put(np.arange(6.0), NamedSharding(mesh_of(4, ("a", "b"), (2, 2)), P())),
        jax.device_put(np.arange(8.0), NamedSharding(mesh_of(8, ("a", "b"), (4, 2)), P("a")))]
    for x in arrays:
        ours = sorted((d.id, b) for d, b in anatomy.written_pieces(x, replica_parallel=parallel))
        assert ours == _orbax_pieces(x, parallel)
        cover = np.zeros(x.shape, int)
        for _, bounds in ours:
            cover[tuple(slice(a, b) for a, b in bounds)] += 1
        assert (cover == 1).all()


def test_write_plan_writes_each_byte_once_and_spreads_the_work():
    state = _state()
    rows = anatomy.write_plan(state)
    assert [r["device"] for r in rows] == list(range(8))
    assert sum(r["bytes written"] for r in rows) == anatomy.state_bytes(state)
    assert sum(r["holds"] for r in rows) == sum(anatomy.bytes_per_device(state).values())
    # fsdp_tp holds some leaves twice (replicated over 'model'): the devices hold more than
    # the state, and every device writes a share
    assert sum(r["holds"] for r in rows) > anatomy.state_bytes(state)
    assert min(r["bytes written"] for r in rows) > 0
    one = anatomy.write_plan(state, replica_parallel=False)
    assert sum(r["bytes written"] for r in one) == anatomy.state_bytes(state)


def test_the_chunks_on_disk_have_the_written_pieces_shapes(saved):
    found = checkpoint.saved_arrays(saved)
    flat = {checkpoint._name(p): x for p, x in jax.tree_util.tree_leaves_with_path(_state())}
    for name, x in flat.items():
        shapes = {tuple(b - a for a, b in bounds) for _, bounds in anatomy.written_pieces(x)}
        assert shapes == {found[name].chunk_shape}, name


def test_files_add_up_to_the_directory(saved):
    rows = anatomy.files(saved / "1")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(saved / "1")
                for f in fs)
    assert sum(r["bytes"] for r in rows) == total
    roles = {r["role"]: r for r in rows}
    assert set(roles) == {"commit markers", "data written by process 0",
                          "merged index of all processes' data",
                          "metadata: tree, shapes, dtypes, saved shardings"}
    # Adam's moments are zeros here (compressible); the parameters are not, so the data is
    # at least a quarter of the state
    assert roles["data written by process 0"]["bytes"] > anatomy.state_bytes(_state()) // 4
    with pytest.raises(InputError, match="not a saved step"):
        empty = saved / "7"
        empty.mkdir(exist_ok=True)
        anatomy.files(empty)
    empty.rmdir()


def test_reading_back_the_saved_layout_reads_each_chunk_once(saved):
    like = checkpoint.saved_layout(saved)
    summary = anatomy.read_summary(saved, like=like)
    assert summary["chunk bytes read"] == summary["state bytes"] == anatomy.state_bytes(_state())
    one = anatomy.read_summary(saved, like=_on_one_device(like))
    assert one["slices read"] == len(jax.tree.leaves(like))
    assert one["chunk bytes read"] == one["bytes placed on devices"] == one["state bytes"]


def _on_one_device(like):
    sharding = NamedSharding(mesh_of(1), P())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), like)


def test_cutting_saved_chunks_another_way_reads_whole_chunks(tmp_path):
    # wq (16, 4, 4) was saved P('data', 'model') on a 4 x 2 mesh: chunks (4, 2, 4). tp on 4
    # devices wants one head each, (16, 1, 4): four chunks of 32 values for 64 values kept.
    saved = tmp_path
    checkpoint.save(saved, {"params": {"blocks": [
        {"wq": _state()["params"]["blocks"][0]["wq"]}]}}, step=1)
    like = checkpoint.saved_layout(saved)
    mesh = transformer.STRATEGIES["tp"].mesh(DEVICES[:4])
    wq = jax.ShapeDtypeStruct((16, 4, 4), np.float32,
                              sharding=NamedSharding(mesh, P(None, "model", None)))
    tree = {"params": {"blocks": [{"wq": wq}]}}
    rows = anatomy.read_plan(saved, like=tree)
    assert [(r["holds"], r["chunks read"], r["chunk bytes"]) for r in rows] == \
        [(64 * 4, 4, 4 * 32 * 4)] * 4
    summary = anatomy.read_summary(saved, like=tree)
    assert summary["chunk bytes read"] == 2 * summary["state bytes"]
    assert like["params"]["blocks"][0]["wq"].sharding.shard_shape((16, 4, 4)) == (4, 2, 4)


def test_bytes_per_device_and_fits():
    big = lm.Config(vocab=32768, d_model=2048, n_heads=16, d_ff=8192, n_layers=24, seq_len=2048)
    one = training.state_like(big, strategy="dp", n_devices=1)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(one["params"]))
    held = anatomy.bytes_per_device(one)
    assert held == {0: 3 * 4 * n_params + 4 + 5 * 4}  # params, two moments, count, data
    eight = training.state_like(big, strategy="fsdp_tp", n_devices=8)
    assert max(anatomy.bytes_per_device(eight).values()) < held[0] / 7
    v5e = anatomy.fits(one, "tpu-v5e")
    assert v5e["fits"] is (held[0] <= CHIPS["tpu-v5e"].hbm_bytes) and v5e["devices"] == 1
    assert anatomy.fits(eight, CHIPS["tpu-v5e"])["fits"] is True
    with pytest.raises(InputError):
        anatomy.fits(one, "tpu-v99")


def test_bad_inputs():
    with pytest.raises(InputTypeError, match="jax.Array"):
        anatomy.written_pieces(np.zeros(3))
    with pytest.raises(InputTypeError, match="'a'"):
        anatomy.write_plan({"a": np.zeros(3)})
    with pytest.raises(InputTypeError, match="sharding"):
        anatomy.bytes_per_device({"a": jax.ShapeDtypeStruct((3,), np.float32)})


# ---------------------------------------------------------------------------- the exercises

PAGE_CONFIG = lm.Config(vocab=128, d_model=128, n_heads=4, d_ff=512, n_layers=1, seq_len=16)


def test_exercise_fsdp_writes_what_it_holds():
    like = training.state_like(PAGE_CONFIG, strategy="fsdp", n_devices=8)
    state = jax.tree.map(lambda x: jax.numpy.zeros(x.shape, x.dtype, device=x.sharding),
                         {"params": like["params"], "opt_state": like["opt_state"]})
    rows = anatomy.write_plan(state)
    count = 4  # Adam's step count, on every device, written once by device 0
    assert [r["bytes written"] for r in rows] == \
        [rows[0]["holds"]] + [r["holds"] - count for r in rows[1:]]
    fsdp_tp = training.state_like(PAGE_CONFIG, strategy="fsdp_tp", n_devices=8)
    assert anatomy.state_bytes(like) == anatomy.state_bytes(fsdp_tp) == \
        sum(r["bytes written"] for r in rows) + 5 * 4  # (the data position is not saved here)


@pytest.mark.slow
def test_exercise_tiny_pieces_cost_more_than_their_bytes(tmp_path):
    s = transformer.STRATEGIES["fsdp_tp"]
    params = lm.init_params(jax.random.key(0), lm.Config())
    params = jax.device_put(params, s.shardings(params, s.mesh(DEVICES)))
    checkpoint.save(tmp_path, params, step=0)
    on_disk = sum(r["bytes"] for r in anatomy.files(tmp_path / "0"))
    assert on_disk > 2 * anatomy.state_bytes(params)
    assert max(math.prod(v.chunk_shape) * 4 for v in checkpoint.saved_arrays(tmp_path).values()) \
        <= 1024


@pytest.mark.slow
def test_exercise_whole_chunks_read_once(tmp_path):
    saved_like = training.state_like(PAGE_CONFIG, strategy="fsdp_tp", n_devices=8)
    checkpoint.save(tmp_path, jax.tree.map(
        lambda x: jax.numpy.zeros(x.shape, x.dtype, device=x.sharding), saved_like), step=0)
    ratio = {}
    for strategy, n in [("fsdp_tp", 8), ("tp", 4), ("fsdp", 2), ("dp", 1)]:
        r = anatomy.read_summary(tmp_path, like=training.state_like(
            PAGE_CONFIG, strategy=strategy, n_devices=n))
        ratio[strategy, n] = r["chunk bytes read"] / r["state bytes"]
    assert ratio[("fsdp_tp", 8)] == ratio[("fsdp", 2)] == ratio[("dp", 1)] == 1
    assert ratio[("tp", 4)] > 1.5


def test_exercise_fewest_v5e_chips():
    big = lm.Config(vocab=32768, d_model=2048, n_heads=16, d_ff=8192, n_layers=24, seq_len=2048)
    fit = {n: anatomy.fits(training.state_like(big, strategy="fsdp", n_devices=n), "tpu-v5e")
           for n in (1, 2)}
    grads = 4 * lm.param_count(training.state_like(big, strategy="fsdp", n_devices=1)["params"])
    # One chip holds the state on paper, not the state and its gradients; two hold both.
    assert fit[1]["fits"] and fit[1]["most per device"] + grads > fit[1]["hbm"]
    assert fit[2]["most per device"] + grads / 2 < fit[2]["hbm"]


def test_explicit_axes_work_like_auto_axes(saved):
    """Every function that reads a layout takes shardings on Explicit meshes as well."""
    auto = checkpoint.saved_layout(saved)
    mesh = jax.make_mesh((4, 2), ("data", "model"), devices=DEVICES,
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    explicit = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=NamedSharding(mesh, x.sharding.spec)
        if isinstance(x.sharding, NamedSharding) else x.sharding), auto)
    assert anatomy.bytes_per_device(explicit) == anatomy.bytes_per_device(auto)
    assert anatomy.read_summary(saved, like=explicit) == anatomy.read_summary(saved, like=auto)
    assert anatomy.layouts(explicit) == anatomy.layouts(auto)
    arrays = checkpoint.restore(saved, like=explicit)
    assert anatomy.write_plan(arrays) == anatomy.write_plan(_state())


def test_planning_refuses_a_like_that_restore_refuses(saved):
    """read_plan and read_summary share restore's check: each like restore refuses, they
    refuse with restore's own message."""
    like = checkpoint.saved_layout(saved)
    wq = like["params"]["blocks"][0]["wq"]
    with_wq = lambda leaf: {**like, "params": {**like["params"], "blocks": [  # noqa: E731
        {**like["params"]["blocks"][0], "wq": leaf}]}}
    bad = {
        "shape": with_wq(jax.ShapeDtypeStruct((32, 4, 4), wq.dtype, sharding=wq.sharding)),
        "dtype": with_wq(jax.ShapeDtypeStruct(wq.shape, np.int32, sharding=wq.sharding)),
        "missing": {"params": like["params"]},
        "extra": {**like, "q": wq},
        "no layout": with_wq(jax.ShapeDtypeStruct(wq.shape, wq.dtype)),
    }
    for name, tree in bad.items():
        with pytest.raises(InputError) as restored:
            checkpoint.restore(saved, like=tree)
        for plan in (anatomy.read_plan, anatomy.read_summary):
            with pytest.raises(type(restored.value)) as planned:
                plan(saved, like=tree)
            assert str(planned.value) == str(restored.value), name


def test_strings_are_not_names_or_flags():
    state = _state()
    with pytest.raises(InputTypeError, match="names must be a list"):
        anatomy.layouts(state, names="wb")
    with pytest.raises(InputError, match="leaf name"):
        anatomy.layouts(state, names=["params.embed", "wb"])
    x = state["params"]["embed"]
    for bad in ("no", "false", 0, 1):
        with pytest.raises(InputTypeError, match="replica_parallel"):
            anatomy.write_plan(state, replica_parallel=bad)
        with pytest.raises(InputTypeError, match="replica_parallel"):
            anatomy.written_pieces(x, replica_parallel=bad)


def test_typed_keys_are_planned_as_the_key_data_orbax_stores(tmp_path):
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    keys = jax.device_put(jax.random.split(jax.random.key(1), 8), NamedSharding(mesh, P("a")))
    state = {"keys": keys, "key": jax.random.key(0)}
    assert anatomy.state_bytes(state) == 8 * 2 * 4 + 2 * 4
    rows = anatomy.write_plan(state)
    assert sum(r["bytes written"] for r in rows) == anatomy.state_bytes(state)
    assert anatomy.layouts(state, names=["keys"])[0]["piece"] == (2,)
    checkpoint.save(tmp_path, state, step=0)
    summary = anatomy.read_summary(tmp_path, like=state)
    assert summary["chunk bytes read"] == summary["state bytes"] == anatomy.state_bytes(state)


@pytest.mark.slow
def test_one_process_reads_shared_chunks_once(tmp_path):
    """The measured file bytes of a restore that cuts the saved chunks another way stay well
    under read_summary's count, which is the bound for slices read by different processes."""
    s = transformer.STRATEGIES["fsdp_tp"]
    params = lm.init_params(jax.random.key(0), PAGE_CONFIG)
    checkpoint.save(tmp_path, jax.device_put(params, s.shardings(params, s.mesh(DEVICES))),
                    step=0)
    measured, modeled = {}, {}
    for strategy, n in [("fsdp_tp", 8), ("tp", 4), ("dp", 1)]:
        like = training.state_like(PAGE_CONFIG, strategy=strategy, n_devices=n)["params"]
        measured[strategy] = anatomy.file_bytes_read(tmp_path, like=like)
        modeled[strategy] = anatomy.read_summary(tmp_path, like=like)["chunk bytes read"]
    assert modeled["tp"] > 1.5 * modeled["fsdp_tp"]
    assert measured["fsdp_tp"] > 0.5 * modeled["fsdp_tp"]  # random floats barely compress
    # How much the tp restore shares depends on timing (resuming.md, review N4): over a few
    # restores it reads more than the saved layout and less than the count of separate reads.
    tp_like = training.state_like(PAGE_CONFIG, strategy="tp", n_devices=4)["params"]
    low, high = anatomy.file_bytes_read_range(tmp_path, like=tp_like, repeats=3)
    assert 0.9 * measured["fsdp_tp"] < low <= high < modeled["tp"]
    with pytest.raises(InputError, match="structure"):  # refused before anything is read
        anatomy.file_bytes_read(tmp_path, like={"w": like["embed"]})
    for repeats in (0, 1.5, True):
        with pytest.raises((InputError, InputTypeError), match="repeats"):
            anatomy.file_bytes_read_range(tmp_path, like=tp_like, repeats=repeats)
