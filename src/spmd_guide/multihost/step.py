"""One training step of the Part IV MLP run by every process of a job, each loading only the
rows its devices hold, checked against the same step in one process on one device.

:func:`data_parallel_step` runs in *each* process that
:func:`spmd_guide.multihost.multihost.launch` starts; :func:`single_process_step` is its
reference, and :func:`reference_table` sets the two side by side for the page
multihost/multihost.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.display import Table
from spmd_guide.multihost import sharded_save
from spmd_guide.multihost.problem import load_problem
from spmd_guide.nn import STRATEGIES, mlp_loss
from spmd_guide.randomness.data import sharded_batches


def data_parallel_step(*, problem: str, strategies: Sequence[str] = ("dp",),
                       batch_size: int = 32,
                       seed: int = 0, loader: str = "sharded",
                       checkpoint_dir: str | None = None) -> dict[str, Any]:
    """Loss and gradients of the MLP on one batch of ``problem``, everywhere.

    The batch is the first of an epoch of the Part VII loader. ``loader="sharded"``: laid
    out as each strategy wants it, each process loading only its devices' rows.
    ``loader="naive"``: every process takes the whole batch and passes it to the step as
    ``jax.device_put(batch)`` does (uncommitted, on its default device), the naive loader
    of Part VII; it runs as long as every process passes the same batch.
    Returns the ids of the examples this process loaded and, per strategy,
    the loss and the gradients (whole, as nested lists). With ``checkpoint_dir``, every
    process then saves the last strategy's parameters there and restores them
    (:func:`~spmd_guide.multihost.sharded_save.save_and_restore`); ``"saved"`` says how that
    went.
    """
    strategies = _strategy_names(strategies)
    loader = checks.one_of("loader", loader, ("sharded", "naive"))
    if checkpoint_dir is not None:
        checkpoint_dir = os.fspath(checks.path("checkpoint_dir", checkpoint_dir))
    dataset, initial_params = load_problem(problem)  # the same file for all
    me = jax.process_index()
    steps, ids_here = {}, None
    for name in strategies:
        strategy = STRATEGIES[name]
        mesh = strategy.mesh(jax.devices())
        if loader == "naive":
            whole = next(sharded_batches(dataset, batch_size,
                                         SingleDeviceSharding(jax.local_devices()[0]),
                                         seed=seed))
            batch = jax.device_put({k: np.asarray(v) for k, v in whole.items()})
        else:
            batch = next(sharded_batches(dataset, batch_size,
                                         _loader_sharding(strategy, mesh), seed=seed))
        if ids_here is None:
            ids_here = sorted({int(i)  # a set: replicas hold rows twice
                               for shard in batch["id"].addressable_shards
                               for i in np.asarray(shard.data)})
            print(f"process {me}: loaded examples")
            print(textwrap.fill(str(ids_here), 76, initial_indent="  ",
                                subsequent_indent="   "))
        # The batch is laid out already; place the parameters. (Not with
        # strategy.shard: it fetches the batch to this host, and a global
        # batch cannot be fetched.)
        params = jax.device_put(
            initial_params, strategy.param_shardings(initial_params, mesh))
        # Outputs replicated (P()): every process gets them whole.
        step = jax.jit(jax.value_and_grad(strategy.loss(mesh)),
                       out_shardings=NamedSharding(mesh, P()))
        loss, grads = step(params, (batch["x"], batch["y"]))
        grads = [[np.asarray(g.addressable_data(0)).tolist() for g in layer]
                 for layer in grads]
        print(f"process {me}: {name:>4} loss = {float(loss):.6f}, "
              f"|grad of W0| = {np.linalg.norm(grads[0][0]):.6f}")
        steps[name] = {"loss": float(loss), "grads": grads}
    value = {"ids": ids_here, "steps": steps}
    if checkpoint_dir is not None:  # every process saves: each writes its devices' pieces
        value["saved"] = sharded_save.save_and_restore({"params": params}, checkpoint_dir)
        print(f"process {me}: saved and restored {name}'s parameters: "
              f"{value['saved']['restored_equal']}")
    return value


def _strategy_names(strategies: Any) -> tuple[str, ...]:
    """Strategy names, checked: a list such as ``("dp", "fsdp")`` of known names."""
    if isinstance(strategies, str):
        raise checks.InputTypeError(
            f"strategies must be a list of names such as ({strategies!r},), got the string "
            f"{strategies!r} (its letters would be read as names).")
    if not isinstance(strategies, Sequence) or not strategies:
        raise checks.InputError(
            f"strategies must name at least one strategy, e.g. ('dp',), got {strategies!r}.")
    return tuple(checks.one_of("strategy", name, STRATEGIES) for name in strategies)


def _loader_sharding(strategy: Any, mesh: Any) -> dict[str, NamedSharding]:
    """The strategy's batch layout for ``x`` and ``y``; the 1-D ``id`` leaf is split over the
    same mesh axes along its only dimension."""
    batch = strategy.batch_sharding(mesh)
    rows = NamedSharding(mesh, P(*batch.spec[:1]))
    return {"x": batch, "y": batch, "id": rows}


def single_process_step(*, problem: str, batch_size: int = 32, seed: int = 0) -> dict[str, Any]:
    """The reference for :func:`data_parallel_step`: the same batch, ``mlp_loss`` on one device."""
    dataset, params = load_problem(problem)
    one_device = SingleDeviceSharding(jax.devices()[0])
    batch = next(sharded_batches(dataset, batch_size, one_device, seed=seed))
    loss, grads = jax.jit(jax.value_and_grad(mlp_loss))(params, (batch["x"], batch["y"]))
    grads = [[np.asarray(g).tolist() for g in layer] for layer in grads]
    return {"loss": float(loss), "grads": grads, "ids": sorted(np.asarray(batch["id"]).tolist())}


def compare_to_reference(results: list[Any], reference: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per process and strategy: its loss, the reference loss, the largest gradient gap.

    ``results`` are the :class:`~spmd_guide.multihost.multihost.ProcessResult` of a
    :func:`data_parallel_step` launch; ``reference`` is :func:`single_process_step`'s value.
    """
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence) or not all(
            isinstance(getattr(r, "value", None), dict) and "steps" in r.value
            for r in results):
        raise checks.InputTypeError(
            "results must be the list launch(data_parallel_step, ...) returned, whose values "
            f"hold 'steps'; got {results!r:.60}.")
    if not isinstance(reference, dict) or not {"loss", "grads"} <= set(reference):
        raise checks.InputTypeError(
            "reference must be single_process_step(...)'s value, a dict with 'loss' and "
            f"'grads'; got {reference!r:.60}.")
    rows = []
    for result in results:
        for name, step in result.value["steps"].items():
            gaps = [np.max(np.abs(np.asarray(g) - np.asarray(r)))
                    for got, ref in zip(step["grads"], reference["grads"], strict=True)
                    for g, r in zip(got, ref, strict=True)]
            rows.append({"process": result.process_id, "strategy": name,
                         "loss": step["loss"], "1-process loss": reference["loss"],
                         "max |grad diff|": float(max(gaps))})
    return rows


def reference_table(results: list[Any], reference: dict[str, Any]) -> Table:
    """:func:`compare_to_reference` as a table to read: losses to 6 decimals (float32 holds
    about 7 significant digits), the gradient gap in scientific notation, as Part IV's
    check tables print them."""
    return Table([{"process": row["process"], "strategy": row["strategy"],
                   "loss": f"{row['loss']:.6f}",
                   "1-process loss": f"{row['1-process loss']:.6f}",
                   "largest |gradient difference|": f"{row['max |grad diff|']:.1e}"}
                  for row in compare_to_reference(results, reference)])


def max_difference(results: list[Any], reference: dict[str, Any]) -> float:
    """The largest gap, loss or gradient entry, between any process's step and the reference."""
    rows = compare_to_reference(results, reference)
    return max(max(abs(r["loss"] - r["1-process loss"]),
                   r["max |grad diff|"]) for r in rows)
