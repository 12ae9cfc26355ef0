"""Memory per device of the transformer's strategies: a formula beside the compiled step.

:func:`predicted_bytes` adds up parameters, gradients, AdamW state and the activations the
backward pass keeps (:func:`kept_per_token`), each divided by the devices its layout splits
it over; :func:`memory_row` puts that beside the compiled training step's memory analysis
(``memory_analysis()``); :func:`against_formula` says on which side of the formula each row
falls (transformer/memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.transformer.lm import Config, Params, check_config, check_tokens, config_of
from spmd_guide.transformer.transformer import (
    Strategy,
    Trainer,
    _bytes_per_device,
    _check_sizes,
    _param_bytes,
    _strategy,
    train_step,
)

__all__ = ["against_formula", "kept_per_token", "measured_bytes", "memory_row",
           "predicted_bytes"]


def kept_per_token(config: Config) -> dict[str, int]:
    """Numbers the backward pass keeps per token, by the layout they have (the kinds of
    ``Strategy.activation_specs``, and ``scores``, laid out like ``heads``): in each layer
    ``6 d_model`` on the residual stream (each norm's input, its normalised value and its
    output), ``4 d_model`` per-head (q, k, v and the attention output), ``3 d_ff`` in the MLP
    (its hidden pre-activation, the GELU's inner value and its output) and ``2 heads seq``
    scores (the scores and the softmax weights of each query); once, ``2 vocab`` logits
    (logits and log-probabilities)."""
    c = check_config(config)
    return {"residual": 6 * c.n_layers * c.d_model, "heads": 4 * c.n_layers * c.d_model,
            "hidden": 3 * c.n_layers * c.d_ff, "scores": 2 * c.n_layers * c.n_heads * c.seq_len,
            "logits": 2 * c.vocab}


def _split(spec: P, mesh: Mesh) -> int:
    """How many devices share out an array laid out as ``spec``: the product of the sizes of
    the mesh axes it names."""
    return int(np.prod([mesh.shape[a] for entry in spec for a in checks.spec_axes(entry)]))


def predicted_bytes(strategy: Strategy, mesh: Mesh, config: Config, params: Params,
                    batch: int) -> dict[str, int]:
    """Bytes per device by formula: parameters (each leaf divided by the devices that split
    it), gradients (the same), AdamW state (two moments), and the activations the backward
    pass keeps: :func:`kept_per_token` for every token of the batch, each kind divided by
    the devices its layout in ``strategy.activation_specs()`` splits it over (scores as
    ``heads``). So ``tp`` keeps the residual stream whole and splits the rest over
    ``model``; ``tp_sp`` splits the residual stream over ``model`` by sequence as well, and
    the rest exactly as ``tp`` does (Korthikanti et al. 2022, section 4.2: sequence
    parallelism divides only what tensor parallelism left replicated).

    Ring strategies (``cp``, ``cp_zigzag``) are charged k and v whole along the sequence:
    ring attention's backward pass keeps every K/V block that came round the ring, all
    ``n`` of them on every device (the ring-attention page, "What the backward pass keeps"),
    so only q, the attention output and the rest divide by ``n``."""
    strategy, batch = _check_sizes(strategy, mesh, config, params, batch)
    p = _param_bytes(strategy, mesh, params)
    specs = strategy.activation_specs() | {"scores": strategy.activation_specs()["heads"]}
    itemsize = np.dtype(config.dtype).itemsize
    tokens = batch * config.seq_len
    kept = kept_per_token(config)
    acts = 0
    if strategy.ring:
        kv = 2 * config.n_layers * config.d_model  # k and v: 2 of the 4 per-head numbers
        kept["heads"] -= kv
        whole = P(*(None if e == strategy.seq_axis else e for e in specs["heads"]))
        acts += tokens * kv * itemsize // _split(whole, mesh)
    acts += sum(tokens * n * itemsize // _split(specs[kind], mesh) for kind, n in kept.items())
    return {"parameters": p, "gradients": p, "optimizer state": 2 * p, "activations": acts}


def measured_bytes(trainer: Trainer, params: Params, state: Any, tokens: jax.Array
                   ) -> dict[str, int]:
    """Bytes per device of the compiled training step (``memory_analysis``): parameters and
    optimizer state as held (arguments), and the temporaries (gradients + activations)."""
    if not isinstance(trainer, Trainer):
        raise checks.InputTypeError(
            f"trainer must be what train_step returns, got {checks.value_text(trainer)}.")
    config_of(params)
    checks.same_structure("params", params, trainer.param_shardings,
                          other="the parameters train_step compiled for")
    checks.array_tree("state", state)
    checks.same_structure("state", state, trainer.state_shardings,
                          other="the optimizer state train_step compiled for")
    checks.array("tokens", tokens, ndim=2, dtype_kind="iu")
    mem = hlo.memory_per_device(trainer.step, params, state, tokens)
    return {"parameters": _bytes_per_device(params), "optimizer state": _bytes_per_device(state),
            "arguments": mem.argument_bytes, "temporaries": mem.temp_bytes,
            "peak": mem.peak_bytes}


def memory_row(strategy: Strategy, devices: Sequence[jax.Device], config: Config,
               params: Params, tokens: jax.Array) -> dict[str, Any]:
    """Predicted and measured bytes per device of one donated AdamW training step."""
    strategy = _strategy(strategy)
    mesh = strategy.mesh(devices)
    tokens = check_tokens(tokens, config)
    sp, st = strategy.shard(params, tokens, mesh)
    trainer = train_step(strategy, mesh, config, sp, optimizer=optax.adamw(1e-3))
    state = jax.eval_shape(trainer.init, sp)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         state, trainer.state_shardings)
    mem = hlo.memory_per_device(hlo.compile(trainer.step, sp, state, st,
                                            compiler_options=hlo.FAST_COMPILE))
    pred = predicted_bytes(strategy, mesh, config, params, tokens.shape[0])
    held = _bytes_per_device(sp)
    opt = sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
              for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(trainer.state_shardings),
                              strict=True))
    return {"strategy": strategy.name, "devices": len(devices),
            "params": held, "params (formula)": pred["parameters"],
            "opt state": opt, "opt state (formula)": pred["optimizer state"],
            "grads + activations (formula)": pred["gradients"] + pred["activations"],
            "temporaries (measured)": mem.temp_bytes,
            "arguments (measured)": mem.argument_bytes}


def against_formula(rows: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Which :func:`memory_row` rows the compiled temporaries put ``below`` and which
    ``above`` the formula's gradients + activations (``"tp (8)"``: strategy and device
    count), in the rows' order; equal ones under ``equal``. The memory page's prose names
    them from this, so it cannot disagree with its table."""
    key_f, key_m = "grads + activations (formula)", "temporaries (measured)"
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise checks.InputTypeError(
            f"rows must be a list of memory_row results, got {checks.value_text(rows)}.")
    rows = list(rows)
    if not rows or not all(isinstance(r, dict) and {key_f, key_m, "strategy", "devices"}
                           <= set(r) for r in rows):
        raise checks.InputTypeError("rows must be a non-empty list of memory_row results.")
    sides: dict[str, list[str]] = {"below": [], "above": [], "equal": []}
    for i, r in enumerate(rows):
        for key in (key_f, key_m):
            checks.real(f"rows[{i}][{key!r}]", r[key], minimum=0)
        side = "below" if r[key_m] < r[key_f] else "above" if r[key_m] > r[key_f] else "equal"
        sides[side].append(f"{r['strategy']} ({r['devices']})")
    return sides
