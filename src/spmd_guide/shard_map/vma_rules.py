"""What ``shard_map``'s types do beyond ``out_specs``: three rules readers trip over.

* **A** ``psum`` **of an invariant value multiplies it.** ``psum`` adds up every device's
  value. If the value is already the same everywhere (it varies over nothing: a ``psum``'s
  result, a ``P()`` input, a constant), the sum is the axis size times that value. On JAX
  0.12 the jaxpr shows it: ``pvary`` (mark as varying), then ``psum_invariant``.
  :func:`psum_twice` computes ``psum(psum(x))``.
* **Mixing a varying and an invariant operand.** An operation on a value that varies over
  ``x`` and one that does not must first make them agree. JAX 0.12 inserts the ``pvary`` itself
  on most operations (the config ``jax_auto_pcast``, on by default); with it off, or in an
  operation without that rule (a loop carry, a custom primitive), tracing stops with
  "requires varying manual axes to match". :func:`mix` adds a ``psum``-ed (invariant) total
  to the varying block, with ``pcast=True`` marking it varying first, the fix.
* ``all_to_all`` **tiled or not.** Untiled, the split dimension must have exactly one slot per
  device: it is removed and a new dimension of that size appears at ``concat_axis``. Tiled, the
  split dimension is divided by the device count and ``concat_axis`` multiplied by it.
  :func:`all_to_all_block_shape` reports the per-device output shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks

__all__ = ["all_to_all_block_shape", "mix", "psum_twice", "summed_jaxpr"]


def _mesh_axis(mesh: Mesh, axis_name: str) -> int:
    checks.mesh("mesh", mesh)
    return checks.axis(mesh, axis_name)


def _placed(x: Any, mesh: Mesh, axis_name: str) -> Any:
    """``x`` laid out as ``in_specs=P(axis_name)`` says: an Explicit-axes mesh refuses
    inputs laid out otherwise (on Auto axes this only moves the rows)."""
    return jax.device_put(x, NamedSharding(mesh, P(axis_name)))


def psum_twice(x: jax.Array, mesh: Mesh, axis_name: str, *, check_vma: bool = True
               ) -> jax.Array:
    """``psum(psum(block))`` of each device's block, returned once (``out_specs=P()``).

    The first ``psum`` gives every device the total; the second adds up those ``n`` equal
    totals: ``n`` times the total.
    """
    n = _mesh_axis(mesh, axis_name)
    x = checks.array("x", x, min_ndim=1)
    checks.divisible("x's first dimension", x.shape[0], n, why=f"over mesh axis {axis_name!r}")
    check_vma = checks.flag("check_vma", check_vma)

    def kernel(block):
        return jax.lax.psum(jax.lax.psum(block.sum(), axis_name), axis_name)

    return jax.shard_map(kernel, mesh=mesh, in_specs=P(axis_name), out_specs=P(),
                         check_vma=check_vma)(_placed(x, mesh, axis_name))


def summed_jaxpr(mesh: Mesh, axis_name: str) -> list[str]:
    """The primitives of ``psum(psum(block))`` inside ``shard_map``, in order (JAX's names)."""
    n = _mesh_axis(mesh, axis_name)
    jaxpr = jax.make_jaxpr(lambda a: psum_twice(a, mesh, axis_name))(jnp.ones(n))
    (inner,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "shard_map"]
    return [e.primitive.name for e in inner.params["jaxpr"].eqns]


def mix(x: jax.Array, mesh: Mesh, axis_name: str, *, pcast: bool) -> jax.Array:
    """Each device's block plus the total over all devices: a varying block and an invariant
    total in one ``+``. With ``pcast=True`` the total is marked varying first
    (``jax.lax.pcast(total, axis_name, to='varying')``), which every JAX setting accepts."""
    n = _mesh_axis(mesh, axis_name)
    x = checks.array("x", x, min_ndim=1)
    checks.divisible("x's first dimension", x.shape[0], n, why=f"over mesh axis {axis_name!r}")
    pcast = checks.flag("pcast", pcast)

    def kernel(block):
        total = jax.lax.psum(block.sum(), axis_name)  # the same on every device
        if pcast:
            total = jax.lax.pcast(total, axis_name, to="varying")
        return block + total

    return jax.shard_map(kernel, mesh=mesh, in_specs=P(axis_name), out_specs=P(axis_name))(
        _placed(x, mesh, axis_name))


def all_to_all_block_shape(block_shape: Sequence[int], mesh: Mesh, axis_name: str, *,
                           split_axis: int, concat_axis: int, tiled: bool) -> tuple[int, ...]:
    """The per-device shape ``jax.lax.all_to_all`` returns for a block of ``block_shape``.

    Traced, not run. Untiled, ``block_shape[split_axis]`` must equal the axis size.
    """
    n = _mesh_axis(mesh, axis_name)
    shape = checks.counts("block_shape", block_shape)
    for name, value in (("split_axis", split_axis), ("concat_axis", concat_axis)):
        checks.count(name, value, minimum=0, maximum=len(shape) - 1)
    tiled = checks.flag("tiled", tiled)
    if not tiled and shape[split_axis] != n:
        raise checks.InputError(
            f"untiled all_to_all needs block_shape[{split_axis}] == {n} (one slot per device "
            f"of {axis_name!r}), got {shape[split_axis]}; use tiled=True to split a multiple.")
    if tiled:
        checks.divisible(f"block_shape[{split_axis}]", shape[split_axis], n,
                         why=f"over mesh axis {axis_name!r}")
    seen: list[tuple[int, ...]] = []

    def kernel(block):
        out = jax.lax.all_to_all(block[0], axis_name, split_axis, concat_axis, tiled=tiled)
        seen.append(tuple(out.shape))
        return out[None]

    f = jax.shard_map(kernel, mesh=mesh, in_specs=P(axis_name), out_specs=P(axis_name))
    jax.eval_shape(f, jax.ShapeDtypeStruct((n, *shape), jnp.float32,
                                           sharding=NamedSharding(mesh, P(axis_name))))
    return seen[0]
