"""The six collective matmuls of Part III: ``lhs @ rhs`` over a ring, by hand.

Every variant is called ``f(lhs, rhs, mesh, axis_name)`` and returns
``lhs @ rhs`` sharded ``P(axis_name, None)``: each device ends with a band of
output rows. Two families:

- **all-gather**: ``lhs`` rows and ``rhs`` rows are both split over the ring.
  Each device keeps its band of ``lhs`` rows and needs every block of ``rhs``,
  so the ``rhs`` blocks travel round the ring.
- **reduce-scatter**: the contraction dimension is split (``lhs`` by columns,
  ``rhs`` by rows). Each device computes a partial product of the whole
  output; the partial sums travel round the ring and are added up, each
  device keeping one band of rows.

Each family comes three ways: one big collective (``all_gather`` /
``psum_scatter``), an overlapped ring of ``ppermute`` steps interleaved with
block matmuls, and a bidirectional ring that sends half of every travelling
block each way round. ``allgather_bidi_fused`` is the bidirectional all-gather
ring again, with one full-size matmul per step where ``allgather_bidi`` runs two
half-size ones.

Everything a variant needs comes in through its arguments (``mesh``,
``axis_name``); nothing is read from module or notebook globals, so re-running
a notebook cell cannot change what an already defined function computes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.shard_map.collectives import axis_size

Matmul = Callable[[Any, Any, Mesh, str], jax.Array]

# ---------------------------------------------------------------------------
# Checks at the boundary: bad input gets a clear error before any computation.
# ---------------------------------------------------------------------------


def check_shapes(lhs: Any, rhs: Any, *, rows_by: int,
                 contraction_by: int) -> None:
    """Raise ``ValueError`` unless ``lhs @ rhs`` is a 2-D matmul whose
    blocks split evenly: ``rows_by`` must divide the rows M of ``lhs`` and
    ``contraction_by`` the contraction dimension K.

    Floor division would silently drop the leftover rows and return a wrong
    product, so uneven shapes are refused instead. Shapes are static, so the
    check costs nothing under ``jit``.
    """
    rows_by = checks.count("rows_by", rows_by)
    contraction_by = checks.count("contraction_by", contraction_by)
    lhs_shape = tuple(checks.array("lhs", lhs).shape)
    rhs_shape = tuple(checks.array("rhs", rhs).shape)
    if len(lhs_shape) != 2 or len(rhs_shape) != 2:
        raise checks.InputError(
            f"Collective matmuls take 2-D operands, got lhs of shape "
            f"{lhs_shape} and rhs of shape {rhs_shape}. Reshape batched "
            f"inputs to (rows, features) first."
        )
    (m, k), (k_rhs, _) = lhs_shape, rhs_shape
    if k != k_rhs:
        raise checks.InputError(
            f"lhs of shape {lhs_shape} and rhs of shape {rhs_shape} cannot "
            f"be multiplied: lhs has {k} columns but rhs has {k_rhs} rows."
        )
    for what, size, divisor in (("rows M", m, rows_by),
                                ("contraction K", k, contraction_by)):
        if size % divisor:
            raise checks.InputError(
                f"lhs of shape {lhs_shape} @ rhs of shape {rhs_shape}: "
                f"{what} = {size} is not divisible by {divisor}, so it "
                f"cannot be split into {divisor} equal blocks. Use a "
                f"multiple of {divisor} (pad with zeros if needed)."
            )


# ---------------------------------------------------------------------------
# Shared plumbing: place the inputs, run the per-device function.
# ---------------------------------------------------------------------------


def _axis_name(axis_name: Any) -> str:
    if not isinstance(axis_name, str) or not axis_name:
        raise checks.InputTypeError(
            f"axis_name must be a mesh axis name (a non-empty string), got {axis_name!r}.")
    return axis_name


def as_operand(x: Any) -> Any:
    """A ``jax.Array`` or tracer as it is, anything else as a NumPy array (a list given to
    ``jax.device_put`` would be a tree of separate scalars)."""
    return x if isinstance(x, (jax.Array, jax.core.Tracer)) else np.asarray(x)


def allgather_specs(axis_name: str) -> tuple[P, P]:
    """The all-gather family's layout of (lhs, rhs): both split by rows."""
    _axis_name(axis_name)
    return P(axis_name, None), P(axis_name, None)


