"""Random numbers under sharding: the partitionable-threefry flag, per-device keys.

JAX's default generator, threefry, is counter based: a random number is a hash
of (key, counter), so an array of random numbers is in principle an elementwise
map over counters that needs no communication. Whether the compiled program
avoids communication depends on the flag ``jax_threefry_partitionable`` (on by
default since JAX 0.5.0). :func:`compare_modes` compiles one function under
both settings and reports the collectives and the values.

Inside ``jax.shard_map`` each device runs the body on its local block, so a key
passed in unchanged gives the *same* numbers on every device. :func:`device_key`
folds the device's position on the mesh into the key, which gives each device
a stream of its own (:func:`sharded_dropout` uses it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks


def add_uniform_noise(key: jax.Array, x: jax.Array) -> jax.Array:
    """``x`` plus uniform noise in [0, 1): the chapter's example."""
    key, x = checks.key("key", key), checks.array("x", x, dtype_kind="f")
    return x + jax.random.uniform(key, x.shape, dtype=x.dtype)


@dataclass(frozen=True)
class ModeResult:
    """What one setting of ``jax_threefry_partitionable`` did to a function."""

    partitionable: bool
    collectives: dict[str, int]
    values: np.ndarray

    @property
    def total_collectives(self) -> int:
        return sum(self.collectives.values())

    def collectives_text(self) -> str:
        """The collectives with a non-zero count, e.g. ``6 x collective-permute``."""
        used = [f"{n} x {kind}" for kind, n in self.collectives.items() if n]
        return ", ".join(used) or "none"

    def row(self) -> dict[str, Any]:
        """A table row: the mode, its collectives and the first values."""
        return {
            "jax_threefry_partitionable": self.partitionable,
            "collectives": self.collectives_text(),
            "first values": np.array2string(self.values.ravel()[:4],
                                            precision=3),
        }


def compare_modes(fn: Callable[..., Any], *args: Any
                  ) -> dict[bool, ModeResult]:
    """Compile and run ``fn(*args)`` with the flag off, then on.

    The flag ``jax_threefry_partitionable`` is switched only inside this
    call, with the ``jax.threefry_partitionable`` context manager (the
    setting is part of jit's cache key: each mode compiles its own
    program). Returns ``{False: ModeResult, True: ModeResult}``.
    """
    from spmd_guide.core import hlo

    checks.function("fn", fn)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    results = {}
    for partitionable in (False, True):
        with jax.threefry_partitionable(partitionable):
            counts = hlo.collective_counts(jitted, *args)
            values = np.asarray(jitted(*args))
        results[partitionable] = ModeResult(partitionable, counts,
                                            values)
    return results


def prefix_matches(key: jax.Array, *, size: int, prefix: int) -> bool:
    """Are the numbers of ``(prefix,)`` the first ones of ``(size,)``?

    True when each number depends only on the key and its own index (the
    counter is the index); False when it also depends on the array's size.
    """
    key, size = checks.key("key", key), checks.count("size", size)
    checks.count("prefix", prefix, maximum=size)
    whole = jax.random.uniform(key, (size,))
    part = jax.random.uniform(key, (prefix,))
    return bool(jnp.array_equal(whole[:prefix], part))


def sampler(shape: tuple[int, ...], sharding: Sharding, *,
            distribution: Callable[..., jax.Array] = jax.random.normal
            ) -> Callable[[jax.Array], jax.Array]:
    """A jitted ``key -> distribution(key, shape)``, laid out by
    ``sharding``.

    Each device computes only its own block. In partitionable mode the
    values do not depend on ``sharding``: a key gives the same array on
    one device or eight. Pass the function to ``spmd_guide.core.hlo`` to read
    its compiled program. A shape that ``sharding`` cannot split evenly is
    refused here, not when the function is first called.
    """
    shape = _layout_fits(shape, sharding, distribution)
    return jax.jit(lambda key: distribution(key, shape),
                   out_shardings=sharding)


