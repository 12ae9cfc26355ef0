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

Both readers follow a strict grammar: exactly the forms XLA's printer writes
(``xla/hlo/ir/replica_group.cc``, ``mesh_and_axis.cc``, ``tile_assignment.cc``), and the
facts XLA's verifier guarantees (groups are disjoint, of one size and cover devices 0..n-1; a
tile assignment uses each device once). Anything else raises :class:`checks.InputError`
quoting the text, where it stopped, and the form expected: a malformed line is never read as
some other set of devices.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from spmd_guide.core import checks

__all__ = ["parse_replica_groups", "parse_tile_assignment", "replica_groups_text"]

_GROUP_FORMS = ("explicit groups {{0,1},{2,3}} (or {} for one group of all), an iota "
                "[2,4]<=[4,2]T(1,0), or mesh axes mesh['a'=4,'b'=2] {'a'}")
_TILE_FORMS = ("GSPMD's notation {devices=[2,4]<=[4,2]T(1,0)} or {devices=[2,4]0,2,4,6,1,3,5,7}, "
               "optionally followed by last_tile_dim_replicate or last_tile_dims={manual}")

_TOKEN = re.compile(r"\s*(?:(?P<int>-?\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<quoted>'[^']*')"
                    r"|(?P<punct><=|[{}\[\](),=:]))")


@dataclass(frozen=True)
class _Token:
    kind: str  # "int", "name", "quoted", "punct", "end"
    text: str
    at: int


