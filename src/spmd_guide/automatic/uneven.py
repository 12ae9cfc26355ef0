"""Uneven shapes inside ``jit``: what a sharding constraint does when the mesh does not divide.

Placing an array (``device_put``, ``in_shardings``, ``out_shardings``) refuses a dimension of
length ``n`` split over ``k`` devices unless ``k`` divides ``n``. Inside ``jit``,
``with_sharding_constraint`` is not refused up front; on JAX 0.12 with the default Shardy
partitioner, measured on XLA:CPU:

* an **intermediate** value is padded: each device holds ``ceil(n / k)`` elements, the last
  blocks partly padding, masked where it matters (:func:`constrained_sum`);
* a **returned** value gets the layout the compiler chose for the program's output, and JAX
  must name that layout as a ``NamedSharding``. Over one mesh axis of ``k`` devices, the
  compiler splits the dimension
  ``g = gcd(n, k)`` ways. ``g = k``: the constraint held (``n`` was even after all). ``g = 1``:
  the output is replicated, every device holding all ``n`` (``P()``), silently. Otherwise a
  split in ``g`` parts over an axis of ``k`` devices has no ``PartitionSpec``, and the compile
  fails with an ``IndivisibleError`` that names the tiling ``[g, k/g]``, not your shape.
  Over several axes the split may be named by the leading axes, or come back as a
  ``GSPMDSharding`` with no ``PartitionSpec`` (the tests pin one case of each).

:func:`returned_layout` states that rule; :func:`observed_layout` measures it (tests check
that the two agree on many lengths, so a JAX release that changes the rule fails a test).
:func:`padded` and :func:`fsdp_spec` are the two ways out: pad to a multiple, or choose a
dimension that divides (and replicate a parameter none of whose dimensions does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks

__all__ = ["constrained_sum", "fsdp_spec", "observed_layout", "padded", "returned_layout"]

OUTCOMES = ("sharded", "replicated", "IndivisibleError")


def returned_layout(length: int, ways: int) -> str:
    """What JAX 0.12 (Shardy) does with a returned ``(length,)`` value constrained to split
    over ``ways`` devices: ``'sharded'``, ``'replicated'`` or ``'IndivisibleError'``."""
    length = checks.count("length", length)
    ways = checks.count("ways", ways)
    g = math.gcd(length, ways)
    if g == ways:
        return "sharded"
    return "replicated" if g == 1 else "IndivisibleError"


def _constrain(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    return jax.lax.with_sharding_constraint(2 * x, sharding)


def observed_layout(length: int, mesh: Mesh, axis_name: str) -> str:
    """Run ``jit(lambda x: with_sharding_constraint(2 * x, P(axis_name)))`` on a ``(length,)``
    array and say what came back: ``'sharded'`` (``P(axis_name)``), ``'replicated'``
    (``P()``, every device holding all of it) or ``'IndivisibleError'`` (the compile failed).
    Raises if the values are wrong or the layout is anything else."""
    length = checks.count("length", length)
    checks.axis(mesh, axis_name)
    # The question is what the compiler does with a constraint, so the axes are Auto (a
    # constraint may name only Auto axes): an Explicit mesh is used with its axes switched.
    mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)
    sharding = NamedSharding(mesh, P(axis_name))
    x = jnp.arange(length, dtype=jnp.float32)
    try:
        out = jax.jit(_constrain, static_argnums=1)(x, sharding)
    except Exception as error:  # JAX's IndivisibleError is private: match it by name
        if type(error).__name__ == "IndivisibleError":
            return "IndivisibleError"
        raise
    if not bool(jnp.array_equal(out, 2 * x)):
        raise AssertionError(f"wrong values for length {length}")
    spec = out.sharding.spec
    if spec == P(axis_name):
        return "sharded"
    if out.sharding.is_fully_replicated:
        return "replicated"
    raise AssertionError(f"unexpected layout {spec} for length {length}")


def constrained_sum(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    """``sum(sin(2 x))`` with ``2 x`` constrained to ``sharding``: an *intermediate* constraint,
    which the compiler honours on an uneven length by padding the blocks."""
    checks.sharding("sharding", sharding)
    x = checks.array("x", x, dtype_kind="fiu")
    return jnp.sum(jnp.sin(jax.lax.with_sharding_constraint(2 * x, sharding)))


def padded(x: Any, multiple: int, *, axis: int = 0) -> tuple[jax.Array, int]:
    """``x`` padded with zeros along ``axis`` to the next multiple of ``multiple``, and the
    original length (slice back with it, or mask the pad out of reductions)."""
    x = checks.array("x", x, min_ndim=1)
    multiple = checks.count("multiple", multiple)
    axis = checks.dimension("axis", axis, x.ndim)
    n = x.shape[axis]
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, -n % multiple)
    return jnp.pad(jnp.asarray(x), widths), n


def fsdp_spec(shape: Sequence[int], ways: int, axis_name: str) -> P:
    """The FSDP layout of a parameter: shard its largest dimension that ``ways`` divides over
    ``axis_name``; if none does, replicate it (``P()``), as FSDP libraries do for small
    parameters, or pad it with :func:`padded` first."""
    shape = checks.counts("shape", shape, minimum=0, min_length=0)
    ways = checks.count("ways", ways)
    axis_name = checks.text("axis_name", axis_name)
    fits = [d for d, size in enumerate(shape) if size % ways == 0 and size >= ways]
    if not fits:
        return P()
    best = max(fits, key=lambda d: (shape[d], -d))
    return P(*(axis_name if d == best else None for d in range(best + 1)))