def reduce_scatter_specs(axis_name: str) -> tuple[P, P]:
    """The reduce-scatter family's layout of (lhs, rhs): K split."""
    _axis_name(axis_name)
    return P(None, axis_name), P(axis_name, None)


def run_on_ring(per_device: Callable[..., jax.Array], lhs: Any, rhs: Any,
                mesh: Mesh, axis_name: str, *,
                specs: tuple[P, P]) -> jax.Array:
    """Lay out ``lhs`` and ``rhs`` as ``specs`` say, then run
    ``per_device(lhs_block, rhs_block, axis_name=..., ring=...)`` on every
    device's blocks. The result is sharded ``P(axis_name, None)``.

    The inputs are placed here because on an Explicit-axes mesh
    ``shard_map`` rejects an argument whose sharding differs from its
    ``in_specs``. ``jax.device_put`` works eagerly and under ``jit``, on
    Auto and Explicit meshes alike.
    """
    checks.function("per_device", per_device)
    axis_size(mesh, axis_name)
    lhs_spec, rhs_spec = specs
    lhs = jax.device_put(as_operand(lhs), NamedSharding(mesh, lhs_spec))
    rhs = jax.device_put(as_operand(rhs), NamedSharding(mesh, rhs_spec))
    program = _ring_program(per_device, mesh, axis_name, lhs_spec, rhs_spec)
    return program(lhs, rhs)


@functools.lru_cache(maxsize=256)
def _ring_program(per_device: Callable[..., jax.Array], mesh: Mesh,
                  axis_name: str, lhs_spec: P, rhs_spec: P
                  ) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """``per_device`` under ``shard_map``, jitted once per arguments.

    Jitted because eager ``shard_map`` runs its body one small operation at
    a time, which is slow for the unrolled rings; cached so that repeated
    eager calls reuse the compiled program.
    """
    kernel = functools.partial(per_device, axis_name=axis_name,
                               ring=mesh.shape[axis_name])
    mapped = jax.shard_map(kernel, mesh=mesh, in_specs=(lhs_spec, rhs_spec),
                           out_specs=P(axis_name, None))
    return jax.jit(mapped)


def pass_along(block: jax.Array, axis_name: str, ring: int, *,
               direction: int) -> jax.Array:
    """Send ``block`` to the next device round the ring (``direction=+1``)
    or to the previous one (``-1``): one collective-permute."""
    perm = [(i, (i + direction) % ring) for i in range(ring)]
    return lax.ppermute(block, axis_name, perm=perm)


# ---------------------------------------------------------------------------
# The all-gather family: lhs P(axis, None), rhs P(axis, None).
# A per-device function sees lhs_rows (M/n, K) and rhs_block (K/n, N).
# ---------------------------------------------------------------------------


def allgather_per_device(lhs_rows, rhs_block, *, axis_name: str, ring: int):
    """Gather every block of ``rhs``, then one local matmul."""
    whole_rhs = lax.all_gather(rhs_block, axis_name, tiled=True)
    return lhs_rows @ whole_rhs


def allgather_overlapped_per_device(lhs_rows, rhs_block, *, axis_name: str,
                                    ring: int):
    """Multiply the ``rhs`` block in hand, and pass it on round the ring.

    The transfer at step ``s`` needs the block of step ``s - 1``, not its
    matmul, so the two can run together. A Python loop: one
    collective-permute per step in the compiled program.
    """
    me = lax.axis_index(axis_name)
    block_rows = rhs_block.shape[0]

    def lhs_columns(block):  # the columns of lhs_rows meeting rhs block
        start = block * block_rows
        return lax.dynamic_slice_in_dim(lhs_rows, start, block_rows, axis=1)

    out = lhs_columns(me) @ rhs_block
    for step in range(1, ring):
        rhs_block = pass_along(rhs_block, axis_name, ring, direction=+1)
        out += lhs_columns((me - step) % ring) @ rhs_block
    return out


def _half_block_columns(lhs_rows, block, half: int, half_rows: int):
    """The ``lhs`` columns that meet one half (0: top, 1: bottom) of ``rhs`` block ``block``,
    for the bidirectional rings, which send each block's halves opposite ways."""
    start = (2 * block + half) * half_rows
    return lax.dynamic_slice_in_dim(lhs_rows, start, half_rows, axis=1)


