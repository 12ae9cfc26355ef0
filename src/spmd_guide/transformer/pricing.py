"""The Part IX transformer priced per strategy (the page "Pricing the transformer" of Part
V): one training step of each strategy compiled at a size worth pricing, on
``jax.ShapeDtypeStruct``s laid out as the strategy lays out real arrays. Nothing is run; the
counts feed :func:`spmd_guide.rooflines.strategies.predict_strategies`.

It lives with the transformer, not with the rooflines, because it needs both: the rooflines
topic comes earlier in the book and imports no later topic.

Arguments are checked before anything is compiled (:mod:`spmd_guide.core.checks`): strategy
names as whole strings, sizes as positive integers (NumPy integers too), unknown sizes refused.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spmd_guide.core import checks, hlo
from spmd_guide.rooflines import hardware, roofline
from spmd_guide.transformer import lm, transformer

#: The transformer the page prices: GPT-2-medium widths, two of its blocks, a 2048-token
#: context (per-block counts scale with the layers; compile time does not).
LM_CONFIG = dict(vocab=32768, d_model=1024, n_heads=16, d_ff=4096, n_layers=2, seq_len=2048)
LM_BATCH = 16


def _sizes(config: dict[str, Any]) -> dict[str, int]:
    """:data:`LM_CONFIG` with ``config``'s sizes, each a positive int; unknown names refused."""
    unknown = sorted(set(config) - set(LM_CONFIG))
    if unknown:
        raise checks.InputError(
            f"unknown transformer size(s) {unknown}; the sizes are {sorted(LM_CONFIG)}.")
    return {key: checks.count(key, value) for key, value in (LM_CONFIG | config).items()}


def transformer_counts(name: str, *, batch: int = LM_BATCH, devices: Any = None,
                       **config: int) -> roofline.Counts:
    """Per-device counts of one training step (loss and gradient) of the Part IX strategy
    ``name`` on a transformer of ``config`` (default :data:`LM_CONFIG`), compiled on
    ``jax.ShapeDtypeStruct``s laid out as the strategy lays them out; nothing is run.

    ``devices``: a list of devices, or a mesh (Auto or Explicit axes) whose devices to use;
    the strategy builds its own mesh over them. Sizes that do not split over that mesh (a
    batch the data axis does not divide, a width the model axis does not) raise
    ``InputError`` naming the size and the axis, before anything is compiled."""
    name = hardware.choice("strategy name", name, transformer.STRATEGIES)
    batch = checks.count("batch", batch)
    config = transformer.Config(**_sizes(config))
    devices = roofline.as_devices(devices)
    _check_layout(name, config, batch, devices)
    return _transformer_counts(name, config, batch, devices)


def _check_layout(name: str, config: Any, batch: int, devices: tuple[jax.Device, ...]) -> None:
    """Every array of strategy ``name``'s step splits evenly over its mesh: the tokens
    ``[batch, seq_len + 1]`` and each parameter (:func:`spmd_guide.core.checks.spec_fits`)."""
    strategy = transformer.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    strategy.loss(mesh, config)  # the strategy's own checks of the config (heads, sequence)
    checks.spec_fits(f"the tokens [batch={batch}, seq_len + 1] of strategy {name!r}",
                     (batch, config.seq_len + 1), strategy.token_spec(), mesh)
    shapes = abstract_params(config)
    paths = jax.tree_util.tree_leaves_with_path(shapes)
    for (path, leaf), sharding in zip(paths, jax.tree.leaves(strategy.shardings(shapes, mesh)),
                                      strict=True):
        checks.spec_fits(f"parameter {jax.tree_util.keystr(path)} of strategy {name!r}",
                         leaf.shape, sharding.spec, mesh)


def abstract_params(config: lm.Config) -> Any:
    """``jax.ShapeDtypeStruct``s shaped as ``init_params(key, config)``'s parameters (the
    tree of :func:`spmd_guide.transformer.lm.param_shapes`, in ``config.dtype``): a model
    of any size, with nothing allocated."""
    config = lm.check_config(config)
    return jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape, jnp.dtype(config.dtype)),
                        lm.param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))


@functools.cache
def _transformer_counts(name: str, config: Any, batch: int,
                        devices: tuple[jax.Device, ...]) -> roofline.Counts:
    strategy = transformer.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    shapes = abstract_params(config)
    params = jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=sharding), shapes, strategy.shardings(shapes, mesh))
    tokens = jax.ShapeDtypeStruct((batch, config.seq_len + 1), jnp.int32,
                                  sharding=jax.sharding.NamedSharding(mesh, strategy.token_spec()))
    step = jax.jit(jax.value_and_grad(strategy.loss(mesh, config)))
    with jax.set_mesh(mesh):  # the strategy's mesh, whatever mesh the caller has set
        compiled = step.lower(params, tokens).compile(hlo.FAST_COMPILE)
    return roofline.counts(compiled)


def transformer_big_arrays(*, batch: int = LM_BATCH, n_devices: int = 8,
                           **config: int) -> dict[str, int]:
    """Bytes per device (float32) of the two largest activations of plain attention and the
    output head, whatever the strategy: every strategy of Part IX splits the batch, the
    heads or the sequence ``n_devices`` ways. One layer's attention scores are
    ``batch x heads x seq x seq``; the logits ``batch x seq x vocab``."""
    c = _sizes(config)
    transformer.Config(**c)  # the same rules as a model of this size (d_model splits into heads)
    batch = checks.count("batch", batch)
    n = checks.count("n_devices", n_devices)
    scores = 4 * batch * c["n_heads"] * c["seq_len"] ** 2
    logits = 4 * batch * c["seq_len"] * c["vocab"]
    checks.divisible("batch x n_heads x seq_len^2", scores // 4, n,
                     why="over the devices (n_devices)")
    checks.divisible("batch x seq_len x vocab", logits // 4, n,
                     why="over the devices (n_devices)")
    return {"attention scores, one layer": scores // n, "logits": logits // n}
