"""A jitted function that closes over an array compiles the array in, whole.

``jax.jit(lambda: state, out_shardings=s)`` has no arguments: ``state`` (a host array the
function closes over) becomes a *constant* of the program. On JAX 0.12 (with the default
``jax_use_simplified_jaxpr_constants=False``) the lowered program holds the constant's bytes,
and after partitioning every device's program holds the whole constant and slices its own
block out of it: the memory a sharding was meant to save is spent, on every device, before
the first step. Passing the array as an *argument* (:func:`init_from_argument`) gives every
device only its block. :func:`constants` lists the constants of a compiled program, to see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from spmd_guide.core import checks
from spmd_guide.core.hlo_text import Buffer, parse_module, program_text, reachable

__all__ = ["constants", "host_array", "init_from_argument", "init_from_closure", "lowered_size"]


def init_from_closure(state: Any, sharding: jax.sharding.Sharding) -> Callable[[], jax.Array]:
    """A jitted, argument-less function returning ``state`` laid out by ``sharding``.

    ``state`` is captured by the closure, so it is compiled into the program as a constant.
    """
    state = checks.array("state", state)
    checks.sharding("sharding", sharding)
    return jax.jit(lambda: state, out_shardings=sharding)


def init_from_argument(sharding: jax.sharding.Sharding) -> Callable[[Any], jax.Array]:
    """The fix: a jitted function that takes the state as an argument laid out by
    ``sharding`` (``in_shardings``), so that each device receives only its block."""
    checks.sharding("sharding", sharding)
    return jax.jit(lambda state: state, in_shardings=sharding, out_shardings=sharding)


def constants(program: str | jax.stages.Compiled, *, min_bytes: int = 1024) -> list[Buffer]:
    """The constants of at least ``min_bytes`` in a compiled program (what one device holds).

    Small constants (loop bounds, block offsets, a ``2.0``) are left out by ``min_bytes``.
    """
    min_bytes = checks.count("min_bytes", min_bytes, minimum=0)
    module = parse_module(program_text(program))
    found = []
    for name in reachable(module):
        for instruction in module.computations[name]:
            if instruction.opcode == "constant":
                found.extend(b for b in instruction.result if b.nbytes >= min_bytes)
    return found


def lowered_size(fn: Callable[..., Any], *args: Any) -> int:
    """Characters of ``fn``'s lowered program (StableHLO text) on ``args``: a constant
    compiled in is written there in full."""
    checks.function("fn", fn)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return len(jitted.lower(*args).as_text())


def host_array(shape: tuple[int, ...], *, seed: int = 0) -> np.ndarray:
    """A float32 host array of random normals (random, so no compiler folds it away)."""
    shape = checks.counts("shape", shape)
    seed = checks.count("seed", seed, minimum=0)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
