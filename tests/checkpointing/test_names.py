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
