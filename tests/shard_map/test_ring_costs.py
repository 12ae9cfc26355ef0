"""ring_costs: what a compiled collective matmul costs, and its ring schedule."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide.core import checks, hlo
from spmd_guide.shard_map import ring_costs


@pytest.mark.parametrize("name", ["allgather", "reduce_scatter_bidi"])
def test_compiled_bytes_meet_the_ring_bound(name):
    m, k, n = 16, 32, 8
    lhs, rhs = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    compiled = ring_costs.compile_variant(name, lhs, rhs, mesh_of(4), "x")
    np.testing.assert_allclose(np.asarray(compiled()), lhs @ rhs)
    sent = sum(op.bytes_sent for op in hlo.collectives(compiled.program))
    assert sent == ring_costs.ring_bound_bytes(name, m, k, n, 4, 4)


@pytest.mark.parametrize("explicit", [False, True], ids=["Auto", "Explicit"])
def test_compile_variant_works_on_both_axis_types(explicit):
    """The variant places its inputs itself, so an Explicit mesh (one axis of two) gives the
    same product and the same collectives as an Auto one."""
    m, k, n = 16, 32, 8
    rng = np.random.default_rng(3)
    lhs = rng.standard_normal((m, k), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    mesh = mesh_of(8, ("x", "y"), (4, 2), explicit=explicit)
    for name in ("allgather_overlapped", "reduce_scatter"):
        compiled = ring_costs.compile_variant(name, lhs, rhs, mesh, "x")
        np.testing.assert_allclose(np.asarray(compiled()), lhs @ rhs, rtol=1e-5, atol=1e-5)
        sent = sum(op.bytes_sent for op in hlo.collectives(compiled.program))
        assert sent == ring_costs.ring_bound_bytes(name, m, k, n, 4, 4)


def test_schedule_visits_every_block_once():
    for name in ("allgather_overlapped", "reduce_scatter_bidi"):
        steps = ring_costs.ring_schedule(name, 4)
        held = {d: set() for d in range(4)}
        for step in steps:
            for device, blocks in enumerate(step.blocks):
                held[device] |= set(blocks)
        assert all(blocks == set(range(4)) for blocks in held.values())


def test_numpy_integers_and_names_work_like_python_ones():
    assert ring_costs.ring_bound_bytes("allgather", np.int64(8), np.int32(8), 8, np.int64(4),
                                       np.int64(4)) == ring_costs.ring_bound_bytes(
        "allgather", 8, 8, 8, 4, 4) == 3 * 64 * 4 // 4
    assert len(ring_costs.ring_schedule(np.str_("allgather_bidi"), np.int64(4))) == 4
    assert ring_costs.bytes_by_direction((), np.int64(4)) == {
        "forward": 0, "backward": 0, "other": 0}
    assert ring_costs.amounts_in_words({"a": np.int64(3)}) == "`a` needs 3 bytes"
    compiled = ring_costs.compile_variant("allgather", np.ones((8, 8)), np.ones((8, 8)),
                                          mesh_of(4), np.str_("x"))
    np.testing.assert_allclose(np.asarray(compiled()), np.full((8, 8), 8.0))


BAD_INPUT = [
    ("negative m", lambda: ring_costs.ring_bound_bytes("allgather", -1, 4, 4, 4, 8),
     checks.InputError, "at least 1"),
    ("bool m", lambda: ring_costs.ring_bound_bytes("allgather", True, 4, 4, 4, 8),
     checks.InputTypeError, "integer"),
    ("float itemsize", lambda: ring_costs.ring_bound_bytes("allgather", 4, 4, 4, 2.5, 8),
     checks.InputTypeError, "integer"),
    ("unknown variant", lambda: ring_costs.ring_schedule("nope", 4), checks.InputError,
     "unknown collective matmul"),
    ("variant not a name", lambda: ring_costs.ring_bound_bytes(3, 4, 4, 4, 4, 4),
     checks.InputError, "unknown collective matmul"),
    ("ring of 0", lambda: ring_costs.ring_schedule("allgather_bidi", 0), checks.InputError,
     "at least 1"),
    ("ring a string", lambda: ring_costs.bytes_by_direction([], "4"), checks.InputTypeError,
     "integer"),
    ("ops a string", lambda: ring_costs.collective_rows("all-gather"), checks.InputTypeError,
     "list of collectives"),
    ("ops of dicts", lambda: ring_costs.bytes_by_direction([{"kind": "all-gather"}], 4),
     checks.InputTypeError, "list of collectives"),
    ("words empty", lambda: ring_costs.amounts_in_words({}), checks.InputTypeError,
     "non-empty dict"),
    ("words negative", lambda: ring_costs.amounts_in_words({"a": -1}), checks.InputError,
     "at least 0"),
    ("words key a number", lambda: ring_costs.amounts_in_words({1: 2}), checks.InputTypeError,
     "names in named"),
    ("words unit a number", lambda: ring_costs.amounts_in_words({"a": 1}, unit=5),
     checks.InputTypeError, "unit"),
    ("draw_ring unknown option", lambda: ring_costs.draw_ring("allgather", 4, colour="red"),
     checks.InputTypeError, "no option 'colour'"),
    ("draw_ring arrows", lambda: ring_costs.draw_ring("allgather", 4, arrows=[]),
     checks.InputTypeError, "no option 'arrows'"),
    ("compile without a mesh", lambda: ring_costs.compile_variant(
        "allgather", np.ones((8, 8)), np.ones((8, 8)), None, "x"), checks.InputTypeError,
     "Mesh"),
    ("compile on a missing axis", lambda: ring_costs.compile_variant(
        "allgather", np.ones((8, 8)), np.ones((8, 8)), mesh_of(4), "y"), checks.InputError,
     "not an axis"),
    ("compile uneven rows", lambda: ring_costs.compile_variant(
        "allgather", np.ones((6, 8)), np.ones((8, 8)), mesh_of(4), "x"), checks.InputError,
     "divisible"),
    ("compile a string operand", lambda: ring_costs.compile_variant(
        "allgather", "lhs", np.ones((8, 8)), mesh_of(4), "x"), checks.InputTypeError, "array"),
    ("memory_row of text", lambda: ring_costs.memory_row("allgather"), checks.InputTypeError,
     "compile_variant"),
    ("summed_at_end of None", lambda: ring_costs.summed_at_end(None), checks.InputTypeError,
     "compile_variant"),
    # Shapes the variant cannot split: the bound of a matmul that cannot run is refused.
    ("bound: k over the ring", lambda: ring_costs.ring_bound_bytes("allgather", 8, 10, 8, 4, 4),
     checks.InputError, r"k \(rows of rhs\) is 10, .* 4 equal parts"),
    ("bound: m over the ring", lambda: ring_costs.ring_bound_bytes(
        "reduce_scatter", 10, 8, 8, 4, 4), checks.InputError, r"m \(rows of lhs\) is 10"),
    ("bound: bidi blocks", lambda: ring_costs.ring_bound_bytes(
        "allgather_bidi", 8, 12, 8, 4, 4), checks.InputError, "8 equal parts"),
    ("bound: itemsize 3", lambda: ring_costs.ring_bound_bytes("allgather", 8, 8, 8, 3, 4),
     checks.InputError, "itemsize"),
    ("bound: ring huge", lambda: ring_costs.ring_bound_bytes("allgather", 8, 8, 8, 4, 10**6),
     checks.InputError, "ring must be at most"),
    ("bound: itemsize bool", lambda: ring_costs.ring_bound_bytes("allgather", 8, 8, 8, True, 4),
     checks.InputTypeError, "itemsize"),
    ("schedule: ring too long to draw", lambda: ring_costs.ring_schedule("allgather", 10**6),
     checks.InputError, "ring must be at most"),
    ("schedule: name a list", lambda: ring_costs.ring_schedule(["allgather"], 4),
     checks.InputError, "unknown collective matmul"),
    ("draw_ring ring 0", lambda: ring_costs.draw_ring("allgather", 0), checks.InputError,
     "ring"),
    ("words bool", lambda: ring_costs.amounts_in_words({"a": True}), checks.InputTypeError,
     "named"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


@pytest.mark.parametrize("family", ["allgather", "reduce_scatter"])
def test_rings_never_make_the_whole_operand(family):
    """The plain variant makes the gathered rhs (or the whole partial output); no ring
    makes an array bigger than one block of it, on shapes unlike the chapter's."""
    m, k, n = 16, 32, 24
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal((m, k), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    whole = (k if family == "allgather" else m) * n * 4
    rows = {name: ring_costs.memory_row(ring_costs.compile_variant(
        name, lhs, rhs, mesh_of(4), "x")) for name in
        (family, f"{family}_overlapped", f"{family}_bidi")}
    assert rows[family]["largest bytes"] == whole
    for name in (f"{family}_overlapped", f"{family}_bidi"):
        assert rows[name]["largest bytes"] <= whole // 4, rows[name]
        assert rows[name]["temporaries"] > 0


def test_cpu_schedule_runs_every_reduce_scatter_matmul_before_any_transfer():
    """What the chapter says of XLA:CPU: the reduce-scatter rings' partial products do not
    wait for a transfer, so the schedule runs them all first and the temporaries hold the
    whole partial output, as the plain variant's do; the all-gather rings must wait."""
    m, k, n = 16, 32, 24
    rng = np.random.default_rng(1)
    lhs = rng.standard_normal((m, k), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    for name, total in [("reduce_scatter_overlapped", 4), ("reduce_scatter_bidi", 8),
                        ("allgather_overlapped", 4), ("allgather", 1)]:
        compiled = ring_costs.compile_variant(name, lhs, rhs, mesh_of(4), "x")
        before, counted = ring_costs.matmuls_before_first_transfer(compiled)
        assert counted == total, name
        # XLA:CPU issues every transfer synchronously: nothing to overlap (the chapter says so).
        assert "collective-permute-start" not in compiled.program.as_text()
        if name.startswith("reduce"):
            assert before == total, name
            assert ring_costs.memory_row(compiled)["temporaries"] >= m * n * 4
        else:
            assert before <= 1, name


def test_memory_row_refuses_a_program_it_cannot_read():
    with pytest.raises(checks.InputTypeError, match="compile_variant"):
        ring_costs.memory_row("allgather")
    with pytest.raises(checks.InputTypeError, match="compile_variant"):
        ring_costs.matmuls_before_first_transfer(None)


def test_allgather_rings_hold_every_partial_product_until_the_last_addition():
    """What the chapter says of XLA:CPU: the running sum of the all-gather rings becomes one
    addition at the end, so every partial product (M/n, N) stays alive until then: n of them
    in the overlapped ring, 2n (one per half block) in the bidirectional one. With K = 2M the
    bidirectional ring's products are as large as the whole gathered rhs, and its
    temporaries exceed the plain gather's by the slices of lhs cut at the start."""
    from spmd_guide.core.hlo_text import entry_instructions

    m, k, n, ring = 16, 32, 24, 4
    rng = np.random.default_rng(2)
    lhs = rng.standard_normal((m, k), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    product = (m // ring) * n * 4
    compiled = {name: ring_costs.compile_variant(name, lhs, rhs, mesh_of(ring), "x")
                for name in ("allgather", "allgather_overlapped", "allgather_bidi")}
    assert ring_costs.summed_at_end(compiled["allgather"]) == (0, 0)
    assert ring_costs.summed_at_end(compiled["allgather_overlapped"]) == (ring, ring * product)
    count, held = ring_costs.summed_at_end(compiled["allgather_bidi"])
    assert (count, held) == (2 * ring, 2 * ring * product) and held == k * n * 4
    temps = {name: ring_costs.memory_row(c)["temporaries"] for name, c in compiled.items()}
    assert temps["allgather"] == k * n * 4 < temps["allgather_bidi"]
    # The rest: the (m/ring, k/(2 ring)) slices of lhs, all cut before the first transfer.
    program = entry_instructions(compiled["allgather_bidi"].program)
    first = next(i for i, ins in enumerate(program) if ins.is_collective)
    slices = [ins for ins in program[:first] if ins.opcode == "fusion"
              and ins.shape_text == f"f32[{m // ring},{k // (2 * ring)}]"]
    assert len(slices) == 2 * ring
    assert 0 < temps["allgather_bidi"] - held <= sum(s.result[0].nbytes for s in slices)
    assert ring_costs.matmuls_before_first_transfer(compiled["allgather_bidi"])[0] == 0


def test_amounts_in_words_says_equal_amounts_once():
    assert ring_costs.amounts_in_words({"a": 393216, "b": 393216, "c": 393216}) == (
        "all three need 393,216 bytes")
    assert ring_costs.amounts_in_words({"a": 1, "b": 1}) == "both need 1 bytes"
    assert ring_costs.amounts_in_words({"a": 5, "b": 6, "c": 7}) == (
        "`a` needs 5 bytes, `b` 6 and `c` 7")
    assert ring_costs.amounts_in_words({"a": 5}) == "`a` needs 5 bytes"
    assert ring_costs.amounts_in_words({f"v{i}": 2 for i in range(5)}) == "all 5 need 2 bytes"
    with pytest.raises(checks.InputTypeError):
        ring_costs.amounts_in_words({})
    with pytest.raises(checks.InputError):
        ring_costs.amounts_in_words({"a": -1})


def test_bytes_by_direction_refuses_a_ring_the_program_does_not_run_on():
    """A program whose all-gather runs over 2 devices, asked about a ring of 3: before, every
    byte was counted as 'other' for the ring of 3."""
    x = np.ones((8, 8), np.float32)
    ops = hlo.collectives(ring_costs.compile_variant("allgather", x, x, mesh_of(2), "x").program)
    assert ring_costs.bytes_by_direction(ops, 2)["other"] > 0
    with pytest.raises(checks.InputError, match=r"ring=3, .* groups of \[2\] devices"):
        ring_costs.bytes_by_direction(ops, 3)


BAD_INTS = {"str": "4", "float": 2.5, "None": None, "zero": 0, "negative": -3,
            "nan": float("nan"), "bool": True}
BOUND = dict(name="allgather", m=8, k=8, n=8, itemsize=4, ring=4)


@pytest.mark.parametrize("arg", ["m", "k", "n", "itemsize", "ring"])
@pytest.mark.parametrize("tag", list(BAD_INTS))
def test_every_bad_size_of_the_bound_is_named(arg, tag):
    ring_costs.ring_bound_bytes(**BOUND)
    with pytest.raises(checks.InputError, match=rf"\b{arg}\b"):
        ring_costs.ring_bound_bytes(**BOUND | {arg: BAD_INTS[tag]})


@pytest.mark.parametrize("fn", [ring_costs.ring_schedule, ring_costs.draw_ring],
                         ids=["schedule", "draw"])
@pytest.mark.parametrize("tag", list(BAD_INTS))
def test_every_bad_ring_is_named(fn, tag):
    with pytest.raises(checks.InputError, match="ring"):
        fn("allgather", BAD_INTS[tag])
    with pytest.raises(checks.InputError, match="ring"):
        ring_costs.bytes_by_direction([], BAD_INTS[tag])


def test_dot_shapes_refuses_what_compile_variant_did_not_make():
    from spmd_guide.core.checks import InputTypeError

    with pytest.raises(InputTypeError, match="compile_variant"):
        ring_costs.dot_shapes("allgather")
