"""The placement helpers every strategy shares: device lists, even splits, trimmed specs and
the Auto twin of an Explicit mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.nn import placement


def test_device_list_accepts_lists_and_arrays_of_devices():
    assert placement.device_list(None) == list(jax.devices())
    assert placement.device_list(DEVICES[:3]) == list(DEVICES[:3])
    assert placement.device_list(tuple(DEVICES[:2])) == list(DEVICES[:2])
    grid = np.array(DEVICES[:4], dtype=object).reshape(2, 2)
    assert placement.device_list(grid) == list(DEVICES[:4])


@pytest.mark.parametrize(("devices", "word"), [
    ("cpu", "list of jax.Device"), (4, "list of jax.Device"), ([0, 1], "jax.Device objects"),
    (mesh_of(2), "got a Mesh"),
])
def test_device_list_refuses_what_is_not_devices(devices, word):
    with pytest.raises(InputTypeError, match=word):
        placement.device_list(devices)


def test_auto_twin_keeps_devices_and_names():
    auto = mesh_of(8, ("a", "b"), (4, 2))
    assert placement.auto_twin(auto) is auto
    twin = placement.auto_twin(mesh_of(8, ("a", "b"), (4, 2), explicit=True))
    assert twin.axis_types == (AxisType.Auto,) * 2
    assert twin.axis_names == auto.axis_names and (twin.devices == auto.devices).all()


def test_trimmed_drops_trailing_nones_only():
    assert placement.trimmed(P("model", None)) == P("model")
    assert placement.trimmed(P(None, "model")) == P(None, "model")
    assert placement.trimmed(P(None, None)) == P()


def test_check_split_names_the_size_and_the_axes():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    placement.check_split("dp", "x", (8, 6), P("a", "b"), mesh, ("batch size", "width"))
    with pytest.raises(InputError, match=r"width of x \(8, 5\) is 5.*'b' \(size 2\)"):
        placement.check_split("dp", "x", (8, 5), P("a", "b"), mesh, ("batch size", "width"))
    with pytest.raises(InputError, match=r"'a' \(size 4\) x 'b' \(size 2\)"):
        placement.check_split("dp", "x", (12,), P(("a", "b")), mesh, ("batch size",))
    with pytest.raises(InputError, match="divisible by its 'model' axis size 2, got 3 devices"):
        placement.check_device_count("auto_dp_tp", 3, 2, "model")
