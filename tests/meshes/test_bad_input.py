"""Every guarded argument of meshes.show through its class battery (battery.py): arrays,
meshes, flags, indices, mesh shapes. Each answer is the package's InputError naming the
argument, or (for a valid form) the plain value's answer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from battery import Flag, MeshArg, anything, battery_tests, call
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.meshes import show


def _placed():
    return jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh_of(4), P("x")))


CALLS = [
    call(show.shard_blocks, lambda: dict(array=_placed(), data=True), data=Flag(),
         same=lambda a, b: [x.bounds for x in a] == [x.bounds for x in b]),
    call(show.layout_table, lambda: dict(array=_placed(), data=True), data=Flag()),
    call(show.gallery_entry, lambda: dict(values=np.arange(32.0).reshape(8, 4),
                                          mesh=mesh_of(4), spec=P("x"), data=True),
         mesh=MeshArg(missing_ok=True), data=Flag(), same=anything),
    call(show.gallery, dict(values=np.arange(32.0).reshape(8, 4), mesh_shapes=[(2, 2)],
                            specs=[P("data")], data=True), data=Flag(), same=anything),
]


QUICK = [c for c in CALLS if c.label in ("show.shard_blocks",)]
test_every_guarded_argument, test_flags_quick = battery_tests(CALLS, QUICK)
