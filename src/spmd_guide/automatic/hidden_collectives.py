"""Programs whose compiled form holds collectives their source never wrote.

Two families, each beside the ``shard_map`` version that keeps the work local:

* **Control flow over sharded data.** :func:`double_until` loops while *any* element is below
  a limit. Under ``jit`` on a sharded array the predicate is a reduction over every device, so
  the compiler puts an all-reduce in the loop's condition: one per trip, and every device
  runs as many trips as the slowest element anywhere needs. :func:`double_until_local` runs
  the same loop inside ``shard_map``: each device decides on its own block, with no message,
  and stops when *its* elements are done. :func:`double_n` loops a fixed number of times: a
  replicated predicate (a counter) needs no message either.
* **Operations that gather.** Sorting or permuting *along* a sharded dimension needs
  elements from other devices (:func:`sort_along`); shuffling each row of a row-sharded
  batch (:func:`shuffle_rows`) does not, and :func:`shuffle_rows_local` guarantees that by
  construction.

Each returns what it computed (and, for the loops, how many trips it ran) so that tests can
check it against a one-device run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks

__all__ = ["double_n", "double_until", "double_until_local", "shuffle_rows",
           "shuffle_rows_local", "sort_along"]


def _limit(limit: float) -> float:
    return checks.real("limit", limit, positive=True)


def double_until(x: jax.Array, limit: float) -> tuple[jax.Array, jax.Array]:
    """Double every element below ``limit`` until none is left; return (x, trips).

    The loop's predicate, ``any(x < limit)``, reads the whole array: on a sharded ``x`` the
    devices must agree on it, which costs a collective on every trip.
    """
    limit = _limit(limit)

    def go_on(state):
        values, _ = state
        return jnp.any(values < limit)

    def step(state):
        values, trips = state
        return jnp.where(values < limit, 2 * values, values), trips + 1

    return jax.lax.while_loop(go_on, step, (x, jnp.int32(0)))


def double_until_local(x: jax.Array, limit: float, mesh: Mesh, axis_name: str
                       ) -> tuple[jax.Array, jax.Array]:
    """:func:`double_until` inside ``shard_map``: each device loops over its own block.

    Returns the doubled array (laid out like ``x``, ``P(axis_name)``) and each device's trip
    count (one per device, in mesh order). No device waits for another.
    """
    limit = _limit(limit)
    checks.mesh("mesh", mesh)
    n = checks.axis(mesh, axis_name)
    x = checks.array("x", x, min_ndim=1)
    checks.divisible("x's first dimension", x.shape[0], n, why=f"over mesh axis {axis_name!r}")

    def local(block):
        values, trips = double_until(block, limit)
        return values, trips[None]

    return jax.shard_map(local, mesh=mesh, in_specs=P(axis_name),
                         out_specs=(P(axis_name), P(axis_name)))(_placed(x, mesh, axis_name))


def double_n(x: jax.Array, trips: int) -> jax.Array:
    """Double ``x`` exactly ``trips`` times: the predicate reads a counter, not the data."""
    trips = checks.count("trips", trips, minimum=0)
    return jax.lax.fori_loop(0, trips, lambda _, values: 2 * values, x)


def sort_along(x: jax.Array, axis: int) -> jax.Array:
    """``jnp.sort`` along ``axis``: if that dimension is sharded, blocks must meet."""
    x = checks.array("x", x, min_ndim=1)
    axis = checks.dimension("axis", axis, x.ndim)
    return jnp.sort(x, axis=axis)


def shuffle_rows(keys: jax.Array, x: jax.Array) -> jax.Array:
    """Permute each row of ``x`` with its own key (``vmap`` of ``jax.random.permutation``)."""
    x = checks.array("x", x, min_ndim=2)
    return jax.vmap(jax.random.permutation)(_keys(keys, x), x)


def _keys(keys: Any, x: Any) -> jax.Array:
    """One typed key per row of ``x`` (legacy raw ``uint32[rows, 2]`` keys are wrapped)."""
    if (isinstance(keys, (jax.Array, np.ndarray)) and keys.dtype == np.uint32
            and keys.shape == (x.shape[0], 2)):
        keys = jax.random.wrap_key_data(keys)  # legacy raw keys, one uint32[2] per row
    if not (hasattr(keys, "dtype") and jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key)):
        raise checks.InputTypeError(
            "keys must be typed random keys, one per row, e.g. "
            f"jax.random.split(jax.random.key(0), {x.shape[0]}); got {checks.value_text(keys)}.")
    if keys.shape != x.shape[:1]:
        raise checks.InputError(
            f"keys must hold one key per row: shape {x.shape[:1]}, got {keys.shape}.")
    return keys


def shuffle_rows_local(keys: jax.Array, x: jax.Array, mesh: Mesh, axis_name: str
                       ) -> jax.Array:
    """:func:`shuffle_rows` inside ``shard_map``: each device shuffles the rows it holds.

    The result equals :func:`shuffle_rows` (the same key for the same row), and no row can
    leave its device: a ``shard_map`` kernel only sees its own block.
    """
    checks.mesh("mesh", mesh)
    n = checks.axis(mesh, axis_name)
    x = checks.array("x", x, min_ndim=2)
    checks.divisible("x's rows", x.shape[0], n, why=f"over mesh axis {axis_name!r}")
    keys = _keys(keys, x)
    return jax.shard_map(shuffle_rows, mesh=mesh, in_specs=(P(axis_name), P(axis_name)),
                         out_specs=P(axis_name))(_placed(keys, mesh, axis_name),
                                                 _placed(x, mesh, axis_name))


def _placed(x: Any, mesh: Mesh, axis_name: str) -> Any:
    """``x`` laid out as ``in_specs=P(axis_name)`` says: an Explicit-axes mesh refuses
    inputs laid out otherwise (on Auto axes this only moves the rows)."""
    return jax.device_put(x, NamedSharding(mesh, P(axis_name)))
