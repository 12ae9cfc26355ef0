"""The book's claims about "the compiler", compiled by XLA:CPU and by XLA:TPU (Part XIV,
tpu/cpu_vs_tpu).

Each probe is one small training computation on a mesh of 8 devices with one axis,
``data``: 8 CPU mock devices for XLA:CPU, a TPU slice's compile-only devices for XLA:TPU.
The same function on the same shapes and layouts goes to both compilers, and
:func:`compare` reads the same fact out of each program: which dtypes the collectives move,
where an accumulation loop's collectives run, how many ops the gradient reduction becomes,
and how many collectives run asynchronously with a matmul in flight.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.core.devices import build_mesh
from spmd_guide.core.hlo_text import parse_module, reachable
from spmd_guide.tpu import schedule
from spmd_guide.tpu.topology import compile_only, tpu_mesh

__all__ = ["CLAIMS", "WEIGHT_SHAPES", "Claim", "compare", "gathers", "overlap_rows",
           "probe_program"]

_WIDTHS = (512, 1024, 1024, 512)
_BATCH = 256
_MICROBATCHES = 4


def _params(mesh: Mesh, spec: P) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct((a, b), jnp.float32, sharding=NamedSharding(mesh, spec))
            for a, b in zip(_WIDTHS[:-1], _WIDTHS[1:], strict=True)]


def _loss(params: list[jax.Array], x: jax.Array, *, dtype: Any = jnp.float32) -> jax.Array:
    h = x.astype(dtype)
    for i, w in enumerate(params):
        h = h @ w.astype(dtype)
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    return jnp.mean(jnp.square(h.astype(jnp.float32)))


def _rows(mesh: Mesh, batch: int = _BATCH) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, _WIDTHS[0]), jnp.float32,
                                sharding=NamedSharding(mesh, P("data")))


def _grad_step(mesh: Mesh, spec: P, *, dtype: Any = jnp.float32, microbatches: int = 1
               ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A gradient step (loss and gradients, the gradients pinned to the parameters'
    layout), over ``microbatches`` accumulated in a ``lax.scan`` when more than one."""
    params = _params(mesh, spec)
    shardings = [p.sharding for p in params]

    def step(params, x):
        if microbatches == 1:
            return jax.value_and_grad(_loss)(params, x, dtype=dtype)
        # Microbatch j takes rows j, j + k, ...: every device keeps its own rows, so the
        # split itself moves nothing.
        chunks = jnp.moveaxis(x.reshape(x.shape[0] // microbatches, microbatches, -1), 1, 0)
        chunks = jax.lax.with_sharding_constraint(chunks, NamedSharding(mesh, P(None, "data")))

        def body(total, chunk):
            loss, grads = jax.value_and_grad(_loss)(params, chunk, dtype=dtype)
            return jax.tree.map(jnp.add, total, (loss, grads)), None

        zero = (jnp.zeros(()), [jnp.zeros(p.shape, p.dtype) for p in params])
        total, _ = jax.lax.scan(body, zero, chunks)
        return total

    fn = jax.jit(step, out_shardings=(NamedSharding(mesh, P()), shardings))
    return fn, (params, _rows(mesh))


def _by_dtype(program: str) -> str:
    kinds: dict[str, set[str]] = {}
    for op in hlo.collectives_in_text(program):
        if op.buffer_bytes >= 1024:  # the weights' and gradients', not the loss's scalar
            kinds.setdefault(op.kind, set()).add(str(op.dtype))
    return "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in sorted(kinds.items())) or "none"


def _loop_computations(program: str) -> set[str]:
    module = parse_module(program)
    inside: set[str] = set()
    for name in reachable(module):
        for i in module.computations[name]:
            if i.opcode == "while":
                body = re.search(r"body=%?([\w.\-]+)", i.attributes)
                if body:
                    sub = hlo_module_from(module, body.group(1))
                    inside |= sub
    return inside


def hlo_module_from(module: Any, root: str) -> set[str]:
    """Names of the computations reachable from ``root`` (itself included)."""
    seen, todo = {root}, [root]
    while todo:
        for i in module.computations[todo.pop()]:
            for called in re.findall(r"%?([\w.\-]+)", i.attributes):
                if called in module.computations and called not in seen:
                    seen.add(called)
                    todo.append(called)
    return seen


#: The probes' weight shapes: a gather whose gathered shape is one of them gathers a weight;
#: any other gathers activations (a batch of rows).
WEIGHT_SHAPES: frozenset[tuple[int, int]] = frozenset(zip(_WIDTHS[:-1], _WIDTHS[1:], strict=True))


def gathers(shape: tuple[int, ...] | str) -> str:
    """``"weight"`` if a gather's full (gathered) ``shape`` is a probe's weight shape,
    ``"activations"`` otherwise. ``shape`` may be HLO text such as ``"bf16[1024,512]"``."""
    if isinstance(shape, str):
        dims = re.search(r"\[([\d,]*)\]", shape)
        if dims is None:
            raise checks.InputError(f"shape={shape!r} is not an HLO shape such as 'f32[8,4]'.")
        shape = tuple(int(d) for d in dims.group(1).split(",") if d)
    return "weight" if tuple(shape) in WEIGHT_SHAPES else "activations"


def _gathers_in_loop(program: str) -> str:
    """Where an accumulation loop's all-gathers run, weights and activations apart."""
    inside = _loop_computations(program)
    ops = [op for op in hlo.collectives_in_text(program) if op.kind == "all-gather"
           and op.buffer_bytes >= 1024]
    parts = []
    for what in ("weight", "activations"):
        mine = [op for op in ops if gathers(op.shape) == what]
        n_in = sum(op.computation in inside for op in mine)
        parts.append(f"{what} gathers: {n_in} in the loop, {len(mine) - n_in} outside")
    return "; ".join(parts)


def _in_loop(program: str, kind: str) -> str:
    inside = _loop_computations(program)
    ops = [op for op in hlo.collectives_in_text(program) if op.kind == kind
           and op.buffer_bytes >= 1024]
    n_in = sum(op.computation in inside for op in ops)
    return f"{n_in} in the loop, {len(ops) - n_in} outside"


def _reductions(program: str) -> str:
    ops = [op for op in hlo.collectives_in_text(program)
           if op.kind in ("all-reduce", "reduce-scatter")]
    arrays = sum(len(op.buffers) for op in ops)
    return f"{len(ops)} op(s) for {arrays} array(s)"


def _overlap(program: str) -> str:
    s = schedule.overlap_summary(program)
    return (f"{s['overlapped with a matmul']} of {s['collectives']} overlap a matmul "
            f"({s['with a matmul fused into the transfer']} fused with one)")


@dataclass(frozen=True)
class Claim:
    """A claim the book makes about what the compiler does, and the probe that tests it."""

    key: str
    claim: str
    where: str
    spec: P
    dtype: Any
    microbatches: int
    read: Callable[[str], str]


CLAIMS: tuple[Claim, ...] = (
    Claim("mixed_precision", "bf16 compute: the collectives move float32 weights and gradients",
          "flax_nnx/training (mixed precision)", P("data", None), jnp.bfloat16, 1, _by_dtype),
    Claim("accumulation_dp", "accumulation (dp): each microbatch reduces its gradient in the loop",
          "flax_nnx/training (accumulation)", P(), jnp.float32, _MICROBATCHES,
          lambda t: _in_loop(t, "all-reduce")),
    Claim("accumulation_fsdp", "accumulation (fsdp): the weight gathers are hoisted out of the loop",
          "flax_nnx/training (accumulation)", P("data", None), jnp.float32, _MICROBATCHES,
          _gathers_in_loop),
    Claim("combining", "dp: every gradient's reduction is combined into one op",
          "flax_nnx/training, profiling/tracing", P(), jnp.float32, 1, _reductions),
    Claim("async", "collectives block: no -start/-done pairs, no overlap with compute",
          "automatic/computation_follows_sharding, profiling/tracing", P("data", None),
          jnp.float32, 1, _overlap),
)


def probe_program(claim: Claim | str, mesh: Mesh, *,
                  compiler_options: dict[str, Any] | None = None) -> str:
    """The compiled program (HLO text) of ``claim``'s probe on ``mesh`` (one axis ``data``),
    with ``compiler_options`` for XLA (``{"xla_tpu_...": False}``)."""
    if isinstance(claim, str):
        claim = checks.one_of("claim", claim, {c.key: c for c in CLAIMS})
        claim = next(c for c in CLAIMS if c.key == claim)
    checks.mesh_axes("mesh", mesh, ("data",))
    fn, args = _grad_step(mesh, claim.spec, dtype=claim.dtype, microbatches=claim.microbatches)
    options = dict(compiler_options or {})
    for key in options:
        checks.text("a compiler option's name", key)
    return compile_only(fn.trace(*args).lower(), options).as_text()


def overlap_rows(program: str) -> list[dict[str, Any]]:
    """:func:`spmd_guide.tpu.schedule.async_collectives` of a probe's program, each row with
    what its collective carries: a weight or activations (for a gather, by
    :func:`gathers`), gradients (for a reduction of more than a scalar), else ``"-"``."""
    rows = []
    for o in schedule.async_collectives(program):
        row = o.row()
        big = o.buffer and not o.buffer.endswith("[]")
        row["carries"] = (gathers(o.buffer) if o.kind == "all-gather" and big else
                          "gradients" if o.kind in ("all-reduce", "reduce-scatter") and big
                          else "-")
        rows.append(row)
    return rows


def compare(topology: str = "v5e:2x4", *, cpu_devices: Any = None) -> list[dict[str, str]]:
    """One row per claim of :data:`CLAIMS`: what XLA:CPU's program shows (on 8 CPU devices)
    and what XLA:TPU's shows (on the slice ``topology``, 8 devices)."""
    tpu = tpu_mesh(topology, (8,), ("data",), axis_types=(AxisType.Auto,))
    cpu = build_mesh((8,), ("data",), devices=cpu_devices)
    rows = []
    for claim in CLAIMS:
        rows.append({"claim (as the book words it)": claim.claim, "page": claim.where,
                     "XLA:CPU": claim.read(probe_program(claim, cpu)),
                     f"XLA:TPU ({topology})": claim.read(probe_program(claim, tpu))})
    return rows
