"""``shard_map`` and its collectives, as tiny worked examples, plus pictures of what moves where.

Inside ``jax.shard_map`` a function sees *one block per device*: ``in_specs`` say how each
input is cut into blocks, ``out_specs`` how the output blocks are put back together. The
collectives (``jax.lax.psum``, ``all_gather``, ``ppermute``, ...) are the only way blocks on
different devices talk to each other.

This module holds

- the chapter's first example (:func:`block_sum`, :func:`block_sums`, :func:`global_sum`);
- one *kernel* per collective -- a function ``kernel(block, axis_name)`` that one device runs
  on its block -- gathered in the registry :data:`EXAMPLES` with the input each is shown on;
- :func:`per_device_result`, which runs a kernel and returns what *every* device holds
  afterwards (the thing the pictures draw and the tests compare with numpy);
- :func:`draw_collective`, the before/after picture of an example, drawn by
  :func:`spmd_guide.core.drawing.draw_panels` (re-exported here with :class:`Panel`,
  :func:`device_color` and :data:`COMBINED`), which the collective matmul chapter reuses for
  its ring diagrams;
- what the compiler makes of each example (:func:`hlo_rows`: HLO op, count, bytes per device
  from :mod:`spmd_guide.core.hlo`) and how the ring cost grows with the devices
  (:func:`ring_scaling`);
- the exercises' answers (:func:`mean_via_psum`, :func:`psum_in_two_steps`,
  :func:`global_positions`) and :func:`rows_to_columns` (a resharding by ``all_to_all``).

Every function takes the mesh and the axis name as arguments: nothing is read from globals.
Inputs are placed on the mesh (``jax.device_put`` with ``NamedSharding(mesh, P(axis_name))``)
before ``shard_map`` sees them, so the functions work on meshes with ``Auto`` or ``Explicit``
axes alike (an Explicit-axes mesh rejects inputs not already laid out as ``in_specs`` say).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.core.drawing import (  # noqa: F401  (the pictures' vocabulary, re-exported)
    COMBINED,
    Panel,
    before_after,
    device_color,
    draw_panels,
    shape_label,
)

Kernel = Callable[[jax.Array, str], jax.Array]

# --------------------------------------------------------------------------------------
# Checks at the boundary
# --------------------------------------------------------------------------------------


def axis_size(mesh: Mesh, axis_name: str) -> int:
    """Devices along ``axis_name`` of ``mesh``; a clear error for a wrong mesh or axis name."""
    return checks.axis(checks.mesh("mesh", mesh), axis_name)


def _array(name: str, x: Any) -> Any:
    """``x`` as an array: a ``jax.Array`` or tracer as it is, a list or scalar as NumPy
    (``jax.device_put`` would take a list for a tree of separate scalars)."""
    x = checks.array(name, x)
    return x if isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) else np.asarray(x)


def _placed(x: Any, mesh: Mesh, axis_name: str) -> jax.Array:
    """``x`` laid out as ``P(axis_name)``; a clear error if it cannot be."""
    n = axis_size(mesh, axis_name)
    x = _array("x", x)
    shape = np.shape(x)
    if len(shape) == 0 or shape[0] % n:
        raise checks.InputError(
            f"an input of shape {shape} cannot be cut into {n} equal "
            f"blocks along its first axis (mesh axis {axis_name!r} has "
            f"{n} devices): use a first dimension divisible by {n}."
        )
    return jax.device_put(x, NamedSharding(mesh, P(axis_name)))


def _kernel_fits(block: jax.Array, axis_name: str, *, dim: int, exact: bool) -> None:
    """Inside ``shard_map``: dimension ``dim`` of ``block`` equals the axis size (``exact``)
    or splits into that many equal parts. Static shapes only: free under ``jit``."""
    n = jax.lax.axis_size(axis_name)
    size = block.shape[dim] if block.ndim > dim else None
    if size is None or (size != n if exact else size % n):
        rule = f"exactly {n}" if exact else f"a multiple of {n}"
        fix = (f"give the input {n * n} rows in all" if exact and dim == 0 else
               f"give the input a multiple of {n * n if dim == 0 else n} "
               f"{'rows' if dim == 0 else 'columns'}")
        raise checks.InputError(
            f"each device's block has shape {tuple(block.shape)}, but its dimension {dim} must "
            f"be {rule} (the size of mesh axis {axis_name!r}): {fix}.")


def blocks(x: Any, n_devices: int) -> np.ndarray:
    """The blocks ``in_specs=P(axis)`` gives each of ``n_devices`` devices, stacked:
    ``blocks(x, n)[d]`` is device d's (numpy, for references and pictures)."""
    n_devices = checks.count("n_devices", n_devices)
    x = np.asarray(_array("x", x))
    if x.ndim == 0 or x.shape[0] % n_devices:
        raise checks.InputError(
            f"an input of shape {x.shape} cannot be cut into {n_devices} equal blocks along "
            f"its first axis: use a first dimension divisible by {n_devices}."
        )
    return x.reshape(n_devices, x.shape[0] // n_devices, *x.shape[1:])


# --------------------------------------------------------------------------------------
# The first example: a sum, block by block
# --------------------------------------------------------------------------------------


def block_sum(block: jax.Array) -> jax.Array:
    """One device's work: the sum of its block, shape (1,)."""
    return block.sum(keepdims=True)


def block_sums(x: Any, mesh: Mesh, *, axis_name: str = "x") -> jax.Array:
    """Every device's block sum, stacked by ``out_specs``."""
    x = _placed(x, mesh, axis_name)
    return jax.shard_map(block_sum, mesh=mesh,
                         in_specs=P(axis_name),
                         out_specs=P(axis_name))(x)


def summed_over_devices(block: jax.Array, axis_name: str) -> jax.Array:
    """The block's sum, then ``psum``: the same total everywhere."""
    return jax.lax.psum(block_sum(block), axis_name)


def global_sum(x: Any, mesh: Mesh, *, axis_name: str = "x") -> jax.Array:
    """The total of ``x``, shape (1,), returned once (``P()``)."""
    x = _placed(x, mesh, axis_name)
    kernel = partial(summed_over_devices, axis_name=axis_name)
    return jax.shard_map(kernel, mesh=mesh,
                         in_specs=P(axis_name), out_specs=P())(x)


def traced_types(kernel: Kernel, x: Any, mesh: Mesh, *, axis_name: str = "x"
                 ) -> tuple[str, str]:
    """``jax.typeof`` of one device's block and of the kernel's result, as JAX prints them.

    A ``{V:x}`` suffix marks a value that *varies* over the manual mesh axis ``x``; a value
    without it is known to be the same on every device. Traced only (nothing is compiled).
    """
    checks.function("kernel", kernel)
    x = _placed(x, mesh, axis_name)
    seen: list[str] = []

    def spy(block: jax.Array) -> jax.Array:
        result = kernel(block, axis_name)
        seen.extend([str(jax.typeof(block)), str(jax.typeof(result))])
        return jnp.expand_dims(result, 0)

    jax.eval_shape(jax.shard_map(spy, mesh=mesh, in_specs=P(axis_name),
                                 out_specs=P(axis_name)), x)
    return seen[0], seen[1]


# --------------------------------------------------------------------------------------
# One kernel per collective (each shown in the chapter: keep lines within 80 columns)
# --------------------------------------------------------------------------------------


def psum_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Every device gets the elementwise sum of all blocks."""
    return jax.lax.psum(block, axis_name)


def pmean_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Every device gets the elementwise mean of all blocks."""
    return jax.lax.pmean(block, axis_name)


def all_gather_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Every device gets all blocks, stacked: shape (n, *block.shape)."""
    return jax.lax.all_gather(block, axis_name, axis=0, tiled=False)


def all_gather_tiled_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Every device gets all blocks, concatenated along axis 0."""
    return jax.lax.all_gather(block, axis_name, axis=0, tiled=True)


def psum_scatter_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Sum the blocks; device d keeps entry d (needs len(block) == n)."""
    _kernel_fits(block, axis_name, dim=0, exact=True)
    return jax.lax.psum_scatter(block, axis_name,
                                scatter_dimension=0, tiled=False)


def psum_scatter_tiled_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Sum the blocks; device d keeps the d-th of n equal slices."""
    _kernel_fits(block, axis_name, dim=0, exact=False)
    return jax.lax.psum_scatter(block, axis_name,
                                scatter_dimension=0, tiled=True)


def ring_shift_kernel(block: jax.Array, axis_name: str, *,
                      step: int = 1) -> jax.Array:
    """Device i sends its block to device (i + step) % n."""
    step = checks.count("step", step, minimum=-checks.MAX_DEVICES, maximum=checks.MAX_DEVICES)
    n = jax.lax.axis_size(axis_name)
    perm = [(i, (i + step) % n) for i in range(n)]
    return jax.lax.ppermute(block, axis_name, perm=perm)


def all_to_all_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """A row block (r, c) becomes a column block (r * n, c / n).

    Each device cuts its block into n column chunks and sends chunk j
    to device j, which stacks the n chunks it receives as rows.
    """
    _kernel_fits(block, axis_name, dim=1, exact=False)
    return jax.lax.all_to_all(block, axis_name,
                              split_axis=1, concat_axis=0, tiled=True)


def axis_index_kernel(block: jax.Array, axis_name: str) -> jax.Array:
    """Each device's own position along the axis, shape (1,)."""
    return jax.lax.axis_index(axis_name)[None]


def rows_to_columns(x: Any, mesh: Mesh, *,
                    axis_name: str = "x") -> jax.Array:
    """The same matrix, resharded from rows to columns by all_to_all."""
    n = axis_size(mesh, axis_name)
    x = _array("x", x)
    if np.ndim(x) != 2 or np.shape(x)[1] % n:
        raise checks.InputError(
            f"rows_to_columns needs a matrix whose column count divides "
            f"by {n}, got shape {np.shape(x)}.")
    x = _placed(x, mesh, axis_name)
    kernel = partial(all_to_all_kernel, axis_name=axis_name)
    return jax.shard_map(kernel, mesh=mesh, in_specs=P(axis_name),
                         out_specs=P(None, axis_name))(x)


# --------------------------------------------------------------------------------------
# The chapter's exercises (their answers, checked by the tests)
# --------------------------------------------------------------------------------------


def mean_via_psum(block: jax.Array, axis_name: str) -> jax.Array:
    """The mean of the whole array, with one ``psum``."""
    total = jax.lax.psum(block.sum(), axis_name)
    return total / (block.size * jax.lax.axis_size(axis_name))


def psum_in_two_steps(block: jax.Array, axis_name: str) -> jax.Array:
    """``psum`` as a reduce-scatter, then an all-gather."""
    piece = jax.lax.psum_scatter(block, axis_name,
                                 scatter_dimension=0, tiled=True)
    return jax.lax.all_gather(piece, axis_name, axis=0, tiled=True)


def global_positions(block: jax.Array, axis_name: str) -> jax.Array:
    """The index in the whole array of each element of the block."""
    start = jax.lax.axis_index(axis_name) * block.shape[0]
    return start + jnp.arange(block.shape[0])


# --------------------------------------------------------------------------------------
# The registry of worked examples
# --------------------------------------------------------------------------------------

Movement = Literal["moved", "combined", "local"]


@dataclass(frozen=True)
class CollectiveExample:
    """One collective, the kernel that shows it, the input it is shown on, and its HLO op.

    ``movement`` says how to colour the result: ``"moved"`` values keep the colour of the
    device they came from, ``"combined"`` values are reduced over devices (white),
    ``"local"`` values are computed on the device that holds them.
    """

    name: str
    call: str
    kernel: Kernel
    hlo_op: str | None
    movement: Movement
    input_shape: Callable[[int], tuple[int, ...]]
    ring: bool = False

    def example_input(self, n_devices: int) -> np.ndarray:
        """``0, 1, 2, ...`` (float32) in this example's global shape for ``n_devices``."""
        n_devices = checks.count("n_devices", n_devices)
        shape = self.input_shape(n_devices)
        return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)

    def arrows(self, n_devices: int) -> list[tuple[int, int]]:
        """The (source, destination) sends to draw: the ring for ``ppermute``, else none."""
        return [(i, (i + 1) % n_devices) for i in range(n_devices)] if self.ring else []