SAMPLERS: dict[str, Callable[[jax.Array, tuple[int, ...]], jax.Array]] = {
    "bits": lambda key, shape: jax.random.bits(key, shape),
    "uniform": lambda key, shape: jax.random.uniform(key, shape),
    "bernoulli": lambda key, shape: jax.random.bernoulli(key, 0.5, shape),
    "normal": lambda key, shape: jax.random.normal(key, shape),
    "truncated_normal": lambda key, shape: jax.random.truncated_normal(key, -2.0, 2.0, shape),
}
"""Samplers by name, each ``f(key, shape)``: the raw bits, two that turn bits into values
exactly (``uniform``, ``bernoulli``), and two that apply float math to them."""


def layout_differences(key: jax.Array, shape: tuple[int, ...], sharding: Sharding, *,
                       samplers: Sequence[str] = tuple(SAMPLERS)) -> list[dict[str, Any]]:
    """For each sampler named in ``samplers``: how many elements of its draw generated in
    ``sharding``'s layout differ from the same draw generated on one device, and by how many
    units in the last place (ulp) at most (``0`` for bits and booleans, which either match
    or not).

    The bits never differ (threefry's counter is the element's index, whatever the
    layout); a sampler that turns bits into floats with float math can, since each layout
    compiles another program over another block shape (on XLA:CPU, what the review of this
    page measured; the mechanism is not established here).
    """
    key = checks.key("key", key)
    if isinstance(samplers, str) or not isinstance(samplers, Sequence) or not samplers:
        raise checks.InputTypeError(
            f"samplers must be a list of names from {sorted(SAMPLERS)}, got {samplers!r:.60}.")
    names = [checks.one_of("sampler", name, SAMPLERS) for name in samplers]
    shape = _layout_fits(shape, sharding, jax.random.normal)
    one_device = SingleDeviceSharding(jax.devices()[0])

    def draws(layout: Sharding) -> dict[str, np.ndarray]:
        # Every sampler in one program per layout: two compilations, not two per sampler
        # (the same elements differ as with one program per sampler).
        program = jax.jit(lambda k: {n: SAMPLERS[n](k, shape) for n in names},
                          out_shardings={n: layout for n in names})
        return {n: np.asarray(v) for n, v in program(key).items()}

    laid_outs, alones = draws(sharding), draws(one_device)
    rows = []
    for name in names:
        laid_out, alone = laid_outs[name], alones[name]
        differ = laid_out != alone
        ulps = 0
        if laid_out.dtype.kind == "f" and differ.any():
            gap = np.abs(laid_out.astype(np.float64) - alone.astype(np.float64))
            ulps = int(np.max(np.round(gap / np.spacing(np.maximum(np.abs(laid_out),
                                                                   np.abs(alone))))))
        rows.append({"sampler": name, "elements": int(differ.size),
                     "differ from 1 device": int(differ.sum()), "most ulp apart": ulps})
    return rows


def _layout_fits(shape: Any, sharding: Any, distribution: Any) -> tuple[int, ...]:
    """``shape`` as a tuple, checked to split evenly under ``sharding``."""
    shape = checks.counts("shape", shape, minimum=0, min_length=0)
    checks.sharding("sharding", sharding)
    checks.function("distribution", distribution)
    if isinstance(sharding, NamedSharding):
        checks.spec_fits("the sampled array", shape, sharding.spec, sharding.mesh)
    else:
        try:
            sharding.shard_shape(shape)
        except ValueError as error:
            raise checks.InputError(f"shape {shape} does not fit {sharding}: {error}") from None
    return shape


def device_key(key: jax.Array,
               axis_names: str | Sequence[str]) -> jax.Array:
    """Inside ``shard_map``: this device's own key, ``fold_in(key, i)``.

    ``i`` is the device's linear position over the mesh axes
    ``axis_names`` (``jax.lax.axis_index`` of the tuple). Name the axes
    that split the data: devices holding the same block (replicas over
    other axes) then get the same key, which keeps the replicas identical.
    """
    if isinstance(axis_names, str):
        names: tuple[str, ...] = (axis_names,)
    elif isinstance(axis_names, Sequence):
        names = tuple(axis_names)
    else:
        names = ()
    if not names or not all(isinstance(n, str) and n for n in names):
        raise checks.InputError(
            f"axis_names must be mesh axis names ('x' or ('x', 'y')), "
            f"got {axis_names!r}.")
    key = checks.key("key", key)
    try:
        index = jax.lax.axis_index(names)
    except NameError:
        raise checks.InputError(
            f"axis_names {axis_names!r}: device_key runs inside jax.shard_map over a mesh "
            f"with these axes (it folds in each device's position along them); called "
            f"elsewhere there is no such axis.") from None
    return jax.random.fold_in(key, index)