class _Reader:
    """Tokens of one HLO value, read front to back; every error quotes the text."""

    def __init__(self, text: str, what: str, forms: str) -> None:
        self.text, self.what, self.forms = text, what, forms
        self.tokens: list[_Token] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                if text[position:].strip() == "":
                    break
                self.fail(f"unexpected character {text[position:].lstrip()[0]!r}",
                          len(text) - len(text[position:].lstrip()))
            kind = match.lastgroup
            self.tokens.append(_Token(kind, match.group(kind), match.start(kind)))
            position = match.end()
        self.tokens.append(_Token("end", "", len(text)))
        self.i = 0

    def fail(self, message: str, at: int | None = None) -> None:
        where = f" at character {at}" if at is not None else ""
        raise checks.InputError(
            f"cannot read {self.what} {checks.value_text(self.text)}: {message}{where}; "
            f"expected {self.forms}.")

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def next(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def at(self, text: str) -> bool:
        return self.peek().kind in ("punct", "name") and self.peek().text == text

    def take(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        token = self.peek()
        if not self.take(text):
            found = repr(token.text) if token.kind != "end" else "the end of the text"
            self.fail(f"expected {text!r}, found {found}", token.at)

    def integer(self, what: str, *, minimum: int = 0) -> int:
        token = self.next()
        if token.kind != "int":
            found = repr(token.text) if token.kind != "end" else "the end of the text"
            self.fail(f"expected {what} (an integer), found {found}", token.at)
        value = int(token.text)
        if value < minimum:
            self.fail(f"{what} {value} is below {minimum}", token.at)
        return value

    def integers(self, what: str, close: str, *, minimum: int = 0) -> list[int]:
        """``a,b,c`` up to ``close`` (consumed); at least one."""
        values = [self.integer(what, minimum=minimum)]
        while self.take(","):
            values.append(self.integer(what, minimum=minimum))
        self.expect(close)
        return values

    def name(self, what: str) -> str:
        token = self.next()
        if token.kind == "quoted":
            return token.text[1:-1]
        if token.kind == "name":
            return token.text
        found = repr(token.text) if token.kind != "end" else "the end of the text"
        self.fail(f"expected {what}, found {found}", token.at)
        raise AssertionError  # unreachable

    def end(self) -> None:
        token = self.peek()
        if token.kind != "end":
            self.fail(f"unexpected text {self.text[token.at:token.at + 20]!r} after the value",
                      token.at)


def _iota(reader: _Reader, reshape: list[int], perm: list[int] | None) -> np.ndarray:
    """``arange(prod(reshape)).reshape(reshape).transpose(perm)``, read in order."""
    if perm is not None and sorted(perm) != list(range(len(reshape))):
        reader.fail(f"the transpose T({','.join(map(str, perm))}) is not a permutation of the "
                    f"{len(reshape)} dimensions of [{','.join(map(str, reshape))}]")
    devices = np.arange(math.prod(reshape)).reshape(tuple(reshape))
    return (devices.transpose(tuple(perm)) if perm is not None else devices).reshape(-1)


def _iota_tail(reader: _Reader, what: str) -> np.ndarray:
    """``[reshape]`` then optional ``T(perm)``, after ``<=``."""
    reader.expect("[")
    reshape = reader.integers(f"{what} reshape size", "]", minimum=1)
    perm = None
    if reader.take("T"):
        reader.expect("(")
        perm = reader.integers("transpose index", ")")
    return _iota(reader, reshape, perm)


def _permutation(reader: _Reader, ids: list[int], what: str) -> None:
    """``ids`` must be 0..n-1, each once (XLA's verifier guarantees it)."""
    seen: set[int] = set()
    for d in ids:
        if d in seen:
            reader.fail(f"device {d} appears twice in {what}")
        seen.add(d)
    if seen != set(range(len(ids))):
        missing = sorted(set(range(len(ids))) - seen)
        reader.fail(f"{what} name {len(ids)} devices, which must be 0..{len(ids) - 1}, but "
                    f"{max(seen)} is out of range and {missing[0]} is missing")


# --------------------------------------------------------------------------- replica groups


def _explicit_groups(reader: _Reader) -> tuple[tuple[int, ...], ...]:
    reader.expect("{")
    if reader.take("}"):
        return ()
    groups = []
    while True:
        reader.expect("{")
        groups.append(tuple(reader.integers("device position", "}")))
        if not reader.take(","):
            break
    reader.expect("}")
    sizes = sorted({len(g) for g in groups})
    if len(sizes) > 1:
        reader.fail(f"the groups have unequal sizes {sizes}")
    _permutation(reader, [d for g in groups for d in g], "the groups")
    return tuple(groups)


def _iota_groups(reader: _Reader) -> tuple[tuple[int, ...], ...]:
    reader.expect("[")
    n_groups = reader.integer("number of groups", minimum=1)
    reader.expect(",")
    size = reader.integer("group size", minimum=1)
    reader.expect("]")
    reader.expect("<=")
    devices = _iota_tail(reader, "iota")
    if devices.size != n_groups * size:
        reader.fail(f"[{n_groups},{size}] names {n_groups * size} devices but the iota "
                    f"holds {devices.size}")
    return tuple(tuple(int(d) for d in row) for row in devices.reshape(n_groups, size))


def _device_ids(reader: _Reader, count: int) -> np.ndarray:
    """A mesh's ``device_ids=(...)``: an iota ``[4,2]T(1,0)`` (optionally ``[dims]<=``
    first), or a list of ids (optionally after its ``[dims]``)."""
    reader.expect("(")
    dims = None
    if reader.take("["):
        dims = reader.integers("device_ids dimension", "]", minimum=1)
    if dims is not None and reader.at("<="):
        reader.take("<=")
        devices = _iota_tail(reader, "device_ids")
    elif dims is not None and not (reader.peek().kind == "int"):
        perm = None
        if reader.take("T"):
            reader.expect("(")
            perm = reader.integers("transpose index", ")")
        devices = _iota(reader, dims, perm)
        dims = None
    else:
        ids = [reader.integer("device position")]
        while reader.take(","):
            ids.append(reader.integer("device position"))
        _permutation(reader, ids, "device_ids")
        devices = np.array(ids)
    reader.expect(")")
    if dims is not None and math.prod(dims) != devices.size:
        reader.fail(f"device_ids dimensions {dims} hold {math.prod(dims)} devices, not "
                    f"{devices.size}")
    if devices.size != count:
        reader.fail(f"device_ids name {devices.size} devices for a mesh of {count}")
    return devices


def _mesh_groups(reader: _Reader) -> tuple[tuple[int, ...], ...]:
    """``mesh[...] {axes}``: each group varies the named (sub-)axes, in the order named, the
    rest fixed (``MeshAxesReplicaGroupList::flattened_replica_groups`` in XLA)."""
    reader.expect("mesh")
    reader.expect("[")
    names: list[str] = []
    sizes: list[int] = []
    while True:
        name = reader.name("a mesh axis name")
        if name in names:
            reader.fail(f"mesh axis {name!r} is named twice")
        reader.expect("=")
        names.append(name)
        sizes.append(reader.integer(f"size of mesh axis {name!r}", minimum=1))
        if not reader.take(","):
            break
    reader.expect("]")
    devices = np.arange(math.prod(sizes))
    if reader.take(","):
        reader.expect("device_ids")
        reader.expect("=")
        devices = _device_ids(reader, math.prod(sizes))
    reader.expect("{")
    grouped: list[tuple[str, int | None, int]] = []  # (axis, sub-axis pre-size, size)
    if not reader.at("}"):
        while True:
            token = reader.peek()
            name = reader.name("a mesh axis name")
            if name not in names:
                reader.fail(f"the groups name axis {name!r}, not in the mesh's {names}", token.at)
            full = sizes[names.index(name)]
            if reader.take(":"):
                reader.expect("(")
                pre = reader.integer("sub-axis pre-size", minimum=1)
                reader.expect(")")
                size = reader.integer("sub-axis size", minimum=2)
                if size >= full or full % (pre * size):
                    reader.fail(f"sub-axis {name}:({pre}){size} does not fit axis {name!r} of "
                                f"size {full}: pre-size x size must divide {full}, and size "
                                f"must be below it")
                grouped.append((name, pre, size))
            else:
                grouped.append((name, None, full))
            if not reader.take(","):
                break
    reader.expect("}")
    for name in names:  # a full axis once, or sub-axes that do not overlap
        refs = sorted((pre, size) for n, pre, size in grouped if n == name)
        if len(refs) > 1 and any(pre is None for pre, _ in refs):
            reader.fail(f"axis {name!r} is grouped more than once")
        for (pre_a, size_a), (pre_b, _) in zip(refs, refs[1:], strict=False):
            if pre_a * size_a > pre_b or pre_b % (pre_a * size_a):
                reader.fail(f"sub-axes of {name!r} overlap")
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
    Malformed text (unbalanced braces, trailing text, a repeated, negative or missing
    device, groups of unequal sizes, an axis the mesh lacks) raises
    :class:`~spmd_guide.core.checks.InputError` quoting it.
    """
    if not isinstance(text, str):
        raise checks.InputTypeError(
            f"parse_replica_groups needs the text of a replica_groups= value, got "
            f"{checks.value_text(text)}.")
    reader = _Reader(text, "replica_groups", _GROUP_FORMS)
    first = reader.peek()
    if first.text == "{":
        groups = _explicit_groups(reader)
    elif first.text == "[":
        groups = _iota_groups(reader)
    elif first.text == "mesh":
        groups = _mesh_groups(reader)
    else:
        found = repr(first.text) if first.kind != "end" else "empty text"
        reader.fail(f"it starts with {found}", first.at)
    reader.end()
    return groups


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
        end = attributes.find("}", match.end())
        if end < 0:
            raise checks.InputError(
                f"the replica_groups=mesh[...] value in {checks.value_text(attributes)} has no "
                "closing '}'; expected mesh['a'=4,'b'=2] {'a'}.")
        return attributes[match.end():end + 1]
    value = _attribute_value(attributes, match.end())
    if not value.strip():
        raise checks.InputError(
            f"replica_groups= has no value in {checks.value_text(attributes)}; expected groups "
            "such as {{0,1},{2,3}} or [2,4]<=[8].")
    depth = 0
    for c in value:
        depth += (c in "([{") - (c in ")]}")
        if depth < 0:
            break
    if depth:
        raise checks.InputError(
            f"the replica_groups= value {value!r} has unbalanced brackets; expected groups "
            "such as {{0,1},{2,3}}.")
    return value


# --------------------------------------------------------------------------- tile assignments


def parse_tile_assignment(text: str) -> np.ndarray:
    """Which device holds which tile, from GSPMD's sharding notation, as positions in the
    program's device list (``mesh.devices.flat``; ``hlo_text.device_ids`` maps them to ids).

    ``{devices=[2,4]<=[4,2]T(1,0)}`` cuts the array into 2 x 4 tiles. The part after
    ``<=`` is not a list of devices: it says how to write the positions 0..n-1 (an *iota*):
    reshape ``arange(8)`` to ``[4,2]`` and transpose it by ``(1,0)``; that array, read in
    order, fills the ``[2,4]`` grid of tiles. Older programs list the positions instead
    (``devices=[2,4]0,2,4,6,1,3,5,7``). With ``last_tile_dim_replicate`` the last entry of
    the dimensions counts copies of each tile. Returns an integer array of the tile grid's
    shape (copies last). The outer braces are optional, but both or neither.

    >>> parse_tile_assignment("{devices=[2,4]<=[4,2]T(1,0)}").tolist()
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    if not isinstance(text, str):
        raise checks.InputTypeError(
            f"parse_tile_assignment needs HLO sharding text, got {text!r:.60}.")
    reader = _Reader(text, "the tile assignment", _TILE_FORMS)
    braced = reader.take("{")
    if reader.peek().text in ("replicated", "maximal", "manual", "unknown"):
        reader.fail(f"{{{reader.peek().text}}} has no tiles", reader.peek().at)
    reader.expect("devices")
    reader.expect("=")
    reader.expect("[")
    dims = reader.integers("tile grid size", "]", minimum=1)
    count = math.prod(dims)
    if reader.take("<="):
        devices = _iota_tail(reader, "iota")
        if devices.size != count:
            reader.fail(f"the tile grid {dims} has {count} tiles but the iota holds "
                        f"{devices.size} devices")
    else:
        ids: list[int] = [reader.integer("device position")]
        while reader.take(","):
            ids.append(reader.integer("device position"))
        if len(ids) != count:
            reader.fail(f"it lists {len(ids)} devices for {count} tiles")
        _permutation(reader, ids, "the tile assignment's devices")
        devices = np.array(ids)
    if reader.take("last_tile_dim_replicate"):
        pass
    elif reader.take("last_tile_dims"):
        reader.expect("=")
        reader.expect("{")
        kinds = [reader.name("a subgroup kind (manual, replicated)")]
        while reader.take(","):
            kinds.append(reader.name("a subgroup kind (manual, replicated)"))
        reader.expect("}")
        if not set(kinds) <= {"manual", "replicated"} or len(kinds) >= len(dims):
            reader.fail(f"last_tile_dims={{{','.join(kinds)}}} must name manual or "
                        f"replicated, fewer than the {len(dims)} grid dimensions")
    if braced:
        reader.expect("}")
    reader.end()
    return devices.reshape(dims)


# --------------------------------------------------------------------------- attribute text


def _int_lists(text: str) -> list[list[int]]:
    """``{{0,1},{2,3}}`` -> ``[[0, 1], [2, 3]]`` (also ``{}`` -> ``[]``): pairs such as a
    permute's ``source_target_pairs``, where ids may repeat across lists."""
    return [[int(v) for v in inner.split(",") if v.strip()]
            for inner in re.findall(r"\{([^{}]*)\}", text) if inner.strip()]


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