EXAMPLES: dict[str, CollectiveExample] = {
    example.name: example
    for example in (
        CollectiveExample("psum", "psum(block, 'x')", psum_kernel, "all-reduce", "combined",
                          lambda n: (2 * n,)),
        CollectiveExample("pmean", "pmean(block, 'x')", pmean_kernel, "all-reduce",
                          "combined", lambda n: (2 * n,)),
        CollectiveExample("all_gather", "all_gather(block, 'x', tiled=False)",
                          all_gather_kernel, "all-gather", "moved", lambda n: (2 * n,)),
        CollectiveExample("all_gather_tiled", "all_gather(block, 'x', tiled=True)",
                          all_gather_tiled_kernel, "all-gather", "moved", lambda n: (2 * n,)),
        CollectiveExample("psum_scatter", "psum_scatter(block, 'x', tiled=False)",
                          psum_scatter_kernel, "reduce-scatter", "combined",
                          lambda n: (n * n,)),
        CollectiveExample("psum_scatter_tiled", "psum_scatter(block, 'x', tiled=True)",
                          psum_scatter_tiled_kernel, "reduce-scatter", "combined",
                          lambda n: (n * n,)),
        CollectiveExample("ppermute", "ppermute(block, 'x', perm=[(i, (i+1) % n)])",
                          ring_shift_kernel, "collective-permute", "moved",
                          lambda n: (2 * n,), ring=True),
        CollectiveExample("all_to_all", "all_to_all(block, 'x', 1, 0, tiled=True)",
                          all_to_all_kernel, "all-to-all", "moved", lambda n: (n, n)),
        CollectiveExample("axis_index", "axis_index('x')", axis_index_kernel, None, "local",
                          lambda n: (2 * n,)),
    )
}
"""The chapter's worked examples, one per collective (all_gather and psum_scatter twice)."""


