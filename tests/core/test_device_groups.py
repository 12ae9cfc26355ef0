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
    with pytest.raises(checks.InputError, match="cannot read replica_groups"):
        device_groups.parse_replica_groups("<mystery>")
    with pytest.raises(checks.InputError, match="not in the mesh"):
        device_groups.parse_replica_groups("mesh['a'=2] {'z'}")
    with pytest.raises(checks.InputError, match="does not fit"):
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
    (lambda: device_groups.parse_tile_assignment("{devices=[2,4]<=[4,2]T(1)}"),
     checks.InputError, "not a permutation"),
    (lambda: device_groups.parse_replica_groups(None), checks.InputTypeError, "replica_groups"),
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


# --------------------------------------------------------------------------- strict grammar
# Printers that write each form as XLA does (replica_group.cc, mesh_and_axis.cc,
# tile_assignment.cc); the parser must read back exactly what they wrote.


def _explicit_text(groups):
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def _ints_text(values):
    return ",".join(map(str, values))


@st.composite
def _explicit_groups(draw):
    n_groups = draw(st.integers(1, 4))
    size = draw(st.integers(1, 4))
    order = draw(st.permutations(range(n_groups * size)))
    return tuple(tuple(order[i * size:(i + 1) * size]) for i in range(n_groups))


@st.composite
def _iota_case(draw):
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    perm = draw(st.permutations(range(len(dims))))
    total = math.prod(dims)
    size = draw(st.sampled_from([d for d in range(1, total + 1) if total % d == 0]))
    reference = np.arange(total).reshape(dims).transpose(perm).reshape(-1, size)
    text = f"[{total // size},{size}]<=[{_ints_text(dims)}]"
    if len(dims) > 1:
        text += f"T({_ints_text(perm)})"
    return text, tuple(tuple(int(d) for d in row) for row in reference)


@st.composite
def _mesh_case(draw):
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    names = [f"ax{i}" for i in range(len(sizes))]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    total = math.prod(sizes)
    order = draw(st.permutations(range(total)))
    listed = draw(st.booleans()) and list(order) != list(range(total))
    text = "mesh[" + ",".join(f"'{n}'={s}" for n, s in zip(names, sizes, strict=True)) + "]"
    if listed:
        text += f", device_ids=({_ints_text(order)})"
    text += " {" + ",".join(f"'{n}'" for n in chosen) + "}"
    # Reference (XLA's flattened_replica_groups): grouped axes moved last, in the order named.
    devices = np.array(order if listed else range(total)).reshape(sizes)
    keep = [names.index(n) for n in chosen]
    rest = [i for i in range(len(sizes)) if i not in keep]
    size = math.prod(sizes[i] for i in keep)
    reference = devices.transpose(rest + keep).reshape(-1, size)
    return text, tuple(tuple(int(d) for d in row) for row in reference)


@st.composite
def _tile_case(draw):
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    total = math.prod(dims)
    if draw(st.booleans()):
        reshape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).filter(
            lambda r: math.prod(r) == total) | st.just([total]))
        perm = draw(st.permutations(range(len(reshape))))
        ids = np.arange(total).reshape(reshape).transpose(perm).reshape(-1)
        tail = f"<=[{_ints_text(reshape)}]" + (f"T({_ints_text(perm)})" if len(reshape) > 1 else "")
    else:
        ids = np.array(draw(st.permutations(range(total))))
        tail = _ints_text(ids)
    suffix = draw(st.sampled_from(["", " last_tile_dim_replicate"] if len(dims) > 1 else [""]))
    return "{devices=[" + _ints_text(dims) + "]" + tail + suffix + "}", ids.reshape(dims)


@settings(max_examples=40, deadline=None)
@given(_explicit_groups())
def test_explicit_groups_print_and_parse_back(groups):
    assert device_groups.parse_replica_groups(_explicit_text(groups)) == groups


@settings(max_examples=40, deadline=None)
@given(st.one_of(_iota_case(), _mesh_case()))
def test_iota_and_mesh_groups_parse_to_the_reference(case):
    text, reference = case
    assert device_groups.parse_replica_groups(text) == reference


