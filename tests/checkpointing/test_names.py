"""Leaf names: every pytree kind a state is made of (dicts, lists, tuples, named tuples,
optax states, dataclasses) is named as Orbax names it, and a tree whose leaves would share a
name, or with a key that holds a dot, is refused by every function that takes one, before
anything is written; typed keys are stored as their key data."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import anatomy, checkpoint, names
from spmd_guide.core.checks import InputError, InputTypeError


class _Moments(NamedTuple):
    mu: Any
    nu: Any


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w"], meta_fields=[])
@dataclasses.dataclass
class _Node:
    w: Any


def _x(n=4):
    return np.arange(float(n), dtype=np.float32)


#: Each pair of paths Orbax would name alike: one key with a dot, one nested path.
COLLISIONS = [
    ({"a.b": _x(), "a": {"b": _x() + 1}}, "a.b"),
    ({"a.0": _x(), "a": [_x() + 1]}, "a.0"),
    ({"a.1": _x(), "a": (_x(), _x() + 1)}, "a.1"),
    ({"m.mu": _x(), "m": _Moments(_x(), _x())}, "m.mu"),
    ({"n.w": _x(), "n": _Node(_x())}, "n.w"),
    ({"o.0.count": np.int32(0), "o": optax.adam(1e-3).init({"w": _x()})}, "o.0.count"),
    ({"d.1": _x(), "d": {1: _x()}}, "d.1"),
]


@pytest.mark.parametrize(("state", "name"), COLLISIONS)
def test_leaves_that_orbax_would_name_alike_are_refused_everywhere(tmp_path, state, name):
    target = tmp_path / "new"
    with pytest.raises(InputError, match="one name") as info:
        checkpoint.save(target, state, step=1)
    assert repr(name) in str(info.value) and str(info.value).count("[") >= 2  # both paths
    assert not target.exists()
    placed = jax.tree.map(lambda x: jax.device_put(x), state)
    for call in (lambda: checkpoint.start_save(target, placed, step=1),
                 lambda: anatomy.write_plan(placed), lambda: anatomy.state_bytes(placed),
                 lambda: anatomy.layouts(placed), lambda: anatomy.bytes_per_device(placed)):
        with pytest.raises(InputError, match="one name"):
            call()
    assert not target.exists()


def test_keys_that_hold_dots_or_cannot_be_named_are_refused(tmp_path):
    target = tmp_path / "new"
    with pytest.raises(InputError, match="holds a dot") as info:
        checkpoint.save(target, {"lr.max": _x()}, step=1)
    assert "'lr_max'" in str(info.value)
    with pytest.raises(InputTypeError, match="can flatten"):  # JAX cannot sort the keys
        checkpoint.save(target, {1: _x(), "b": _x()}, step=1)
    assert not target.exists()
    directory = tmp_path / "saved"
    checkpoint.save(directory, {"w": _x()}, step=1)
    like = {"w.x": jax.ShapeDtypeStruct((4,), np.float32, sharding=NamedSharding(mesh_of(1),
                                                                                  P()))}
    with pytest.raises(InputError, match="like has the key 'w.x'"):
        checkpoint.restore(directory, like=like)
    with pytest.raises(InputError, match="like has the key 'w.x'"):
        anatomy.read_summary(directory, like=like)


def test_names_and_stored_form_are_orbaxs():
    state = {"l": [_x()], "m": _Moments(_x(), _x()), "n": _Node(_x()),
             "o": optax.adam(1e-3).init({"w": _x()})}
    assert [names.leaf_name(p) for p, _ in names.named_leaves("state", state)] == [
        "l.0", "m.mu", "m.nu", "n.w", "o.0.count", "o.0.mu.w", "o.0.nu.w"]
    # The kind of each container: a list or tuple index is [i], a key or a field is .name.
    assert [names.structure_name(p) for p, _ in names.named_leaves("state", state)] == [
        "l[0]", "m.mu", "m.nu", "n.w", "o[0].count", "o[0].mu.w", "o[0].nu.w"]
    as_list, as_dict = ({"blocks": [{"w": _x()}]}, {"blocks": {0: {"w": _x()}}})
    (p_list, _), (p_dict, _) = jax.tree_util.tree_leaves_with_path(as_list) + \
        jax.tree_util.tree_leaves_with_path(as_dict)
    assert names.leaf_name(p_list) == names.leaf_name(p_dict) == "blocks.0.w"  # Orbax's
    assert (names.structure_name(p_list), names.structure_name(p_dict)) == ("blocks[0].w",
                                                                           "blocks.0.w")
    keys = jax.random.split(jax.random.key(0), 8)
    stored = names.physical(jax.ShapeDtypeStruct((8,), keys.dtype, sharding=NamedSharding(
        mesh_of(8), P("x"))))
    assert (stored.shape, stored.dtype, stored.sharding.spec) == ((8, 2), np.uint32,
                                                                  P("x", None))
    assert names.is_key(keys) and not names.is_key(_x())


def test_every_pytree_kind_round_trips(tmp_path):
    state = {"l": [_x(), _x(2)], "t": (_x(3),), "m": _Moments(_x(), _x() + 1),
             "n": _Node(_x(5)), "o": optax.adam(1e-3).init({"w": _x()}), "s": 3}
    checkpoint.save(tmp_path, state, step=0)
    sharding = NamedSharding(mesh_of(2), P())
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype,
                                                       sharding=sharding), state)
    back = checkpoint.restore(tmp_path, like=like)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", [("a", "b"), "a.b", ["a"], (0,), None, b"a"])
def test_a_name_needs_a_key_path(path):
    """A tuple of strings is not a key path: leaf_name(('a', 'b')) would say 'ab'."""
    for name in (names.leaf_name, names.structure_name):
        with pytest.raises(InputTypeError, match="key path"):
            name(path)


def _snapshot(directory):
    return sorted((str(p.relative_to(directory)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in directory.rglob("*"))


@pytest.mark.parametrize(("saved", "wrong"), [
    ({"blocks": [_x(), _x() + 1]}, {"blocks": {0: _x(), 1: _x() + 1}}),
    ({"blocks": {0: _x(), 1: _x() + 1}}, {"blocks": [_x(), _x() + 1]}),
    ({"blocks": (_x(), _x() + 1)}, {"blocks": {"0": _x(), "1": _x() + 1}})])
def test_a_target_of_another_structure_is_the_callers_mistake_not_damage(tmp_path, saved,
                                                                         wrong):
    """Orbax names a list index and a dict key alike (blocks.0) but restores one into the
    other only within its kind: the restore refuses the target and shows both structures; it
    never calls the sound checkpoint damaged or suggests deleting it."""
    checkpoint.save(tmp_path, saved, step=1)
    before = _snapshot(tmp_path)
    sharding = NamedSharding(mesh_of(2), P())
    shapes = functools.partial(jax.tree.map, lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding))
    for call in (lambda: checkpoint.restore(tmp_path, like=shapes(wrong)),
                 lambda: anatomy.read_summary(tmp_path, like=shapes(wrong))):
        with pytest.raises(InputError, match="structure differs") as info:
            call()
        text = str(info.value)
        assert not isinstance(info.value, checkpoint.DamagedCheckpointError)
        assert "blocks[0]" in text and "blocks.0" in text and "intact" in text
        assert "delete" not in text and "damaged" not in text
    assert _snapshot(tmp_path) == before  # nothing on disk changed
    back = checkpoint.restore(tmp_path, like=shapes(saved))  # the right target reads it
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(a, b)
    assert checkpoint.saved_structure(tmp_path) == sorted(
        names.structure_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(saved))


def test_orbaxs_own_structure_complaint_is_not_damage(tmp_path):
    """The safety net behind the check: Orbax's structure mismatch, if it ever reaches the
    reader, is an InputError that says the checkpoint is intact."""
    checkpoint.save(tmp_path, {"w": _x()}, step=1)
    with pytest.raises(InputError, match="intact") as info:
        with checkpoint._reading(tmp_path, 1):
            raise ValueError(checkpoint._STRUCTURE_MISMATCH + " structures do not match")
    assert not isinstance(info.value, checkpoint.DamagedCheckpointError)
