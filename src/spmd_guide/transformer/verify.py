"""Each strategy of :mod:`spmd_guide.transformer.transformer` checked against the one-device
model, for the pages' tables: loss and gradients against ``lm_loss``, where the gradients
land without ``out_shardings``, the collectives of the pinned program, each parameter's
``PartitionSpec``, and the textbook formula for the bytes sent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.transformer import breakdown
from spmd_guide.transformer.lm import Config, Params, check_params, check_tokens, config_of, lm_loss
from spmd_guide.transformer.transformer import STRATEGIES, Strategy, _check_sizes, _strategy

__all__ = ["StrategyCheck", "check_strategy", "predicted_comm_bytes", "rounding_words",
           "spec_table"]


def _spec_text(spec: P) -> str:
    return "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"


class StrategyCheck(dict):
    """A row of :func:`check_strategy` (a plain dict to display) that also keeps the compiled
    program's text (``.hlo``, for :func:`collective_breakdown`), the two losses as floats
    (``.loss``, ``.ref_loss``) and, per gradient leaf, whether it came back in its
    parameter's layout from a jit with no ``out_shardings`` (``.unpinned_in_layout``)."""

    hlo: str = ""
    loss: float = 0.0
    ref_loss: float = 0.0
    unpinned_in_layout: tuple[bool, ...] = ()


@functools.cache
def _reference_grad(config: Config) -> Callable[..., Any]:
    """``lm_loss`` and its gradient, jitted once per config (so pages compile it once)."""
    return jax.jit(jax.value_and_grad(functools.partial(lm_loss, config=config)),
                   compiler_options=hlo.FAST_COMPILE)


def _in_layout(grads: Params, params: Params) -> tuple[bool, ...]:
    return tuple(g.sharding.is_equivalent_to(p.sharding, g.ndim)
                 for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(params), strict=True))


def check_strategy(strategy: Strategy, mesh: Mesh, config: Config, params: Params,
                   tokens: jax.Array) -> StrategyCheck:
    """Compile the strategy's loss-and-gradient; compare with ``lm_loss`` on one device and
    read its collectives. One row of the pages' tables. ``mesh`` may have Auto or Explicit
    axes.

    The program is first compiled with no ``out_shardings``: the column "unpinned grads in
    param layout" counts the gradient leaves that come back in their parameter's layout all
    the same. Where some do not (ZeRO's gradients on Auto axes, which the compiler is free
    to return replicated), the row's loss, gradients, collectives and bytes are those of the
    program with the gradients pinned to the parameters' shardings, as :func:`train_step`
    compiles it; where all do, the two programs are one.
    """
    strategy = _strategy(strategy)
    strategy.check(config, mesh)
    check_params(params, config)
    tokens = check_tokens(tokens, config)
    ref_loss, ref_grads = _reference_grad(config)(params, tokens)
    sp, st = strategy.shard(params, tokens, mesh)
    value_and_grad = jax.value_and_grad(strategy.loss(mesh, config))
    compiled = hlo.compile(jax.jit(value_and_grad), sp, st, compiler_options=hlo.FAST_COMPILE)
    loss, grads = compiled(sp, st)
    unpinned = _in_layout(grads, sp)
    if not all(unpinned):
        pinned = jax.jit(value_and_grad, out_shardings=(NamedSharding(mesh, P()),
                                                        strategy.shardings(params, mesh)))
        compiled = hlo.compile(pinned, sp, st, compiler_options=hlo.FAST_COMPILE)
        loss, grads = compiled(sp, st)
        if not all(_in_layout(grads, sp)):  # out_shardings is a promise; check it held
            raise AssertionError(f"{strategy.name}: pinned gradients left their layouts")
    text = compiled.as_text()
    ops = breakdown.collectives(text)
    kinds: dict[str, int] = {}
    for op in ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    grad_err = max(float(np.max(np.abs(np.asarray(g) - np.asarray(r))))
                   for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads),
                                   strict=True))
    row = StrategyCheck({
            "strategy": strategy.name,
            "mesh": " x ".join(f"{k}={v}" for k, v in mesh.shape.items()),
            "|loss - ref|": f"{abs(float(loss) - float(ref_loss)):.1e}",
            "max |grad - ref|": f"{grad_err:.1e}",
            "unpinned grads in param layout": f"{sum(unpinned)}/{len(unpinned)}",
            "collectives": ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "none",
            "bytes sent": sum(op.bytes_sent for op in ops)})
    row.hlo = text
    row.loss, row.ref_loss = float(loss), float(ref_loss)
    row.unpinned_in_layout = unpinned
    return row


