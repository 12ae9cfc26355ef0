"""Before trusting "shard_map is faster than jit": compare what the two programs compute.

A speed difference between a ``jit`` step and a ``shard_map`` step is only a finding if both
compute the same thing. Dropout is the classic case where they do not: under ``jit`` the random
mask of a sharded activation is drawn as one global array (each device draws its own block,
from its position in it), while a ``shard_map`` kernel that draws with the key it was given
draws the *same* block on every device, unless the key is first made per-device with
``jax.random.fold_in(key, jax.lax.axis_index(axis))``.

:func:`dropout_steps` builds the three versions over one mesh axis; :func:`program_facts`
reads what a compiled program does (collectives, FLOPs from XLA's cost analysis, whether it
reads its device's position: the HLO op ``partition-id``), and :func:`distinct_blocks` counts
how many different masks the devices drew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.core.hlo_text import parse_module, reachable

__all__ = ["ProgramFacts", "distinct_blocks", "dropout", "dropout_steps", "program_facts"]


def dropout(x: jax.Array, key: jax.Array, *, rate: float) -> jax.Array:
    """Inverted dropout: zero each element with probability ``rate``, scale the rest."""
    rate = checks.real("rate", rate, minimum=0.0, maximum=1.0, inclusive_max=False)
    key = checks.key("key", key)
    x = checks.array("x", x)
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def dropout_steps(mesh: Mesh, axis_name: str, *, rate: float = 0.5
                  ) -> dict[str, Callable[[jax.Array, jax.Array], jax.Array]]:
    """Three jitted ``f(x, key)`` that apply dropout to a batch sharded ``P(axis_name)``:

    ``jit`` (the global program; the compiler splits it), ``shard_map, one key`` (every
    device draws with the same key), ``shard_map, fold_in`` (the key folded with the
    device's index first: a different mask per device, as under ``jit``).
    """
    checks.mesh("mesh", mesh)
    checks.axis(mesh, axis_name)
    rate = checks.real("rate", rate, minimum=0.0, maximum=1.0, inclusive_max=False)

    def per_device(fold: bool) -> Callable[[jax.Array, jax.Array], jax.Array]:
        def kernel(block, key):
            if fold:
                key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
            return dropout(block, key, rate=rate)

        return jax.jit(jax.shard_map(kernel, mesh=mesh, in_specs=(P(axis_name), P()),
                                     out_specs=P(axis_name)))

    return {"jit": jax.jit(lambda x, key: dropout(x, key, rate=rate)),
            "shard_map, one key": per_device(False),
            "shard_map, fold_in": per_device(True)}


@dataclass(frozen=True)
class ProgramFacts:
    """What one compiled program does, per device: its collectives (kind -> count), the
    FLOPs XLA's cost analysis counts, and whether it reads its device's position."""

    collectives: dict[str, int]
    flops: float
    reads_position: bool


def program_facts(fn: Callable[..., Any], *args: Any) -> ProgramFacts:
    """Compile ``fn`` on ``args`` once and read :class:`ProgramFacts` from the program."""
    compiled = hlo.compile(fn, *args)
    text = compiled.as_text()
    module = parse_module(text)
    position = any(i.opcode == "partition-id" for name in reachable(module)
                   for i in module.computations[name])
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return ProgramFacts(hlo.count_kinds(hlo.collectives_in_text(text)),
                        float(cost.get("flops", 0.0)), position)


def distinct_blocks(out: Any, n_blocks: int) -> int:
    """How many different zero patterns (masks) the ``n_blocks`` row blocks of ``out`` hold."""
    out = np.asarray(checks.array("out", out, min_ndim=1))
    n_blocks = checks.count("n_blocks", n_blocks)
    checks.divisible("out's first dimension", out.shape[0], n_blocks, why="into row blocks")
    masks = (out != 0).reshape(n_blocks, -1)
    return len({m.tobytes() for m in masks})