def allgather_bidi_per_device(lhs_rows, rhs_block, *, axis_name: str,
                              ring: int):
    """As ``allgather_overlapped_per_device``, with each ``rhs`` block
    cut in two: the top half travels forward round the ring, the bottom
    half backward."""
    me = lax.axis_index(axis_name)
    forward, backward = jnp.split(rhs_block, 2, axis=0)
    half_rows = forward.shape[0]

    def lhs_columns(block, half):  # the columns meeting one half of a block
        return _half_block_columns(lhs_rows, block, half, half_rows)

    out = lhs_columns(me, 0) @ forward + lhs_columns(me, 1) @ backward
    for step in range(1, ring):
        forward = pass_along(forward, axis_name, ring, direction=+1)
        backward = pass_along(backward, axis_name, ring, direction=-1)
        out += lhs_columns((me - step) % ring, 0) @ forward
        out += lhs_columns((me + step) % ring, 1) @ backward
    return out


def allgather_bidi_fused_per_device(lhs_rows, rhs_block, *, axis_name: str,
                                    ring: int):
    """As ``allgather_bidi_per_device``, with one full-size matmul per step
    instead of two half-size ones: the two halves in hand are stacked into
    one (K/n, N) block (the pad-and-add form: each half padded with zeros
    where the other goes, then added) and multiplied by the matching
    ``lhs`` columns, stacked the same way."""
    me = lax.axis_index(axis_name)
    forward, backward = jnp.split(rhs_block, 2, axis=0)
    half_rows = forward.shape[0]

    def lhs_columns(block, half):  # the columns meeting one half of a block
        return _half_block_columns(lhs_rows, block, half, half_rows)

    def one_dot(forward_block, backward_block):
        columns = jnp.concatenate([lhs_columns(forward_block, 0),
                                   lhs_columns(backward_block, 1)], axis=1)
        return columns @ jnp.concatenate([forward, backward], axis=0)

    out = one_dot(me, me)
    for step in range(1, ring):
        forward = pass_along(forward, axis_name, ring, direction=+1)
        backward = pass_along(backward, axis_name, ring, direction=-1)
        out += one_dot((me - step) % ring, (me + step) % ring)
    return out


def allgather(lhs: Any, rhs: Any, mesh: Mesh, axis_name: str) -> jax.Array:
    """``lhs @ rhs``, gathering all of ``rhs`` onto every device first."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=ring, contraction_by=ring)
    return run_on_ring(allgather_per_device, lhs, rhs, mesh, axis_name,
                       specs=allgather_specs(axis_name))


def allgather_overlapped(lhs: Any, rhs: Any, mesh: Mesh,
                         axis_name: str) -> jax.Array:
    """``lhs @ rhs``, passing ``rhs`` blocks round the ring as it goes."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=ring, contraction_by=ring)
    return run_on_ring(allgather_overlapped_per_device, lhs, rhs, mesh,
                       axis_name, specs=allgather_specs(axis_name))


def allgather_bidi(lhs: Any, rhs: Any, mesh: Mesh,
                   axis_name: str) -> jax.Array:
    """``lhs @ rhs``, half of every ``rhs`` block going each way round."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=ring, contraction_by=2 * ring)
    return run_on_ring(allgather_bidi_per_device, lhs, rhs, mesh, axis_name,
                       specs=allgather_specs(axis_name))


def allgather_bidi_fused(lhs: Any, rhs: Any, mesh: Mesh,
                         axis_name: str) -> jax.Array:
    """``lhs @ rhs`` as ``allgather_bidi``, one full-size matmul per step."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=ring, contraction_by=2 * ring)
    return run_on_ring(allgather_bidi_fused_per_device, lhs, rhs, mesh,
                       axis_name, specs=allgather_specs(axis_name))


# ---------------------------------------------------------------------------
# The reduce-scatter family: lhs P(None, axis), rhs P(axis, None).
# A per-device function sees lhs_columns (M, K/n) and rhs_block (K/n, N).
# ---------------------------------------------------------------------------


def reduce_scatter_per_device(lhs_columns, rhs_block, *, axis_name: str,
                              ring: int):
    """One local matmul (this device's share of every output entry), then
    ``psum_scatter``: sum the shares, keep one band of rows."""
    partial_sum = lhs_columns @ rhs_block
    return lax.psum_scatter(partial_sum, axis_name, scatter_dimension=0,
                            tiled=True)


