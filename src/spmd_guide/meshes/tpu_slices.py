"""Which chips ``jax.make_mesh`` puts on each mesh axis of a small TPU slice, on stand-in devices.

``jax.make_mesh`` hands TPU devices to ``mesh_utils.create_device_mesh``, which reads only each
device's ``device_kind``, ``coords``, ``core_on_chip`` and ``platform``; stand-ins with those
attributes (:class:`~spmd_guide.meshes.tpu_ring.TrayDevice`) run JAX's real layout code on a
CPU. :func:`slice_devices` makes the chips of a 4- or 8-chip slice of a TPU v4, v5e, v5p or
v6e; :func:`mesh_chips` lays a mesh shape over them as ``jax.make_mesh`` does;
:func:`axis_groups` lists the chips of each group along one axis (the devices a collective
along that axis runs over), and :func:`group_shape` says what those chips form:

* ``"ring"``: they can be walked as a cycle of neighbouring chips (a 2x2 face, a 2x4 tray's
  rim);
* ``"line"``: only as a path of neighbours (two chips, or four in a row), a line without the
  link back;
* ``"scattered"``: not even that: some chip of the group has no neighbour in it, so steps
  cross chips of other groups;
* ``"one chip"``.

:func:`hops` is Part I's hop count (:func:`~spmd_guide.meshes.tpu_ring.ring_hops`) for chips
given by their coordinates: the distance of each step round the group in the order the mesh
lists it, and back to the start. The slices here are too small to have wraparound links, so a
distance is the sum of the coordinate differences. Part V prices each collective by the
:func:`group_shape` of its chips (``spmd_guide.rooflines.hardware``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import permutations, product

import numpy as np

from spmd_guide.core import checks
from spmd_guide.meshes.tpu_ring import TrayDevice

#: Chip keys (as ``spmd_guide.rooflines.hardware.CHIPS`` names them) -> the ``device_kind``
#: their devices report, which picks ``create_device_mesh``'s rule.
DEVICE_KINDS = {"tpu-v4": "TPU v4", "tpu-v5e": "TPU v5 lite", "tpu-v5p": "TPU v5p",
                "tpu-v6e": "TPU v6 lite"}
#: (chip, chips in the slice) -> the slice's shape (x, y, z), from each generation's smallest
#: slices: a 2x2 of four chips; eight as a 2x4 tray (v5e, v6e) or a 2x2x2 cube (v4, v5p).
SLICES = {("tpu-v4", 4): (2, 2, 1), ("tpu-v4", 8): (2, 2, 2),
          ("tpu-v5e", 4): (2, 2, 1), ("tpu-v5e", 8): (4, 2, 1),
          ("tpu-v5p", 4): (2, 2, 1), ("tpu-v5p", 8): (2, 2, 2),
          ("tpu-v6e", 4): (2, 2, 1), ("tpu-v6e", 8): (4, 2, 1)}
#: What the chips of a group form (:func:`group_shape`).
SHAPES = ("one chip", "ring", "line", "scattered")

Coords = tuple[int, int, int]


def _slice(chip: object, n_chips: object) -> tuple[str, int]:
    if not isinstance(chip, str):
        raise checks.InputTypeError(
            f"chip must be one chip name such as 'tpu-v4', got {chip!r} ({type(chip).__name__}).")
    chip = str(checks.one_of("chip", str(chip), DEVICE_KINDS))
    n = checks.count("n_chips", n_chips)
    if (chip, n) not in SLICES:
        raise checks.InputError(
            f"n_chips={n}: stand-ins are made for slices of "
            f"{sorted({k for c, k in SLICES if c == chip})} chips of {chip}.")
    return chip, n


def slice_devices(chip: str, n_chips: int) -> list[TrayDevice]:
    """Stand-ins for the chips of a ``n_chips`` slice of ``chip`` (:data:`SLICES`), one device
    per chip, numbered as a slice lists them: x fastest, then y, then z."""
    chip, n = _slice(chip, n_chips)
    dx, dy, dz = SLICES[chip, n]
    return [TrayDevice(id=i, coords=(x, y, z), core_on_chip=0, device_kind=DEVICE_KINDS[chip])
            for i, (z, y, x) in enumerate(product(range(dz), range(dy), range(dx)))]


def mesh_chips(chip: str, mesh_shape: Sequence[int]) -> np.ndarray:
    """The chip coordinates at each place of a mesh of ``mesh_shape`` over a slice of
    ``chip`` with that many chips, laid out as ``jax.make_mesh`` lays it out: an object array
    of ``(x, y, z)`` tuples. Like ``jax.make_mesh``, it lets ``create_device_mesh`` split a
    physical axis only on a v5e."""
    from jax.experimental import mesh_utils

    shape = checks.counts("mesh_shape", mesh_shape, min_length=1)
    devices = slice_devices(chip, math.prod(shape))
    laid = mesh_utils.create_device_mesh(
        shape, devices, allow_split_physical_axes=devices[0].device_kind == "TPU v5 lite")
    return np.vectorize(lambda d: d.coords, otypes=[object])(laid)


def axis_groups(chip: str, mesh_shape: Sequence[int], axis: int) -> list[list[Coords]]:
    """The chips of each group along mesh axis ``axis`` (its index), in mesh order: the chips
    a collective along that axis runs over."""
    laid = mesh_chips(chip, mesh_shape)
    axis = checks.count("axis", axis, minimum=0, maximum=laid.ndim - 1)
    moved = np.moveaxis(laid, axis, -1).reshape(-1, laid.shape[axis])
    return [[tuple(c) for c in row] for row in moved]


def _distance(a: Sequence[int], b: Sequence[int]) -> int:
    return int(sum(abs(p - q) for p, q in zip(a, b, strict=True)))


def _coords(name: str, group: object) -> list[Coords]:
    if isinstance(group, (str, bytes)) or not isinstance(group, (Sequence, np.ndarray)) \
            or len(group) == 0:
        raise checks.InputTypeError(
            f"{name} must be a non-empty list of chip coordinates (x, y, z), got {group!r:.60}.")
    out = []
    for i, c in enumerate(group):
        if isinstance(c, (str, bytes)) or not isinstance(c, (Sequence, np.ndarray)) \
                or len(c) != 3:
            raise checks.InputTypeError(
                f"{name}[{i}] must be three coordinates (x, y, z), got {c!r}.")
        out.append(tuple(checks.count(f"{name}[{i}]", v, minimum=0) for v in c))
    if len(set(out)) != len(out):
        raise checks.InputError(f"{name} names a chip twice: {out}.")
    return out


def hops(group: Sequence[Coords]) -> list[int]:
    """Chip distance of each step round ``group`` in its order, and back to the start (Part
    I's hop count): 1 between neighbours, 2 or more where the step crosses other chips."""
    chips = _coords("group", group)
    return [_distance(a, b) for a, b in zip(chips, [*chips[1:], chips[0]], strict=True)]


def group_shape(group: Sequence[Coords]) -> str:
    """What the chips of ``group`` form, in any order (:data:`SHAPES`): ``"ring"`` when a
    cycle of neighbours passes through them all, else ``"line"`` when a path of neighbours
    does (two neighbouring chips are a line: one link), else ``"scattered"``."""
    chips = _coords("group", group)
    if len(chips) == 1:
        return "one chip"
    if len(chips) > 8:
        raise checks.InputError(f"group has {len(chips)} chips; at most 8 are searched.")
    def neighbours(order: Sequence[Coords]) -> bool:
        return all(_distance(a, b) == 1 for a, b in zip(order, order[1:], strict=False))

    if len(chips) > 2 and any(neighbours((chips[0], *rest, chips[0]))
                              for rest in permutations(chips[1:])):
        return "ring"
    return "line" if any(neighbours(order) for order in permutations(chips)) else "scattered"


def layout_rows(chip: str, mesh_shape: Sequence[int]) -> list[dict[str, object]]:
    """One table row per mesh axis: its length, its first group's chips in mesh order, Part
    I's hop count round them, whether the mesh order is a ring of neighbours (every step one
    hop), and what the chips form in the best order (:func:`group_shape`; every group of the
    axis alike, or the list of shapes)."""
    laid = mesh_chips(chip, mesh_shape)
    rows = []
    for axis, length in enumerate(laid.shape):
        groups = axis_groups(chip, laid.shape, axis)
        shapes = sorted({group_shape(g) for g in groups})
        first = groups[0]
        steps = hops(first)
        rows.append({"chip": chip, "mesh": str(tuple(laid.shape)), "axis": axis,
                     "length": length,
                     "chips (first group)": " ".join("".join(map(str, c)) for c in first),
                     "hops in mesh order": steps,
                     "mesh order a ring": length > 2 and all(s == 1 for s in steps),
                     "chips form": shapes[0] if len(shapes) == 1 else ", ".join(shapes)})
    return rows