def example(name: str) -> CollectiveExample:
    """The worked example called ``name``; a clear error listing the names otherwise."""
    return EXAMPLES[checks.one_of("collective example name", name, EXAMPLES)]


# --------------------------------------------------------------------------------------
# Running a kernel: what does every device hold afterwards?
# --------------------------------------------------------------------------------------


def per_device_function(kernel: Kernel, mesh: Mesh, *,
                        axis_name: str = "x") -> Callable:
    """``kernel`` under ``shard_map``; output [d] is device d's result.

    Each device's result gets a new leading axis of size 1, and
    ``out_specs=P(axis_name)`` stacks them: nothing is lost even when
    the devices hold different values. The input is first put in the layout
    ``in_specs`` names (a no-op when it is already there): on Explicit axes
    ``shard_map`` refuses an input laid out otherwise.

    A bare ``AssertionError`` while tracing the kernel (what JAX raises inside ``shard_map``
    for a collective naming an axis the mesh lacks) becomes an error that says so.
    """
    checks.function("kernel", kernel)
    axis_size(mesh, axis_name)

    def one_device(block: jax.Array) -> jax.Array:
        try:
            result = kernel(block, axis_name)
        except AssertionError as error:
            raise checks.InputError(
                f"the kernel {getattr(kernel, '__name__', kernel)!r} failed while being traced "
                f"with a bare AssertionError, which is what JAX raises when a collective names "
                f"an axis the mesh does not have. This mesh has axes "
                f"{tuple(mesh.axis_names)}; use the axis_name argument the kernel receives "
                f"({axis_name!r}) instead of a fixed name.") from error
        return jnp.expand_dims(result, 0)

    mapped = jax.shard_map(one_device, mesh=mesh,
                           in_specs=P(axis_name), out_specs=P(axis_name))
    rows = NamedSharding(mesh, P(axis_name))

    def placed_then_mapped(x: Any) -> jax.Array:
        return mapped(jax.device_put(_array("x", x), rows))

    return placed_then_mapped


