"""Tests for spmd_guide.meshes.show: the table and grid list exactly the devices and slices a spec implies.

The expected layout is computed here independently of ``devices_indices_map``: a device at mesh
coordinates ``c`` holds, along an array dimension split over mesh axes ``(n1, n2, ...)``, chunk
number ``c[n1] * size(n2) * ... + c[n2] * ... + ...`` (the first axis named is the major one).
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES, mesh_of
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.meshes import show


def axis_group(entry: None | str | tuple[str, ...]) -> tuple[str, ...]:
    """The mesh axes one PartitionSpec entry splits a dimension over."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def padded(spec: P, ndim: int) -> tuple:
    """The spec's entries, with the implicit trailing Nones written out."""
    return tuple(spec) + (None,) * (ndim - len(spec))


def expected_layout(mesh: Mesh, spec: P, shape: tuple[int, ...]) -> dict[int, tuple]:
    """device id -> ((start, stop) per dimension), from the mesh and the spec alone."""
    entries = padded(spec, len(shape))
    layout = {}
    for coords, device in np.ndenumerate(mesh.devices):
        position = dict(zip(mesh.axis_names, coords, strict=True))
        bounds = []
        for entry, size in zip(entries, shape, strict=True):
            parts, chunk = 1, 0
            for name in axis_group(entry):
                chunk = chunk * mesh.shape[name] + position[name]
                parts *= mesh.shape[name]
            step = size // parts
            bounds.append((chunk * step, (chunk + 1) * step))
        layout[device.id] = tuple(bounds)
    return layout


def check_blocks(array: jax.Array, mesh: Mesh, spec: P) -> list[show.Block]:
    """Assert the blocks of ``array`` are exactly the layout the spec implies; return them."""
    expected = expected_layout(mesh, spec, array.shape)
    blocks = show.shard_blocks(array, data=True)
    seen = {}
    for block in blocks:
        assert block.devices == tuple(sorted(block.devices))
        for device in block.devices:
            assert device not in seen
            seen[device] = block.bounds
        index = tuple(slice(start, stop) for start, stop in block.bounds)
        np.testing.assert_array_equal(block.data, np.asarray(array)[index])
    assert seen == expected
    # one block per distinct slice: devices with the same slice share a block
    assert len(blocks) == len(set(expected.values()))
    return blocks


CASES = [
    (1, ("x",), (1,), [P(), P("x"), P(None, "x")]),
    (2, ("x",), (2,), [P(), P("x"), P(None, "x"), P("x", None)]),
    (4, ("a", "b"), (2, 2), [P("a", "b"), P("b", "a"), P("a"), P(None, "b"), P(("a", "b"))]),
    (8, ("a", "b"), (4, 2), [P("a", "b"), P("b", "a"), P("a", None), P(None, "b"),
                             P(("a", "b"), None), P(("b", "a"), None), P("a"), P()]),
    (8, ("a", "b"), (2, 4), [P("a", "b"), P(None, ("b", "a")), P("b")]),
    (8, ("x",), (8,), [P("x"), P(None, "x"), P()]),
]


@pytest.mark.parametrize(("k", "names", "mesh_shape", "specs"), CASES)
def test_blocks_table_and_grid_match_the_spec(k, names, mesh_shape, specs):
    mesh = mesh_of(k, names, mesh_shape)
    x = np.arange(64).reshape(8, 8)
    for spec in specs:
        array = jax.device_put(x, NamedSharding(mesh, spec))
        blocks = check_blocks(array, mesh, spec)
        table = show.layout_table(array).splitlines()[2:]
        assert len(table) == len(blocks)
        for line, block in zip(table, blocks, strict=True):
            devices, index, _ = re.split(r"\s{2,}", line.strip(), maxsplit=2)
            assert devices == ", ".join(f"D{d}" for d in block.devices)
            assert index == "[" + ", ".join(f"{a}:{b}" for a, b in block.bounds) + "]"
        grid = show.layout_grid(array).html
        assert grid.count("grid-row:") == len(blocks)
        for block in blocks:
            assert f">{block.label}</span>" in grid


def test_one_dimensional_arrays_are_one_row():
    mesh = mesh_of(4)
    array = jax.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))
    blocks = check_blocks(array, mesh, P("x"))
    assert [b.bounds for b in blocks] == [((0, 2),), ((2, 4),), ((4, 6),), ((6, 8),)]
    grid = show.layout_grid(array, data=True).html
    assert grid.count("grid-row:1/2;") == 4
    assert [f"grid-column:{i}/{i + 1};" in grid for i in range(1, 5)] == [True] * 4


