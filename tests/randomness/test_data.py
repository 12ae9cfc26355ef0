"""The loader contract: each example once per epoch, order fixed by the seed, batches laid out
as asked, and a clear error for every batch size that cannot work."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import mesh_of
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.randomness import data


def _dataset(n: int, features: int = 3):
    """Example i is recognisable: x row i holds i*features.., y[i] = i."""
    x = np.arange(n * features, dtype=np.float32).reshape(n, features)
    return x, np.arange(n, dtype=np.int32)


def _rows_in_order(batches) -> list[int]:
    return [int(i) for _, y in batches for i in np.asarray(y)]


def _check_pairs(batch) -> None:
    x, y = (np.asarray(a) for a in batch)
    np.testing.assert_array_equal(x[:, 0], y * x.shape[1])


def _sharding(k: int = 8, spec: P | None = None) -> NamedSharding:
    return NamedSharding(mesh_of(k), P("x") if spec is None else spec)


def test_every_example_exactly_once_and_pairs_stay_together():
    batches = list(data.sharded_batches(_dataset(40), 8, _sharding(), seed=0))
    assert len(batches) == 5
    assert sorted(_rows_in_order(batches)) == list(range(40))
    for batch in batches:
        _check_pairs(batch)


def test_order_is_fixed_by_seed_and_epoch():
    dataset, sharding = _dataset(32), _sharding()

    def order(**kw):
        return _rows_in_order(data.sharded_batches(dataset, 8, sharding, **kw))

    assert order(seed=3) == order(seed=3)
    assert order(seed=3) == order(seed=3, epoch=0)
    assert order(seed=3) != order(seed=4)
    assert order(seed=3) != order(seed=3, epoch=1)
    assert order(seed=3) != list(range(32))  # shuffled
    np.testing.assert_array_equal(order(seed=3), data.epoch_order(32, seed=3))


@pytest.mark.parametrize(
    "k, mesh_args, spec",
    [(1, None, P("x")), (2, None, P("x")), (4, None, P("x")), (8, None, P("x")),
     (8, (8, ("a", "b"), (2, 4)), P("a")), (8, (8, ("a", "b"), (2, 4)), P(("a", "b")))],
)
def test_batches_carry_the_requested_sharding(k, mesh_args, spec):
    mesh = mesh_of(*mesh_args) if mesh_args else mesh_of(k)
    sharding = NamedSharding(mesh, spec)
    x, y = next(data.sharded_batches(_dataset(16), 8, sharding, seed=1))
    assert x.sharding == sharding and y.sharding == sharding
    assert x.shape == (8, 3) and y.shape == (8,)
    pieces = data.batch_axis_size(sharding)
    for shard in x.addressable_shards:  # each device holds only its slice
        assert shard.data.shape == (8 // pieces, 3)


def test_both_loaders_on_a_mesh_of_explicit_axes():
    """jax.make_mesh's default axes: the batches carry the sharding asked for, and the
    process-local path agrees with the global one."""
    sharding = NamedSharding(mesh_of(8, ("a", "b"), (4, 2), explicit=True), P("a"))
    ours = list(data.process_local_batches(_dataset(40), 16, sharding, seed=5))
    theirs = list(data.sharded_batches(_dataset(40), 16, sharding, seed=5))
    assert data.batch_axis_size(sharding) == 4 and len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs, strict=True):
        for u, v in zip(a, b, strict=True):
            assert u.sharding == v.sharding == sharding
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_each_device_is_asked_only_for_its_own_rows(monkeypatch):
    requests = []
    real = jax.make_array_from_callback

    def spy(shape, sharding, callback, dtype=None):
        def recording(index):
            out = callback(index)
            requests.append(np.shape(out))
            return out
        return real(shape, sharding, recording, dtype)

    monkeypatch.setattr(jax, "make_array_from_callback", spy)
    next(data.sharded_batches(_dataset(16), 16, _sharding(), seed=0))
    assert requests and all(shape[0] == 2 for shape in requests)  # 16 rows / 8 devices


def test_pytree_datasets_and_per_leaf_shardings():
    x, y = _dataset(16)
    mesh = mesh_of(8, ("data", "model"), (4, 2))
    shardings = {"x": NamedSharding(mesh, P("data", None)), "y": NamedSharding(mesh, P("data"))}
    batch = next(data.sharded_batches({"x": x, "y": y}, 8, shardings, seed=0))
    assert set(batch) == {"x", "y"}
    assert batch["x"].sharding == shardings["x"] and batch["y"].sharding == shardings["y"]
    _check_pairs((batch["x"], batch["y"]))


def test_last_partial_batch_policy():
    dataset, sharding = _dataset(40), _sharding()
    kept = list(data.sharded_batches(dataset, 16, sharding, seed=0))
    assert [b[1].shape[0] for b in kept] == [16, 16, 8]
    assert sorted(_rows_in_order(kept)) == list(range(40))
    dropped = data.sharded_batches(dataset, 16, sharding, seed=0, drop_remainder=True)
    assert len(dropped) == 2
    rows = _rows_in_order(dropped)
    assert len(rows) == len(set(rows)) == 32
    assert rows == _rows_in_order(kept)[:32]
    # a remainder that cannot split over the devices needs drop_remainder=True
    with pytest.raises(ValueError, match="drop_remainder=True"):
        data.sharded_batches(_dataset(44), 16, sharding, seed=0)
    assert len(data.sharded_batches(_dataset(44), 16, sharding, seed=0, drop_remainder=True)) == 2


def test_len_counts_down():
    batches = data.sharded_batches(_dataset(24), 8, _sharding(), seed=0)
    assert len(batches) == 3
    next(batches)
    assert len(batches) == 2
    assert len(list(batches)) == 2 and len(batches) == 0


def test_skip_resumes_at_a_position_without_building_the_skipped_batches(monkeypatch):
    sharding = _sharding()
    whole = [_rows_in_order([b]) for b in data.sharded_batches(_dataset(40), 8, sharding, seed=3)]
    batches = data.sharded_batches(_dataset(40), 8, sharding, seed=3)
    next(batches)
    assert batches.position == 1
    built = []
    monkeypatch.setattr(data, "_gather", lambda leaf, rows, s: built.append(rows) or leaf[rows])
    assert batches.skip(2) is batches and batches.position == 3 and not built
    monkeypatch.undo()
    assert [_rows_in_order([b]) for b in batches] == whole[3:]
    with pytest.raises(checks.InputError, match="at most 0"):
        batches.skip(1)
    with pytest.raises(checks.InputTypeError, match="integer"):
        data.sharded_batches(_dataset(40), 8, sharding, seed=3).skip(1.0)


@pytest.mark.parametrize(
    "batch_size, message",
    [(0, "at least 1"), (-8, "at least 1"), (12, "multiple of 8"), (48, "larger than"),
     (8.0, "integer"), (True, "integer")],
)
def test_bad_batch_sizes_raise_at_the_call(batch_size, message):
    with pytest.raises(ValueError, match=message):
        data.sharded_batches(_dataset(40), batch_size, _sharding(), seed=0)


def test_bad_datasets_and_shardings_raise():
    x, y = _dataset(40)
    with pytest.raises(ValueError, match=r"leading length.*40.*39"):
        data.sharded_batches((x, y[:39]), 8, _sharding(), seed=0)
    with pytest.raises(ValueError, match="empty"):
        data.sharded_batches((x[:0], y[:0]), 8, _sharding(), seed=0)
    with pytest.raises(ValueError, match="scalar"):
        data.sharded_batches((x, np.float32(1)), 8, _sharding(), seed=0)
    with pytest.raises(ValueError, match="no arrays"):
        data.sharded_batches((), 8, _sharding(), seed=0)
    with pytest.raises(ValueError, match="rank"):
        data.sharded_batches((x, y), 8, _sharding(8, P("x", None)), seed=0)
    with pytest.raises(TypeError, match="Sharding"):
        data.sharded_batches((x, y), 8, P("x"), seed=0)
    with pytest.raises(ValueError, match="seed"):
        data.sharded_batches((x, y), 8, _sharding(), seed=-1)


def test_single_device_sharding_works():
    sharding = SingleDeviceSharding(jax.devices()[0])
    batches = list(data.sharded_batches(_dataset(10), 5, sharding, seed=2))
    assert len(batches) == 2 and batches[0][0].sharding == sharding
    assert data.batch_axis_size(sharding) == 1


def test_process_local_path_equals_global_path_on_one_process():
    dataset, sharding = _dataset(40), _sharding()
    for drop in (False, True):
        ours = list(data.process_local_batches(dataset, 16, sharding, seed=5, drop_remainder=drop))
        theirs = list(data.sharded_batches(dataset, 16, sharding, seed=5, drop_remainder=drop))
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            for u, v in zip(a, b, strict=True):
                assert u.sharding == v.sharding
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    with pytest.raises(ValueError, match="multiple of 8"):
        data.process_local_batches(dataset, 12, sharding, seed=0)


def test_each_process_shuffles_its_local_examples_with_its_own_permutation(monkeypatch):
    """P6-N2: with one permutation for all, local example i of every process would share a
    batch every epoch. Process 0 keeps sharded_batches's order; process 1 draws another."""
    assert np.array_equal(data.epoch_order(40, seed=5, process=0), data.epoch_order(40, seed=5))
    orders = [data.epoch_order(40, seed=5, epoch=e, process=p) for p in (0, 1) for e in (0, 1)]
    assert all(np.array_equal(np.sort(o), np.arange(40)) for o in orders)
    assert len({tuple(o) for o in orders}) == 4
    dataset, sharding = _dataset(40), _sharding()
    first = np.asarray(next(data.process_local_batches(dataset, 16, sharding, seed=5))[1])
    monkeypatch.setattr(jax, "process_index", lambda *_: 1)  # as if this were process 1
    other = np.asarray(next(data.process_local_batches(dataset, 16, sharding, seed=5))[1])
    assert not np.array_equal(first, other)
    assert np.array_equal(other, data.epoch_order(40, seed=5, process=1)[:16])


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 64),
    devices=st.sampled_from([1, 2, 4, 8]),
    per_device=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
    drop=st.booleans(),
)
def test_loader_over_sizes(n, devices, per_device, seed, drop):
    batch_size = devices * per_device
    sharding = _sharding(devices)
    remainder = n % batch_size if batch_size <= n else None
    if batch_size > n or (remainder and remainder % devices and not drop):
        with pytest.raises(ValueError):
            data.sharded_batches(_dataset(n), batch_size, sharding, seed=seed,
                                 drop_remainder=drop)
        return
    batches = list(data.sharded_batches(_dataset(n), batch_size, sharding, seed=seed,
                                        drop_remainder=drop))
    rows = _rows_in_order(batches)
    assert len(rows) == len(set(rows))  # never twice
    expected = n // batch_size * batch_size if (drop or not remainder) else n
    assert len(rows) == expected
    assert rows == list(data.epoch_order(n, seed=seed)[:expected])
    assert all(b[0].sharding == sharding and b[0].shape[0] % devices == 0 for b in batches)


