"""A global array seen from one process: its global shape from the process's local shape, an
abstract array (``jax.ShapeDtypeStruct`` with its sharding) to compile against without any
data, and what gathering it costs.

JAX 0.12 has no call that brings a global array to *one* process (jax-ml/jax#16816 asked for
it): ``jax.device_put`` onto process 0's devices is refused, because the input spans other
processes (:func:`gather_to_one_error`). What there is, ``multihost_utils.process_allgather(x,
tiled=True)``, compiles :func:`allgather_program`: an identity whose output is replicated, so
every device of every process receives the whole array.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks


def _named(name: str, sharding: Any) -> NamedSharding:
    if not isinstance(sharding, NamedSharding):
        raise checks.InputTypeError(
            f"{name} must be a jax.sharding.NamedSharding (a mesh and a PartitionSpec), got "
            f"{sharding!r:.80}.")
    return sharding


def global_shape(sharding: NamedSharding, local_shape: Sequence[int]) -> tuple[int, ...]:
    """The global shape of an array laid out by ``sharding`` of which this process holds
    ``local_shape`` (the rows its devices hold, as passed to
    ``jax.make_array_from_process_local_data``); nothing is allocated.

    Along each dimension, the process holds as many blocks as its devices have distinct
    positions on the mesh axes that split that dimension; the array has as many blocks as
    those axes' sizes multiply to. So ``global = local * blocks / blocks_here``.
    """
    sharding = _named("sharding", sharding)
    local_shape = tuple(checks.counts("local_shape", local_shape, minimum=0, min_length=0))
    spec = tuple(sharding.spec) + (None,) * (len(local_shape) - len(sharding.spec))
    if len(spec) > len(local_shape):
        raise checks.InputError(
            f"sharding's spec {sharding.spec} has {len(sharding.spec)} entries, more than the "
            f"{len(local_shape)} dimensions of local_shape {local_shape}.")
    mesh = sharding.mesh
    here = {d.id for d in sharding.addressable_devices}
    where = {int(d.id): index for index, d in np.ndenumerate(mesh.devices)}
    names = list(mesh.axis_names)
    shape = []
    for dim, (size, entry) in enumerate(zip(local_shape, spec, strict=True)):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        blocks = math.prod(mesh.shape[a] for a in axes)
        blocks_here = len({tuple(where[i][names.index(a)] for a in axes) for i in here})
        if size % blocks_here:
            raise checks.InputError(
                f"local_shape[{dim}] = {size} does not split into the {blocks_here} blocks this "
                f"process's devices hold along mesh axes {axes}.")
        shape.append(size // blocks_here * blocks)
    return tuple(shape)


def abstract(sharding: NamedSharding, local_shape: Sequence[int],
             dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    """The global array as ``jax.ShapeDtypeStruct(global_shape, dtype, sharding=sharding)``:
    what ``jax.eval_shape`` and ``jax.jit(f).lower(...)`` take in place of the data."""
    return jax.ShapeDtypeStruct(global_shape(sharding, local_shape), jnp.dtype(dtype),
                                sharding=sharding)


def allgather_program(sharding: NamedSharding) -> Any:
    """What ``process_allgather(x, tiled=True)`` compiles for an ``x`` laid out by
    ``sharding`` (``jax/experimental/multihost_utils.py``): the identity, its output
    replicated (``P()``) on every device of the mesh."""
    sharding = _named("sharding", sharding)
    return jax.jit(lambda a: a, out_shardings=sharding.update(spec=P()))


def gather_to_one_error(x: jax.Array) -> str | None:
    """The first sentence of the error ``jax.device_put(x, <process 0's first device>)``
    raises, or ``None`` where it works (``x`` on one process's devices only)."""
    if not isinstance(x, jax.Array):
        raise checks.InputTypeError(f"x must be a jax.Array, got {type(x).__name__}.")
    first = next(d for d in jax.devices() if d.process_index == 0)
    try:
        jax.device_put(x, SingleDeviceSharding(first)).block_until_ready()
    except (ValueError, NotImplementedError) as error:
        sentence = re.match(r".*?[.:](?=\s|$)", str(error))
        return f"{type(error).__name__}: {sentence.group(0) if sentence else error}"
    return None


def facts(x: jax.Array, local_shape: Sequence[int]) -> dict[str, Any]:
    """In each process of a launch: the global shape and the abstract array computed from
    ``local_shape`` alone, what ``eval_shape`` makes of it, ``process_allgather``'s result,
    and the refusal of a gather onto process 0."""
    guess = abstract(x.sharding, local_shape, x.dtype)
    doubled = jax.eval_shape(lambda a: 2 * a, guess)
    gathered = multihost_utils.process_allgather(x, tiled=True)
    return {
        "local_shape": list(local_shape),
        "global_shape_from_local": list(guess.shape),
        "abstract": f"ShapeDtypeStruct({guess.shape}, {guess.dtype}, {guess.sharding.spec})",
        "eval_shape": f"{doubled.shape} {doubled.sharding.spec}",
        "allgathered": np.asarray(gathered).tolist(),
        "gather_to_one_error": gather_to_one_error(x),
    }
