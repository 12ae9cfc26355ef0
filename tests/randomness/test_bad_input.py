"""Every guarded argument of the Part VII functions through its class battery (battery.py):
keys (typed, raw, batched, ints), seeds and sizes, rates, meshes, axis names, shardings. Each
answer is the package's InputError naming the argument, or (for a valid form) the plain
value's answer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from battery import Axis, Count, Flag, Key, MeshArg, Real, Text, battery_tests, call
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.randomness import data, prng


def _sharding():
    return NamedSharding(mesh_of(4), P("x"))


def _dataset():
    return (np.arange(64.0).reshape(16, 4), np.arange(16))


def _first(batches):
    return next(iter(batches))


def _device_keys(key, axis_names):
    """The key bits each of 4 devices gets, from device_key inside shard_map."""
    def body(_):
        k = prng.device_key(key, axis_names)
        bits = jax.random.key_data(k) if jax.dtypes.issubdtype(
            k.dtype, jax.dtypes.prng_key) else k
        return bits[None]

    return jax.shard_map(body, mesh=mesh_of(4), in_specs=P("x"), out_specs=P("x"))(
        jnp.zeros(4))


CALLS = [
    call(data.epoch_order, dict(num_examples=16, seed=3, epoch=1, process=0),
         num_examples=Count(), seed=Count(0), epoch=Count(0), process=Count(0)),
    call(lambda **kw: _first(data.sharded_batches(**kw)), lambda: dict(
        dataset=_dataset(), batch_size=8, sharding=_sharding(), seed=0, epoch=0,
        drop_remainder=False), label="data.sharded_batches", batch_size=Count(),
         seed=Count(0), epoch=Count(0), drop_remainder=Flag()),
    call(data.batch_axis_size, lambda: dict(sharding=_sharding(), ndim=2), ndim=Count()),
    call(prng.add_uniform_noise, lambda: dict(key=jax.random.key(0), x=jnp.ones((8, 4))),
         key=Key()),
    call(prng.prefix_matches, lambda: dict(key=jax.random.key(0), size=24, prefix=12),
         key=Key(), size=Count(), prefix=Count()),
    call(prng.layout_differences, lambda: dict(key=jax.random.key(0), shape=(8, 4),
                                               sharding=_sharding()), key=Key()),
    call(_device_keys, lambda: dict(key=jax.random.key(0), axis_names="x"), key=Key(),
         label="prng.device_key"),
    call(prng.device_key, lambda: dict(key=jax.random.key(0), axis_names="x"),
         label="prng.device_key outside shard_map", axis_names=Axis()),
    call(prng.dropout, lambda: dict(key=jax.random.key(0), x=jnp.ones((8, 4)), rate=0.5),
         key=Key(), rate=Real(positive=False, minimum=0.0, maximum=1.0)),
    call(prng.sharded_dropout, lambda: dict(key=jax.random.key(0), x=jnp.ones((8, 4)),
                                            mesh=mesh_of(4), axis_name="x", rate=0.5,
                                            per_device_keys=True),
         key=Key(), mesh=MeshArg(), axis_name=Axis(),
         rate=Real(positive=False, minimum=0.0, maximum=1.0), per_device_keys=Flag()),
    call(prng.block_correlation, lambda: dict(values=np.arange(16.0) % 5, blocks=4),
         blocks=Count(minimum=2)),
]


CALLS += [
    call(lambda shape, sharding: prng.sampler(shape, sharding)(jax.random.key(0)),
         lambda: dict(shape=(8, 4), sharding=_sharding()), label="prng.sampler"),
    call(data.rows_by_device, lambda: dict(batch_leaf=_first(data.sharded_batches(
        _dataset(), 8, _sharding(), seed=0))[0], title="t"), title=Text(),
         same=lambda a, b: True),
    call(lambda **kw: _first(data.process_local_batches(**kw)), lambda: dict(
        local_dataset=_dataset(), batch_size=8, sharding=_sharding(), seed=0, epoch=0,
        drop_remainder=False), label="data.process_local_batches", batch_size=Count(),
         seed=Count(0), epoch=Count(0), drop_remainder=Flag()),
]
CALLS = [c for c in CALLS if c.args]

QUICK = [c for c in CALLS if c.label in ("data.epoch_order", "prng.dropout")]
test_every_guarded_argument, test_keys_and_numbers_quick = battery_tests(CALLS, QUICK)
