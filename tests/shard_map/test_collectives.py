"""Tests for spmd_guide.shard_map.collectives: every worked example against numpy on 2, 4 and 8 devices,
the HLO each collective becomes (the chapter's table), the check_vma error, and the pictures."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax import P

from spmd_guide.core import hlo
from spmd_guide.shard_map import collectives

SIZES = (2, 4, 8)


def reference(name: str, x: np.ndarray, n: int) -> np.ndarray:
    """What every device holds after example ``name``, computed with numpy: ``[d]`` = device d."""
    b = x.reshape(n, x.shape[0] // n, *x.shape[1:])  # b[d]: device d's block
    every = lambda v: np.stack([v] * n)  # noqa: E731 - the same value on every device
    if name == "psum":
        return every(b.sum(0))
    if name == "pmean":
        return every(b.mean(0))
    if name == "all_gather":
        return every(b)
    if name == "all_gather_tiled":
        return every(x)
    if name == "psum_scatter":
        return b.sum(0)  # device d keeps element d of the sum
    if name == "psum_scatter_tiled":
        return b.sum(0).reshape(n, -1)
    if name == "ppermute":
        return np.stack([b[(d - 1) % n] for d in range(n)])
    if name == "all_to_all":
        return np.stack([x[:, d * (x.shape[1] // n):(d + 1) * (x.shape[1] // n)]
                         for d in range(n)])
    if name == "axis_index":
        return np.arange(n).reshape(n, 1)
    raise AssertionError(name)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(collectives.EXAMPLES))
def test_each_example_matches_numpy(name, n):
    x, result = collectives.run_example(name, mesh_of(n))
    expected = reference(name, x, n)
    assert result.shape == expected.shape
    np.testing.assert_allclose(result, expected, rtol=1e-6)


def test_examples_cover_every_collective_the_chapter_teaches():
    assert set(collectives.EXAMPLES) == {"psum", "pmean", "all_gather", "all_gather_tiled", "psum_scatter",
                               "psum_scatter_tiled", "ppermute", "all_to_all", "axis_index"}


@pytest.mark.parametrize("n", SIZES)
def test_block_sums_and_global_sum(n):
    x = np.arange(4 * n, dtype=np.float32)
    np.testing.assert_allclose(collectives.block_sums(x, mesh_of(n)), x.reshape(n, -1).sum(1))
    total = collectives.global_sum(x, mesh_of(n))
    assert total.shape == (1,) and total.sharding.spec == P()
    np.testing.assert_allclose(total, [x.sum()])


def test_functions_work_on_explicit_meshes_too():
    mesh = mesh_of(8, explicit=True)
    x = np.arange(32, dtype=np.float32)
    np.testing.assert_allclose(collectives.global_sum(x, mesh), [x.sum()])
    _, result = collectives.run_example("ppermute", mesh)
    np.testing.assert_allclose(result[1], [0, 1])


@pytest.mark.parametrize("explicit", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["Auto", "Explicit"])
def test_every_function_that_takes_a_mesh_works_on_both_axis_types(explicit):
    """Each public function with a mesh argument, on one axis of a 2-axis mesh of each type,
    against the same call on an Auto mesh of the axis alone (or numpy). (The quick suite
    runs the Explicit mesh; the 2-axis Auto mesh is in the slow sweep.)"""
    mesh = mesh_of(8, ("x", "y"), (4, 2), explicit=explicit)
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_allclose(collectives.block_sums(x, mesh), x.reshape(4, 4).sum(1))
    np.testing.assert_allclose(collectives.global_sum(x, mesh), [x.sum()])
    assert collectives.traced_types(collectives.psum_kernel, x, mesh) == (
        collectives.traced_types(collectives.psum_kernel, x, mesh_of(4)))
    square = np.arange(64, dtype=np.float32).reshape(8, 8)
    moved = collectives.rows_to_columns(square, mesh)
    np.testing.assert_array_equal(moved, square)
    assert moved.sharding.spec == P(None, "x")
    per_device = collectives.per_device_function(collectives.psum_kernel, mesh)
    expected = np.stack([x.reshape(4, 4).sum(0)] * 4)
    np.testing.assert_allclose(per_device(x), expected)  # numpy input, placed by the function
    np.testing.assert_allclose(jax.jit(per_device)(jnp.asarray(x)), expected)
    np.testing.assert_allclose(
        collectives.per_device_result(collectives.psum_kernel, x, mesh), expected)
    for name in collectives.EXAMPLES:
        example_input, result = collectives.run_example(name, mesh)
        np.testing.assert_allclose(result, reference(name, example_input, 4), rtol=1e-6)
    assert len(collectives.example_panels("psum", mesh)) == 2
    assert collectives.draw_collective("psum", mesh) is not None
    assert collectives.hlo_rows(mesh) == collectives.hlo_rows(mesh_of(4))


@pytest.mark.parametrize("n", SIZES)
def test_rows_to_columns_keeps_values_and_changes_layout(n):
    x = np.arange(4 * n * n, dtype=np.float32).reshape(2 * n, 2 * n)
    y = collectives.rows_to_columns(x, mesh_of(n))
    np.testing.assert_array_equal(y, x)
    assert y.sharding.spec == P(None, "x")
    assert y.addressable_shards[0].data.shape == (2 * n, 2)


def test_rows_to_columns_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"divides by 4, got shape \(8, 6\)"):
        collectives.rows_to_columns(np.zeros((8, 6)), mesh_of(4))
    with pytest.raises(ValueError, match="got shape"):
        collectives.rows_to_columns(np.zeros(8), mesh_of(4))


def test_explicit_mesh_rejects_an_input_not_laid_out_as_in_specs():
    mesh = mesh_of(8, explicit=True)
    f = jax.shard_map(collectives.block_sum, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(ValueError, match="does not match the specs of the input"):
        f(jnp.arange(32.0))
    placed = jax.reshard(jnp.arange(32.0), jax.NamedSharding(mesh, P("x")))
    np.testing.assert_allclose(f(placed), np.arange(32.0).reshape(8, 4).sum(1))


def test_out_specs_P_without_psum_is_rejected_by_check_vma():
    f = jax.jit(jax.shard_map(collectives.block_sum, mesh=mesh_of(8), in_specs=P("x"), out_specs=P()))
    with pytest.raises(ValueError, match="check_vma=False"):
        f(np.arange(32.0))


def test_without_the_check_P_silently_returns_device_0s_block():
    f = jax.shard_map(collectives.block_sum, mesh=mesh_of(8), in_specs=P("x"), out_specs=P(),
                      check_vma=False)
    np.testing.assert_allclose(f(np.arange(32.0)), [0 + 1 + 2 + 3])


def test_traced_types_mark_varying_values():
    x = np.arange(16, dtype=np.float32)
    mesh = mesh_of(8)
    assert collectives.traced_types(collectives.psum_kernel, x, mesh) == ("float32[2]{V:x}", "float32[2]")
    assert collectives.traced_types(collectives.all_gather_kernel, x, mesh) == ("float32[2]{V:x}", "float32[8,2]{V:x}")
    assert collectives.traced_types(collectives.axis_index_kernel, x, mesh)[1] == "int32[1]{V:x}"


# --------------------------------------------------------------------------- the HLO table

EXPECTED_HLO = {  # example -> (HLO op, count, bytes one device sends on 8 devices)
    "psum": ("all-reduce", 1, 2 * 7 * 8 // 8),              # f32[2]: 2(n-1)/n * 8 B
    "pmean": ("all-reduce", 1, 2 * 7 * 8 // 8),
    "all_gather": ("all-gather", 1, 7 * 64 // 8),           # gathered f32[8,2]: (n-1)/n * 64 B
    "all_gather_tiled": ("all-gather", 1, 7 * 64 // 8),     # gathered f32[16]
    "psum_scatter": ("reduce-scatter", 1, 7 * 32 // 8),     # input f32[8]
    "psum_scatter_tiled": ("reduce-scatter", 1, 7 * 32 // 8),  # input f32[8]
    "ppermute": ("collective-permute", 1, 8),               # the whole f32[2] operand
    "all_to_all": ("all-to-all", 1, 7 * 32 // 8),           # 8 chunks of f32[1,1]
    "axis_index": ("(none)", 0, 0),
}


def test_hlo_table_pins_each_collective():
    rows = {row["example"]: row for row in collectives.hlo_rows(mesh_of(8))}
    assert set(rows) == set(EXPECTED_HLO)
    for name, (op, count, sent) in EXPECTED_HLO.items():
        row = rows[name]
        found = (row["HLO op"], row["count"], row["sent"])
        assert found == (op, count, sent), name
        assert collectives.EXAMPLES[name].hlo_op == (None if op == "(none)" else op)


def test_group_size_and_bytes_follow_the_mesh():
    mesh = mesh_of(4)
    x = jax.device_put(np.arange(8, dtype=np.float32), jax.NamedSharding(mesh, P("x")))
    (op,) = hlo.collectives(collectives.per_device_function(collectives.psum_kernel, mesh), x)
    assert (op.kind, op.group_size, op.bytes_sent) == ("all-reduce", 4, 2 * 3 * 8 // 4)


def test_pmean_is_an_all_reduce_then_a_scale():
    mesh = mesh_of(8)
    x = jax.device_put(np.arange(16, dtype=np.float32), jax.NamedSharding(mesh, P("x")))
    text = hlo.compiled_text(collectives.per_device_function(collectives.pmean_kernel, mesh), x)
    assert "all-reduce(" in text
    assert "multiply(" in text or "divide(" in text
    psum_text = hlo.compiled_text(collectives.per_device_function(collectives.psum_kernel, mesh), x)
    assert "multiply(" not in psum_text and "divide(" not in psum_text


# --------------------------------------------------------------------------- the pictures


def _cells(fig):
    from matplotlib.patches import Rectangle  # here, not at import: collecting stays fast

    return [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_gid() == "cell"]


def _arrows(fig):
    from matplotlib.patches import FancyArrowPatch

    return [p for p in fig.axes[0].patches
            if isinstance(p, FancyArrowPatch) and p.get_gid() == "arrow"]


@pytest.mark.parametrize("name, before, after", [
    ("psum", 2, 2), ("all_gather", 2, 16), ("psum_scatter", 8, 1), ("all_to_all", 8, 8),
])
def test_draw_collective_draws_one_cell_per_value(name, before, after):
    fig = collectives.draw_collective(name, mesh_of(8))
    assert len(_cells(fig)) == 8 * (before + after)
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "value"]
    x, result = collectives.run_example(name, mesh_of(8))
    assert labels == [f"{v:g}" for v in np.concatenate([x.ravel(), result.ravel()])]


def test_ring_shift_picture_has_one_arrow_per_device_and_moved_colours():
    fig = collectives.draw_collective("ppermute", mesh_of(4))
    assert len(_arrows(fig)) == 4
    cells = _cells(fig)
    before, after = cells[:8], cells[8:]
    for d in range(4):  # device d now holds device d-1's block, in device d-1's colour
        for i in range(2):
            assert after[2 * d + i].get_facecolor() == pytest.approx(collectives.device_color((d - 1) % 4))
            assert before[2 * d + i].get_facecolor() == pytest.approx(collectives.device_color(d))


def test_all_to_all_picture_colours_each_value_by_its_source():
    panels = collectives.example_panels("all_to_all", mesh_of(4))
    after = panels[1]
    for d in range(4):
        np.testing.assert_array_equal(np.ravel(after.origins[d]), np.arange(4))


def test_a_gathered_array_goes_out_stacked_or_not_at_all():
    """The chapter's check_vma claim: all_gather's result is varying, so out_specs=P() is
    refused, and out_specs=P('x') stacks one whole copy per device."""
    mesh = mesh_of(4)
    x = np.arange(8, dtype=np.float32)

    def gathered(block):
        return jax.lax.all_gather(block, "x", tiled=True)

    stacked = jax.shard_map(gathered, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    np.testing.assert_array_equal(stacked, np.tile(x, 4))
    with pytest.raises(ValueError, match="replicat"):
        jax.shard_map(gathered, mesh=mesh, in_specs=P("x"), out_specs=P())(x)


def test_captions_say_when_a_block_is_drawn_as_a_row():
    """all_to_all turns each device's row f32[1,4] into a column f32[4,1]; the panel draws it as
    a row of cells, and its caption says so."""
    before, after = collectives.example_panels("all_to_all", mesh_of(4))
    assert before.caption == "each device: f32[1,4]"
    assert after.caption == "each device: f32[4,1], drawn as a row"
    assert collectives.flat_caption(np.zeros(3, np.float32)) == "each device: f32[3]"
    assert collectives.flat_caption(np.zeros((2, 3), np.float32)).endswith("drawn as a row")


def test_reductions_are_drawn_as_combined():
    panels = collectives.example_panels("psum_scatter", mesh_of(2))
    assert all((np.asarray(o) == collectives.COMBINED).all() for o in panels[1].origins)
    fig = collectives.draw_collective("psum", mesh_of(2))
    after = _cells(fig)[4:]
    assert all(c.get_facecolor() == pytest.approx(collectives.device_color(collectives.COMBINED)) for c in after)


def test_draw_panels_general_api():
    panels = [collectives.Panel(f"step {k}", [[k, k + 1, k + 2]] * 3) for k in range(3)]
    ring = [(0, 1), (1, 2), (2, 0)]
    fig = collectives.draw_panels(panels, arrows=[ring, ring], gap_labels=["send", "send"])
    assert len(_cells(fig)) == 3 * 3 * 3
    assert len(_arrows(fig)) == 6


def test_draw_panels_rejects_bad_input():
    two = collectives.Panel("a", [[1], [2]])
    with pytest.raises(ValueError, match="same devices"):
        collectives.draw_panels([two, collectives.Panel("b", [[1]])])
    with pytest.raises(ValueError, match="outside"):
        collectives.draw_panels([two, two], arrows=[[(0, 5)]])
    with pytest.raises(ValueError, match="one entry per gap"):
        collectives.draw_panels([two, two], arrows=[None, None])
    with pytest.raises(ValueError, match="one origin per value"):
        collectives.draw_panels([collectives.Panel("a", [[1, 2], [3, 4]], origins=[[0], [1]])])
    with pytest.raises(ValueError, match="at least one"):
        collectives.draw_panels([])


# --------------------------------------------------------------------------- bad input


def test_uneven_input_and_wrong_axis_raise_clear_errors():
    with pytest.raises(ValueError, match=r"\(10,\).*4 equal blocks.*divisible by 4"):
        collectives.block_sums(np.arange(10.0), mesh_of(4))
    with pytest.raises(ValueError, match="'y' is not an axis"):
        collectives.global_sum(np.arange(8.0), mesh_of(4), axis_name="y")
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        collectives.block_sums(np.arange(8.0), "mesh")
    with pytest.raises(ValueError, match="choose one of"):
        collectives.example("psum_gather")


# --------------------------------------------------------------------------- exercises


@pytest.mark.parametrize("n", SIZES)
def test_exercise_answers(n):
    mesh = mesh_of(n)
    x = np.arange(2 * n * n, dtype=np.float32) ** 2
    np.testing.assert_allclose(collectives.per_device_result(collectives.mean_via_psum, x, mesh),
                               np.full(n, x.mean()), rtol=1e-6)
    np.testing.assert_allclose(collectives.per_device_result(collectives.psum_in_two_steps, x, mesh),
                               reference("psum", x, n))
    shifted = collectives.per_device_result(partial(collectives.ring_shift_kernel, step=-1), x, mesh)
    b = x.reshape(n, -1)
    np.testing.assert_allclose(shifted, np.stack([b[(d + 1) % n] for d in range(n)]))
    np.testing.assert_array_equal(collectives.per_device_result(collectives.global_positions, x, mesh).ravel(),
                                  np.arange(x.size))


def test_psum_in_two_steps_costs_what_one_all_reduce_costs():
    mesh = mesh_of(8)
    x = jax.device_put(np.arange(64, dtype=np.float32), jax.NamedSharding(mesh, P("x")))
    two = collectives.per_device_function(collectives.psum_in_two_steps, mesh)
    one = collectives.per_device_function(collectives.psum_kernel, mesh)
    counts = hlo.collective_counts(two, x)
    assert counts["reduce-scatter"] == 1 and counts["all-gather"] == 1
    assert counts["all-reduce"] == 0
    assert hlo.communication_bytes(two, x) == hlo.communication_bytes(one, x) == 2 * 7 * 32 // 8


def test_ring_scaling_psum_approaches_twice_the_buffer():
    rows = collectives.ring_scaling(collectives.psum_kernel, block_elements=256, device_counts=(2, 4, 8))
    assert [r["devices"] for r in rows] == [2, 4, 8]
    assert [r["sent / B"] for r in rows] == [2 * (n - 1) / n for n in (2, 4, 8)]
    assert all(r["B"] == "1 KiB" for r in rows)
    with pytest.raises(ValueError, match="this process has 8"):
        collectives.ring_scaling(collectives.psum_kernel, block_elements=4, device_counts=(16,))


def test_draw_panels_docstring_ring_example_with_string_labels():
    ring = [(i, (i + 1) % 4) for i in range(4)]
    held = [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1]]
    steps = [collectives.Panel(f"step {k}", [[f"B{b}"] for b in held[k]], origins=[[b] for b in held[k]])
             for k in range(3)]
    fig = collectives.draw_panels(steps, arrows=[ring, ring], gap_labels=["ppermute", "ppermute"],
                        fmt="{}")
    assert len(_cells(fig)) == 12 and len(_arrows(fig)) == 8
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "value"]
    assert labels[4:8] == ["B3", "B0", "B1", "B2"]
    step1 = _cells(fig)[4:8]
    assert [c.get_facecolor() for c in step1] == [pytest.approx(collectives.device_color(b))
                                                  for b in held[1]]


def test_two_psums_compile_to_one_combined_all_reduce():
    """shard_map_collectives.md: one op per collective is not a rule; XLA combines."""
    mesh = mesh_of(8)
    two_sums = jax.jit(jax.shard_map(
        lambda block: (jax.lax.psum(block, "x"), jax.lax.psum(2 * block, "x")),
        mesh=mesh, in_specs=jax.P("x"), out_specs=(jax.P(), jax.P())))
    ops = hlo.collectives(two_sums, jnp.arange(32.0))
    assert [(op.kind, len(op.buffers)) for op in ops] == [("all-reduce", 2)]

# --------------------------------------------------------------------------- bad input, table

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402

BAD_INPUT = [
    ("string x", lambda: collectives.global_sum("abc", mesh_of(2)), InputTypeError, "array"),
    ("None x", lambda: collectives.block_sums(None, mesh_of(2)), InputTypeError, "array"),
    ("scalar x", lambda: collectives.global_sum(3.0, mesh_of(2)), InputError, "equal"),
    ("indivisible x", lambda: collectives.global_sum(np.arange(5.0), mesh_of(2)), InputError,
     "divisible by 2"),
    ("unknown axis", lambda: collectives.block_sums(np.arange(4.0), mesh_of(2), axis_name="y"),
     InputError, "not an axis"),
    ("axis not str", lambda: collectives.block_sums(np.arange(4.0), mesh_of(2), axis_name=0),
     InputTypeError, "axis_name"),
    ("mesh a list", lambda: collectives.global_sum(np.arange(4.0), [0, 1]), InputTypeError, "Mesh"),
    ("blocks n=0", lambda: collectives.blocks(np.arange(4), 0), InputError, "n_devices"),
    ("blocks n=2.0", lambda: collectives.blocks(np.arange(4), 2.0), InputTypeError, "integer"),
    ("kernel not callable", lambda: collectives.per_device_result("psum", np.arange(4.0), mesh_of(2)),
     InputTypeError, "function"),
    ("kernel names axis 'y'", lambda: collectives.per_device_result(
        lambda b, a: jax.lax.psum(b, "y"), np.arange(4.0), mesh_of(2)), InputError,
     "does not have"),
    ("untiled psum_scatter block of 2 on 4", lambda: collectives.per_device_result(
        collectives.psum_scatter_kernel, np.arange(8.0), mesh_of(4)), InputError, "exactly 4"),
    ("tiled psum_scatter block of 1 on 4", lambda: collectives.per_device_result(
        collectives.psum_scatter_tiled_kernel, np.arange(4.0), mesh_of(4)), InputError, "multiple of 4"),
    ("all_to_all 3 columns on 2", lambda: collectives.per_device_result(
        collectives.all_to_all_kernel, np.ones((2, 3)), mesh_of(2)), InputError, "columns"),
    ("rows_to_columns string", lambda: collectives.rows_to_columns("m", mesh_of(2)), InputTypeError,
     "array"),
    ("unknown example", lambda: collectives.example("gather"), InputError, "choose one of"),
    ("example n=0", lambda: collectives.EXAMPLES["psum"].example_input(0), InputError, "n_devices"),
    ("traced_types kernel None", lambda: collectives.traced_types(None, np.arange(4.0), mesh_of(2)),
     InputTypeError, "function"),
    ("ring_scaling block 0", lambda: collectives.ring_scaling(collectives.psum_kernel, block_elements=0,
                                                    device_counts=[2]), InputError,
     "block_elements"),
    ("ring_scaling 99 devices", lambda: collectives.ring_scaling(collectives.psum_kernel, block_elements=4,
                                                       device_counts=[99]), InputError,
     "this process has"),
    ("ring_scaling counts int", lambda: collectives.ring_scaling(collectives.psum_kernel, block_elements=4,
                                                       device_counts=4), InputTypeError,
     "sequence"),
    ("hlo_rows bad axis", lambda: collectives.hlo_rows(mesh_of(2), axis_name="z"), InputError,
     "not an axis"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_python_lists_are_arrays_not_trees_of_scalars():
    x = list(range(16))
    assert collectives.global_sum(x, mesh_of(4)).tolist() == [120]
    np.testing.assert_array_equal(np.asarray(collectives.block_sums([float(v) for v in x], mesh_of(8))),
                                  np.arange(16.0).reshape(8, 2).sum(1))


# --------------------------------------------------------------------------- property: any shape

_KERNELS = ["psum", "all_gather_tiled", "psum_scatter", "psum_scatter_tiled", "ppermute",
            "all_to_all"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(_KERNELS), n=st.sampled_from([1, 2, 4, 8]),
       rows=st.integers(1, 20), cols=st.integers(1, 5))
def test_random_shapes_and_meshes_give_numpy_or_the_packages_error(name, n, rows, cols):
    shape = (rows,) if name != "all_to_all" else (rows, cols)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    try:
        got = collectives.per_device_result(collectives.EXAMPLES[name].kernel, x, mesh_of(n))
    except (InputError, InputTypeError):
        block = rows // n if rows % n == 0 else None
        assert (block is None or (name == "psum_scatter" and block != n)
                or (name == "psum_scatter_tiled" and block % n)
                or (name == "all_to_all" and cols % n))
        return
    np.testing.assert_allclose(got, reference(name, x, n))
