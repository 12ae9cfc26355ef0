"""Which devices an HLO text names: replica groups and GSPMD's tile assignments.

A collective's ``replica_groups=`` come in three spellings, all read by
:func:`parse_replica_groups`: explicit lists ``{{0,1,2,3},{4,5,6,7}}``, an iota
``[2,4]<=[4,2]T(1,0)``, and mesh axes ``mesh['a'=4,'b'=2] {'a'}`` (sub-axes ``{'a':(2)2}``, a
device order ``device_ids=(...)``). JAX 0.10 printed the partitioner's collectives with mesh
axes and ``shard_map``'s as explicit lists; JAX 0.12 prints both with mesh axes wherever the
groups follow them (explicit lists remain for groups that do not, such as
``axis_index_groups``). GSPMD's notation for a sharding, ``{devices=[2,4]<=[4,2]T(1,0)}``, is
read by :func:`parse_tile_assignment`. :mod:`spmd_guide.core.hlo_text` re-exports all of it.

Every number these functions return is a *position* in the compiled program's device list
(for a program over one mesh, ``mesh.devices.flat``), which is what HLO writes; it is a
``jax.Device.id`` only when that list is in id order. ``hlo_text.device_ids`` maps positions
to ids.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from spmd_guide.core import checks

__all__ = ["parse_replica_groups", "parse_tile_assignment", "replica_groups_text"]


def _int_lists(text: str) -> list[list[int]]:
    """``{{0,1},{2,3}}`` -> ``[[0, 1], [2, 3]]`` (also ``{}`` -> ``[]``)."""
    return [[int(v) for v in inner.split(",") if v.strip()]
            for inner in re.findall(r"\{([^{}]*)\}", text) if inner.strip()]


def _iota(reshape: Sequence[int], transpose: Sequence[int] | None) -> np.ndarray:
    devices = np.arange(math.prod(reshape)).reshape(tuple(reshape))
    return devices.transpose(tuple(transpose)) if transpose is not None else devices


_IOTA_GROUPS = re.compile(
    r"^\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?$"
)
_MESH_GROUPS = re.compile(
    r"^mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>[^)]*(?:\([^)]*\))?[^)]*)\))?"
    r"\s*\{(?P<grouped>[^}]*)\}$"
)
_MESH_AXIS = re.compile(r"^'?([^'=]+)'?=(\d+)$")
_GROUP_AXIS = re.compile(r"^'?([^':]+)'?(?::\((\d+)\)(\d+))?$")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _mesh_groups(match: re.Match[str]) -> tuple[tuple[int, ...], ...]:
    """Expand ``mesh[...] {axes}``: each group varies the named (sub-)axes, the rest fixed."""
    names, sizes = [], []
    for item in match["axes"].split(","):
        axis = _MESH_AXIS.match(item.strip())
        if not axis:
            raise ValueError(f"cannot read mesh axis {item!r} in replica_groups")
        names.append(axis.group(1))
        sizes.append(int(axis.group(2)))
    ids = match["ids"]
    if ids is None:
        devices = np.arange(math.prod(sizes))
    else:
        devices = _device_list(ids.strip(), math.prod(sizes))
    grouped: list[tuple[str, int | None, int]] = []  # (axis, sub-axis pre-size, size)
    for item in match["grouped"].split(","):
        if not item.strip():
            continue
        ref = _GROUP_AXIS.match(item.strip())
        if not ref or ref.group(1) not in names:
            raise ValueError(f"replica_groups names axis {item!r}, not in mesh {names}")
        if ref.group(2) is None:
            grouped.append((ref.group(1), None, sizes[names.index(ref.group(1))]))
        else:
            grouped.append((ref.group(1), int(ref.group(2)), int(ref.group(3))))
    # Split each axis into pieces: a sub-axis ":(pre)size" is the `size` devices that
    # follow the `pre` major ones along that axis.
    dims: list[int] = []
    index_of: dict[tuple[str, int | None], int] = {}
    for name, size in zip(names, sizes, strict=True):
        subs = sorted((pre, sub) for n, pre, sub in grouped if n == name and pre is not None)
        cursor = 1
        for pre, sub in subs:
            if pre > cursor:
                dims.append(pre // cursor)
            index_of[(name, pre)] = len(dims)
            dims.append(sub)
            cursor = pre * sub
        if size % cursor:
            raise ValueError(f"sub-axes of {name!r} (size {size}) do not divide it")
        if cursor == 1:
            index_of[(name, None)] = len(dims)
            dims.append(size)
        elif size // cursor > 1:
            dims.append(size // cursor)
    keep = [index_of[(name, pre)] for name, pre, _ in grouped]
    rest = [i for i in range(len(dims)) if i not in keep]
    group_size = math.prod(dims[i] for i in keep)
    array = devices.reshape(dims).transpose(rest + keep).reshape(-1, group_size)
    return tuple(tuple(int(d) for d in row) for row in array)


def _device_list(text: str, count: int) -> np.ndarray:
    """Device positions of a mesh, printed as an iota (``[4,2]T(1,0)``, optionally after
    ``[dims]<=``) or as a list (optionally after its ``[dims]``)."""
    iota = re.match(r"^(?:\[[\d,]+\]<=)?\[([\d,]+)\](?:T\(([\d,]+)\))?$", text)
    if iota:
        perm = _ints(iota.group(2)) if iota.group(2) else None
        devices = _iota(_ints(iota.group(1)), perm).reshape(-1)
    else:
        devices = np.array([int(v) for v in re.findall(r"\d+", re.sub(r"^\[[\d,]*\]", "", text))])
    if devices.size != count:
        raise ValueError(f"cannot read mesh device_ids=({text}) for {count} devices")
    return devices


def parse_replica_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """The device groups an HLO ``replica_groups=`` value names, in any of its three spellings,
    as positions in the program's device list (module docs).

    >>> parse_replica_groups("{{0,2},{1,3}}")
    ((0, 2), (1, 3))
    >>> parse_replica_groups("[2,2]<=[2,2]T(1,0)")
    ((0, 2), (1, 3))
    >>> parse_replica_groups("mesh['a'=2,'b'=2] {'a'}")
    ((0, 2), (1, 3))

    ``{}`` (every device in one group) gives ``()``: the caller knows the device count.
    """
    text = text.strip()
    if text.startswith("{"):
        return tuple(tuple(group) for group in _int_lists(text))
    iota = _IOTA_GROUPS.match(text)
    if iota:
        n_groups, size = int(iota.group(1)), int(iota.group(2))
        perm = _ints(iota.group(4)) if iota.group(4) else None
        devices = _iota(_ints(iota.group(3)), perm).reshape(n_groups, size)
        return tuple(tuple(int(d) for d in row) for row in devices)
    mesh = _MESH_GROUPS.match(text)
    if mesh:
        return _mesh_groups(mesh)
    raise ValueError(f"cannot read replica_groups={text!r}")


def replica_groups_text(attributes: str) -> str | None:
    """The value of ``replica_groups=`` in an instruction's attributes, whatever its
    spelling (a mesh value runs through its ``{axes}``), or None when there is none."""
    if not isinstance(attributes, str):
        raise checks.InputTypeError(
            f"replica_groups_text needs an instruction's attribute text, got {attributes!r:.60}.")
    match = re.search(r"replica_groups=", attributes)
    if match is None:
        return None
    if attributes.startswith("mesh[", match.end()):  # through `, device_ids=(...) {axes}`
        return attributes[match.end():attributes.index("}", match.end()) + 1]
    return _attribute_value(attributes, match.end())


_TILES = re.compile(
    r"^\{?\s*devices=\[(?P<dims>[\d,]+)\](?P<ids>[^ }]*)(?P<rest>[^}]*)\}?$")


def parse_tile_assignment(text: str) -> np.ndarray:
    """Which device holds which tile, from GSPMD's sharding notation, as positions in the
    program's device list (``mesh.devices.flat``; ``hlo_text.device_ids`` maps them to ids).

    ``{devices=[2,4]<=[4,2]T(1,0)}`` cuts the array into 2 x 4 tiles. The part after
    ``<=`` is not a list of devices: it says how to write the positions 0..n-1 (an *iota*):
    reshape ``arange(8)`` to ``[4,2]`` and transpose it by ``(1,0)``; that array, read in
    order, fills the ``[2,4]`` grid of tiles. Older programs list the positions instead
    (``devices=[2,4]0,2,4,6,1,3,5,7``). With ``last_tile_dim_replicate`` the last entry of
    the dimensions counts copies of each tile. Returns an integer array of the tile grid's
    shape (copies last).

    >>> parse_tile_assignment("{devices=[2,4]<=[4,2]T(1,0)}").tolist()
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    if not isinstance(text, str):
        raise checks.InputTypeError(
            f"parse_tile_assignment needs HLO sharding text, got {text!r:.60}.")
    match = _TILES.match(text.strip())
    if not match:
        raise ValueError(
            f"cannot read the tile assignment {text!r}: expected GSPMD's notation such as "
            "{devices=[2,4]<=[4,2]T(1,0)} ({replicated} and {maximal ...} have no tiles).")
    dims = _ints(match["dims"])
    ids = match["ids"].strip()
    if ids.startswith("<="):
        devices = _device_list(ids[2:], math.prod(dims))
    else:
        devices = np.array(_ints(ids))
        if devices.size != math.prod(dims):
            raise ValueError(
                f"the tile assignment {text!r} lists {devices.size} devices for "
                f"{math.prod(dims)} tiles.")
    return devices.reshape(dims)


def _attribute_value(attrs: str, start: int) -> str:
    """The text of an attribute value starting at ``start`` (up to the next top-level comma)."""
    depth = 0
    for i in range(start, len(attrs)):
        c = attrs[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return attrs[start:i]
    return attrs[start:]
