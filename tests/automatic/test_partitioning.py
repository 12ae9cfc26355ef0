"""Tests of spmd_guide.automatic.partitioning, and of every compiler fact the Part II chapters state.

Each claim the two chapters make about what the compiler did (output shardings, collective
kinds, counts and group sizes, bytes sent) is pinned here, on the chapter's 8-device mesh
and on 4 and 2 devices where the example makes sense. Expected bytes are worked out by hand
from shapes and group sizes (ring model: all-reduce 2(n-1)/n of the buffer, all-gather
(n-1)/n of the gathered buffer), never read back from the code under test.
"""

from __future__ import annotations

import importlib.util
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.automatic import partitioning
from spmd_guide.core import checks, hlo, hlo_text
from spmd_guide.core.display import error_of
from spmd_guide.core.timing import Timing, speedup

F32 = 4
# (mesh shape over axes a/x and b/y) for 8, 4 and 2 devices
MESHES = [(4, 2), (2, 2), (2, 1)]


def equivalent(sharding, mesh, spec, ndim) -> bool:
    return sharding.is_equivalent_to(NamedSharding(mesh, spec), ndim)


def no_other_kinds(counts: dict[str, int], **expected: int) -> None:
    want = {kind: expected.get(kind.replace("-", "_"), 0) for kind in hlo.KINDS}
    assert counts == want


def ring_all_reduce(buffer_bytes: int, n: int) -> int:
    return 2 * (n - 1) * buffer_bytes // n


def ring_all_gather(gathered_bytes: int, n: int) -> int:
    return (n - 1) * gathered_bytes // n


def square(mesh, spec, size: int = 8) -> jax.Array:
    return partitioning.place(jnp.arange(size * size, dtype=jnp.float32).reshape(size, size), mesh, spec)


# --------------------------------------------------------------------------- meshes and arrays


class TestAutoMesh:
    def test_axes_are_auto_over_the_first_devices(self, devices):
        mesh = partitioning.auto_mesh((2, 2), ("a", "b"))
        assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
        assert dict(mesh.shape) == {"a": 2, "b": 2}
        assert sorted(d.id for d in mesh.devices.flat) == [d.id for d in devices[:4]]

    def test_devices_keep_their_order(self, devices):
        mesh = partitioning.auto_mesh((4,), ("x",), devices=devices[3::-1])
        assert [d.id for d in mesh.devices.flat] == [3, 2, 1, 0]

    @pytest.mark.parametrize("shape, names, message", [
        ((), (), "at least 1 entries"),
        ((0, 2), ("a", "b"), "at least 1"),
        ((2.0,), ("a",), "must be an integer"),
        ((2, 2), ("a",), "one distinct axis name"),
        ((2, 2), ("a", "a"), "one distinct axis name"),
        ((4, 4), ("a", "b"), "needs 16 devices"),
    ])
    def test_bad_meshes_are_refused(self, shape, names, message):
        with pytest.raises(ValueError, match=message):
            partitioning.auto_mesh(shape, names)


