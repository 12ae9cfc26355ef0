"""The PartitionSpec cheat sheet of Part IV, read off the strategies themselves.

For each strategy: where the weights, the activations, the gradients and the AdamW optimizer
state live, how many bytes of parameters a device stores, and which collectives one training
step holds. Nothing is typed: every spec is read from arrays that the strategy placed or
that a compiled program produced, so the sheet stays true when a strategy changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spmd_guide import checks, hlo
from spmd_guide.display import Table
from spmd_guide.mlp import Batch, Params, layer_outputs, param_bytes_per_device
from spmd_guide.strategies import STRATEGIES, Strategy


def spec_of(array: Any) -> str:
    """The PartitionSpec of an array's sharding as text, ``P()`` when fully replicated."""
    sharding = array.sharding
    if sharding.is_fully_replicated:
        return "P()"
    spec = getattr(sharding, "spec", None)
    return str(spec) if spec is not None else type(sharding).__name__


def optimizer_state_shardings(optimizer: optax.GradientTransformation, params: Params,
                              mesh: Mesh) -> Any:
    """Shardings for ``optimizer.init(params)``: every parameter-shaped leaf (AdamW's ``mu``
    and ``nu``) like its parameter, everything else (the step count) replicated on ``mesh``.

    Pass them as ``out_shardings`` to ``jax.jit(optimizer.init)`` and to the training step:
    unpinned, ``jax.jit(optimizer.init)`` puts the whole state on one device, since zeros
    depend on no input's layout.
    """
    checks.mesh("mesh", mesh)
    abstract = jax.eval_shape(optimizer.init, params)
    return optax.tree_utils.tree_map_params(
        optimizer, lambda _, param: param.sharding, abstract, params,
        transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()))


@dataclass(frozen=True)
class Entry:
    """One strategy's row of the cheat sheet (specs as text, one per layer where it varies)."""

    strategy: str
    kind: str
    mesh: str
    weights: tuple[str, ...]
    activations: tuple[str, ...]
    gradients: tuple[str, ...]
    optimizer_state: tuple[str, ...]
    param_bytes: int
    collectives: str

    def row(self) -> dict[str, str]:
        def lines(specs: tuple[str, ...]) -> str:
            return "\n".join(f"{i}: {s}" for i, s in enumerate(specs))

        return {"strategy": self.strategy, "mesh": self.mesh,
                "weights W_i": lines(self.weights), "activations": lines(self.activations),
                "gradients dW_i": lines(self.gradients),
                "AdamW mu, nu (pinned)": lines(self.optimizer_state),
                "params per device": hlo.format_bytes(self.param_bytes),
                "collectives per step": self.collectives}


def entry(strategy: Strategy | str, params: Params, batch: Batch, *,
          devices: Sequence[jax.Device] | None = None) -> Entry:
    """The cheat-sheet row of ``strategy`` for this model and batch on ``devices``."""
    if isinstance(strategy, str):
        strategy = STRATEGIES[checks.one_of("strategy", strategy, sorted(STRATEGIES))]
    mesh = strategy.mesh(devices)
    placed, placed_batch = strategy.shard(params, batch, mesh)
    loss = strategy.loss(mesh)
    grads = jax.jit(jax.grad(loss))(placed, placed_batch)
    optimizer = optax.adamw(1e-3)
    state = jax.jit(optimizer.init, out_shardings=optimizer_state_shardings(
        optimizer, placed, mesh))(placed)
    mu = state[0].mu  # ScaleByAdamState: the first moment, shaped like the parameters
    if strategy.kind == "jit":  # where the compiler put each layer's output
        outputs = jax.jit(layer_outputs)(placed, placed_batch[0])
        activations = tuple(spec_of(out) for out in outputs)
    else:  # inside shard_map every activation is laid out like the batch
        activations = (str(strategy.batch_spec()),) * len(params)
    step = strategy.sgd_step(mesh, placed, learning_rate=0.01)
    counts = hlo.collective_counts(step, placed, placed_batch)
    return Entry(
        strategy=strategy.name, kind=strategy.kind,
        mesh=" x ".join(f"{name}={size}" for name, size in mesh.shape.items()),
        weights=tuple(spec_of(w) for w, _ in placed),
        activations=activations,
        gradients=tuple(spec_of(g) for g, _ in grads),
        optimizer_state=tuple(spec_of(m) for m, _ in mu),
        param_bytes=param_bytes_per_device(placed),
        collectives=", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "none",
    )


def cheat_sheet(names: Sequence[str], params: Params, batch: Batch, *,
                devices: Sequence[jax.Device] | None = None) -> list[Entry]:
    """:func:`entry` for each strategy in ``names``."""
    strategies = [checks.one_of("strategy", n, sorted(STRATEGIES)) for n in names]
    return [entry(n, params, batch, devices=devices) for n in strategies]


def table(entries: Sequence[Entry]) -> Table:
    """The sheet as a table, one row per strategy."""
    if not entries:
        raise checks.InputError("the cheat sheet needs at least one strategy.")
    return Table([e.row() for e in entries])