@settings(max_examples=40, deadline=None)
@given(_tile_case())
def test_tile_assignments_parse_to_the_reference(case):
    text, reference = case
    assert device_groups.parse_tile_assignment(text).tolist() == reference.tolist()
    assert device_groups.parse_tile_assignment(text[1:-1]).tolist() == reference.tolist()


def _mutations(text, ids):
    """Malformed variants of a valid printed value: each must be refused."""
    out = [text + "garbage", text + "}", text[:-1], "{" + text, text + ",{9}"]
    if ids:
        first = str(ids[0])
        out.append(text.replace(first, "-" + first, 1) if "-" not in text else text + "x")
        out.append(text.replace(str(ids[-1]), str(ids[0]), 1)
                   if len(ids) > 1 and str(ids[-1]) not in text.split("[")[0] else text + "]")
    return out


@settings(max_examples=30, deadline=None)
@given(_explicit_groups(), st.data())
def test_mutated_explicit_groups_are_refused(groups, data):
    text = _explicit_text(groups)
    flat = [d for g in groups for d in g]
    bad = [text + "garbage", text + "}", text[:-1], text[1:], text + " {0}",
           text.replace("{", "", 1)]
    # Repeat an id (into another group, or the same), a negative id, an id out of range.
    i = data.draw(st.integers(0, len(flat) - 1))
    if len(flat) > 1:
        j = (i + 1) % len(flat)
        repeated = [list(g) for g in groups]
        k = 0
        for g in repeated:
            for m in range(len(g)):
                if k == j:
                    g[m] = flat[i]
                k += 1
        bad.append(_explicit_text(repeated))
    negative = [[-d - 1 if d == flat[i] else d for d in g] for g in groups]
    bad.append(_explicit_text(negative))
    out_of_range = [[len(flat) if d == flat[i] else d for d in g] for g in groups]
    bad.append(_explicit_text(out_of_range))
    for text_ in bad:
        with pytest.raises(checks.InputError, match="cannot read replica_groups"):
            device_groups.parse_replica_groups(text_)


@settings(max_examples=30, deadline=None)
@given(st.one_of(_iota_case(), _mesh_case()))
def test_mutated_iota_and_mesh_groups_are_refused(case):
    text, _ = case
    bad = [text + "garbage", text + "}", text[:-1], text + ",", " " + text + " ]"]
    bad.append(text.replace("[", "[-", 1))
    for text_ in bad:
        with pytest.raises(checks.InputError, match="cannot read replica_groups"):
            device_groups.parse_replica_groups(text_)


@settings(max_examples=30, deadline=None)
@given(_tile_case())
def test_mutated_tile_assignments_are_refused(case):
    text, ids = case
    bad = [text + "garbage", text + "}", text[:-1], text[1:], text.replace("[", "[-", 1),
           text.replace("]", "],0", 1), text.replace("devices", "device", 1)]
    if "<=" not in text and ids.size > 1:
        flat = ids.reshape(-1).tolist()
        head, tail = text.split("]", 1)
        bad.append(head + "]" + tail.replace(str(flat[1]), str(flat[0]), 1))
    for text_ in bad:
        with pytest.raises(checks.InputError, match="cannot read the tile assignment"):
            device_groups.parse_tile_assignment(text_)


@pytest.mark.parametrize(("text", "word"), [
    ("{{0,1},{1,2}}", "appears twice"),            # device 1 in two groups
    ("{{0,1}}}}garbage", "unexpected text"),        # trailing text
    ("{{0,1},{2}}", "unequal sizes"),
    ("{{0,-1}}", "below 0"),
    ("{{0,2}}", "out of range"),
    ("{{0,1},{2,3}", "expected '}'"),              # unbalanced
    ("[2,4]<=[4,2]T(1)", "not a permutation"),
    ("[2,4]<=[4]", "names 8 devices"),
    ("mesh['a'=2,'a'=2] {'a'}", "named twice"),
    ("mesh['a'=4] {'a','a'}", "more than once"),
    ("mesh['a'=8] {'a':(1)4,'a':(2)2}", "overlap"),
    ("mesh['a'=2,'b'=2], device_ids=(0,1,1,3) {'a'}", "appears twice"),
    ("mesh['a'=2,'b'=2], device_ids=(0,1,2) {'a'}", "3 devices"),
    ("mesh['a'=2] {'a'} trailing", "unexpected text"),
    ("", "empty text"),
])
def test_malformed_replica_groups_say_what_and_the_form(text, word):
    with pytest.raises(checks.InputError, match=word) as info:
        device_groups.parse_replica_groups(text)
    assert "expected explicit groups" in str(info.value)


