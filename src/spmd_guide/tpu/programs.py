"""Every training strategy compiled by XLA:TPU for a slice you do not have: its collectives,
its memory against the chip's HBM, and XLA:TPU's own cost analysis (Part XIV,
tpu/compiling).

A strategy's training step is compiled on ``jax.ShapeDtypeStruct`` s laid out as the strategy
lays out real arrays, on a mesh over the compile-only devices of
:func:`spmd_guide.tpu.topology.topology_devices`; nothing is allocated or run. The
transformer's step is Part IX's ``train_step`` (AdamW, outputs pinned to their inputs'
layouts, inputs donated); the MLP's is Part IV's ``sgd_step``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from spmd_guide.core import checks, hlo
from spmd_guide.nn import STRATEGIES as NN_STRATEGIES
from spmd_guide.rooflines import hardware
from spmd_guide.transformer import lm, pricing, transformer
from spmd_guide.tpu.topology import chip_key, topology_devices

__all__ = ["FAMILIES", "MLP_SIZES", "TRANSFORMER", "Program", "compile_strategy",
           "collective_rows", "memory_row", "cost_row"]

#: The transformer Part XIV compiles by default: wide enough that its AdamW state decides
#: whether a strategy fits a 16 GB v5e chip, two blocks deep so that a compile stays short.
TRANSFORMER = dict(vocab=32768, d_model=4096, n_heads=32, d_ff=16384, n_layers=2,
                   seq_len=1024)
TRANSFORMER_BATCH = 8
#: Part IV's MLP, at widths worth a TPU: [batch 1024] x 4096 -> 8192 -> 8192 -> 4096.
MLP_SIZES = (4096, 8192, 8192, 4096)
MLP_BATCH = 1024

FAMILIES = ("transformer", "mlp")


@dataclass(frozen=True)
class Program:
    """One strategy's training step compiled by XLA:TPU for one slice."""

    family: str
    strategy: str
    topology: str
    chip: str
    compiled: jax.stages.Compiled

    @functools.cached_property
    def collectives(self) -> list[hlo.Collective]:
        return hlo.collectives_in_text(self.compiled.as_text())

    @functools.cached_property
    def memory(self) -> hlo.MemoryStats:
        return hlo._memory(self.compiled)


def _sds(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def compile_strategy(family: str, strategy: str, topology: str, *,
                     compiler_options: dict[str, Any] | None = None,
                     **sizes: int) -> Program:
    """Compile ``strategy`` of ``family`` (``"transformer"``: Part IX's ``STRATEGIES``;
    ``"mlp"``: Part IV's) for every device of the TPU slice ``topology``.

    ``sizes`` override :data:`TRANSFORMER` (and ``batch``) or, for the MLP, ``batch``.
    ``compiler_options`` go to XLA:TPU (``{"xla_tpu_...": ...}``)."""
    family = hardware.choice("family", family, FAMILIES)
    options = dict(compiler_options or {})
    for key in options:
        checks.text("a compiler option's name", key)
    devices = topology_devices(topology)
    if family == "transformer":
        name = hardware.choice("strategy", strategy, transformer.STRATEGIES)
        compiled = _transformer_step(name, tuple(devices), tuple(sorted(sizes.items())),
                                     tuple(sorted(options.items())))
    else:
        name = hardware.choice("strategy", strategy, [s for s in NN_STRATEGIES if s != "single"])
        unknown = sorted(set(sizes) - {"batch", "widths"})
        if unknown:
            raise checks.InputError(f"the MLP takes only batch= and widths=, got {unknown}.")
        batch = checks.count("batch", sizes.get("batch", MLP_BATCH))
        widths = checks.counts("widths", sizes.get("widths", MLP_SIZES), min_length=2)
        compiled = _mlp_step(name, tuple(devices), batch, widths,
                             tuple(sorted(options.items())))
    return Program(family, name, topology, chip_key(devices), compiled)


@functools.cache
def _transformer_step(name: str, devices: tuple[jax.Device, ...], sizes: tuple, options: tuple
                      ) -> jax.stages.Compiled:
    sizes = dict(sizes)
    batch = checks.count("batch", sizes.pop("batch", TRANSFORMER_BATCH))
    config = transformer.Config(**pricing._sizes(TRANSFORMER | sizes))
    strategy = transformer.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    pricing._check_layout(name, config, batch, devices)
    shapes = pricing.abstract_params(config)
    trainer = transformer.train_step(strategy, mesh, config, shapes, optimizer=lm.optimizer())
    params = _sds(shapes, trainer.param_shardings)
    state = _sds(jax.eval_shape(trainer.init, params), trainer.state_shardings)
    tokens = jax.ShapeDtypeStruct((batch, config.seq_len + 1), jnp.int32,
                                  sharding=NamedSharding(mesh, strategy.token_spec()))
    with jax.set_mesh(mesh):
        return trainer.step.trace(params, state, tokens).lower().compile(dict(options) or None)


@functools.cache
def _mlp_step(name: str, devices: tuple[jax.Device, ...], batch: int,
              widths: tuple[int, ...], options: tuple) -> jax.stages.Compiled:
    strategy = NN_STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    shapes = [(jax.ShapeDtypeStruct((a, b), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.float32))
              for a, b in zip(widths[:-1], widths[1:], strict=True)]
    params = _sds(shapes, strategy.param_shardings(shapes, mesh))
    rows = strategy.batch_sharding(mesh)
    batch_ = (jax.ShapeDtypeStruct((batch, widths[0]), jnp.float32, sharding=rows),
              jax.ShapeDtypeStruct((batch, widths[-1]), jnp.float32, sharding=rows))
    step = strategy.sgd_step(mesh, shapes, learning_rate=1e-2)
    with jax.set_mesh(mesh):
        return step.trace(params, batch_).lower().compile(dict(options) or None)
