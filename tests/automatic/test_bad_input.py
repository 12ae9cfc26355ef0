"""Every guarded argument of the Part II functions through its class battery (battery.py):
shapes and counts, meshes and axis names, dimension indices, limits, keys, directories. Each
answer is the package's InputError naming the argument (nothing on disk changed), or (for a
valid form) the plain value's answer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from battery import (
    Array,
    Axis,
    Choice,
    Count,
    Index,
    MeshArg,
    PathArg,
    Real,
    anything,
    battery_tests,
    call,
    fresh_root,
)
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.automatic import closures, hidden_collectives, partitioning, uneven


def _dump_dir():
    return fresh_root() / "dump"


CALLS = [
    call(uneven.returned_layout, dict(length=10, ways=4), length=Count(), ways=Count()),
    call(uneven.observed_layout, lambda: dict(length=10, mesh=mesh_of(4), axis_name="x"),
         length=Count(), mesh=MeshArg(), axis_name=Axis()),
    call(uneven.padded, dict(x=jnp.arange(10.0), multiple=4, axis=0), multiple=Count(),
         axis=Index(1), x=Array(kind="fi")),
    call(uneven.fsdp_spec, dict(shape=(8, 6), ways=4, axis_name="x"), ways=Count()),
    call(hidden_collectives.double_n, dict(x=jnp.ones(8), trips=3), trips=Count(0)),
    call(hidden_collectives.double_until, dict(x=jnp.ones(8), limit=100.0), limit=Real()),
    call(hidden_collectives.double_until_local, lambda: dict(x=jnp.ones(8), limit=100.0,
                                                             mesh=mesh_of(4), axis_name="x"),
         limit=Real(), mesh=MeshArg(), axis_name=Axis()),
    call(hidden_collectives.sort_along, dict(x=jnp.arange(12.0).reshape(3, 4)[::-1], axis=0),
         axis=Index(2)),
    call(hidden_collectives.shuffle_rows_local, lambda: dict(
        keys=jax.random.split(jax.random.key(0), 8), x=jnp.arange(32.0).reshape(8, 4),
        mesh=mesh_of(4), axis_name="x"), mesh=MeshArg(), axis_name=Axis()),
    call(closures.host_array, dict(shape=(4, 4), seed=2), seed=Count(0)),
    call(closures.constants, lambda: dict(program=jax.jit(lambda: jnp.arange(512.0)).lower()
                                          .compile(), min_bytes=16), min_bytes=Count(0)),
    call(partitioning.auto_mesh, dict(shape=(2, 2), names=("a", "b")), same=lambda a, b: a == b),
    call(partitioning.matmul_partitioning, lambda: dict(
        name="rows x columns", mesh=mesh_of(4, ("a", "b"), (2, 2)), m=16, k=32, n=16),
         name=Choice(), m=Count(), k=Count(), n=Count(), same=anything),
    call(lambda fn, directory: partitioning.dump_dot(fn, jnp.ones(4), directory=directory),
         lambda: dict(fn=jnp.sin, directory=_dump_dir()),
         label="partitioning.dump_dot", directory=PathArg(reads=False), same=anything),
]


CALLS += [
    call(partitioning.place, lambda: dict(array=jnp.arange(16.0).reshape(4, 4),
                                          mesh=mesh_of(4), spec=P("x")),
         array=Array(kind="fi"), mesh=MeshArg()),
    call(partitioning.single_vs_sharded, lambda: dict(
        fn=jnp.sin, arrays=[jnp.ones(8)], mesh=mesh_of(4), specs=[P("x")], runs=2),
         runs=Count(), mesh=MeshArg(), same=anything),
    call(lambda state, sharding: closures.init_from_closure(state, sharding)(), lambda: dict(
        state=jnp.arange(8.0), sharding=NamedSharding(mesh_of(4), P("x"))),
         label="closures.init_from_closure", state=Array(kind="fi")),
    call(uneven.constrained_sum, lambda: dict(x=jnp.arange(8.0),
                                              sharding=NamedSharding(mesh_of(4), P("x"))),
         x=Array(kind="fi")),
]

QUICK = [c for c in CALLS if c.label in ("uneven.padded", "uneven.returned_layout")]
test_every_guarded_argument, test_numbers_quick = battery_tests(CALLS, QUICK)