def per_device_result(kernel: Kernel, x: Any, mesh: Mesh, *, axis_name: str = "x"
                      ) -> np.ndarray:
    """Run ``kernel`` on each device's block of ``x``; ``result[d]`` is device d's output."""
    checks.function("kernel", kernel)
    placed = _placed(x, mesh, axis_name)
    return np.asarray(_jitted(kernel, mesh, axis_name)(placed))


@lru_cache(maxsize=64)
def _jitted(kernel: Kernel, mesh: Mesh, axis_name: str) -> Callable[[jax.Array], jax.Array]:
    """One jitted per-device function per (kernel, mesh, axis), so a picture reuses the
    program its numbers came from instead of compiling it again."""
    return jax.jit(per_device_function(kernel, mesh, axis_name=axis_name))


def run_example(name: str, mesh: Mesh, *, axis_name: str = "x") -> tuple[np.ndarray, np.ndarray]:
    """``(input, per-device result)`` of the worked example ``name`` on ``mesh``."""
    ex = example(name)
    x = ex.example_input(axis_size(mesh, axis_name))
    return x, per_device_result(ex.kernel, x, mesh, axis_name=axis_name)


# --------------------------------------------------------------------------------------
# Pictures: what each device holds, before and after
# --------------------------------------------------------------------------------------


def example_panels(name: str, mesh: Mesh, *, axis_name: str = "x") -> list[Panel]:
    """The before/after panels of the worked example ``name``, values computed on ``mesh``.

    Before: each device's input block, in its own colour. After: what each device holds,
    coloured by where each value came from. For collectives that only move data, the origin
    of every value is found by running the same kernel on an array that holds each block's
    device index -- the values land exactly where the data lands.
    """
    ex = example(name)
    n = axis_size(mesh, axis_name)
    x, result = run_example(name, mesh, axis_name=axis_name)
    before = blocks(x, n)
    if ex.movement == "moved":
        marks = np.broadcast_to(np.arange(n, dtype=np.float32).reshape(
            (n,) + (1,) * (x.ndim)), before.shape).reshape(x.shape)
        origins = per_device_result(ex.kernel, marks, mesh, axis_name=axis_name).astype(int)
    elif ex.movement == "combined":
        origins = np.full(result.shape, COMBINED)
    else:
        origins = np.broadcast_to(
            np.arange(n).reshape((n,) + (1,) * (result.ndim - 1)), result.shape)
    return [dataclasses.replace(panel, caption=flat_caption(panel.values[0]))
            for panel in before_after(before, result, origins)]