def rounding_words(rows: Sequence[StrategyCheck]) -> str:
    """A sentence on the largest loss difference among :func:`check_strategy` rows, in units
    of the gap between neighbouring float32 numbers at the reference loss (so a reader sees
    it is rounding), or that every loss is exact."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise checks.InputTypeError(
            f"rows must be a list of check_strategy rows, got {checks.value_text(rows)}.")
    rows = list(rows)
    if not rows or not all(isinstance(r, StrategyCheck) for r in rows):
        raise checks.InputTypeError("rows must be a non-empty list of check_strategy rows.")
    worst = max(rows, key=lambda r: abs(r.loss - r.ref_loss))
    diff = abs(worst.loss - worst.ref_loss)
    if diff == 0:
        return "Here every strategy's loss equals the one-device loss exactly."
    gap = float(np.spacing(np.float32(worst.ref_loss)))
    steps = round(diff / gap)
    times = "exactly that gap" if steps == 1 else f"{steps} times that gap"
    return (f"The largest loss difference, {worst['strategy']}'s, is {diff:.1e}; float32 "
            f"numbers near its loss of {worst.ref_loss:.2f} are {gap:.1e} apart, so the "
            f"difference is {times}: rounding in the last bits, not a different computation.")


def spec_table(params: Params, meshes: dict[str, Mesh]) -> list[dict[str, str]]:
    """Rows: one per parameter of the first block and the embeddings, one column per
    strategy giving that parameter's ``PartitionSpec``. ``meshes`` maps strategy names to
    their meshes."""
    config_of(params)
    if not isinstance(meshes, dict) or not meshes:
        raise checks.InputTypeError(
            f"meshes must be a dict such as {{'tp': mesh}} from strategy names to meshes, got "
            f"{checks.value_text(meshes)}.")
    for name, mesh in meshes.items():
        checks.one_of("strategy", name, STRATEGIES)
        checks.mesh_axes(f"meshes[{name!r}]", mesh, STRATEGIES[name].axes,
                         why=f"(strategy {name!r} splits over them)")
    leaves = jax.tree_util.tree_leaves_with_path(params)
    specs = {name: jax.tree.leaves(STRATEGIES[name].param_specs(params, mesh))
             for name, mesh in meshes.items()}
    rows = []
    for i, (path, _) in enumerate(leaves):
        key = jax.tree_util.keystr(path)
        if "[1]" in key or any(f"[{j}]" in key for j in range(2, 64)):
            continue  # later blocks repeat block 0
        rows.append({"parameter": key.replace("['blocks'][0]", "block.")
                     .replace("['", "").replace("']", "")}
                    | {name: _spec_text(s[i]) for name, s in specs.items()})
    return rows


def predicted_comm_bytes(strategy: Strategy, mesh: Mesh, config: Config, params: Params,
                         batch: int) -> dict[str, int]:
    """Bytes one device sends in a forward + backward pass, by the textbook formula (ring
    model), split into parameter/gradient traffic and activation traffic.

    ``P`` = parameter bytes, ``A = batch * seq_len * d_model * 4`` the residual stream,
    ``L`` layers. dp: all-reduce grads, ``2 (n-1)/n P``. fsdp: all-gather params once and
    reduce-scatter grads, ``2 (n-1)/n P``. tp and tp_sp: four all-reduces (or all-gather +
    reduce-scatter pairs, the same bytes) of ``A`` per layer, ``4 L 2 (m-1)/m A``. cp:
    ``n - 1`` sends of the local K and V blocks per layer forward and as many of their
    gradients backward, ``4 L (n-1) A / n``, plus the dp all-reduce of the grads. fsdp_tp:
    the fsdp term on ``P / m`` and the tp term on ``A / d``.
    """
    strategy, batch = _check_sizes(strategy, mesh, config, params, batch)
    size = dict(mesh.shape)
    p = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))
    a = batch * config.seq_len * config.d_model * 4
    d = size.get("data", 1)
    m = size.get("model", 1)
    s = size.get("seq", 1)
    grads = 2 * (d - 1) * p // d if strategy.fsdp or "data" in strategy.axes else 0
    if strategy.tensor:
        grads //= m
        acts = 4 * config.n_layers * 2 * (m - 1) * (a // d) // m
    elif strategy.ring:
        grads = 2 * (s - 1) * p // s
        acts = 4 * config.n_layers * (s - 1) * a // s
    else:
        acts = 0
    return {"parameters and gradients": grads, "activations": acts, "total": grads + acts}
