"""The Part VIII transformer priced per strategy (the page "Pricing the transformer" of Part
V): one training step of each strategy compiled at a size worth pricing, on
``jax.ShapeDtypeStruct``s laid out as the strategy lays out real arrays. Nothing is run; the
counts feed :func:`spmd_guide.rooflines.roofline_pages.predict_strategies`.

It lives with the transformer, not with the rooflines, because it needs both: the rooflines
topic comes earlier in the book and imports no later topic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from spmd_guide.core import checks, hlo
from spmd_guide.rooflines import roofline
from spmd_guide.transformer import transformer

#: The transformer the page prices: GPT-2-medium widths, two of its blocks, a 2048-token
#: context (per-block counts scale with the layers; compile time does not).
LM_CONFIG = dict(vocab=32768, d_model=1024, n_heads=16, d_ff=4096, n_layers=2, seq_len=2048)
LM_BATCH = 16


def transformer_counts(name: str, *, batch: int = LM_BATCH,
                       devices: Sequence[jax.Device] | None = None,
                       **config: int) -> roofline.Counts:
    """Per-device counts of one training step (loss and gradient) of the Part VIII strategy
    ``name`` on a transformer of ``config`` (default :data:`LM_CONFIG`), compiled on
    ``jax.ShapeDtypeStruct``s laid out as the strategy lays them out; nothing is run."""
    checks.one_of("strategy", name, transformer.STRATEGIES)
    batch = checks.count("batch", batch)
    config = transformer.Config(**(LM_CONFIG | config))
    return _transformer_counts(name, config, batch,
                               tuple(jax.devices() if devices is None else devices))


@functools.cache
def _transformer_counts(name: str, config: Any, batch: int,
                        devices: tuple[jax.Device, ...]) -> roofline.Counts:
    strategy = transformer.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    shapes = jax.eval_shape(functools.partial(transformer.init_params, config=config),
                            jax.random.key(0))
    params = jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=sharding), shapes, strategy.shardings(shapes, mesh))
    tokens = jax.ShapeDtypeStruct((batch, config.seq_len + 1), jnp.int32,
                                  sharding=jax.sharding.NamedSharding(mesh, strategy.token_spec()))
    step = jax.jit(jax.value_and_grad(strategy.loss(mesh, config)))
    return roofline.counts(step.lower(params, tokens).compile(hlo.FAST_COMPILE))


def transformer_big_arrays(*, batch: int = LM_BATCH, n_devices: int = 8,
                           **config: int) -> dict[str, int]:
    """Bytes per device (float32) of the two largest activations of plain attention and the
    output head, whatever the strategy: every strategy of Part VIII splits the batch, the
    heads or the sequence ``n_devices`` ways. One layer's attention scores are
    ``batch x heads x seq x seq``; the logits ``batch x seq x vocab``."""
    c = LM_CONFIG | config
    batch = checks.count("batch", batch)
    n = checks.count("n_devices", n_devices)
    return {"attention scores, one layer": 4 * batch * c["n_heads"] * c["seq_len"] ** 2 // n,
            "logits": 4 * batch * c["seq_len"] * c["vocab"] // n}
