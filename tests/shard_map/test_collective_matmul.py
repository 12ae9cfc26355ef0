"""Tests for spmd_guide.shard_map.collective_matmul: the six ring matmuls, their programs, their errors.

Correctness uses small integer operands (values in -2..2): every product and partial sum is
then an integer far below 2**8, exact in bfloat16 and float32 alike, so any summation order
gives the exact answer and the check is equality. Random normal operands check the stated
tolerance: |C - A@B| <= K * eps * (|A| @ |B|) elementwise, the textbook bound for a sum of K
products in a format with machine epsilon eps (float32 2**-23, bfloat16 2**-7).

Compiling the unrolled rings dominates the run time, so each (variant, ring, shape, dtype)
is compiled once (``compiled``) and shared by the correctness and the compiler-fact tests.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import hlo
from spmd_guide.shard_map import collective_matmul, ring_costs

NAMES = list(collective_matmul.VARIANTS)
RINGS = ["allgather_overlapped", "allgather_bidi", "allgather_bidi_fused", "reduce_scatter_overlapped",
         "reduce_scatter_bidi"]


def integer_operands(m: int, k: int, n: int, dtype, seed: int = 0):
    """numpy operands (no JAX operation, so nothing to compile) and their exact product."""
    rng = np.random.default_rng(seed)
    lhs = rng.integers(-2, 3, size=(m, k)).astype(np.float32)
    rhs = rng.integers(-2, 3, size=(k, n)).astype(np.float32)
    return lhs.astype(dtype), rhs.astype(dtype), lhs @ rhs


def shape_for(ring: int, *, square: bool) -> tuple[int, int, int]:
    """A shape every variant can split on ``ring`` devices (M and K multiples of 2 * ring)."""
    return (4 * ring, 4 * ring, 4 * ring) if square else (6 * ring, 4 * ring, 5)


@functools.cache
def compiled(name: str, ring: int, shape: tuple[int, int, int], dtype: str = "float32"):
    """Variant ``name`` compiled on the first ``ring`` devices, with its integer operands."""
    lhs, rhs, expected = integer_operands(*shape, jnp.dtype(dtype))
    program = ring_costs.compile_variant(name, lhs, rhs, mesh_of(ring), "x")
    return program, expected


def test_registry_has_the_six_variants_and_the_fused_bidirectional_one():
    assert list(collective_matmul.VARIANTS) == ["allgather", "allgather_overlapped", "allgather_bidi",
                                 "reduce_scatter", "reduce_scatter_overlapped",
                                 "reduce_scatter_bidi", "allgather_bidi_fused"]
    assert all(callable(f) for f in collective_matmul.VARIANTS.values())


# ----------------------------------------------------------------------------- correctness

# Every variant runs on 2, 4 and 8 devices; between them the cases cover square and
# non-square shapes, float32 and bfloat16, placed and misplaced inputs, jit and Explicit axes.
# (Each case is one compilation: the whole grid would cost more than it teaches.)


@pytest.mark.parametrize("name", NAMES)
def test_2_devices_square_bfloat16_under_jit_on_explicit_mesh_with_misplaced_inputs(name):
    mesh = mesh_of(2, explicit=True)
    lhs, rhs, expected = integer_operands(*shape_for(2, square=True), jnp.bfloat16)
    # Laid out the wrong way for the variant (and committed): the variant must re-place them.
    lhs = jax.device_put(lhs, NamedSharding(mesh, P(None, None)))
    rhs = jax.device_put(rhs, NamedSharding(mesh, P(None, "x")))
    out = jax.jit(lambda a, b: collective_matmul.VARIANTS[name](a, b, mesh, "x"))(lhs, rhs)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), expected)
    assert out.sharding.spec == P("x", None)


@pytest.mark.parametrize("name", NAMES)
def test_4_devices_non_square_bfloat16_exact_and_within_tolerance(name):
    shape = shape_for(4, square=False)
    program, expected = compiled(name, 4, shape, "bfloat16")
    out = program()
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), expected)

    # Random normal operands, same compiled program: the stated bfloat16 tolerance.
    rng = np.random.default_rng(1)
    lhs = rng.standard_normal(shape[:2]).astype(jnp.bfloat16)
    rhs = rng.standard_normal(shape[1:]).astype(jnp.bfloat16)
    out = program.program(jax.device_put(lhs, program.lhs.sharding),
                          jax.device_put(rhs, program.rhs.sharding))
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    bound = shape[1] * 2.0**-7 * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(np.asarray(out, np.float64) - a @ b) <= bound)


@pytest.mark.parametrize("name", NAMES)
def test_8_devices_non_square_float32_exact_and_within_tolerance(name):
    shape = shape_for(8, square=False)
    program, expected = compiled(name, 8, shape)
    out = program()
    assert out.shape == expected.shape and out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh_of(8), P("x", None)), 2)

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(shape[:2]), rng.standard_normal(shape[1:])
    out = program.program(jax.device_put(a.astype(np.float32), program.lhs.sharding),
                          jax.device_put(b.astype(np.float32), program.rhs.sharding))
    bound = shape[1] * 2.0**-23 * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(np.asarray(out, np.float64) - a @ b) <= bound)


# Slow sweep only: the quick suite makes the same claim on more cases in
# test_random_shapes_and_meshes_give_the_product_or_the_packages_error (any shape on six meshes,
# the 2-device ring among them: the exact product wherever the split is even).
@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), m=st.integers(1, 3), k=st.integers(1, 3),
       n=st.integers(1, 9))
def test_any_evenly_split_shape_is_exact(name, m, k, n):
    lhs, rhs, expected = integer_operands(4 * m, 4 * k, n, jnp.float32, seed=m)
    out = collective_matmul.VARIANTS[name](lhs, rhs, mesh_of(2), "x")
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_raw_shard_map_rejects_misplaced_input_on_explicit_mesh():
    """Why the variants place their inputs: shard_map alone refuses them on Explicit axes."""
    mesh = mesh_of(2, explicit=True)
    kernel = functools.partial(collective_matmul.allgather_per_device, axis_name="x", ring=2)
    mapped = jax.shard_map(kernel, mesh=mesh, in_specs=collective_matmul.allgather_specs("x"),
                           out_specs=P("x", None))
    lhs, rhs, _ = integer_operands(4, 4, 2, jnp.float32)
    with pytest.raises(ValueError, match="does not match"):
        mapped(lhs, rhs)


@pytest.mark.parametrize(("name", "explicit", "jit"), [
    ("allgather_overlapped", True, False),
    ("reduce_scatter_overlapped", False, True),
])
def test_one_axis_of_a_two_axis_mesh(name, explicit, jit):
    mesh = mesh_of(8, ("a", "b"), (4, 2), explicit=explicit)
    lhs, rhs, expected = integer_operands(16, 16, 3, jnp.float32)
    matmul = functools.partial(collective_matmul.VARIANTS[name], mesh=mesh, axis_name="a")
    out = (jax.jit(matmul) if jit else matmul)(lhs, rhs)
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("a", None)), 2)


def test_one_device_ring():
    lhs, rhs, expected = integer_operands(4, 6, 3, jnp.float32)
    for name in NAMES:
        out = collective_matmul.VARIANTS[name](lhs, rhs, mesh_of(1), "x")
        np.testing.assert_array_equal(np.asarray(out), expected)


# ----------------------------------------------------------------------- compiler facts

# Ring of 8 devices, float32, lhs (48, 32) @ rhs (32, 5); bytes derived by hand:
#   all-gather family moves rhs: each device lacks 7 of 8 blocks of 4 x 5 floats = 80 B each,
#   so 7 * 80 = 560 B. Overlapped: 7 permutes of (4, 5) = 80 B. Bidi: 14 permutes of the
#   half blocks (2, 5) = 40 B. A plain all-gather of the (32, 5) buffer: 7/8 * 640 = 560 B.
#   reduce-scatter family moves output rows: 7 of 8 row blocks of 6 x 5 floats = 120 B each,
#   so 840 B: 7 permutes of (6, 5), 14 of (3, 5), or 7/8 of the (48, 5) buffer of 960 B.
EXPECTED = {
    "allgather": ({"all-gather": 1}, 560),
    "allgather_overlapped": ({"collective-permute": 7}, 560),
    "allgather_bidi": ({"collective-permute": 14}, 560),
    "reduce_scatter": ({"reduce-scatter": 1}, 840),
    "reduce_scatter_overlapped": ({"collective-permute": 7}, 840),
    "reduce_scatter_bidi": ({"collective-permute": 14}, 840),
    "allgather_bidi_fused": ({"collective-permute": 14}, 560),
}


@pytest.mark.parametrize("name", NAMES)
def test_collectives_and_ring_bound_bytes_on_8_devices(name):
    program, _ = compiled(name, 8, shape_for(8, square=False))
    counts, sent = EXPECTED[name]
    assert hlo.collective_counts(program.program) == {**dict.fromkeys(hlo.KINDS, 0), **counts}
    assert hlo.communication_bytes(program.program) == sent
    assert ring_costs.ring_bound_bytes(name, 48, 32, 5, 4, 8) == sent


@pytest.mark.parametrize("name", RINGS)
def test_rings_use_only_collective_permutes(name):
    program, _ = compiled(name, 8, shape_for(8, square=False))
    counts = hlo.collective_counts(program.program)
    assert counts["all-gather"] == counts["reduce-scatter"] == counts["all-reduce"] == 0
    assert counts["all-to-all"] == 0
    assert counts["collective-permute"] == (14 if ring_costs.is_bidi(name) else 7)


@pytest.mark.parametrize("name", NAMES)
def test_bytes_are_the_ring_bound_on_4_devices_in_bfloat16(name):
    """bfloat16 operands; the CPU backend has no bfloat16 arithmetic, so XLA widens them to
    float32 *before* the collectives, which then move 4 bytes per element, not 2."""
    m, k, n = shape_for(4, square=False)
    program, _ = compiled(name, 4, (m, k, n), "bfloat16")
    ops = hlo.collectives(program.program)
    wire_dtype = "f32" if jax.default_backend() == "cpu" else "bf16"
    assert {op.dtype for op in ops} == {wire_dtype}
    itemsize = 4 if wire_dtype == "f32" else 2
    moved = k * n if name.startswith("allgather") else m * n  # rhs, or the output
    assert sum(op.bytes_sent for op in ops) == 3 * moved * itemsize // 4
    assert ring_costs.ring_bound_bytes(name, m, k, n, itemsize, 4) == 3 * moved * itemsize // 4


def test_bidirectional_rings_split_the_bytes_evenly_between_directions():
    for name, total in (("allgather_bidi", 560), ("reduce_scatter_bidi", 840)):
        ops = hlo.collectives(compiled(name, 8, shape_for(8, square=False))[0].program)
        assert ring_costs.bytes_by_direction(ops, 8) == {"forward": total // 2,
                                                 "backward": total // 2, "other": 0}
    ops = hlo.collectives(compiled("allgather_overlapped", 8, (48, 32, 5))[0].program)
    assert ring_costs.bytes_by_direction(ops, 8) == {"forward": 560, "backward": 0, "other": 0}
    ops = hlo.collectives(compiled("reduce_scatter_overlapped", 8, (48, 32, 5))[0].program)
    assert ring_costs.bytes_by_direction(ops, 8) == {"forward": 0, "backward": 840, "other": 0}
    ops = hlo.collectives(compiled("allgather", 8, (48, 32, 5))[0].program)
    assert ring_costs.bytes_by_direction(ops, 8) == {"forward": 0, "backward": 0, "other": 560}


def test_collective_rows_group_the_ops():
    ops = hlo.collectives(compiled("allgather_bidi", 8, (48, 32, 5))[0].program)
    rows = ring_costs.collective_rows(ops)
    assert rows == [{"collective": "collective-permute", "buffer": "f32[2,5]", "group": 8,
                     "count": 14, "sent per op": "40 B", "bytes sent": 560}]


# ----------------------------------------------------------------------- bad input


UNEVEN = {  # (lhs shape, rhs shape) on 4 devices, and the divisor the message must name
    "allgather": ((10, 8), (8, 3), "rows M = 10", 4),
    "allgather_overlapped": ((8, 6), (6, 3), "contraction K = 6", 4),
    "allgather_bidi": ((8, 12), (12, 3), "contraction K = 12", 8),
    "allgather_bidi_fused": ((8, 20), (20, 3), "contraction K = 20", 8),
    "reduce_scatter": ((6, 8), (8, 3), "rows M = 6", 4),
    "reduce_scatter_overlapped": ((8, 10), (10, 3), "contraction K = 10", 4),
    "reduce_scatter_bidi": ((12, 8), (8, 3), "rows M = 12", 8),
}


@pytest.mark.parametrize("name", NAMES)
def test_uneven_shapes_raise_before_any_computation(name, monkeypatch):
    lhs_shape, rhs_shape, what, divisor = UNEVEN[name]

    def no_computation(*args, **kwargs):
        raise AssertionError("computation started before the shapes were checked")

    monkeypatch.setattr(collective_matmul, "run_on_ring", no_computation)
    monkeypatch.setattr(collective_matmul.jax, "device_put", no_computation)
    with pytest.raises(ValueError) as error:
        collective_matmul.VARIANTS[name](np.ones(lhs_shape, np.float32), np.ones(rhs_shape, np.float32),
                          mesh_of(4), "x")
    message = str(error.value)
    assert str(lhs_shape) in message and what in message
    assert f"not divisible by {divisor}" in message


def test_other_bad_input_gets_clear_errors():
    mesh = mesh_of(2)
    ok = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"'y' is not an axis of the mesh, whose axes are \('x',\)"):
        collective_matmul.allgather(ok, ok, mesh, "y")
    with pytest.raises(ValueError, match="2-D operands"):
        collective_matmul.reduce_scatter(np.ones((2, 4, 4)), ok, mesh, "x")
    with pytest.raises(ValueError, match="4 columns but rhs has 6 rows"):
        collective_matmul.allgather_bidi(ok, np.ones((6, 4)), mesh, "x")
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        collective_matmul.allgather(ok, ok, "x", "x")
    with pytest.raises(ValueError, match="unknown collective matmul name 'gather'"):
        collective_matmul.variant("gather")


# ----------------------------------------------------------------------- ring diagrams


@pytest.mark.parametrize("ring", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("name", RINGS)
def test_ring_schedule_covers_every_block_once_and_moves_one_hop(name, ring):
    steps = ring_costs.ring_schedule(name, ring)
    assert len(steps) == ring
    slots = len(steps[0].blocks[0])
    assert slots == (2 if ring_costs.is_bidi(name) else 1)
    directions = ([+1, -1] if name.startswith("allgather") else [-1, +1])[:slots]
    for d in range(ring):
        for slot in range(slots):
            seen = [step.blocks[d][slot] for step in steps]
            assert sorted(seen) == list(range(ring))  # every block once per device
    for now, after in zip(steps, steps[1:], strict=False):  # consecutive pairs
        for d in range(ring):
            for slot, direction in enumerate(directions):
                # what device d held travels to its neighbour in this slot's direction
                assert after.blocks[(d + direction) % ring][slot] == now.blocks[d][slot]
    if name.startswith("allgather"):
        assert all(set(b) == {d} for d, b in enumerate(steps[0].blocks))
    else:
        assert all(set(b) == {d} for d, b in enumerate(steps[-1].blocks))


@pytest.mark.parametrize("name", RINGS)
def test_ring_schedule_sends_are_the_compiled_source_target_pairs(name):
    ops = hlo.collectives(compiled(name, 8, (48, 32, 5))[0].program)
    compiled_pairs = sorted(pair for op in ops for pair in op.groups)
    drawn_pairs = sorted(pair for step in ring_costs.ring_schedule(name, 8) for pair in step.sends)
    assert drawn_pairs == compiled_pairs


def test_draw_ring_draws_one_cell_per_block_and_one_arrow_per_send():
    fig = ring_costs.draw_ring("allgather_bidi", 4)
    patches = fig.axes[0].patches
    assert sum(p.get_gid() == "cell" for p in patches) == 4 * 4 * 2
    assert sum(p.get_gid() == "arrow" for p in patches) == 3 * 8
    fig = ring_costs.draw_ring("allgather", 4)
    assert sum(p.get_gid() == "cell" for p in fig.axes[0].patches) == 4 + 16


# ----------------------------------------------------------------------- the chapter


@pytest.mark.parametrize("ring", [4, 8])
def test_chapter_pitfall_wrongly_bound_ring_multiplies_by_ring_size(ring):
    """Exercise 3: the overlapped ring kernel bound to a replicated rhs spec (``P()``) sees the
    whole rhs as "its block", multiplies it once per step, and returns ring x the product: 4x
    on the page's 4-device ring ``four`` (the answer says 4), 8x on a ring of 8."""
    mesh = mesh_of(ring)
    lhs, rhs, expected = integer_operands(8, 8, 4, jnp.float32)
    kernel = functools.partial(collective_matmul.allgather_overlapped_per_device, axis_name="x",
                               ring=ring)
    wrong = jax.jit(jax.shard_map(kernel, mesh=mesh, in_specs=(P("x", None), P()),
                                  out_specs=P("x", None)))
    out = np.asarray(wrong(lhs, rhs))
    assert out.shape == expected.shape and not np.allclose(out, expected)
    np.testing.assert_array_equal(out, ring * expected)


