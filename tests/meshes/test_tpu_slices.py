"""tpu_slices: the chips jax.make_mesh's layout code puts on each mesh axis of small TPU
slices (stand-in devices), Part I's hop count on them, what each group's chips form, and bad
input. The numbers pinned here are the ones devices_and_meshes and parallelism print."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.meshes import tpu_slices


def _row(chip, shape, axis):
    return tpu_slices.layout_rows(chip, shape)[axis]


@pytest.mark.parametrize("chip, shape, axis, first, steps, as_ring, form", [
    # A 1-D mesh over a 4-chip v4 or v5p: the 2x2 face, listed in zigzag order.
    ("tpu-v4", (4,), 0, "000 010 100 110", [1, 2, 1, 2], False, "ring"),
    ("tpu-v5p", (4,), 0, "000 010 100 110", [1, 2, 1, 2], False, "ring"),
    ("tpu-v5e", (4,), 0, "000 100 110 010", [1, 1, 1, 1], True, "ring"),
    ("tpu-v4", (8,), 0, "000 001 010 011 100 101 110 111", [1, 2, 1, 3, 1, 2, 1, 3], False,
     "ring"),
    ("tpu-v5e", (8,), 0, "000 100 200 300 310 210 110 010", [1] * 8, True, "ring"),
    ("tpu-v5p", (8,), 0, "000 100 110 010 011 111 101 001", [1] * 8, True, "ring"),
    # The (4, 2) mesh of auto_dp_tp: a face on v4, scattered chips on v5e/v6e/v5p.
    ("tpu-v4", (4, 2), 0, "000 001 010 011", [1, 2, 1, 2], False, "ring"),
    ("tpu-v5e", (4, 2), 0, "000 200 310 110", [2, 2, 2, 2], False, "scattered"),
    ("tpu-v6e", (4, 2), 0, "000 200 310 110", [2, 2, 2, 2], False, "scattered"),
    ("tpu-v5p", (4, 2), 0, "000 110 011 101", [2, 2, 2, 2], False, "scattered"),
    ("tpu-v5e", (4, 2), 1, "000 100", [1, 1], False, "line"),
    ("tpu-v5e", (2, 4), 1, "000 100 200 300", [1, 1, 1, 3], False, "line"),
])
def test_the_groups_jax_make_mesh_makes(chip, shape, axis, first, steps, as_ring, form):
    row = _row(chip, shape, axis)
    assert row["chips (first group)"] == first
    assert row["hops in mesh order"] == steps
    assert row["mesh order a ring"] is as_ring
    assert row["chips form"] == form


def test_the_layout_is_jax_s_own():
    """The stand-ins run mesh_utils.create_device_mesh itself: a v5e 2x2 takes JAX's
    _TRAY_2x2_RING_ORDER (0, 1, 3, 2) of the slice's devices."""
    from jax._src import mesh_utils

    devices = tpu_slices.slice_devices("tpu-v5e", 4)
    laid = tpu_slices.mesh_chips("tpu-v5e", (4,))
    assert [c for c in laid] == [devices[i].coords for i in mesh_utils._TRAY_2x2_RING_ORDER]
    assert all(d.device_kind == "TPU v5 lite" and d.core_on_chip == 0 for d in devices)


def test_group_shapes_and_hops():
    assert tpu_slices.group_shape([(0, 0, 0)]) == "one chip"
    assert tpu_slices.group_shape([(0, 0, 0), (1, 0, 0)]) == "line"
    assert tpu_slices.group_shape([(0, 0, 0), (1, 1, 0)]) == "scattered"
    assert tpu_slices.group_shape([(0, 0, 0), (1, 1, 0), (0, 1, 0), (1, 0, 0)]) == "ring"
    assert tpu_slices.group_shape([(0, 0, 0), (2, 0, 0), (1, 0, 0)]) == "line"
    assert tpu_slices.hops(np.array([(0, 0, 0), (1, 1, 0)])) == [2, 2]


@pytest.mark.parametrize("call, error, word", [
    (lambda: tpu_slices.slice_devices("tpu-v3", 4), InputError, "chip"),
    (lambda: tpu_slices.slice_devices(["tpu-v4"], 4), InputTypeError, "chip"),
    (lambda: tpu_slices.slice_devices("tpu-v4", 16), InputError, "n_chips=16"),
    (lambda: tpu_slices.slice_devices("tpu-v4", 4.0), InputTypeError, "n_chips"),
    (lambda: tpu_slices.slice_devices("tpu-v4", True), InputTypeError, "n_chips"),
    (lambda: tpu_slices.mesh_chips("tpu-v4", (3,)), InputError, "n_chips=3"),
    (lambda: tpu_slices.mesh_chips("tpu-v4", "4"), InputTypeError, "mesh_shape"),
    (lambda: tpu_slices.axis_groups("tpu-v4", (4, 2), 2), InputError, "axis"),
    (lambda: tpu_slices.hops([]), InputTypeError, "group"),
    (lambda: tpu_slices.hops([(0, 0)]), InputTypeError, "group"),
    (lambda: tpu_slices.hops([(0, 0, -1)]), InputError, "group"),
    (lambda: tpu_slices.group_shape([(0, 0, 0), (0, 0, 0)]), InputError, "twice"),
    (lambda: tpu_slices.group_shape([(i, 0, 0) for i in range(9)]), InputError, "at most 8"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