class TestPlace:
    def test_lays_out_by_the_spec(self):
        mesh = mesh_of(8, ("a", "b"), (4, 2))
        x = partitioning.place(np.arange(64.0).reshape(8, 8), mesh, P("a", "b"))
        assert x.sharding == NamedSharding(mesh, P("a", "b"))
        assert {s.data.shape for s in x.addressable_shards} == {(2, 4)}
        np.testing.assert_array_equal(np.asarray(x), np.arange(64.0).reshape(8, 8))

    @pytest.mark.parametrize("shape, spec, message", [
        ((6, 8), P("a", None), "not divisible by 4"),
        ((8, 8), P(("a", "b"), None), None),  # 8 ways over a and b: fine
        ((4, 8), P(("a", "b"), None), "not divisible by 8"),
        ((8,), P("a", "b"), "names 2 dimensions"),
        ((8, 8), P("c"), "does not have"),
        ((8, 8), P("a", "a"), "uses a mesh axis twice"),
    ])
    def test_uneven_or_unknown_layouts_are_refused(self, shape, spec, message):
        mesh = mesh_of(8, ("a", "b"), (4, 2))
        if message is None:
            assert partitioning.place(np.zeros(shape), mesh, spec).shape == shape
        else:
            with pytest.raises(ValueError, match=message):
                partitioning.place(np.zeros(shape), mesh, spec)

    @settings(max_examples=15, deadline=None)
    @given(rows=st.integers(1, 12), cols=st.integers(1, 12),
           row_axis=st.sampled_from([None, "a", "b"]), col_axis=st.sampled_from([None, "a", "b"]))
    def test_places_exactly_when_the_split_is_even(self, rows, cols, row_axis, col_axis):
        mesh = mesh_of(8, ("a", "b"), (4, 2))
        spec = P(row_axis, col_axis)
        if row_axis is not None and row_axis == col_axis:
            with pytest.raises(ValueError, match="twice"):
                partitioning.place(np.zeros((rows, cols)), mesh, spec)
            return
        ways = [dict(mesh.shape)[a] if a else 1 for a in (row_axis, col_axis)]
        values = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
        if rows % ways[0] or cols % ways[1]:
            with pytest.raises(ValueError, match="not divisible"):
                partitioning.place(values, mesh, spec)
        else:
            placed = partitioning.place(values, mesh, spec)
            assert {s.data.shape for s in placed.addressable_shards} == {
                (rows // ways[0], cols // ways[1])}
            np.testing.assert_array_equal(np.asarray(placed), values)


def test_spec_text_drops_trailing_none():
    assert partitioning.spec_text(P("a", None)) == "P('a')"
    assert partitioning.spec_text(P(None, "b")) == "P(None, 'b')"
    assert partitioning.spec_text(P()) == "P()"
    assert partitioning.spec_text(P(("a", "b"), None)) == "P(('a', 'b'))"


# --------------------------------------------------------------------------- chapter 1 facts


@pytest.mark.parametrize("shape", MESHES)
class TestComputationFollowsSharding:
    def mesh(self, shape):
        return mesh_of(shape[0] * shape[1], ("a", "b"), shape)

    def test_elementwise_keeps_the_sharding_without_communication(self, shape):
        if shape == (2, 2):
            pytest.skip("8 and 2 devices cover it")
        mesh = self.mesh(shape)
        x = square(mesh, P("a", "b"))
        run = partitioning.partitioning(partitioning.elementwise, x)
        assert run.output_sharding.is_equivalent_to(x.sharding, 2)
        assert run.output_spec == "P('a', 'b')"
        no_other_kinds(run.counts)
        assert run.bytes_sent == 0 and run.collectives_text == "none"
        y = run.compiled(x)
        np.testing.assert_allclose(np.asarray(y), 2 * np.sin(np.asarray(x)) + 1, atol=1e-6)

    def test_column_sums_all_reduce_over_a(self, shape):
        a, b = shape
        mesh = self.mesh(shape)
        run = partitioning.partitioning(partitioning.column_sums, square(mesh, P("a", "b")))
        assert equivalent(run.output_sharding, mesh, P("b"), 1)
        (op,) = run.ops
        assert (op.kind, op.group_size, op.shape) == ("all-reduce", a, (8 // b,))
        assert run.bytes_sent == ring_all_reduce(8 // b * F32, a)
        if shape == (4, 2):  # the chapter's numbers
            assert run.output_spec == "P('b')" and run.bytes_sent == 24

    def test_row_sums_all_reduce_over_b_exercise_1(self, shape):
        a, b = shape
        if b == 1:
            pytest.skip("no mesh axis along the rows: nothing to add up")
        mesh = self.mesh(shape)
        run = partitioning.partitioning(lambda t: t.sum(axis=1), square(mesh, P("a", "b")))
        assert equivalent(run.output_sharding, mesh, P("a"), 1)
        (op,) = run.ops
        assert (op.kind, op.group_size) == ("all-reduce", b)
        assert run.bytes_sent == ring_all_reduce(8 // a * F32, b)

    def test_rows_times_columns_is_free(self, shape):
        mesh = self.mesh(shape)
        run = partitioning.matmul_partitioning("rows x columns", mesh)
        assert equivalent(run.output_sharding, mesh, P("a", "b"), 2)
        assert run.ops == ()

    def test_sharded_contraction_all_reduces_the_partial_products(self, shape):
        a, _ = shape
        mesh = self.mesh(shape)
        run = partitioning.matmul_partitioning("sharded contraction", mesh)
        assert run.output_sharding.is_fully_replicated
        (op,) = run.ops
        assert (op.kind, op.group_size, op.shape) == ("all-reduce", a, (16, 16))
        assert run.bytes_sent == ring_all_reduce(16 * 16 * F32, a)
        if shape == (4, 2):
            assert run.bytes_sent == 1536 and op.shape_text == "f32[16,16]"

    def test_rows_out_all_reduces_then_slices_on_cpu(self, shape):
        a, _ = shape
        mesh = self.mesh(shape)
        run = partitioning.matmul_partitioning("sharded contraction, rows out", mesh)
        assert equivalent(run.output_sharding, mesh, P("a"), 2)
        full = 16 * 16 * F32
        if shape == (2, 2):
            # on 2 x 2 the compiler all-reduces half the product and swaps the other half
            no_other_kinds(run.counts, all_reduce=1, collective_permute=1)
            assert run.bytes_sent == ring_all_reduce(full // 2, 2) + full // 2
            return
        (op,) = run.ops
        assert op.kind == "all-reduce"  # the chapter: "this CPU backend still emits an all-reduce"
        assert run.bytes_sent == ring_all_reduce(full, a)
        # a reduce-scatter would send half as much: the chapter's comparison
        rs = hlo.ring_bytes("reduce-scatter", op.buffer_bytes, op.group_size)
        assert 2 * rs == run.bytes_sent
        assert "dynamic-slice" in hlo_text.entry_computation(run.compiled.as_text())

    def test_replicated_weights_exercise_2(self, shape):
        mesh = self.mesh(shape)
        run = partitioning.partitioning(partitioning.matmul, partitioning.place(jnp.ones((16, 32)), mesh, P("a", None)),
                              partitioning.place(jnp.ones((32, 16)), mesh, P()))
        assert equivalent(run.output_sharding, mesh, P("a"), 2)
        assert run.output_spec == "P('a')"
        assert run.ops == ()

    def test_copy_keeps_the_sharding(self, shape):
        if shape != (4, 2):
            pytest.skip("the chapter's mesh is enough for a copy")
        mesh = self.mesh(shape)
        x = square(mesh, P("a", "b"))
        assert jnp.copy(x).sharding == x.sharding
        run = partitioning.partitioning(jnp.copy, x, what="jnp.copy")
        assert run.ops == () and run.output_sharding.is_equivalent_to(x.sharding, 2)


def test_matmul_results_are_correct_and_cases_are_checked():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    lhs = np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / (16 * 32)
    for name, case in partitioning.MATMUL_CASES.items():
        left = partitioning.place(lhs, mesh, case.lhs)
        right = partitioning.place(np.ones((32, 16), np.float32), mesh, case.rhs)
        np.testing.assert_allclose(np.asarray(jax.jit(partitioning.matmul)(left, right)),
                                   lhs @ np.ones((32, 16)), rtol=1e-5, err_msg=name)
    with pytest.raises(ValueError, match="unknown matmul case"):
        partitioning.matmul_partitioning("diagonal", mesh)
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        partitioning.matmul_partitioning("rows x columns", mesh_of(8))


def test_partitioning_table_rows():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    runs = [partitioning.matmul_partitioning(name, mesh) for name in partitioning.MATMUL_CASES]
    table = partitioning.partitioning_table(runs)
    assert [r["what"] for r in table.rows] == list(partitioning.MATMUL_CASES)
    assert table.rows[1]["collectives"] == "1 all-reduce in groups of 4"
    assert table.rows[1]["bytes sent"] == "1.5 KiB"
    assert table.rows[0]["inputs"] == "P('a')\nP(None, 'b')"
    assert "<br>" in table._repr_html_() and "sharded contraction" in str(table)


def test_partitioning_refuses_several_outputs():
    x = square(mesh_of(8, ("a", "b"), (4, 2)), P("a", "b"))
    with pytest.raises(ValueError, match="one array output"):
        partitioning.partitioning(lambda t: (t, t), x)


@pytest.mark.parametrize("shape, transposed_ops, transposed_bytes", [
    # 4 x 2: an all-to-all of 2 x f32[2,1,2] over 2 devices sends 1/2 of 32 B = 16 B,
    # then a collective-permute of f32[4,2] sends all 32 B.
    ((4, 2), {"all_to_all": 1, "collective_permute": 1}, 16 + 32),
    # 2 x 2: the blocks just swap devices: one collective-permute of f32[4,4] = 64 B.
    ((2, 2), {"collective_permute": 1}, 64),
])
def test_with_sharding_constraint_costs(shape, transposed_ops, transposed_bytes):
    x_size, y_size = shape
    xy = mesh_of(x_size * y_size, ("x", "y"), shape)
    z = square(xy, P("x", "y"))
    values = np.arange(64.0, dtype=np.float32).reshape(8, 8)

    transposed = partitioning.resharded_sine(NamedSharding(xy, P("y", "x")))
    run = partitioning.partitioning(transposed, z)
    assert equivalent(run.output_sharding, xy, P("y", "x"), 2)
    no_other_kinds(run.counts, **transposed_ops)
    assert run.bytes_sent == transposed_bytes
    np.testing.assert_allclose(np.asarray(transposed(z)), np.sin(values) + 1, atol=1e-6)

    replicated = partitioning.resharded_sine(NamedSharding(xy, P()))
    run = partitioning.partitioning(replicated, z)
    assert run.output_sharding.is_fully_replicated
    no_other_kinds(run.counts, all_gather=2)
    # gather the columns over y (rows stay split over x), then the rows over x
    assert run.bytes_sent == (ring_all_gather(8 // x_size * 8 * F32, y_size)
                              + ring_all_gather(8 * 8 * F32, x_size))
    assert sorted(op.group_size for op in run.ops) == sorted([x_size, y_size])

    rows_kept = partitioning.resharded_sine(NamedSharding(xy, P("x", None)))  # exercise 3
    run = partitioning.partitioning(rows_kept, z)
    assert equivalent(run.output_sharding, xy, P("x"), 2)
    (op,) = run.ops
    assert (op.kind, op.group_size) == ("all-gather", y_size)
    assert run.bytes_sent == ring_all_gather(8 // x_size * 8 * F32, y_size)
    if shape == (4, 2):
        assert partitioning.partitioning(replicated, z).bytes_sent == 224 and run.bytes_sent == 32


def test_chapter_wording_of_the_constraint_costs():
    xy = mesh_of(8, ("x", "y"), (4, 2))
    z = square(xy, P("x", "y"))
    run = partitioning.partitioning(partitioning.resharded_sine(NamedSharding(xy, P())), z)
    assert run.collectives_text == "1 all-gather in groups of 2 and 1 all-gather in groups of 4"


# --------------------------------------------------------------------------- disagreeing shardings


@pytest.mark.parametrize("k", [2, 4])
def test_arguments_on_different_devices_are_an_error(devices, k):
    first = partitioning.auto_mesh((k,), ("x",), devices=devices[:k])
    other = partitioning.auto_mesh((k,), ("x",), devices=devices[k:2 * k])
    u = partitioning.place(jnp.arange(8.0), first, P("x"))
    v = partitioning.place(jnp.arange(8.0), other, P("x"))
    message = error_of(jax.jit(lambda a, b: a + b), u, v)
    assert message.startswith("ValueError: Received incompatible devices")


@pytest.mark.parametrize("k", [2, 8])
def test_same_devices_in_another_order_are_an_error(devices, k):
    first = partitioning.auto_mesh((k,), ("x",), devices=devices[:k])
    backwards = partitioning.auto_mesh((k,), ("x",), devices=devices[k - 1::-1])
    u = partitioning.place(jnp.arange(8.0), first, P("x"))
    w = partitioning.place(jnp.arange(8.0), backwards, P("x"))
    assert error_of(jax.jit(lambda a, b: a + b), u, w).startswith(
        "ValueError: Received incompatible devices")


def test_committed_and_uncommitted(devices):
    mesh = partitioning.auto_mesh((4,), ("x",), devices=devices[:4])
    y = partitioning.place(jnp.arange(8.0), mesh, P("x"))
    like = jnp.ones_like(y)
    fresh = jnp.ones(8)
    assert y.committed and like.committed and not fresh.committed
    assert like.sharding == y.sharding
    assert (y + like).sharding == y.sharding
    assert (y + fresh).sharding == y.sharding
    np.testing.assert_array_equal(np.asarray(y + like), np.arange(8.0) + 1)
    pinned = jax.device_put(jnp.ones(8), devices[5])
    assert pinned.committed
    assert error_of(jnp.add, y, pinned).startswith("ValueError: Received incompatible devices")


# --------------------------------------------------------------------------- timing


@pytest.mark.parametrize("explicit", [False, True], ids=["Auto", "Explicit"])
def test_functions_that_take_a_mesh_work_on_both_axis_types(explicit):
    """place, matmul_partitioning and single_vs_sharded on a mesh of each axis type: the same
    layouts, collectives and values. matmul_partitioning asks what the compiler picks, so an
    Explicit mesh runs with its axes switched to Auto (same devices)."""
    mesh = mesh_of(8, ("a", "b"), (4, 2), explicit=explicit)
    placed = partitioning.place(np.arange(64.0).reshape(8, 8), mesh, P("a", "b"))
    assert placed.sharding.spec == P("a", "b") and placed.sharding.mesh.axis_types == (
        mesh.axis_types)
    np.testing.assert_array_equal(np.asarray(placed), np.arange(64.0).reshape(8, 8))
    auto = mesh_of(8, ("a", "b"), (4, 2))
    for name in partitioning.MATMUL_CASES:
        run, reference = (partitioning.matmul_partitioning(name, m) for m in (mesh, auto))
        assert (run.output_spec, run.collectives_text, run.bytes_sent) == (
            reference.output_spec, reference.collectives_text, reference.bytes_sent), name
        assert [d.id for d in run.output_sharding.mesh.devices.flat] == [
            d.id for d in mesh.devices.flat]
    single, spread = partitioning.single_vs_sharded(
        partitioning.matmul, [np.ones((16, 16)), np.ones((16, 16))], mesh,
        [P("a", None), P()], runs=1)
    assert "8 devices" in spread.label and "1 device" in single.label


def test_single_vs_sharded_reports_both_device_counts():
    mesh = partitioning.auto_mesh((8,), ("x",))
    single, sharded = partitioning.single_vs_sharded(partitioning.elementwise, [jnp.ones(64)], mesh, [P("x")],
                                           runs=2, label="sin")
    assert isinstance(single, Timing) and isinstance(sharded, Timing)
    assert (single.device_count, sharded.device_count) == (1, 8)
    assert single.label == "sin, 1 device" and sharded.label == "sin, 8 devices"
    assert len(single.times) == 2
    assert speedup(single, sharded) == pytest.approx(single.median / sharded.median)
    with pytest.raises(ValueError, match="one PartitionSpec per array"):
        partitioning.single_vs_sharded(partitioning.matmul, [jnp.ones((8, 8))], mesh, [P("x"), P()])


# --------------------------------------------------------------------------- under the hood


def test_lowered_program_carries_shardy_annotations():
    assert jax.config.jax_use_shardy_partitioner is True
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    text = jax.jit(partitioning.column_sums).lower(square(mesh, P("a", "b"))).as_text()
    assert "sdy.mesh @mesh" in text and "#sdy.sharding<@mesh" in text


def rows_out_program():
    """The chapter's "reading the compiled program" example: sharded contraction, rows out."""
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    rows_out = jax.jit(partitioning.matmul, out_shardings=NamedSharding(mesh, P("a", None)))
    lhs = partitioning.place(jnp.ones((16, 32)), mesh, P(None, "a"))
    rhs = partitioning.place(jnp.ones((32, 16)), mesh, P("a", None))
    return rows_out, lhs, rhs


def test_the_compiled_program_names_groups_by_mesh_axes_not_parameters_by_sharding():
    """computation_follows_sharding.md on JAX 0.12: per-device parameters without a
    sharding= (0.10 printed one), and the all-reduce's groups in the mesh spelling."""
    rows_out, lhs, rhs = rows_out_program()
    compiled = rows_out.lower(lhs, rhs).compile()
    entry = hlo_text.entry_computation(compiled)
    params = hlo_text.lines_with(entry, "parameter(")
    assert [p.split(" = ")[1].split("{")[0] for p in params] == ["f32[16,8]", "f32[8,16]"]
    assert "sharding=" not in compiled.as_text()
    (op,) = hlo.collectives(compiled)
    assert hlo_text.replica_groups_text(op.line) == "mesh['axis_0'=4,'axis_1'=2] {'axis_0'}"
    assert op.groups == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_shardy_propagates_and_xlas_spmd_partitioner_writes_the_per_device_program():
    rows_out, lhs, rhs = rows_out_program()
    first, second = partitioning.partitioner_passes(rows_out, lhs, rhs)
    assert (first.after, second.after) == ("shardy-xla", "spmd-partitioning")
    propagated = hlo_text.entry_computation(first.text)
    (dot,) = hlo_text.lines_with(propagated, " dot(")
    assert dot.split(" = ")[1].startswith("f32[16,16]")
    assert "sharding={mesh['a'=4,'b'=2], [{'a'}, {}]}" in dot
    assert not hlo_text.lines_with(propagated, *(f" {k}(" for k in hlo.KINDS))
    assert "sharding={mesh['a'=4,'b'=2], [{}, {'a'}]}" in hlo_text.lines_with(
        propagated, "parameter(0)")[0]
    partitioned = hlo_text.entry_computation(second.text)
    assert [p.split(" = ")[1].split("{")[0]
            for p in hlo_text.lines_with(partitioned, "parameter(")] == ["f32[16,8]", "f32[8,16]"]
    assert len(hlo_text.lines_with(partitioned, " all-reduce(")) == 1


def test_gspmd_notation_of_the_lowered_hlo_is_an_iota_recipe():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x_ba = square(mesh, P("b", "a"))
    hlo_in = jax.jit(partitioning.elementwise).lower(x_ba).compiler_ir("hlo").as_hlo_text()
    (parameter,) = hlo_text.lines_with(hlo_in, "parameter(0)")
    notation = "{" + parameter.split("sharding={", 1)[1].split("}", 1)[0] + "}"
    assert notation == "{devices=[2,4]<=[4,2]T(1,0)}"
    assert hlo_text.parse_tile_assignment(notation).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    p_none_a = jax.jit(partitioning.elementwise).lower(square(mesh, P(None, "a")))
    assert "sharding={devices=[1,4,2]<=[8] last_tile_dim_replicate}" in (
        p_none_a.compiler_ir("hlo").as_hlo_text())


@pytest.mark.parametrize(("passes", "error", "word"), [
    ("shardy-xla", checks.InputTypeError, "sequence of XLA pass names"),
    ((), checks.InputTypeError, "sequence of XLA pass names"),
    (("shardy xla",), checks.InputTypeError, "sequence of XLA pass names"),
    (("no-such-pass",), checks.InputError, "ran no pass named"),
])
def test_partitioner_passes_refuses_what_it_cannot_show(passes, error, word):
    rows_out, lhs, rhs = rows_out_program()
    with pytest.raises(error, match=word):
        partitioning.partitioner_passes(rows_out, lhs, rhs, passes=passes)


def test_entry_computation_and_lines_with():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    text = jax.jit(partitioning.column_sums).lower(square(mesh, P("a", "b"))).compile().as_text()
    entry = hlo_text.entry_computation(text)
    assert entry.startswith("ENTRY") and entry.rstrip().endswith("}")
    assert "metadata=" not in entry and "FileNames" not in entry
    (line,) = hlo_text.lines_with(entry, " all-reduce(")
    assert "replica_groups" in line
    with pytest.raises(ValueError, match="at least one"):
        hlo_text.lines_with(entry)
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo_text.entry_computation("HloModule m")


def test_cost_analysis_is_per_device():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x = square(mesh, P("a", "b"))
    sharded = jax.jit(partitioning.elementwise).lower(x).compile().cost_analysis()
    single = jax.jit(partitioning.elementwise).lower(np.asarray(x)).compile().cost_analysis()
    assert (int(sharded["flops"]), int(single["flops"])) == (16, 128)  # 2 flops per element
    assert int(sharded["transcendentals"]) == 8


def test_dump_dot_writes_graphviz_files(tmp_path):
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    paths = partitioning.dump_dot(partitioning.column_sums, square(mesh, P("a", "b")), directory=tmp_path)
    names = [p.name for p in paths]
    assert len(paths) == 2
    assert any("before_optimizations" in n for n in names)
    assert any("after_optimizations" in n for n in names)
    assert all(p.read_text().startswith("digraph") for p in paths)


def test_the_old_graph_route_is_gone():
    assert not hasattr(jax, "xla_computation")
    assert importlib.util.find_spec("jax.lib.xla_client") is None


def test_dataflow_marks_the_collectives():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    f = jax.jit(partitioning.matmul, out_shardings=NamedSharding(mesh, P("a", None)))
    lhs = partitioning.place(jnp.ones((16, 32)), mesh, P(None, "a"))
    rhs = partitioning.place(jnp.ones((32, 16)), mesh, P("a", None))
    nodes = partitioning.entry_dataflow(hlo.compiled_text(f, lhs, rhs))
    names = {n.name for n in nodes}
    assert all(o in names for n in nodes for o in n.operands)
    assert [n.opcode for n in nodes if n.is_collective] == ["all-reduce"]
    (reduce,) = [n for n in nodes if n.is_collective]
    assert reduce.shape_text == "f32[16,16]"
    figure = partitioning.plot_dataflow(f, lhs, rhs, title="t")
    red = [p for p in figure.axes[0].patches if p.get_facecolor()[0] > 0.9
           and p.get_facecolor()[1] < 0.7]
    assert len(red) == 1 and len(figure.axes[0].patches) == len(nodes)
    import matplotlib.pyplot as plt

    plt.close(figure)


# --------------------------------------------------------------------------- chapter 2 facts


def explicit(k: int = 8):
    shape = {8: (4, 2), 4: (2, 2), 2: (2, 1)}[k]
    return mesh_of(k, ("x", "y"), shape, explicit=True)


def test_make_mesh_defaults_to_explicit_and_p_is_partition_spec():
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    assert mesh.axis_types == (AxisType.Explicit,)
    assert jax.P is P


@pytest.mark.parametrize("k", [2, 8])
def test_types_carry_shardings(k):
    mesh = explicit(k)
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(32.0).reshape(8, 4), jax.P("x", "y"))
        if k == 2:  # y has size 1 and is dropped from the type
            assert str(jax.typeof(a)) in ("float32[8@x,4@y]", "float32[8@x,4]")
        else:
            assert str(jax.typeof(a)) == "float32[8@x,4@y]"
        seen = []

        @jax.jit
        def normalize_rows(t):
            total = t.sum(axis=1, keepdims=True)
            seen.append(str(jax.typeof(total)))
            return t / total

        out = normalize_rows(a)
        assert seen == ["float32[8@x,1]"]
        assert out.sharding.spec == a.sharding.spec


def test_the_rules_table():
    with jax.set_mesh(explicit(8)):
        a = jax.device_put(np.arange(32.0).reshape(8, 4), jax.P("x", "y"))
        w = jax.device_put(np.ones((4, 6)), jax.P(None, "y"))
        expected = {
            "sin": (lambda t: jnp.sin(t) * 2 + 1, "float32[8@x,4@y]"),
            "sum0": (lambda t: t.sum(axis=0), "float32[4@y]"),
            "T": (lambda t: t.T, "float32[4@y,8@x]"),
            "merge": (lambda t: t.reshape(32), "float32[32@(x,y)]"),
            "split": (lambda t: t.reshape(8, 2, 2), "float32[8@x,2@y,2]"),  # exercise 1
            "bad reshape": (lambda t: t.reshape(4, 8), "ShardingTypeError: This reshape"),
            "concat": (lambda t: jnp.concatenate([t, t]), "float32[16@x,4@y]"),
            "zeros": (lambda t: jnp.zeros((8, 4)), "float32[8,4]"),
            "cumsum": (lambda t: jnp.cumsum(t, axis=0), "ShardingTypeError: Input should be"),
            "matmul": (lambda t: t @ w, "float32[8@x,6@y]"),
        }
        table = partitioning.result_types({k: f for k, (f, _) in expected.items()}, a)
        got = {row["operation"]: row["result type"] for row in table.rows}
        for name, (_, want) in expected.items():
            assert got[name].startswith(want), (name, got[name])
        assert str(jax.typeof(jnp.zeros((8, 4), out_sharding=jax.P("x", "y")))) == (
            "float32[8@x,4@y]")  # exercise 3


@pytest.mark.parametrize("k", [2, 4, 8])
def test_matmul_type_error_and_its_fixes(k):
    mesh = explicit(k)
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(32.0).reshape(8, 4), jax.P("x", "y"))
        b = jax.device_put(np.arange(32.0).reshape(4, 8), jax.P("x", None))
        if k > 2:
            message = " ".join(error_of(jnp.matmul, a, b).split())
            # JAX 0.12: the one "ambiguous" message (0.10 and 0.11 said "dot_general requires
            # contracting dimensions to have consistent sharding" for differing specs).
            assert message == (
                "ShardingTypeError: Contracting dimensions are sharded and it is ambiguous how "
                "the output should be sharded. Please specify the output sharding via the "
                "`out_sharding` parameter. Got lhs_contracting_spec=('y',) and "
                "rhs_contracting_spec=('x',)")
            with pytest.raises(Exception) as info:
                a @ b
            error_class = info.type
            assert error_class.__name__ == "ShardingTypeError"
            assert error_class.__module__ == "jax._src.core"
            assert error_class.__mro__[1:] == (Exception, BaseException, object)
            assert not hasattr(jax.errors, "ShardingTypeError")
        fix_out = jax.jit(lambda s, t: jnp.matmul(s, t, out_sharding=jax.P("x", None)))
        fix_reshard = jax.jit(lambda s, t: s @ jax.reshard(t, jax.P()))
        want = np.arange(32.0).reshape(8, 4) @ np.arange(32.0).reshape(4, 8)
        x_size, y_size = dict(mesh.shape)["x"], dict(mesh.shape)["y"]
        for fix in (fix_out, fix_reshard):
            run = partitioning.partitioning(fix, a, b)
            product = run.compiled(a, b)
            assert str(jax.typeof(product)) == "float32[8@x,8]"
            np.testing.assert_allclose(np.asarray(product), want)
            if k == 8:  # the chapter's table: b's rows gathered over x, a's columns over y
                assert run.collectives_text == (
                    "1 all-gather in groups of 4 and 1 all-gather in groups of 2")
                assert run.bytes_sent == (ring_all_gather(4 * 8 * F32, x_size)
                                          + ring_all_gather(8 // x_size * 4 * F32, y_size))
                assert run.bytes_sent == 112


def test_both_contracting_dims_on_one_axis_is_ambiguous():
    with jax.set_mesh(explicit(8)):
        a = jax.device_put(np.arange(32.0).reshape(8, 4), jax.P("x", "y"))
        b = jax.device_put(np.arange(32.0).reshape(4, 8), jax.P("x", None))
        b_by_y = jax.reshard(b, jax.P("y", None))
        assert str(jax.typeof(b_by_y)) == "float32[4@y,8]"
        same_axis = " ".join(error_of(jnp.matmul, a, b_by_y).split())
        different_axes = " ".join(error_of(jnp.matmul, a, b).split())
        # JAX 0.12 gives both cases one message; only the specs it quotes differ.
        assert same_axis.endswith("Got lhs_contracting_spec=('y',) and rhs_contracting_spec=('y',)")
        assert same_axis.split(" Got ")[0] == different_axes.split(" Got ")[0]
        assert "ambiguous" in same_axis
        # exercise 2
        assert error_of(lambda t: t.T @ t, a).startswith("ShardingTypeError")
        gram = jax.jit(lambda t: jnp.matmul(t.T, t, out_sharding=jax.P("y", None)))
        assert str(jax.typeof(gram(a))) == "float32[4@y,4]"
        np.testing.assert_allclose(np.asarray(gram(a)), np.asarray(a).T @ np.asarray(a))


def test_auto_axes_region():
    with jax.set_mesh(explicit(8)):
        a = jax.device_put(np.arange(32.0).reshape(8, 4), jax.P("x", "y"))
        b = jax.device_put(np.arange(32.0).reshape(4, 8), jax.P("x", None))
        seen = []

        def inside(s, t):
            seen.append((str(jax.typeof(s)), str(jax.typeof(t))))
            return s @ t

        @jax.jit
        def matmul_auto(s, t):
            return jax.sharding.auto_axes(inside, out_sharding=jax.P("x", None))(s, t)

        result = matmul_auto(a, b)
        assert seen == [("float32[8,4]", "float32[4,8]")]
        assert str(jax.typeof(result)) == "float32[8@x,8]"
        np.testing.assert_allclose(np.asarray(result), np.asarray(a) @ np.asarray(b))
        run = partitioning.partitioning(matmul_auto, a, b)
        assert run.collectives_text == "1 all-gather in groups of 4 and 1 all-gather in groups of 2"
        assert run.bytes_sent == 112


def test_explicit_axes_region():
    mesh = partitioning.auto_mesh((4, 2), ("x", "y"))
    with jax.set_mesh(mesh):
        c = jax.device_put(np.arange(32.0).reshape(8, 4), jax.P("x", "y"))
        seen = []

        def column_sums(t):
            seen.append(str(jax.typeof(t)))
            return t.sum(axis=0)

        @jax.jit
        def sums_explicit(t):
            seen.append(str(jax.typeof(t)))
            return jax.sharding.explicit_axes(column_sums, in_sharding=jax.P("x", "y"))(t)

        totals = sums_explicit(c)
    assert seen == ["float32[8,4]", "float32[8@x,4@y]"]
    assert partitioning.sharding_text(totals.sharding) == "P('y')"
    np.testing.assert_allclose(np.asarray(totals), np.arange(32.0).reshape(8, 4).sum(0))


def test_api_changes_stated_in_the_chapter():
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mesh:
            pass
    assert caught and caught[0].category is DeprecationWarning
    assert "jax.set_mesh" in str(caught[0].message)
    assert not hasattr(jax.sharding, "use_mesh")
    assert hasattr(jax, "set_mesh")


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda m: partitioning.place(None, m, P()), checks.InputTypeError, "must be an array"),
    (lambda m: partitioning.place(np.ones(8), m, "a"), checks.InputTypeError, "PartitionSpec"),
    (lambda m: partitioning.spec_text("xy"), checks.InputTypeError, "PartitionSpec"),
    (lambda m: partitioning.sharding_text(3), checks.InputTypeError, "Sharding"),
    (lambda m: partitioning.matmul_partitioning("rows x columns", m, m=0), checks.InputError, "m must"),
    (lambda m: partitioning.matmul_partitioning("nope", m), checks.InputError, "unknown matmul case"),
    (lambda m: partitioning.auto_mesh(8, "x"), checks.InputTypeError, "tuple of strings"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call(mesh_of(8, ("a", "b"), (4, 2)))


def test_ring_arithmetic_redoes_the_bytes_sent(devices):
    """The chapter's derivation of the column sums' 24 bytes, and the other kinds' sums."""
    x = square(mesh_of(8, ("a", "b"), (4, 2)), P("a", "b"))
    (op,) = partitioning.partitioning(partitioning.column_sums, x).ops
    assert partitioning.ring_arithmetic(op) == "2 × (4 − 1) / 4 × 16 B = 24 B"
    gather = hlo.Collective("all-gather", op.buffers, 4, ring_all_gather(16, 4))
    assert partitioning.ring_arithmetic(gather) == "(4 − 1) / 4 × 16 B = 12 B"
    permute = hlo.Collective("collective-permute", op.buffers, 2, 16)
    assert partitioning.ring_arithmetic(permute) == "16 B = 16 B"
    with pytest.raises(checks.InputTypeError, match="Collective"):
        partitioning.ring_arithmetic("all-reduce")


def test_sharding_text_names_a_single_device_array_for_what_it_is(devices):
    """A fresh jnp array is a SingleDeviceSharding, not a P() over a mesh."""
    fresh = jnp.ones(8)
    assert not fresh.committed
    assert partitioning.sharding_text(fresh.sharding) == "SingleDeviceSharding"
    replicated = partitioning.place(np.ones(8), mesh_of(8, ("a", "b"), (4, 2)), P())
    assert partitioning.sharding_text(replicated.sharding) == "P()"


def test_valid_inputs_that_used_to_fail_or_mislead():
    assert partitioning.sharding_text(P("x")) == "P('x')"  # a spec, not a sharding: read as itself
    assert dict(partitioning.auto_mesh(8, ("x",)).shape) == {"x": 8}
    assert dict(partitioning.auto_mesh((np.int64(2), 4), ("a", "b")).shape) == {"a": 2, "b": 4}


def test_explicit_chapter_both_fixes_compile_to_one_program():
    """explicit_sharding.md: out_sharding= and jax.reshard(b, P()) give the same program,
    whose two all-gathers assemble b over 'x' and a's columns over 'y'. On JAX 0.12 the two
    texts differ in one line only: the gather of b names the mesh axes 'axis_0', 'axis_1'
    in the out_sharding= program and 'x', 'y' in the reshard one (same device groups)."""
    mesh = mesh_of(8, ("x", "y"), (4, 2), explicit=True)
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(32.0).reshape(8, 4), P("x", "y"))
        b = jax.device_put(np.arange(32.0).reshape(4, 8), P("x", None))
        fix_out = jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=P("x", None)))
        fix_reshard = jax.jit(lambda a, b: a @ jax.reshard(b, P()))
        first, second = partitioning.partitioning(fix_out, a, b), partitioning.partitioning(fix_reshard, a, b)
        other = partitioning.partitioning(jax.jit(lambda x: x * 2), jax.device_put(np.ones(8), P()))
    assert hlo_text.same_program(first.compiled, second.compiled)
    assert sorted((op.shape, op.group_size) for op in first.ops) == [((2, 4), 2), ((4, 8), 4)]
    assert [op.groups for op in first.ops] == [op.groups for op in second.ops]
    assert not hlo_text.same_program(first.compiled, other.compiled)
    ((out_line, reshard_line),) = hlo_text.differing_lines(first.compiled, second.compiled)
    assert " all-gather(" in out_line and " all-gather(" in reshard_line
    assert "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}" in out_line
    assert "replica_groups=mesh['x'=4,'y'=2] {'x'}" in reshard_line
    assert (hlo_text.replica_groups_text(out_line), hlo_text.replica_groups_text(reshard_line)
            ) == ("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", "mesh['x'=4,'y'=2] {'x'}")