def dropout(key: jax.Array, x: jax.Array, *, rate: float) -> jax.Array:
    """Inverted dropout: zero each entry with probability ``rate``, and
    scale the others by ``1 / (1 - rate)`` to keep the expected value.

    A concrete ``rate`` is checked to lie in [0, 1); a traced one (under
    ``jit``) is not."""
    key, x = checks.key("key", key), checks.array("x", x, dtype_kind="f")
    rate = checks.real("rate", rate, minimum=0.0, maximum=1.0, inclusive_max=False)
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def sharded_dropout(key: jax.Array, x: jax.Array, mesh: Mesh, *,
                    axis_name: str, rate: float,
                    per_device_keys: bool = True) -> jax.Array:
    """Dropout on ``x``, split by rows over ``axis_name``, in shard_map.

    With ``per_device_keys=True`` each device draws its mask from
    :func:`device_key`; with ``False`` every device uses ``key`` itself
    (the common mistake: every device gets the same mask). The result is
    laid out ``P(axis_name)``. ``mesh`` may have Auto or Explicit axes; the key and
    ``x`` are placed on it as the program needs, wherever they were.
    """
    size = checks.axis(checks.mesh("mesh", mesh), axis_name)
    key = checks.key("key", key)
    x = checks.array("x", x, dtype_kind="f")
    rate = checks.real("rate", rate, minimum=0.0, maximum=1.0, inclusive_max=False)
    per_device_keys = checks.flag("per_device_keys", per_device_keys)
    if x.ndim < 1 or x.shape[0] % size:
        raise checks.InputError(
            f"x of shape {x.shape} cannot be split by rows over mesh "
            f"axis {axis_name!r} of size {size}: the first dimension must "
            f"be a multiple of {size}.")
    # Lay both inputs out as the program needs them (a key committed elsewhere, or an x
    # split another way, would be refused by jit on either kind of mesh axes).
    key = jax.device_put(key, NamedSharding(mesh, P()))
    x = jax.device_put(x, NamedSharding(mesh, P(axis_name)))
    program = _dropout_program(mesh, axis_name, float(rate),
                               per_device_keys)
    return program(key, x)


@functools.lru_cache(maxsize=32)
def _dropout_program(mesh: Mesh, axis_name: str, rate: float,
                     per_device_keys: bool) -> Callable[..., jax.Array]:
    """The jitted shard_map program of :func:`sharded_dropout`."""

    def local(key: jax.Array, block: jax.Array) -> jax.Array:
        if per_device_keys:
            key = device_key(key, axis_name)
        return dropout(key, block, rate=rate)

    spec = P(axis_name)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), spec),
                                 out_specs=spec))


def block_correlation(values: Any, *, blocks: int) -> float:
    """Mean correlation between ``blocks`` equal row blocks of ``values``.

    One block per device: 1.0 means every device produced the same numbers,
    near 0 means independent streams.
    """
    blocks = checks.count("blocks", blocks, minimum=2)
    array = np.asarray(checks.array("values", values), dtype=np.float64)
    if array.ndim < 1 or array.shape[0] % blocks:
        raise checks.InputError(
            f"need at least 2 blocks that split the first dimension evenly, "
            f"got blocks={blocks} for shape {array.shape}.")
    rows = array.reshape(blocks, -1)
    if np.any(rows.std(axis=1) == 0):
        raise checks.InputError("a block is constant: its correlation is undefined.")
    matrix = np.corrcoef(rows)
    return float(matrix[~np.eye(blocks, dtype=bool)].mean())