def test_replicated_block_lists_all_its_devices():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    array = jax.device_put(np.ones((8, 2)), NamedSharding(mesh, P()))
    table = show.layout_table(array)
    assert "D0, D1, D2, D3, D4, D5, D6, D7" in table
    assert len(table.splitlines()) == 3
    assert ">D0,D1,D2,D3,D4,D5,D6,D7</span>" in show.layout_grid(array).html
    half = jax.device_put(np.ones((8, 2)), NamedSharding(mesh, P("b")))
    assert [b.devices for b in show.shard_blocks(half)] == [(0, 2, 4, 6), (1, 3, 5, 7)]


def test_grid_places_blocks_like_the_array():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    array = jax.device_put(np.arange(16).reshape(8, 2), NamedSharding(mesh, P("a", "b")))
    cells = re.findall(r"grid-row:(\d)/(\d);grid-column:(\d)/(\d);.*?>(D\d)</span>",
                       show.layout_grid(array).html)
    placed = {label: (int(r0), int(c0)) for r0, _, c0, _, label in cells}
    assert placed == {f"D{2 * r + c}": (r + 1, c + 1) for r in range(4) for c in range(2)}


def test_data_values_in_table_and_grid():
    mesh = mesh_of(2)
    array = jax.device_put(np.array([[10, 11], [12, 13]]), NamedSharding(mesh, P("x")))
    table = show.layout_table(array, data=True)
    assert "[[10 11]]" in table and "[[12 13]]" in table
    grid = show.layout_grid(array, data=True, title="two rows").html
    assert "two rows" in grid
    assert re.findall(r">(\d+)</td>", grid) == ["10", "11", "12", "13"]
    assert "<td" not in show.layout_grid(array).html


def test_large_blocks_are_elided_and_huge_arrays_refused():
    mesh = mesh_of(2)
    array = jax.device_put(np.arange(40 * 40).reshape(40, 40), NamedSharding(mesh, P("x")))
    grid = show.layout_grid(array, data=True).html
    assert "⋮" in grid and "⋯" in grid
    shown = re.findall(r">(\d+)</td>", grid)
    assert len(shown) == 2 * show.VALUES_PER_AXIS**2
    assert {"0", "39", "760", "1599"} <= set(shown) and "400" not in shown
    big = jax.device_put(np.zeros(show.MAX_DATA_ELEMENTS + 2), NamedSharding(mesh, P("x")))
    with pytest.raises(ValueError, match="data=False"):
        show.layout_grid(big, data=True)
    assert "D0" in show.layout_table(big)  # without data it is fine


def test_single_device_and_custom_device_order():
    on_three = jax.device_put(np.arange(5.0), DEVICES[3])
    (block,) = show.shard_blocks(on_three)
    assert block.devices == (3,) and block.bounds == ((0, 5),)
    assert "SingleDeviceSharding" in show.layout_grid(on_three).text
    order = [0, 1, 2, 3, 6, 7, 4, 5]
    ring = Mesh(np.array(DEVICES)[order].reshape(4, 2), ("a", "b"))
    array = jax.device_put(np.zeros((8, 2)), NamedSharding(ring, P(("a", "b"), None)))
    blocks = check_blocks(array, ring, P(("a", "b"), None))
    assert [b.devices[0] for b in blocks] == order


@pytest.mark.parametrize("bad", [jnp.zeros((2, 2, 2)), jnp.float32(1.0)])
def test_other_ranks_raise_value_error(bad):
    for fn in (show.layout_table, show.layout_grid, show.shard_blocks):
        with pytest.raises(ValueError, match="1-D and 2-D"):
            fn(bad)


@pytest.mark.parametrize("bad", [np.zeros((2, 2)), [[1, 2]], "array"])
def test_non_arrays_raise_type_error(bad):
    for fn in (show.layout_table, show.layout_grid):
        with pytest.raises(TypeError, match="jax.device_put"):
            fn(bad)


def test_traced_values_raise_type_error():
    @jax.jit
    def inside(x):
        show.layout_table(x)
        return x

    with pytest.raises(TypeError, match="traced"):
        inside(jnp.zeros(4))


