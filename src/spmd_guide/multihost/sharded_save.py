"""A sharded checkpoint written by every process of a job, each the pieces of its own devices.

Orbax's checkpointers are collective: every process must call ``save`` and ``restore``, with
the same arguments. Each process writes the pieces its devices hold (a replicated piece once,
by one of its holders), into a key-value store of its own (``ocdbt.process_<i>/``), and the
save waits at barriers for every process: called by process 0 alone, it waits there until the
distributed runtime's timeout and fails (``benchmarks/multihost_edges.py`` keeps a run).
Part XI's ``checkpoint.save`` wraps the same Orbax call for a long run; this module, run in
each process that :func:`spmd_guide.multihost.multihost.launch` starts, uses Orbax directly.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks


def save_and_restore(state: Any, directory: str | os.PathLike[str], *,
                     savers: Sequence[int] | None = None) -> dict[str, Any]:
    """Save ``state`` (a pytree of global arrays) to ``directory`` with Orbax's
    ``StandardCheckpointer`` in every process, then restore it into the same layouts and
    compare.

    Returns what this process saw: the seconds the save took, the entries of the saved
    directory, and whether every restored leaf equals the saved one and has its sharding.
    ``savers`` (default: every process, as it must be) lists the processes that call
    ``save``, to show the mistake: then nothing is restored, and the other processes go on
    at once (to the launcher's ``jax.distributed.shutdown``).
    """
    import orbax.checkpoint as ocp  # a second of imports: only in processes that save

    path = pathlib.Path(checks.path("directory", directory)).absolute()
    me = jax.process_index()
    savers = (list(range(jax.process_count())) if savers is None else
              [checks.count("savers", i, minimum=0, maximum=jax.process_count() - 1)
               for i in savers])
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)
    if me not in savers:
        return {"save_seconds": None, "entries": [], "restored_equal": None}
    with ocp.StandardCheckpointer() as checkpointer:
        start = time.monotonic()
        checkpointer.save(path, state)
        checkpointer.wait_until_finished()
        seconds = time.monotonic() - start
        if len(savers) < jax.process_count():
            return {"save_seconds": round(seconds, 2),
                    "entries": sorted(p.name for p in path.iterdir()), "restored_equal": None}
        restored = checkpointer.restore(path, like)
    same = jax.tree.map(lambda a, b: bool(jax.jit(lambda u, v: jnp.array_equal(u, v))(a, b))
                        and a.sharding == b.sharding, state, restored)
    return {"save_seconds": round(seconds, 2),
            "entries": sorted(p.name for p in path.iterdir()),
            "restored_equal": all(jax.tree.leaves(same))}


def save_from(*, directory: str, savers: Sequence[int] | None = None,
              rows_per_device: int = 2) -> dict[str, Any]:
    """In each launched process: a global ``(rows_per_device * devices, 2)`` array split
    over every device, each process passing its own rows, saved and restored by
    :func:`save_and_restore` (``savers``: the processes that call ``save``)."""
    rows_per_device = checks.count("rows_per_device", rows_per_device)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    rows = rows_per_device * jax.local_device_count()
    local = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + 100 * jax.process_index()
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
    return save_and_restore({"x": x}, directory, savers=savers)
