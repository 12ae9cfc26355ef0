"""Every guarded argument of the Part III functions through its class battery (battery.py):
meshes (a missing axis, Explicit axes), axis names, operand arrays, ring sizes and counts,
variant names. Each answer is the package's InputError naming the argument, or (for a valid
form) the plain value's answer."""

from __future__ import annotations

import jax.numpy as jnp
from battery import (
    Array,
    Axis,
    Choice,
    Count,
    Flag,
    Index,
    MeshArg,
    Text,
    battery_tests,
    call,
)
from helpers import mesh_of

from spmd_guide.shard_map import collective_matmul, collectives, ring_costs, vma_rules


def _matmul(name):
    return call(collective_matmul.VARIANTS[name], lambda: dict(
        lhs=jnp.arange(64.0).reshape(8, 8), rhs=jnp.arange(32.0).reshape(8, 4),
        mesh=mesh_of(4), axis_name="x"), label=f"collective_matmul.{name}",
        lhs=Array(ndim=2, kind="fi"), rhs=Array(ndim=2, kind="fi"), mesh=MeshArg(), axis_name=Axis())


CALLS = [
    _matmul("allgather"), _matmul("reduce_scatter_bidi"),
    call(collective_matmul.check_shapes, lambda: dict(lhs=jnp.ones((8, 8)), rhs=jnp.ones((8, 4)),
                                                      rows_by=4, contraction_by=2),
         rows_by=Count(), contraction_by=Count()),
    call(collective_matmul.variant, dict(name="allgather"), name=Choice()),
    call(collectives.blocks, dict(x=jnp.arange(16.0), n_devices=4), n_devices=Count()),
    call(collectives.global_sum, lambda: dict(x=jnp.arange(16.0), mesh=mesh_of(4),
                                              axis_name="x"),
         x=Array(ndim=1, kind="fi"), mesh=MeshArg(), axis_name=Axis()),
    call(collectives.block_sums, lambda: dict(x=jnp.arange(16.0), mesh=mesh_of(4),
                                              axis_name="x"), mesh=MeshArg(), axis_name=Axis()),
    call(collectives.rows_to_columns, lambda: dict(x=jnp.arange(16.0).reshape(4, 4),
                                                   mesh=mesh_of(4), axis_name="x"),
         mesh=MeshArg(), axis_name=Axis()),
    call(collectives.example, dict(name="psum"), name=Choice(), same=lambda a, b: a is b),
    call(collectives.run_example, lambda: dict(name="psum", mesh=mesh_of(4), axis_name="x"),
         name=Choice(), mesh=MeshArg(), axis_name=Axis()),
    call(collectives.ring_scaling, dict(kernel=collectives.psum_kernel, block_elements=8,
                                        device_counts=[2, 4]), block_elements=Count()),
    call(ring_costs.ring_bound_bytes, dict(name="allgather", m=64, k=64, n=64, itemsize=4,
                                           ring=4),
         name=Choice(), m=Count(), k=Count(), n=Count(), itemsize=Count(), ring=Count()),
    call(ring_costs.ring_schedule, dict(name="allgather", ring=4), name=Choice(),
         ring=Count()),
    call(ring_costs.is_bidi, dict(name="allgather_bidi"), name=Choice()),
    call(vma_rules.all_to_all_block_shape, lambda: dict(block_shape=(8, 4), mesh=mesh_of(4),
                                                        axis_name="x", split_axis=0,
                                                        concat_axis=1, tiled=True),
         mesh=MeshArg(), axis_name=Axis(), split_axis=Index(2), concat_axis=Index(2),
         tiled=Flag()),
    call(vma_rules.psum_twice, lambda: dict(x=jnp.arange(8.0), mesh=mesh_of(4),
                                            axis_name="x", check_vma=True),
         mesh=MeshArg(), axis_name=Axis(), check_vma=Flag()),
    call(vma_rules.mix, lambda: dict(x=jnp.arange(8.0), mesh=mesh_of(4), axis_name="x",
                                     pcast=True),
         mesh=MeshArg(), axis_name=Axis(), pcast=Flag()),
    call(vma_rules.summed_jaxpr, lambda: dict(mesh=mesh_of(4), axis_name="x"),
         mesh=MeshArg(), axis_name=Axis()),
]


CALLS += [
    call(ring_costs.compile_variant, lambda: dict(
        name="allgather", lhs=jnp.ones((8, 8)), rhs=jnp.ones((8, 4)), mesh=mesh_of(4),
        axis_name="x"), name=Choice(), lhs=Array(ndim=2, kind="fi"), mesh=MeshArg(),
        axis_name=Axis(), same=lambda a, b: True),
    call(ring_costs.amounts_in_words, dict(named={"a": 1024, "b": 2048}, unit="bytes"),
         unit=Text(empty_ok=False)),
    call(ring_costs.draw_ring, dict(name="allgather_bidi", ring=4), name=Choice(),
         ring=Count(), same=lambda a, b: True),
    call(collectives.per_device_result, lambda: dict(
        kernel=collectives.psum_kernel, x=jnp.arange(16.0), mesh=mesh_of(4), axis_name="x"),
         x=Array(ndim=1, kind="fi"), mesh=MeshArg(), axis_name=Axis()),
    call(collectives.hlo_rows, lambda: dict(mesh=mesh_of(4), axis_name="x"), mesh=MeshArg(),
         axis_name=Axis(), same=lambda a, b: True),
]

QUICK = [c for c in CALLS if c.label in ("ring_costs.ring_bound_bytes",)]
test_every_guarded_argument, test_numbers_quick = battery_tests(CALLS, QUICK)