def reduce_scatter_overlapped_per_device(lhs_columns, rhs_block, *,
                                         axis_name: str, ring: int):
    """Receive a running sum of one output row block, add this device's
    share, pass it on. The share's matmul does not need the incoming sum,
    so it can run during the transfer. After ``ring - 1`` steps each device
    holds the full sum of its own row block.
    """
    me = lax.axis_index(axis_name)
    block_rows = lhs_columns.shape[0] // ring  # exact: checked by caller

    def my_share(block):  # this device's share of output row block `block`
        rows = lax.dynamic_slice_in_dim(
            lhs_columns, block * block_rows, block_rows, axis=0)
        return rows @ rhs_block

    running_sum = my_share((me + 1) % ring)
    for step in range(1, ring):
        running_sum = pass_along(running_sum, axis_name, ring, direction=-1)
        running_sum += my_share((me + step + 1) % ring)
    return running_sum


def reduce_scatter_bidi_per_device(lhs_columns, rhs_block, *,
                                   axis_name: str, ring: int):
    """As ``reduce_scatter_overlapped_per_device``, with each output row
    block cut in two: running sums of the top halves travel backward round
    the ring, those of the bottom halves forward."""
    me = lax.axis_index(axis_name)
    half_rows = lhs_columns.shape[0] // (2 * ring)  # exact: checked

    def my_share(block, half):  # this device's share of half a row block
        start = (2 * block + half) * half_rows
        rows = lax.dynamic_slice_in_dim(
            lhs_columns, start, half_rows, axis=0)
        return rows @ rhs_block

    top = my_share((me + 1) % ring, 0)
    bottom = my_share((me - 1) % ring, 1)
    for step in range(1, ring):
        top = pass_along(top, axis_name, ring, direction=-1)
        bottom = pass_along(bottom, axis_name, ring, direction=+1)
        top += my_share((me + step + 1) % ring, 0)
        bottom += my_share((me - step - 1) % ring, 1)
    return jnp.concatenate([top, bottom], axis=0)


def reduce_scatter(lhs: Any, rhs: Any, mesh: Mesh,
                   axis_name: str) -> jax.Array:
    """``lhs @ rhs`` as local partial products, then one reduce-scatter."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=ring, contraction_by=ring)
    return run_on_ring(reduce_scatter_per_device, lhs, rhs, mesh, axis_name,
                       specs=reduce_scatter_specs(axis_name))


def reduce_scatter_overlapped(lhs: Any, rhs: Any, mesh: Mesh,
                              axis_name: str) -> jax.Array:
    """``lhs @ rhs``, passing running sums round the ring as it goes."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=ring, contraction_by=ring)
    return run_on_ring(reduce_scatter_overlapped_per_device, lhs, rhs, mesh,
                       axis_name, specs=reduce_scatter_specs(axis_name))


def reduce_scatter_bidi(lhs: Any, rhs: Any, mesh: Mesh,
                        axis_name: str) -> jax.Array:
    """``lhs @ rhs``, half of every running sum going each way round."""
    ring = axis_size(mesh, axis_name)
    check_shapes(lhs, rhs, rows_by=2 * ring, contraction_by=ring)
    return run_on_ring(reduce_scatter_bidi_per_device, lhs, rhs, mesh,
                       axis_name, specs=reduce_scatter_specs(axis_name))


VARIANTS: dict[str, Matmul] = {
    "allgather": allgather,
    "allgather_overlapped": allgather_overlapped,
    "allgather_bidi": allgather_bidi,
    "reduce_scatter": reduce_scatter,
    "reduce_scatter_overlapped": reduce_scatter_overlapped,
    "reduce_scatter_bidi": reduce_scatter_bidi,
    "allgather_bidi_fused": allgather_bidi_fused,
}
"""The collective matmuls by name; each is ``f(lhs, rhs, mesh, axis)``: the six of the
chapter, and ``allgather_bidi`` again with one full-size matmul per step."""

FAMILY_SPECS: dict[str, Callable[[str], tuple[P, P]]] = {
    name: (allgather_specs if name.startswith("allgather")
           else reduce_scatter_specs)
    for name in VARIANTS
}
"""For each variant, the function giving the (lhs, rhs) layout it needs."""


def variant(name: str) -> Matmul:
    """The variant called ``name``; a clear error listing the names."""
    return VARIANTS[checks.one_of("collective matmul name", name, VARIANTS)]