@pytest.mark.parametrize(("text", "word"), [
    ("{devices=[2,4]<=[4,2]T(1)}", "not a permutation"),
    ("{devices=[2,2]0,1,1,3}", "appears twice"),
    ("{devices=[2,2]0,1,2,7}", "out of range"),
    ("{devices=[2,2]<=[4]", "expected '}'"),
    ("devices=[2,2]<=[4]}", "unexpected text"),
    ("{devices=[2,2]<=[4]} junk", "unexpected text"),
    ("{devices=[2,2]<=[8]}", "4 tiles"),
    ("{devices=[2,2]<=[4] last_tile_dims={bogus}}", "manual or replicated"),
    ("{maximal device=0}", "no tiles"),
])
def test_malformed_tile_assignments_say_what_and_the_form(text, word):
    with pytest.raises(checks.InputError, match=word) as info:
        device_groups.parse_tile_assignment(text)
    assert "expected GSPMD's notation" in str(info.value)


@st.composite
def _sub_axis_case(draw):
    """mesh[...] with one axis grouped by a sub-axis ``:(pre)size`` and the device order an
    iota ``device_ids=([dims]T(perm))``; reference: XLA's recipe (the axis reshaped to [pre,
    size, rest], groups along ``size``) on the device array."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3).filter(
        lambda s: max(s) >= 4 and math.prod(s) <= 64))
    names = [f"ax{i}" for i in range(len(sizes))]
    axis = draw(st.sampled_from([i for i, s in enumerate(sizes) if s >= 4]))
    full = sizes[axis]
    pre, size = draw(st.sampled_from([(p, s) for p in (1, 2, 4) for s in (2, 4)
                                      if s < full and full % (p * s) == 0]))
    total = math.prod(sizes)
    perm = draw(st.permutations(range(len(sizes))))
    ids_dims = [sizes[p] for p in perm]  # any iota over the mesh's devices
    devices = np.arange(total).reshape(ids_dims).transpose(np.argsort(perm)).reshape(-1)
    text = ("mesh[" + ",".join(f"'{n}'={s}" for n, s in zip(names, sizes, strict=True)) + "]"
            + f", device_ids=([{_ints_text(ids_dims)}]T({_ints_text(np.argsort(perm))})) "
            + "{" + f"'{names[axis]}':({pre}){size}" + "}")
    split = sizes[:axis] + [pre, size, full // (pre * size)] + sizes[axis + 1:]
    keep = axis + 1
    rest = [i for i in range(len(split)) if i != keep]
    reference = devices.reshape(split).transpose(rest + [keep]).reshape(-1, size)
    return text, tuple(tuple(int(d) for d in row) for row in reference)


@settings(max_examples=30, deadline=None)
@given(_sub_axis_case())
def test_sub_axes_and_iota_device_ids_parse_to_xlas_recipe(case):
    text, reference = case
    assert device_groups.parse_replica_groups(text) == reference


@pytest.mark.parametrize("text, word", [
    ("replica_groups={{0,1}", "unbalanced"),
    ("replica_groups={{0,1}}}, x=1", "unbalanced"),
    ("replica_groups=, to_apply=%r", "no value"),
    ("replica_groups=", "no value"),
])
def test_replica_groups_text_refuses_broken_values(text, word):
    """Bad-input audit D: an unbalanced or empty value used to come back as text."""
    with pytest.raises(checks.InputError, match=word):
        device_groups.replica_groups_text(text)