def test_empty_arrays_raise_value_error():
    with pytest.raises(ValueError, match="no elements"):
        show.layout_table(jnp.zeros((0,)))


@st.composite
def mesh_and_spec(draw):
    k = draw(st.sampled_from([1, 2, 4, 8]))
    first = draw(st.sampled_from([d for d in (1, 2, 4, 8) if k % d == 0]))
    two_axes = draw(st.booleans())
    names, shape = (("a", "b"), (first, k // first)) if two_axes else (("a",), (k,))
    ndim = draw(st.sampled_from([1, 2]))
    axes = list(draw(st.permutations(names)))
    entries = []
    for _ in range(ndim):
        take = draw(st.integers(0, len(axes)))
        group, axes = tuple(axes[:take]), axes[take:]
        entries.append(None if not group else group[0] if len(group) == 1 else group)
    sizes = dict(zip(names, shape, strict=True))
    dims = []
    for entry in entries:
        dims.append(math.prod(sizes[n] for n in axis_group(entry)) * draw(st.integers(1, 3)))
    return k, names, shape, P(*entries), tuple(dims)


@settings(max_examples=20, deadline=None)
@given(mesh_and_spec())
def test_any_mesh_and_spec(case):
    k, names, mesh_shape, spec, shape = case
    mesh = mesh_of(k, names, mesh_shape)
    array = jax.device_put(np.arange(math.prod(shape)).reshape(shape), NamedSharding(mesh, spec))
    blocks = check_blocks(array, mesh, spec)
    assert sorted(d for b in blocks for d in b.devices) == list(range(k))


SPECS = [P(), P("data", None), P(None, "model"), P("model", None), P("data", "model"),
         P("model", "data"), P(None, "data"), P(("data", "model"), None),
         P(("model", "data"), None)]
MESH_SHAPES = [(4, 2), (2, 4), (1, 8), (8, 1)]


@pytest.fixture(scope="module")
def book_gallery():
    return show.gallery(np.arange(32).reshape(8, 4), MESH_SHAPES, SPECS, devices=DEVICES)


def test_gallery_fails_exactly_where_a_dimension_does_not_divide(book_gallery):
    for mesh_shape in MESH_SHAPES:
        sizes = dict(zip(("data", "model"), mesh_shape, strict=True))
        for spec in SPECS:
            entry = book_gallery.entry(mesh_shape, spec)
            fits = all(
                size % math.prod(sizes[n] for n in axis_group(entry)) == 0
                for entry, size in zip(padded(spec, 2), (8, 4), strict=True)
            )
            assert entry.ok == fits, (mesh_shape, spec)
            if fits:
                mesh = jax.make_mesh(mesh_shape, ("data", "model"), devices=DEVICES)
                expected = expected_layout(mesh, spec, (8, 4))
                got = {d: b.bounds for b in entry.blocks for d in b.devices}
                assert got == expected
                assert "<table" in entry._repr_html_()
            else:
                assert entry.error.startswith("ValueError: ")
                assert "divide" in entry.error
                assert "ValueError" in entry._repr_html_()


def test_gallery_overview_and_sections(book_gallery):
    text = str(book_gallery.overview())
    assert text.count("✗ ValueError") == sum(not e.ok for e in book_gallery.entries) == 4
    assert book_gallery.entry((2, 4), P("data", "model")).ok  # the notebooks' 2 x 4 layout
    section = book_gallery.section((4, 2)).html
    assert section.count("display:inline-grid") == sum(
        book_gallery.entry((4, 2), s).ok for s in SPECS)
    with pytest.raises(KeyError):
        book_gallery.entry((3, 3), P())


def test_gallery_overview_is_as_narrow_as_its_results(book_gallery):
    """Each spec heads its own row, so no row holds more cells than there are meshes (the
    table fits a phone, however long the specs)."""
    markup = book_gallery.overview().html
    assert markup.count("scope='rowgroup'") == len(SPECS)
    rows = markup.split("<tr>")[1:]
    assert max(row.count("<td") + row.count("<th") for row in rows) == 4


def test_spec_text_has_no_trailing_comma_and_captions_use_it():
    """JAX prints P('b',); the book's tables print P('b'): the grid captions agree."""
    assert str(P("b")) == "P('b',)"
    assert show.spec_text(P("b")) == "P('b')"
    assert show.spec_text(P(("a", "b"), None)) == "P(('a', 'b'), None)"
    assert show.spec_text(P()) == "P()"
    mesh = jax.make_mesh((8,), ("b",), devices=DEVICES)
    array = jax.device_put(np.arange(8.0), NamedSharding(mesh, P("b")))
    assert "· P('b') ·" in show.describe(array)
    with pytest.raises(InputTypeError, match="PartitionSpec"):
        show.spec_text("b")


@pytest.mark.parametrize("explicit", [False, True], ids=["Auto", "Explicit"])
def test_gallery_entry_works_on_both_axis_types(explicit):
    mesh = mesh_of(8, ("data", "model"), (4, 2), explicit=explicit)
    values = np.arange(32).reshape(8, 4)
    entry = show.gallery_entry(values, mesh, P("data", "model"))
    assert entry.ok and [b.devices for b in entry.blocks] == [(d,) for d in range(8)]
    bad = show.gallery_entry(values, mesh, P(None, ("data", "model")))
    assert not bad.ok and bad.grid is None and "4" in bad.error and "8" in bad.error


def test_gallery_entry_lets_other_errors_through():
    mesh = jax.make_mesh((8,), ("x",), devices=DEVICES)
    with pytest.raises(TypeError):
        show.gallery_entry(object(), mesh, P("x"))


# --- Answers to the Part I exercises -------------------------------------------------------


def test_devices_and_meshes_exercises():
    mesh = jax.make_mesh((2, 4), ("x", "y"), devices=DEVICES)
    assert [d.id for d in mesh.devices[1]] == [4, 5, 6, 7]
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,) * 2
    stand_ins = show.tpu_v3_tray()
    order = [d.id for d in mesh_utils.create_device_mesh((8,), stand_ins)]
    assert order == [0, 1, 2, 3, 6, 7, 4, 5]
    assert show.ring_hops(stand_ins, order) == [0, 1, 0, 1, 0, 1, 0, 1]
    assert show.ring_hops(stand_ins, list(range(8))) == [0, 1, 0, 2, 0, 1, 0, 2]
    rows = [[d.id for d in row] for row in mesh_utils.create_device_mesh((2, 4), stand_ins)]
    assert rows == [[0, 1, 2, 3], [6, 7, 4, 5]]
    assert [max(show.ring_hops(stand_ins, row)) for row in rows] == [1, 1]
    assert show.grid_hops(stand_ins, rows)["columns"] == [[2, 2]] * 4  # exercise 3, columns


def test_sharding_arrays_exercises():
    mesh = jax.make_mesh((4, 2), ("a", "b"), devices=DEVICES)
    x = np.arange(16).reshape(8, 2)

    x = np.arange(32).reshape(8, 4)

    def holders(spec, row, col):
        return show.devices_holding(jax.device_put(x, NamedSharding(mesh, spec)), (row, col))

    assert holders(P("a", "b"), 5, 3) == (5,)
    assert holders(P("b", None), 0, 0) == (0, 2, 4, 6)
    assert holders(P(("a", "b"), None), 1, 0) == (1,)
    assert holders(P(("b", "a"), None), 1, 0) == (2,)
    # PositionalSharding(devices).reshape(4, 2).replicate(1) == P('a', None) on this mesh
    blocks = show.shard_blocks(jax.device_put(x, NamedSharding(mesh, P("a", None))))
    assert [b.devices for b in blocks] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert not hasattr(jax.sharding, "PositionalSharding")


def test_gallery_exercises(book_gallery):
    everywhere = [s for s in SPECS if all(book_gallery.entry(m, s).ok for m in MESH_SHAPES)]
    assert everywhere == [P(), P("data", None), P("model", None), P(("data", "model"), None),
                          P(("model", "data"), None)]
    same = [book_gallery.entry((1, 8), s).blocks for s in (P(), P("data", None))]
    assert same[0] == same[1]
    assert len(same[0]) == 1 and same[0][0].devices == tuple(range(8))
    assert book_gallery.entry((1, 8), P(None, "model")).ok is False


def test_gallery_two_axis_row_specs_differ_only_in_order_and_only_on_2d_meshes(book_gallery):
    """gallery.md: the two tuple specs give single rows everywhere; their device orders
    differ on (4, 2) and (2, 4), and agree on (1, 8) and (8, 1)."""
    first, second = P(("data", "model"), None), P(("model", "data"), None)
    for shape in MESH_SHAPES:
        a, b = book_gallery.entry(shape, first).blocks, book_gallery.entry(shape, second).blocks
        assert len(a) == len(b) == 8 and all(len(block.devices) == 1 for block in a + b)
        assert sorted(x.devices for x in a) == sorted(x.devices for x in b)
        assert ([x.devices for x in a] == [x.devices for x in b]) == (1 in shape), shape


def test_devices_holding_checks_against_numpy():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x = np.arange(32).reshape(8, 4)
    for spec in (P("a", "b"), P("b"), P(("b", "a"))):
        array = jax.device_put(x, NamedSharding(mesh, spec))
        for row, col in np.ndindex(x.shape):
            holders = show.devices_holding(array, (row, col))
            for shard in array.addressable_shards:
                has_it = x[row, col] in np.asarray(shard.data)
                assert (shard.device.id in holders) == has_it
    for bad in [(8, 0), (0,), (-1, 0)]:
        with pytest.raises(ValueError, match="not an element"):
            show.devices_holding(array, bad)


def test_ring_diagram_draws_every_device():
    stand_ins = show.tpu_v3_tray()
    svg = show.ring_diagram(stand_ins, [0, 1, 2, 3, 6, 7, 4, 5], title="ring").html
    assert svg.count("<rect") == 4 + 8
    assert all(f">D{i}<" in svg for i in range(8))
    with pytest.raises(ValueError, match="every device"):
        show.ring_diagram(stand_ins, [0, 1, 2])
    assert show.ring_hops(stand_ins, [0, 1, 2, 3]) == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="distinct"):
        show.ring_hops(stand_ins, [0, 0, 9])
    with pytest.raises(ValueError, match="coords"):
        show.ring_hops([SimpleNamespace(id=0)], [0])


# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402


def _sharded(n: int = 2):
    return jax.device_put(np.arange(8.0), NamedSharding(mesh_of(n), P("x")))


BAD_INPUT = [
    ("index a float", lambda: show.devices_holding(_sharded(), (2.5,)), InputTypeError,
     "integer"),
    ("index a str", lambda: show.devices_holding(_sharded(), "3"), InputTypeError, "sequence"),
    ("index out of range", lambda: show.devices_holding(_sharded(), (8,)), InputError,
     "not an element"),
    ("index too short", lambda: show.devices_holding(_sharded(), ()), InputError,
     "not an element"),
    ("numpy array, not jax", lambda: show.layout_table(np.arange(4)), InputTypeError,
     "device_put"),
    ("3-D array", lambda: show.shard_blocks(jnp.zeros((2, 2, 2))), InputError, "reshape"),
    ("data flag str", lambda: show.shard_blocks(_sharded(), data="yes"), InputTypeError,
     "True or False"),
    ("describe a list", lambda: show.describe([1, 2]), InputTypeError, "jax.Array"),
    ("title not str", lambda: show.layout_grid(_sharded(), title=3), InputTypeError, "title"),
    ("side_by_side of text", lambda: show.side_by_side("a", "b"), InputTypeError, "HTML"),
    ("gallery_entry spec str", lambda: show.gallery_entry(np.arange(8), mesh_of(2), "x"),
     InputTypeError, "PartitionSpec"),
    ("gallery_entry no mesh", lambda: show.gallery_entry(np.arange(8), None, P("x")),
     InputTypeError, "Mesh"),
    ("gallery names mismatch", lambda: show.gallery(np.arange(8), [(2, 4)], [P()],
                                                    axis_names=("x",)), InputError,
     "one name per axis"),
    ("gallery shape 0", lambda: show.gallery(np.arange(8), [(0, 8)], [P()]), InputError,
     "at least 1"),
    ("gallery of 16 devices", lambda: show.gallery(np.arange(8), [(16,)], [P()],
                                                   axis_names=("x",)), InputError,
     "8 are available"),
    ("gallery shapes a tuple of ints", lambda: show.gallery(np.arange(8), (2, 4), [P()]),
     InputTypeError, "sequence"),
    ("gallery values str", lambda: show.gallery("abc", [(2, 4)], [P()]), InputTypeError,
     "array"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_numpy_integer_index_is_an_index():
    assert show.devices_holding(_sharded(), (np.int64(5),)) == (DEVICES[1].id,)