# ------------------------------------------------------------------ the chapter's exercises


def test_exercise_batch_counts():
    """Exercise 1: 1000 examples in batches of 64 over 8 devices."""
    ids, sharding = (np.arange(1000),), _sharding()
    kept = data.sharded_batches(ids, 64, sharding, seed=0)
    assert len(kept) == 16
    assert [b[0].shape[0] for b in kept][-1] == 40
    assert len(data.sharded_batches(ids, 64, sharding, seed=0, drop_remainder=True)) == 15


def test_exercise_batch_axis_of_a_2d_mesh():
    """Exercise 2: P('data') on a 2 x 4 ('data', 'model') mesh cuts the batch in 2."""
    sharding = NamedSharding(mesh_of(8, ("data", "model"), (2, 4)), P("data"))
    assert data.batch_axis_size(sharding) == 2
    (batch,) = next(data.sharded_batches((np.arange(8),), 8, sharding, seed=0))
    by_rows: dict[int, set[bytes]] = {}
    for shard in batch.addressable_shards:
        assert shard.data.shape == (4,)
        by_rows.setdefault(shard.index[0].start, set()).add(np.asarray(shard.data).tobytes())
    assert sorted(by_rows) == [0, 4] and all(len(v) == 1 for v in by_rows.values())
    with pytest.raises(ValueError, match="multiple of 2"):
        data.sharded_batches((np.arange(8),), 3, sharding, seed=0)