def test_chapter_exercise_bytes_for_a_large_layer():
    """Exercise 1: float32 (1024, 4096) @ (4096, 1024) on 8 devices, from compiled programs.

    The ring variants move the same bytes as these one-collective ones: pinned above for
    small shapes with the same formula (``ring_bound_bytes``)."""
    mesh = mesh_of(8)
    for name, expected in (("allgather", 14_680_064), ("reduce_scatter", 3_670_016)):
        lhs_spec, rhs_spec = collective_matmul.FAMILY_SPECS[name]("x")
        lhs = jax.ShapeDtypeStruct((1024, 4096), jnp.float32,
                                   sharding=NamedSharding(mesh, lhs_spec))
        rhs = jax.ShapeDtypeStruct((4096, 1024), jnp.float32,
                                   sharding=NamedSharding(mesh, rhs_spec))
        program = jax.jit(functools.partial(collective_matmul.VARIANTS[name], mesh=mesh, axis_name="x"))
        assert hlo.communication_bytes(program, lhs, rhs) == expected
        for variant in (name, f"{name}_overlapped", f"{name}_bidi"):
            assert ring_costs.ring_bound_bytes(variant, 1024, 4096, 1024, 4, 8) == expected


def test_chapter_exercise_uneven_shape():
    """Exercise 2: K = 24 on 8 devices suits allgather_overlapped but not allgather_bidi."""
    lhs, rhs = np.ones((16, 24), np.float32), np.ones((24, 4), np.float32)
    collective_matmul.check_shapes(lhs, rhs, rows_by=8, contraction_by=8)
    with pytest.raises(ValueError, match="contraction K = 24 is not divisible by 16"):
        collective_matmul.allgather_bidi(lhs, rhs, mesh_of(8), "x")


