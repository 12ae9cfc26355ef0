"""The programs Part VIII runs in several processes at once, with :func:`spmd_guide.multihost.multihost.launch`.

Every function here runs in *each* launched process, after ``jax.distributed.initialize``: the
same code, a different ``jax.process_index()``. Each prints what its process sees (that is the
process's own output, which the chapter shows) and returns a JSON-able summary for the tests.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import textwrap
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.display import Table
from spmd_guide.multihost import multihost
from spmd_guide.nn import STRATEGIES, Params, init_mlp, make_regression_batch, mlp_loss
from spmd_guide.randomness.data import sharded_batches


def describe_process(*, rows_per_device: int = 2) -> dict[str, Any]:
    """Print and return what this process sees: its devices, all devices,
    and its shards of a global array built from per-process data."""
    rows_per_device = checks.count("rows_per_device", rows_per_device)
    me, count = jax.process_index(), jax.process_count()
    local_ids = [d.id for d in jax.local_devices()]
    global_ids = [d.id for d in jax.devices()]
    print(f"process {me} of {count}")
    print(f"  local devices:  {local_ids}")
    print(f"  global devices: {global_ids}")

    # x = arange(rows_per_device * device_count), sharded over every device.
    # Each process passes only its own part: rows_here consecutive values.
    mesh = jax.make_mesh((jax.device_count(),), ("data",),
                         axis_types=(AxisType.Explicit,))
    sharding = NamedSharding(mesh, P("data"))
    rows_here = rows_per_device * jax.local_device_count()
    local_part = np.arange(me * rows_here, (me + 1) * rows_here,
                           dtype=np.int32)
    x = jax.make_array_from_process_local_data(sharding, local_part)
    print(f"x: global shape {x.shape}, "
          f"fully addressable: {x.is_fully_addressable}")
    shards = []
    for shard in x.addressable_shards:
        (rows,) = shard.index
        data = np.asarray(shard.data).tolist()
        shards.append({"device": shard.device.id, "start": rows.start,
                       "stop": rows.stop, "data": data})
        print(f"  device {shard.device.id:>4} holds "
              f"x[{rows.start}:{rows.stop}] = {data}")
    elsewhere = [i for i in global_ids if i not in local_ids]
    print(f"  devices {elsewhere} hold the rest")

    # One program on all devices: its all-reduce crosses processes.
    total = int(jax.jit(jnp.sum)(x))
    print(f"sum(x) over all {len(global_ids)} devices = {total}")
    try:
        np.asarray(x)
        fetch_error = None
    except RuntimeError as error:
        fetch_error = f"{type(error).__name__}: {error}"
        first = re.match(r".*?\.(?=\s|$)", str(error))
        print(textwrap.fill(
            f"np.asarray(x) -> {type(error).__name__}: "
            f"{first.group(0) if first else error}",
            76, subsequent_indent="    "))

    return {
        "process_index": me, "process_count": count,
        "local_devices": local_ids, "global_devices": global_ids,
        "device_process": {str(d.id): d.process_index
                           for d in jax.devices()},
        "global_shape": list(x.shape),
        "fully_addressable": x.is_fully_addressable,
        "shards": shards, "other_devices": elsewhere, "sum": total,
        "fetch_error": fetch_error,
        "hybrid_mesh": hybrid_mesh_ids(),
        "listening": listening_addresses(),
    }


def hybrid_mesh_ids() -> list[list[int]]:
    """Device ids of a ``("data", "model")`` mesh whose ``data`` axis crosses processes.

    ``create_hybrid_device_mesh`` builds a mesh per *granule* (a slice on a multi-slice TPU, a
    process with ``process_is_granule=True``) from ``mesh_shape`` and lays the granules out by
    ``dcn_mesh_shape``: here ``model`` stays inside a process (the fast links) and ``data``
    goes between processes (the slow network).
    """
    devices = mesh_utils.create_hybrid_device_mesh(
        mesh_shape=(1, jax.local_device_count()),
        dcn_mesh_shape=(jax.process_count(), 1),
        process_is_granule=True,
    )
    return [[d.id for d in row] for row in devices]


def misbehave(*, raise_on: int | None = None,
              hang_on: int | None = None) -> int:
    """Fail on purpose: process ``raise_on`` raises, ``hang_on`` hangs."""
    raise_on = _process_id("raise_on", raise_on)
    hang_on = _process_id("hang_on", hang_on)
    me = jax.process_index()
    print(f"process {me} started", flush=True)
    if me == raise_on:
        raise RuntimeError(f"process {me} gives up on purpose")
    if me == hang_on:
        print(f"process {me} hangs on purpose", flush=True)
        while True:
            time.sleep(1)
    return me


def freeze(*, frozen: int = 1, how: str = "stop") -> float:
    """Process ``frozen`` stops taking part after a first collective with the others; they
    enter a second collective, which waits for it. Returns, in a process that gets out, how
    many seconds it waited.

    ``how="stop"``: as on a host that loses power, it stops itself (``SIGSTOP``): its
    connections stay open but it sends nothing, heartbeats included, and JAX's coordination
    service terminates the others once the heartbeats are overdue. ``how="exit"``: as a
    crash, it ends at once (``os._exit(0)``: no shutdown, no goodbye to the service; exit
    code 0 so that the launcher, which stops everything when a process fails, does not step
    in). Its heartbeats stop too, and the others are terminated the same way, after the
    heartbeat timeout. ``how="hang"``: it stays alive in a Python loop; its heartbeats go
    on, and the others wait until something else (a time limit) ends them.
    """
    frozen = checks.count("frozen", frozen, minimum=0, maximum=jax.process_count() - 1)
    how = checks.one_of("how", how, ("stop", "exit", "hang"))
    me = jax.process_index()
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), np.ones(jax.local_device_count(), np.float32))
    print(f"process {me}: first sum = {float(jax.jit(jnp.sum)(x)):g}", flush=True)
    if me == frozen:
        print(f"process {me} {'exits' if how == 'exit' else 'freezes'}", flush=True)
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if how == "exit":
            os._exit(0)
        while True:
            time.sleep(0.1)
    start = time.monotonic()
    print(f"process {me} waits in the second sum", flush=True)
    float(jax.jit(jnp.sum)(x + 1))
    return time.monotonic() - start


FAILURE_WAYS = {"stop": "freezes (SIGSTOP)", "exit": "exits (os._exit)",
                "hang": "hangs alive"}


def failure_modes(hows: Sequence[str] = ("stop", "exit"), *, heartbeat_timeout: int = 1,
                  timeout: float = 60.0) -> dict[str, Any]:
    """Run :func:`freeze` once for each way in ``hows``, all at the same time (two processes
    of two devices each, ``initialize``'s heartbeat timeout set to ``heartbeat_timeout``
    seconds), and return how each run ended: the ``ProcessFailed`` (or ``ProcessTimeout``)
    the launcher raised, by way. Process 1 is the one that stops, exits or hangs; process 0
    waits in a collective with it.
    """
    if isinstance(hows, str) or not isinstance(hows, Sequence) or not hows:
        raise checks.InputTypeError(
            f"hows must be a non-empty list of ways, from {sorted(FAILURE_WAYS)}, got {hows!r:.60}.")
    hows = [checks.one_of("how", how, FAILURE_WAYS) for how in hows]
    if len(set(hows)) != len(hows):
        raise checks.InputError(f"hows names a way twice: {hows}.")
    heartbeat_timeout = checks.count("heartbeat_timeout", heartbeat_timeout)

    def run(how: str) -> Any:
        try:
            multihost.launch(freeze, num_processes=2, devices_per_process=2,
                             heartbeat_timeout=heartbeat_timeout, timeout=timeout,
                             kwargs={"how": how})
        except multihost.ProcessFailed as failed:
            return failed
        raise RuntimeError(f"freeze(how={how!r}) ended without a failure")

    with ThreadPoolExecutor(max_workers=len(hows)) as pool:
        return dict(zip(hows, pool.map(run, hows), strict=True))


def failure_table(ended: dict[str, Any]) -> Table:
    """One row per way and process of :func:`failure_modes`: how it ended, when, and why."""
    rows = []
    for how, failed in ended.items():
        for result in failed.results:
            verdict = multihost.service_verdict(result.stderr) or ""
            rows.append({"process 1": FAILURE_WAYS[how], **result.row(),
                         "coordination service": "declared 1 dead" if
                         verdict.endswith("(stopped sending heartbeats): 1.") else verdict})
    return Table(rows)


def _process_id(name: str, value: Any) -> int | None:
    """``None``, or a process id (an integer >= 0; not the string ``'0'``)."""
    return None if value is None else checks.count(name, value, minimum=0)


def listening_addresses() -> list[str] | None:
    """``host:port`` of every TCP socket this process listens on (Linux ``/proc``; else None)."""
    if not Path("/proc/self/fd").is_dir():
        return None
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = local.split(":")
            raw = bytes.fromhex(host_hex)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian words
            address = ipaddress.ip_address(raw)
            if address.version == 6 and address.ipv4_mapped:
                address = address.ipv4_mapped
            found.append(f"{address}:{int(port_hex, 16)}")
    return sorted(found)


def example_problem(*, layer_sizes: Sequence[int] = (8, 16, 8), num_examples: int = 64,
                    seed: int = 0) -> tuple[dict[str, np.ndarray], Params]:
    """The Part IV regression task as a dataset (``x``, ``y`` and each example's ``id``) and
    the MLP's initial parameters, both from ``seed``."""
    layer_sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    num_examples = checks.count("num_examples", num_examples)
    seed = checks.count("seed", seed, minimum=0)
    (x, y), params = _make_problem(seed, sizes=tuple(layer_sizes), num_examples=num_examples)
    dataset = {"x": np.asarray(x), "y": np.asarray(y),
               "id": np.arange(num_examples, dtype=np.int32)}
    return dataset, params


@partial(jax.jit, static_argnames=("sizes", "num_examples"))  # one compilation, not one per op
def _make_problem(seed: int, *, sizes: tuple[int, ...], num_examples: int):
    data = make_regression_batch(jax.random.key(seed), num_examples, sizes[0], sizes[-1])
    return data, init_mlp(jax.random.key(seed + 1), sizes)


def save_problem(path: str | os.PathLike[str], **options: Any) -> str:
    """Write :func:`example_problem` (``options`` are its arguments) to an ``.npz`` file; return
    its path. The launched processes read it, as the hosts of a cluster read the same files."""
    path = checks.path("path", path, what="a file name")
    dataset, params = example_problem(**options)
    layers = {f"{kind}{i}": np.asarray(array) for i, layer in enumerate(params)
              for kind, array in zip("wb", layer, strict=True)}
    np.savez(path, **dataset, **layers)
    return os.fspath(path)


def load_problem(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], Params]:
    """The dataset and parameters written by :func:`save_problem`, as NumPy arrays."""
    path = checks.path("path", path, what="a file name")
    if not Path(path).is_file():
        raise checks.InputError(f"no problem file {os.fspath(path)!r}: write it with "
                                "save_problem(path) first.")
    with np.load(path) as saved:
        dataset = {key: saved[key] for key in ("x", "y", "id")}
        params = [(saved[f"w{i}"], saved[f"b{i}"])
                  for i in range(sum(key.startswith("w") for key in saved.files))]
    return dataset, params


def data_parallel_step(*, problem: str, strategies: Sequence[str] = ("dp",),
                       batch_size: int = 32,
                       seed: int = 0, loader: str = "sharded") -> dict[str, Any]:
    """Loss and gradients of the MLP on one batch of ``problem``, everywhere.

    The batch is the first of an epoch of the Part VII loader. ``loader="sharded"``: laid
    out as each strategy wants it, each process loading only its devices' rows.
    ``loader="naive"``: every process takes the whole batch and passes it to the step as
    ``jax.device_put(batch)`` does (uncommitted, on its default device), the naive loader
    of Part VII; it runs as long as every process passes the same batch.
    Returns the ids of the examples this process loaded and, per strategy,
    the loss and the gradients (whole, as nested lists).
    """
    strategies = _strategy_names(strategies)
    loader = checks.one_of("loader", loader, ("sharded", "naive"))
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
    return {"ids": ids_here, "steps": steps}


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


# ---------------------------------------------------------------- what changes on a cluster


SLURM_EXAMPLE_ENV = {
    "SLURM_JOB_ID": "12345",
    "SLURM_STEP_NODELIST": "node[001-004]",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
}
"""What ``srun --nodes=4 --ntasks-per-node=2`` sets for its sixth task (the second on node002)."""


