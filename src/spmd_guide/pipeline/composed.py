"""Expert parallelism composed with data parallelism: one MoE layer on a ``(data, expert)``
mesh.

:func:`~spmd_guide.pipeline.moe.moe_layer` splits tokens and experts over one axis. Here the
tokens are split over *both* axes (every device holds its own tokens), the experts over the
``expert`` axis only, and each expert's weights are replicated along ``data``. A device's
all-to-alls stay inside its ``expert`` group (the devices that share its ``data`` index, and
between them hold every expert); only the small routing counts and the statistics cross the
``data`` axis, since the drop rule counts over the whole batch
(:mod:`spmd_guide.pipeline.moe`'s docstring). So the layer equals
:func:`~spmd_guide.pipeline.moe.reference_moe` on any ``data x expert`` mesh; in training, the
gradients of the replicated expert weights are summed over ``data``, as in data parallelism.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.pipeline import moe


def _axes(mesh: Mesh, data_axis: Any, expert_axis: Any) -> tuple[int, int]:
    checks.mesh("mesh", mesh)
    d = checks.axis(mesh, data_axis, name="data_axis")
    e = checks.axis(mesh, expert_axis, name="expert_axis")
    if data_axis == expert_axis:
        raise checks.InputError(
            f"data_axis and expert_axis must be two different mesh axes, both are "
            f"{data_axis!r}; for the expert axis alone use moe.moe_layer.")
    if any(t == AxisType.Manual for t in mesh.axis_types):
        raise checks.InputError("mesh has Manual axes: call the layer outside shard_map, on a "
                                "mesh of Auto or Explicit axes.")
    return d, e


def specs(data_axis: str = "data", expert_axis: str = "expert") -> dict[str, P]:
    """Where each array lives: the router replicated, the experts split over
    ``expert_axis`` (replicated along ``data_axis``), the tokens over both."""
    tokens = P((data_axis, expert_axis))
    return {"router": P(), "w_in": P(expert_axis), "w_out": P(expert_axis), "x": tokens}


def moe_layer_2d(params: moe.Params, x: jax.Array, mesh: Mesh, *, data_axis: str = "data",
                 expert_axis: str = "expert", top_k: int,
                 capacity_factor: float) -> tuple[jax.Array, moe.Stats]:
    """The MoE layer with tokens split over ``data_axis`` and ``expert_axis`` together and
    experts over ``expert_axis``. Returns ``(y, stats)`` equal to
    :func:`~spmd_guide.pipeline.moe.reference_moe`; ``y`` comes back split like ``x``
    (``P((data_axis, expert_axis))``), ``stats`` replicated. Works on Auto and Explicit
    axes; the inputs are laid out as the layer needs, wherever they are."""
    top_k, capacity_factor = moe._check(params, x, top_k, capacity_factor)
    d, e = _axes(mesh, data_axis, expert_axis)
    tokens, n_experts = x.shape[0], params["router"].shape[1]
    checks.divisible("the number of tokens (dimension 0 of x)", tokens, d * e,
                     why=f"over mesh axes {data_axis!r} x {expert_axis!r} ({d} x {e} devices)")
    checks.divisible("n_experts", n_experts, e, why=f"over mesh axis {expert_axis!r}")
    cap = moe.capacity(tokens, top_k=top_k, n_experts=n_experts,
                       capacity_factor=capacity_factor)
    slots = min(cap, tokens // (d * e))  # one device may fill an expert's whole capacity
    args = (params["router"], params["w_in"], params["w_out"], x)
    fast = not any(checks.is_traced(a) for a in args)  # compile options: top-level jit only
    layer = _program(mesh, data_axis, expert_axis, top_k=top_k, cap=cap, slots=slots,
                     tokens=tokens, fast=fast)
    return layer(*args)


@functools.cache
def _program(mesh: Mesh, data_axis: str, expert_axis: str, *, top_k: int, cap: int,
             slots: int, tokens: int, fast: bool) -> Any:
    """The jitted ``shard_map`` of moe's per-device layer, built once per configuration;
    ``fast``: compiled without LLVM's code optimization (for a call on concrete arrays,
    where compile time is what counts; a jit with compiler options cannot be nested)."""
    both = (data_axis, expert_axis)
    body = functools.partial(moe._local_layer, axis_name=expert_axis, token_axes=both,
                             top_k=top_k, cap=cap, slots=slots, tokens=tokens)
    s = specs(data_axis, expert_axis)
    in_specs = (s["router"], s["w_in"], s["w_out"], s["x"])
    stat_specs = {"tokens_per_expert": P(), "dropped": P(), "aux_loss": P(), "kept": s["x"]}
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=(s["x"], stat_specs))

    def layer(*args: jax.Array) -> tuple[jax.Array, moe.Stats]:
        return mapped(*(jax.device_put(a, NamedSharding(mesh, spec))
                        for a, spec in zip(args, in_specs, strict=True)))

    return jax.jit(layer, compiler_options=hlo.FAST_COMPILE if fast else None)


def init_moe_stack(key: Any, *, n_layers: int, d_model: int, d_ff: int,
                   n_experts: int) -> list[moe.Params]:
    """``n_layers`` MoE layers (:func:`~spmd_guide.pipeline.moe.init_moe` each)."""
    key = checks.key("key", key)
    n_layers = checks.count("n_layers", n_layers)
    return [moe.init_moe(k, d_model=d_model, d_ff=d_ff, n_experts=n_experts)
            for k in jax.random.split(key, n_layers)]


def moe_stack(layers: Sequence[moe.Params], x: jax.Array, mesh: Mesh | None = None, *,
              top_k: int, capacity_factor: float, data_axis: str = "data",
              expert_axis: str = "expert") -> tuple[jax.Array, jax.Array]:
    """A stack of MoE layers with residual connections, ``x = x + layer(x)`` for each, and
    the mean of their load-balancing losses. With ``mesh=None`` every layer is
    :func:`~spmd_guide.pipeline.moe.reference_moe` (one device); with a mesh, every layer is
    :func:`moe_layer_2d` over ``data_axis`` x ``expert_axis``, equal to the former."""
    if isinstance(layers, dict) or not isinstance(layers, Sequence) or not layers:
        raise checks.InputTypeError(
            f"layers must be a non-empty list of MoE layers (init_moe_stack returns one), got "
            f"{checks.value_text(layers)}.")
    if mesh is None:
        layer = functools.partial(moe.reference_moe, top_k=top_k,
                                  capacity_factor=capacity_factor)
    else:
        layer = functools.partial(moe_layer_2d, mesh=mesh, data_axis=data_axis,
                                  expert_axis=expert_axis, top_k=top_k,
                                  capacity_factor=capacity_factor)
    aux = []
    for params in layers:
        y, stats = layer(params, x)
        x = x + y
        aux.append(stats["aux_loss"])
    return x, jnp.mean(jnp.stack(aux))