def test_exercise_seed_and_epoch_do_not_alias():
    """Exercise 3: (seed, epoch) = (0, 1) and (1, 0) give different orders."""
    assert not np.array_equal(data.epoch_order(100, seed=0, epoch=1),
                              data.epoch_order(100, seed=1, epoch=0))


# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402


def _rows(n: int = 2):
    return NamedSharding(mesh_of(n), P("x"))


BAD_INPUT = [
    ("batch_axis_size ndim 0", lambda: data.batch_axis_size(_rows(), ndim=0), InputError,
     "ndim"),
    ("batch_axis_size a spec", lambda: data.batch_axis_size(P("x")), InputTypeError,
     "NamedSharding"),
    ("batch_axis_size ndim float", lambda: data.batch_axis_size(_rows(), ndim=1.0),
     InputTypeError, "integer"),
    ("batch size 0", lambda: data.sharded_batches(_dataset(8), 0, _rows(), seed=0), InputError,
     "batch_size"),
    ("batch size str", lambda: data.sharded_batches(_dataset(8), "4", _rows(), seed=0),
     InputTypeError, "batch_size"),
    ("batch size too big", lambda: data.sharded_batches(_dataset(8), 16, _rows(), seed=0),
     InputError, "larger"),
    ("batch size indivisible", lambda: data.sharded_batches(_dataset(8), 3, _rows(), seed=0),
     InputError, "multiple of 2"),
    ("seed negative", lambda: data.sharded_batches(_dataset(8), 4, _rows(), seed=-1),
     InputError, "seed"),
    ("seed float", lambda: data.sharded_batches(_dataset(8), 4, _rows(), seed=0.5),
     InputTypeError, "seed"),
    ("epoch str", lambda: data.sharded_batches(_dataset(8), 4, _rows(), seed=0, epoch="1"),
     InputTypeError, "epoch"),
    ("drop_remainder str", lambda: data.sharded_batches(_dataset(8), 4, _rows(), seed=0,
                                                        drop_remainder="no"),
     InputTypeError, "True or False"),
    ("string leaf", lambda: data.sharded_batches({"x": np.ones((4, 2)), "name": "abc"}, 2,
                                                 _rows(), seed=0), InputTypeError, "name"),
    ("lengths differ", lambda: data.sharded_batches((np.ones(8), np.ones(6)), 2, _rows(),
                                                    seed=0), InputError, "leading length"),
    ("empty dataset", lambda: data.sharded_batches((), 2, _rows(), seed=0), InputError,
     "no arrays"),
    ("sharding a spec", lambda: data.sharded_batches(_dataset(8), 4, P("x"), seed=0),
     InputTypeError, "Sharding"),
    ("last batch uneven", lambda: data.sharded_batches(_dataset(9), 4, _rows(), seed=0),
     InputError, "drop_remainder"),
    ("epoch_order 0", lambda: data.epoch_order(0, seed=0), InputError, "num_examples"),
    ("local batches size", lambda: data.process_local_batches(_dataset(8), 3, _rows(), seed=0),
     InputError, "multiple of 2"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_numpy_integers_are_counts():
    batches = data.sharded_batches(_dataset(8), np.int64(4), _rows(), seed=np.int32(1),
                                   epoch=np.int64(0))
    assert len(batches) == 2 and data.batch_axis_size(_rows(4), ndim=np.int64(2)) == 4


def test_rows_by_device_shows_every_value_in_boxes_that_wrap():
    """sharded_data.md: the first batch's ids, one box per device, nothing clipped."""
    first = next(data.sharded_batches((np.arange(40),), 16, _sharding(), seed=0))[0]
    shown = data.rows_by_device(first, title="ids")
    values = np.asarray(first)
    lines = str(shown).splitlines()
    assert lines[0] == "ids" and lines[2].startswith("D0 (rows 0-1): ")
    for d in range(8):
        assert lines[2 + d] == f"D{d} (rows {2 * d}-{2 * d + 1}): {values[2 * d]} {values[2 * d + 1]}"
        assert f"{values[2 * d]} {values[2 * d + 1]}</div>" in shown.html
    assert "flex-wrap:wrap" in shown.html and "white-space:nowrap" in shown.html
    many = next(data.sharded_batches((np.arange(160),), 160, _sharding(), seed=0))[0]
    assert str(data.rows_by_device(many)).splitlines()[1].endswith(" ...")
    with pytest.raises(TypeError, match="title"):
        data.rows_by_device(first, title=3)


def test_loader_errors_are_value_errors():
    """sharded_data.md: the table shows InputError, a ValueError subclass."""
    from spmd_guide.core.checks import InputError

    assert issubclass(InputError, ValueError)
    with pytest.raises(InputError):
        data.sharded_batches((np.arange(40),), 12, _sharding(), seed=0)
