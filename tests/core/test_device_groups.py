"""device_groups: the device groups of a collective (replica groups, in each spelling) and
GSPMD's tile assignments, from literal HLO (so the tests hold whatever the compiler prints)
and from programs JAX writes."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_guide.core import checks, device_groups, hlo_text


def test_unreadable_replica_groups_raise():
    with pytest.raises(ValueError, match="cannot read replica_groups"):
        device_groups.parse_replica_groups("<mystery>")
    with pytest.raises(ValueError, match="not in mesh"):
        device_groups.parse_replica_groups("mesh['a'=2] {'z'}")
    with pytest.raises(ValueError, match="do not divide"):
        device_groups.parse_replica_groups("mesh['a'=6] {'a':(1)4}")


def test_replica_groups_three_spellings_agree():
    explicit = device_groups.parse_replica_groups("{{0,2,4,6},{1,3,5,7}}")
    assert explicit == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert device_groups.parse_replica_groups("[2,4]<=[4,2]T(1,0)") == explicit
    assert device_groups.parse_replica_groups("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}") == explicit
    assert device_groups.parse_replica_groups("[2,4]<=[8]") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert device_groups.parse_replica_groups("mesh['axis_0'=4,'axis_1'=2] {'axis_1'}") == (
        (0, 1), (2, 3), (4, 5), (6, 7))
    assert device_groups.parse_replica_groups("mesh['a'=4,'b'=2] {'a','b'}") == (tuple(range(8)),)
    assert device_groups.parse_replica_groups("{}") == ()


def test_replica_groups_mesh_sub_axes_and_device_ids():
    # 'x':(2)2 is the middle factor of x=8 = 2 (major) x 2 x 2 (minor).
    assert device_groups.parse_replica_groups("mesh['x'=8] {'x':(2)2}") == (
        (0, 2), (1, 3), (4, 6), (5, 7))
    assert device_groups.parse_replica_groups("mesh['x'=8] {'x':(1)2}") == (
        (0, 4), (1, 5), (2, 6), (3, 7))
    # A non-iota mesh: devices [[0,2],[1,3]]; grouping over 'b' pairs each row.
    assert device_groups.parse_replica_groups("mesh['a'=2,'b'=2], device_ids=(0,2,1,3) {'b'}") == (
        (0, 2), (1, 3))
    # As the partitioner prints it: devices iota(8).reshape(4,2).T laid out as [1,2,4].
    assert device_groups.parse_replica_groups(
        "mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_1'}"
    ) == ((0, 1), (2, 3), (4, 5), (6, 7))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4).flatmap(
    lambda dims: st.tuples(st.just(dims), st.permutations(range(len(dims))),
                           st.integers(0, 10))))
def test_iota_replica_groups_match_an_index_reference(case):
    dims, perm, pick = case
    total = math.prod(dims)
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    size = divisors[pick % len(divisors)]
    text = f"[{total // size},{size}]<=[{','.join(map(str, dims))}]"
    text += f"T({','.join(map(str, perm))})"
    groups = device_groups.parse_replica_groups(text)
    # Reference: the p-th device of the flattened transposed iota, by index arithmetic.
    transposed_dims = [dims[p] for p in perm]
    flat = []
    for position in range(total):
        index_t = np.unravel_index(position, transposed_dims)
        index = [0] * len(dims)
        for axis_t, axis in enumerate(perm):
            index[axis] = index_t[axis_t]
        flat.append(int(np.ravel_multi_index(index, dims)))
    assert groups == tuple(tuple(flat[i:i + size]) for i in range(0, total, size))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).flatmap(
    lambda sizes: st.tuples(st.just(sizes),
                            st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))))
def test_mesh_replica_groups_vary_exactly_the_named_axes(case):
    sizes, chosen = case
    names = [f"ax{i}" for i in range(len(sizes))]
    grouped = [n for n, c in zip(names, chosen, strict=True) if c]
    text = ("mesh[" + ",".join(f"'{n}'={s}" for n, s in zip(names, sizes, strict=True)) + "] {"
            + ",".join(f"'{n}'" for n in grouped) + "}")
    groups = device_groups.parse_replica_groups(text)
    size = math.prod(s for s, c in zip(sizes, chosen, strict=True) if c)
    assert all(len(g) == size for g in groups)
    assert sorted(d for g in groups for d in g) == list(range(math.prod(sizes)))
    for group in groups:
        coords = [np.unravel_index(d, sizes) for d in group]
        fixed = {tuple(int(c[i]) for i in range(len(sizes)) if not chosen[i]) for c in coords}
        assert len(fixed) == 1  # the axes not named stay put inside a group


def test_replica_groups_text_finds_each_spelling_whole():
    rest = ", use_global_device_ids=true, to_apply=%add"
    for value in ("{{0,1},{2,3}}", "[2,4]<=[4,2]T(1,0)", "mesh['a'=4,'b'=2] {'a'}",
                  "mesh['a'=4,'b'=2] {'a':(2)2}", "mesh['a'=2,'b'=2], device_ids=(0,2,1,3) {'b'}",
                  "{}"):
        assert device_groups.replica_groups_text(f"channel_id=1, replica_groups={value}{rest}") == value
    assert device_groups.replica_groups_text("channel_id=1, to_apply=%add") is None


@pytest.mark.parametrize(("text", "tiles"), [
    # P('b', 'a') on a 4 x 2 mesh ('a'=4, 'b'=2): rows split 2 ways, columns 4 ways.
    ("{devices=[2,4]<=[4,2]T(1,0)}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("{devices=[2,4]<=[8]}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("devices=[2,4]0,2,4,6,1,3,5,7", [[0, 2, 4, 6], [1, 3, 5, 7]]),  # the older list form
    # P(None, 'a') on the same mesh: 4 column tiles, each on 2 devices (copies last).
    ("{devices=[1,4,2]<=[8] last_tile_dim_replicate}", [[[0, 1], [2, 3], [4, 5], [6, 7]]]),
])
def test_tile_assignment_reads_the_iota_as_a_recipe_not_a_device_list(text, tiles):
    assert device_groups.parse_tile_assignment(text).tolist() == tiles


def test_tile_assignment_matches_where_jax_puts_the_blocks():
    """The notation JAX's lowering writes (compiler_ir('hlo')) for P('b', 'a') decodes to
    the devices that hold each block of the array."""
    import numpy as np
    from helpers import mesh_of
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x = jax.device_put(np.zeros((8, 8), np.float32), NamedSharding(mesh, P("b", "a")))
    lowered = jax.jit(lambda t: t * 2).lower(x)
    (line,) = [line for line in lowered.compiler_ir("hlo").as_hlo_text().splitlines()
               if "parameter(0)" in line]
    notation = line.split("sharding=", 1)[1].split("}", 1)[0] + "}"
    assert notation == "{devices=[2,4]<=[4,2]T(1,0)}"
    tiles = device_groups.parse_tile_assignment(notation)
    for shard in x.addressable_shards:
        rows, cols = shard.index
        assert tiles[rows.start // 4, cols.start // 2] == shard.device.id


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: device_groups.parse_tile_assignment("{replicated}"), ValueError, "tile assignment"),
    (lambda: device_groups.parse_tile_assignment("{devices=[2,2]0,1,2}"), ValueError,
     "3 devices"),
    (lambda: device_groups.parse_tile_assignment(None), checks.InputTypeError, "sharding text"),
    (lambda: device_groups.replica_groups_text(7), checks.InputTypeError, "attribute text"),
    (lambda: device_groups.parse_replica_groups("<mystery>"), ValueError, "replica_groups"),
])
def test_bad_input_is_refused(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_hlo_text_re_exports_the_readers():
    for name in device_groups.__all__:
        assert getattr(hlo_text, name) is getattr(device_groups, name)