def flat_caption(block: Any) -> str:
    """A panel's caption for one device's ``block``: ``"each device: f32[1,8]"``.

    A panel draws each device's block as one row of cells; a block that is not a row (a column
    such as ``f32[8,1]``, or a matrix) says that it is drawn as one.
    """
    block = np.asarray(block)
    caption = f"each device: {shape_label(block)}"
    if any(size > 1 for size in block.shape[:-1]):
        caption += ", drawn as a row"
    return caption


def draw_collective(name: str, mesh: Mesh, *, axis_name: str = "x", **options: Any) -> Any:
    """The before/after picture of the worked example ``name`` (options go to draw_panels)."""
    ex = example(name)
    n = axis_size(mesh, axis_name)
    sends = ex.arrows(n)
    options.setdefault("title", f"jax.lax.{ex.call}")
    options.setdefault("alt", f"jax.lax.{ex.call} on {n} devices: each device's block before, "
                       "then what each device holds after, coloured by the device each value "
                       "came from" + (" (white: summed over all devices)"
                                      if ex.movement == "combined" else "") + ".")
    return draw_panels(example_panels(name, mesh, axis_name=axis_name),
                       arrows=[sends or None], gap_labels=[ex.hlo_op or "no communication"],
                       **options)


# --------------------------------------------------------------------------------------
# What the compiler makes of each collective
# --------------------------------------------------------------------------------------


def hlo_rows(mesh: Mesh, *, axis_name: str = "x") -> list[dict[str, Any]]:
    """One row per worked example: its HLO collectives, their count and bytes per device.

    Counts and bytes come from the compiled program (:mod:`spmd_guide.core.hlo`): ``buffer`` is
    the array the ring model charges, ``B`` its bytes, ``n`` the devices in the collective's
    group and ``sent`` the bytes one device sends (:func:`spmd_guide.core.hlo.ring_bytes`).
    """
    rows = []
    for name, ex in EXAMPLES.items():
        x = _placed(ex.example_input(axis_size(mesh, axis_name)), mesh, axis_name)
        ops = hlo.collectives(_jitted(ex.kernel, mesh, axis_name), x)
        counts = {kind: sum(op.kind == kind for op in ops) for kind in hlo.KINDS}
        counts = {kind: count for kind, count in counts.items() if count}
        rows.append({
            "example": name,
            "HLO op": ", ".join(counts) or "(none)",
            "count": sum(counts.values()),
            "buffer": "; ".join(op.shape_text.replace(" x ", "×") for op in ops) or "-",
            "B": sum(op.buffer_bytes for op in ops),
            "n": ", ".join(str(op.group_size) for op in ops) or "-",
            "sent": sum(op.bytes_sent for op in ops),
        })
    return rows


def ring_scaling(kernel: Kernel, *, block_elements: int, device_counts: Sequence[int],
                 axis_name: str = "x") -> list[dict[str, Any]]:
    """Bytes one device sends for ``kernel`` on float32 blocks of ``block_elements``, as the
    number of devices grows (meshes over the first k devices, Auto axes)."""
    checks.function("kernel", kernel)
    block_elements = checks.count("block_elements", block_elements)
    available = len(jax.devices())
    device_counts = checks.counts("device_counts", device_counts)
    if not isinstance(axis_name, str) or not axis_name:
        raise checks.InputTypeError(f"axis_name must be a non-empty string, got {axis_name!r}.")
    rows = []
    for k in device_counts:
        if not 1 <= k <= available:
            raise checks.InputError(
                f"cannot build a mesh of {k} devices: this process has {available}.")
        mesh = jax.make_mesh((k,), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,),
                             devices=jax.devices()[:k])
        x = _placed(np.zeros(k * block_elements, np.float32), mesh, axis_name)
        ops = hlo.collectives(per_device_function(kernel, mesh, axis_name=axis_name), x)
        buffer = sum(op.buffer_bytes for op in ops)
        sent = sum(op.bytes_sent for op in ops)
        rows.append({"devices": k, "B": hlo.format_bytes(buffer),
                     "bytes sent per device": sent,
                     "sent / B": round(sent / buffer, 4) if buffer else 0.0})
    return rows