def test_cpu_widens_even_a_bare_bfloat16_all_gather():
    """collective_matmuls.md's note: XLA:CPU's float normalization, not arithmetic."""
    mesh = mesh_of(8)
    gather = jax.jit(jax.shard_map(lambda b: jax.lax.all_gather(b, "x", tiled=True), mesh=mesh,
                                   in_specs=P("x"), out_specs=P(), check_vma=False))
    x = jax.device_put(jnp.ones((16, 4), jnp.bfloat16), NamedSharding(mesh, P("x")))
    (op,) = hlo.collectives(gather, x)
    assert op.dtype == "f32" and gather(x).dtype == jnp.bfloat16


def test_the_notebooks_bidirectional_case_agrees_at_its_tolerance():
    """coming_from_notebooks.md: its 8 x 8 @ 8 x 4 on 4 devices matches at 1e-3; bfloat16
    inputs against float32 do not."""
    ring = mesh_of(4, ("i",))
    lhs = jax.random.normal(jax.random.key(0), (8, 8))
    rhs = jax.random.normal(jax.random.key(1), (8, 4))
    out = collective_matmul.VARIANTS["allgather_bidi"](lhs, rhs, ring, "i")
    assert jnp.allclose(out, lhs @ rhs, atol=1e-3, rtol=1e-3)
    low = jnp.matmul(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16),
                     preferred_element_type=jnp.float32)
    assert not jnp.allclose(low, lhs @ rhs, atol=1e-3, rtol=1e-3)

# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402


def _op(kind: str, pairs, nbytes: int = 16, *, group_size: int = 2) -> hlo.Collective:
    """A stand-in collective: ``pairs`` are a collective-permute's (source, target); its group
    size is the largest ring they form, as ``hlo.collectives`` reports it."""
    group_size = hlo._largest_cycle(pairs) if pairs else group_size
    return hlo.Collective(kind=kind, buffers=(hlo.Buffer("f32", (nbytes // 4,)),),
                          group_size=group_size, bytes_sent=nbytes,
                          groups=tuple(tuple(p) for p in pairs))


def _ring(n: int, step: int = 1):
    return [(i, (i + step) % n) for i in range(n)]


_OK = np.ones((8, 8), np.float32)
BAD_INPUT = [
    ("string lhs", lambda: collective_matmul.allgather("lhs", _OK, mesh_of(2), "x"), InputTypeError, "array"),
    ("None rhs", lambda: collective_matmul.reduce_scatter(_OK, None, mesh_of(2), "x"), InputTypeError, "rhs"),
    ("object lhs", lambda: collective_matmul.allgather(np.full((8, 8), None), _OK, mesh_of(2), "x"),
     InputTypeError, "numbers"),
    ("1-D lhs", lambda: collective_matmul.allgather(np.ones(8), _OK, mesh_of(2), "x"), InputError, "2-D"),
    ("K mismatch", lambda: collective_matmul.allgather(_OK, np.ones((4, 8)), mesh_of(2), "x"), InputError,
     "columns"),
    ("M indivisible", lambda: collective_matmul.reduce_scatter_bidi(np.ones((6, 8)), _OK, mesh_of(2), "x"),
     InputError, "divisible"),
    ("unknown axis", lambda: collective_matmul.allgather(_OK, _OK, mesh_of(2), "y"), InputError, "not an axis"),
    ("axis not str", lambda: collective_matmul.allgather(_OK, _OK, mesh_of(2), 0), InputTypeError, "axis"),
    ("mesh a tuple", lambda: collective_matmul.allgather(_OK, _OK, (2,), "x"), InputTypeError, "Mesh"),
    ("unknown variant", lambda: collective_matmul.variant("allgater"), InputError, "choose one of"),
    ("rows_by 0", lambda: collective_matmul.check_shapes(_OK, _OK, rows_by=0, contraction_by=1), InputError,
     "rows_by"),
    ("rows_by -8", lambda: collective_matmul.check_shapes(_OK, _OK, rows_by=-8, contraction_by=1), InputError,
     "rows_by"),
    ("ring bytes m<0", lambda: ring_costs.ring_bound_bytes("allgather", -8, 8, 8, 4, 8), InputError,
     "m must be"),
    ("ring bytes ring 0", lambda: ring_costs.ring_bound_bytes("reduce_scatter", 8, 8, 8, 4, 0),
     InputError, "ring"),
    ("ring bytes float", lambda: ring_costs.ring_bound_bytes("allgather", 8, 8.5, 8, 4, 2),
     InputTypeError, "integer"),
    ("schedule ring 0", lambda: ring_costs.ring_schedule("allgather_bidi", 0), InputError, "ring"),
    ("8-ring sends, ring=4", lambda: ring_costs.bytes_by_direction([_op("collective-permute", _ring(8))],
                                                           4), InputError, "ring=8"),
    ("4-ring back, ring=8", lambda: ring_costs.bytes_by_direction(
        [_op("collective-permute", _ring(4, -1))], 8), InputError, "ring=4"),
    ("ops not collectives", lambda: ring_costs.bytes_by_direction(["all-gather"], 2), InputTypeError,
     "hlo.collectives"),
    ("rows of a string", lambda: ring_costs.collective_rows("ops"), InputTypeError, "collectives"),
    ("compile bidi odd K", lambda: ring_costs.compile_variant("allgather_bidi", np.ones((4, 6)),
                                                      np.ones((6, 4)), mesh_of(2), "x"),
     InputError, "divisible by 4"),
    ("specs axis None", lambda: collective_matmul.allgather_specs(None), InputTypeError, "axis_name"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_python_lists_multiply_like_arrays():
    lhs = np.arange(32, dtype=np.float32).reshape(4, 8)
    rhs = np.arange(16, dtype=np.float32).reshape(8, 2)
    for name in ("allgather", "reduce_scatter_bidi"):
        out = collective_matmul.VARIANTS[name](lhs.tolist(), rhs.tolist(), mesh_of(2), "x")
        np.testing.assert_allclose(np.asarray(out), lhs @ rhs)


def test_bytes_by_direction_counts_the_right_ring_and_a_2d_mesh_ring():
    forward, backward = _op("collective-permute", _ring(8)), _op("collective-permute",
                                                                 _ring(8, -1), 8)
    assert ring_costs.bytes_by_direction([forward, backward], 8) == {
        "forward": 16, "backward": 8, "other": 0}
    # a ring of 4 along the second axis of a (2, 4) mesh: two rings, ids 0-3 and 4-7
    two_rings = [(i, 4 * (i // 4) + (i + 1) % 4) for i in range(8)]
    assert ring_costs.bytes_by_direction([_op("collective-permute", two_rings)], 4)["forward"] == 16
    assert ring_costs.bytes_by_direction([_op("all-gather", (), group_size=4)], 4) == {
        "forward": 0, "backward": 0, "other": 16}


# --------------------------------------------------------------------------- property: any shape

_SUBMESHES = st.sampled_from([(1,), (2,), (4,), (8,), (2, 4), (4, 2)])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), mesh_shape=_SUBMESHES, m=st.integers(1, 16),
       k=st.integers(1, 16), n=st.integers(1, 5), axis=st.integers(0, 1))
def test_random_shapes_and_meshes_give_the_product_or_the_packages_error(
        name, mesh_shape, m, k, n, axis):
    names = ("x", "y")[:len(mesh_shape)]
    mesh = mesh_of(int(np.prod(mesh_shape)), names, mesh_shape)
    axis_name = names[min(axis, len(names) - 1)]
    lhs, rhs, expected = integer_operands(m, k, n, jnp.float32, seed=m + k)
    try:
        out = collective_matmul.VARIANTS[name](lhs, rhs, mesh, axis_name)
    except (InputError, InputTypeError):
        ring = mesh.shape[axis_name]
        bidi = 2 if ring_costs.is_bidi(name) else 1
        rows = ring * (bidi if name.startswith("reduce") else 1)
        cols = ring * (bidi if name.startswith("allgather") else 1)
        assert m % rows or k % cols  # refused only when the split is uneven
        return
    np.testing.assert_array_equal(np.asarray(out), expected)



# The quick suite runs the 4-device ring; the 2- and 8-device rings (each two unrolled ring
# programs to compile) are in the slow sweep.
@pytest.mark.parametrize("ring", [pytest.param(2, marks=pytest.mark.slow), 4,
                                  pytest.param(8, marks=pytest.mark.slow)])
def test_fused_bidi_runs_one_full_size_dot_per_step(ring):
    """Lesson 9: allgather_bidi runs two half-size dots per step, allgather_bidi_fused one
    full-size dot, on the same bytes sent; both equal lhs @ rhs."""
    shape = (4 * ring, 8 * ring, 6)
    half, fused = (compiled(name, ring, shape) for name in ("allgather_bidi", "allgather_bidi_fused"))
    for program, expected in (half, fused):
        np.testing.assert_array_equal(np.asarray(program()), expected)
    m, k, n = shape[0] // ring, shape[1] // ring, shape[2]
    assert ring_costs.dot_shapes(half[0]) == [f"({m}, {k // 2}) @ ({k // 2}, {n})"] * 2 * ring
    assert ring_costs.dot_shapes(fused[0]) == [f"({m}, {k}) @ ({k}, {n})"] * ring
    sent = [sum(op.bytes_sent for op in hlo.collectives(p[0].program)) for p in (half, fused)]
    assert sent[0] == sent[1] > 0
    # The same matmul FLOPs, 2 (M/n) K N per device; the fused form adds its partial
    # products once a step where the half-size form adds twice, so its total is lower.
    flops = [p[0].program.cost_analysis()["flops"] for p in (half, fused)]
    dots = 2 * shape[0] // ring * shape[1] * shape[2]
    assert dots <= flops[1] < flops[0] < 1.5 * dots


@pytest.mark.slow
@pytest.mark.parametrize("flag, known", [
    ("--xla_gpu_disable_async_collectives=COLLECTIVEPERMUTE", True),
    ("--xla_gpu_threshold_for_windowed_einsum_mib=0", True),
    ("--xla_gpu_enable_async_collective_permute=true", False),
    ("--xla_gpu_enable_async_collectives=true", False),
])
def test_the_gpu_flags_the_page_names_are_this_jaxlib_s(flag, known):
    """Review T5-W1: the page names the flags this jaxlib's XLA knows, and says the old
    enable flags stop JAX at start-up ("Unknown flag in XLA_FLAGS"), on any backend."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "import jax; jax.numpy.ones(2).sum()"],
                         env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flag},
                         capture_output=True, text=True, timeout=120)
    assert (run.returncode == 0) is known, run.stderr[-400:]
    if not known:
        assert "Unknown flag in XLA_FLAGS" in run.stderr
