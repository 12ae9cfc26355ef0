"""Sharded batches: global ``jax.Array`` batches, each device holding its slice.

A *dataset* is a pytree (a tuple, a dict, ...) of NumPy arrays that share their
leading length ``N``: example ``i`` is row ``i`` of every leaf. A *batch* has
the same structure, each leaf a global ``jax.Array`` of ``batch_size`` rows
laid out by ``sharding``.

Two entry points, one policy:

* :func:`sharded_batches`: every process can read the whole dataset (one host,
  or a copy per host). Batches are built with ``jax.make_array_from_callback``:
  each device is asked only for the rows of its own slice, so no device (and
  no process) ever materializes a whole batch.
* :func:`process_local_batches`: each process holds only its *own* part of the
  data. Batches are built with ``jax.make_array_from_process_local_data``: the
  process supplies the rows its devices hold, and the pieces form one global
  array. With one process it gives exactly the batches of
  :func:`sharded_batches`.

**Order.** One call is one epoch. Its order is a permutation of the examples
drawn from ``(seed, epoch)`` alone: the same seed and epoch give the same
batches on every run and every process; another ``epoch`` reshuffles.
(:func:`process_local_batches` folds in the process index too: each process
permutes its own examples independently.)

**The last partial batch.** When ``batch_size`` does not divide ``N``, the
last ``N % batch_size`` examples of the epoch's order do not fill a batch. By
default (``drop_remainder=False``) they come as a smaller last batch, so every
example is seen exactly once per epoch; that batch must still split evenly over
the sharding's batch axis (otherwise the call raises), and a jitted step
compiles once more for its shape. With ``drop_remainder=True`` they are
dropped: all batches have one shape (one compilation) and each example is seen
at most once per epoch; since every epoch reshuffles, the dropped examples
change from epoch to epoch. Training loops usually want
``drop_remainder=True``, evaluation the default.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from spmd_guide.core import checks
from spmd_guide.core.display import MONO_CSS, PALETTE, TEXT, Html
from spmd_guide.meshes import show

Dataset = Any
"""A pytree of NumPy arrays sharing their leading length (one row per example)."""


def epoch_order(num_examples: int, *, seed: int,
                epoch: int = 0, process: int = 0) -> np.ndarray:
    """The order of one epoch: a permutation fixed by (seed, epoch).

    ``process`` (a process index) gives each process of a multi-process job its own
    permutation of its *local* examples (:func:`process_local_batches`); process 0 draws the
    order of the whole dataset, so one process reproduces :func:`sharded_batches`.
    """
    _check_count("num_examples", num_examples, minimum=1)
    _check_count("seed", seed, minimum=0)
    _check_count("epoch", epoch, minimum=0)
    _check_count("process", process, minimum=0)
    entropy = (int(seed), int(epoch)) + ((int(process),) if process else ())
    rng = np.random.default_rng(entropy)
    return rng.permutation(int(num_examples))


class Batches(Iterator[Any]):
    """An iterator over one epoch's batches that knows how many are left."""

    def __init__(self, selections: list[np.ndarray],
                 build: Callable[[np.ndarray], Any]):
        self._selections = selections
        self._build = build
        self._next = 0

    def __len__(self) -> int:
        return len(self._selections) - self._next

    @property
    def position(self) -> int:
        """How many batches of this epoch have been taken: with ``(seed, epoch)`` all a
        checkpoint needs to resume the data (the order does not depend on the layout)."""
        return self._next

    def skip(self, n: int) -> Batches:
        """Move past the next ``n`` batches without building them (resume at a saved
        :attr:`position`); returns ``self``. ``n`` at most the batches left."""
        n = checks.count("n", n, minimum=0, maximum=len(self))
        self._next += n
        return self

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        if self._next >= len(self._selections):
            raise StopIteration
        rows = self._selections[self._next]
        self._next += 1
        return self._build(rows)


def sharded_batches(dataset: Dataset, batch_size: int,
                    sharding: Sharding | Any, *, seed: int,
                    epoch: int = 0,
                    drop_remainder: bool = False) -> Batches:
    """One epoch of global batches of ``dataset``, laid out by
    ``sharding``.

    ``sharding`` is one ``Sharding`` for every leaf (``NamedSharding(mesh,
    P("data"))`` splits the rows over mesh axis ``"data"``) or a pytree of
    shardings shaped like the dataset. Each device materializes only its
    own rows. Every example comes exactly once per epoch, in an order
    fixed by ``(seed, epoch)``; ``drop_remainder=True`` drops a last
    partial batch.

    Raises ``ValueError`` at the call for leaves of different lengths, or
    a batch size that is not positive, exceeds the dataset, or does not
    split evenly over the sharding's batch axis.
    """
    batch_size = checks.count("batch_size", batch_size)
    seed, epoch = checks.count("seed", seed, minimum=0), checks.count("epoch", epoch, minimum=0)
    leaves, treedef = _leaves(dataset)
    shardings = _shardings_for(leaves, treedef, sharding)
    n = leaves[0].shape[0]
    sizes = _batch_sizes(n, batch_size, leaves, shardings,
                         drop_remainder=drop_remainder,
                         what="the dataset")
    order = epoch_order(n, seed=seed, epoch=epoch)

    def build(rows: np.ndarray) -> Any:
        pairs = zip(leaves, shardings, strict=True)
        arrays = [_gather(leaf, rows, leaf_sharding)
                  for leaf, leaf_sharding in pairs]
        return jax.tree.unflatten(treedef, arrays)

    return Batches(_split(order, sizes), build)


def _gather(leaf: np.ndarray, rows: np.ndarray,
            sharding: Sharding) -> jax.Array:
    """A global batch of ``leaf[rows]``: each device gets its slice."""

    def fetch(index: tuple[slice, ...]) -> np.ndarray:
        # index: this device's slice of the global batch, per dimension
        return leaf[rows[index[0]]][(slice(None), *index[1:])]

    shape = (len(rows), *leaf.shape[1:])
    return jax.make_array_from_callback(shape, sharding, fetch)


def process_local_batches(local_dataset: Dataset, batch_size: int,
                          sharding: Sharding | Any, *, seed: int,
                          epoch: int = 0,
                          drop_remainder: bool = False) -> Batches:
    """:func:`sharded_batches` for a process that holds only its own data.

    ``batch_size`` is the *global* batch size. Each process contributes
    the rows its own devices hold (``batch_size / process_count`` when the
    batch axis is spread evenly over processes), taken from
    ``local_dataset`` in an order fixed by ``(seed, epoch)`` and the process
    index, and ``jax.make_array_from_process_local_data`` assembles the global
    batch. Each process shuffles its local examples with a permutation of its
    own: with one shared permutation, local example ``i`` of every process
    would land in the same batch epoch after epoch.

    Every process must call it with the same arguments except its data,
    and the local datasets must have the same length everywhere, so that
    all processes yield the same number of batches (a process that stops
    early leaves the others waiting). With one process it yields exactly
    the batches of :func:`sharded_batches`.
    """
    batch_size = checks.count("batch_size", batch_size)
    seed, epoch = checks.count("seed", seed, minimum=0), checks.count("epoch", epoch, minimum=0)
    leaves, treedef = _leaves(local_dataset)
    shardings = _shardings_for(leaves, treedef, sharding)
    _check_batch_size(batch_size, leaves, shardings)
    share = _local_rows(shardings, leaves, batch_size)
    processes = batch_size // share  # processes that split one batch
    n_local = leaves[0].shape[0]
    what = ("the dataset" if processes == 1 else
            f"{processes} process shares of {n_local} examples")
    sizes = _batch_sizes(n_local * processes, batch_size, leaves,
                         shardings, drop_remainder=drop_remainder,
                         what=what)
    order = epoch_order(n_local, seed=seed, epoch=epoch, process=jax.process_index())

    def build(rows: np.ndarray) -> Any:
        arrays = [
            jax.make_array_from_process_local_data(
                leaf_sharding, leaf[rows],
                (len(rows) * processes, *leaf.shape[1:]))
            for leaf, leaf_sharding in zip(leaves, shardings, strict=True)
        ]
        return jax.tree.unflatten(treedef, arrays)

    local_sizes = [size // processes for size in sizes]
    return Batches(_split(order, local_sizes), build)


def batch_axis_size(sharding: Sharding, ndim: int = 1) -> int:
    """Into how many pieces ``sharding`` cuts the leading (batch) axis.

    ``ndim`` is the rank of the array it lays out, at least 1: an array
    without a leading axis has no batch axis. A batch size must be a
    multiple of this number. Devices holding the same rows (replicas over
    other mesh axes) count once.
    """
    checks.sharding("sharding", sharding)
    ndim = checks.count("ndim", ndim)
    n = len(sharding.device_set)
    probe = (n,) * ndim
    try:
        sharding.check_compatible_aval(probe)
        index_map = sharding.devices_indices_map(probe)
    except (ValueError, TypeError, IndexError) as error:
        raise checks.InputError(f"sharding {sharding} does not fit an array of rank "
                         f"{ndim}: {error}") from error
    return len({_row_range(index[0], n) for index in index_map.values()})


# ------------------------------------------------------------------ helpers


def _check_count(name: str, value: Any, *, minimum: int) -> None:
    checks.count(name, value, minimum=minimum)


def _leaves(dataset: Dataset) -> tuple[list[np.ndarray], Any]:
    """The dataset's leaves as NumPy arrays sharing a non-empty first axis."""
    flat, treedef = jax.tree.flatten_with_path(dataset)
    if not flat:
        raise checks.InputError("the dataset has no arrays: pass e.g. a tuple "
                         "(x, y) of NumPy arrays.")
    leaves, lengths = [], {}
    for path, leaf in flat:
        name = jax.tree_util.keystr(path) or "dataset"
        array = np.asarray(checks.array(f"dataset leaf {name}", leaf))
        if array.ndim == 0:
            raise checks.InputError(f"dataset leaf {name} is a scalar; every leaf "
                             f"needs a leading example axis.")
        leaves.append(array)
        lengths[name] = array.shape[0]
    if len(set(lengths.values())) != 1:
        listing = ", ".join(f"{name}: {n}" for name, n in lengths.items())
        raise checks.InputError(f"the dataset's arrays must share their leading "
                         f"length (one row per example), got {listing}.")
    if leaves[0].shape[0] == 0:
        raise checks.InputError("the dataset is empty (leading length 0).")
    return leaves, treedef


def _shardings_for(leaves: list[np.ndarray], treedef: Any,
                   sharding: Any) -> list[Sharding]:
    """One sharding per leaf: ``sharding``, or the leaves of its pytree."""
    if isinstance(sharding, Sharding):
        return [sharding] * len(leaves)
    flat, tree = jax.tree.flatten(
        sharding, is_leaf=lambda s: isinstance(s, Sharding))
    if tree != treedef or not all(isinstance(s, Sharding) for s in flat):
        raise checks.InputTypeError(
            f"sharding must be one jax.sharding.Sharding (e.g. "
            f"NamedSharding(mesh, P('data'))) or a pytree of them shaped "
            f"like the dataset ({treedef}); got {sharding!r}.")
    return flat


def _row_range(index: Any, length: int) -> tuple[int, int]:
    if isinstance(index, slice):
        start, stop, _ = index.indices(length)
        return start, stop
    return 0, length


def _check_batch_size(batch_size: int, leaves: list[np.ndarray],
                      shardings: list[Sharding]) -> int:
    """Check that batches of ``batch_size`` split over the batch axis;
    return the number of pieces that axis is cut into."""
    _check_count("batch_size", batch_size, minimum=1)
    pieces = math.lcm(*(batch_axis_size(s, leaf.ndim)
                        for leaf, s in zip(leaves, shardings, strict=True)))
    if batch_size % pieces:
        raise checks.InputError(
            f"batch_size {batch_size} does not split evenly over the "
            f"sharding's batch axis of {pieces} pieces: use a multiple of "
            f"{pieces}.")
    return pieces


def _batch_sizes(n: int, batch_size: int, leaves: list[np.ndarray],
                 shardings: list[Sharding], *, drop_remainder: bool,
                 what: str) -> list[int]:
    """The sizes of the epoch's batches, checked to fit the shardings."""
    _check_count("batch_size", batch_size, minimum=1)
    drop_remainder = checks.flag("drop_remainder", drop_remainder)
    if batch_size > n:
        raise checks.InputError(
            f"batch_size {batch_size} is larger than {what} ({n} examples): "
            f"an epoch would have no full batch. Use at most {n}.")
    pieces = _check_batch_size(batch_size, leaves, shardings)
    full, remainder = divmod(n, batch_size)
    sizes = [batch_size] * full
    if remainder and not drop_remainder:
        if remainder % pieces:
            raise checks.InputError(
                f"{n} examples in batches of {batch_size} leave a last batch "
                f"of {remainder}, which does not split evenly over the "
                f"sharding's batch axis of {pieces} pieces. Pass "
                f"drop_remainder=True to drop it, or choose a batch size "
                f"that divides {n}.")
        sizes.append(remainder)
    for leaf, leaf_sharding in zip(leaves, shardings, strict=True):
        for size in set(sizes):
            shape = (size, *leaf.shape[1:])
            try:
                leaf_sharding.shard_shape(shape)
            except ValueError as error:
                raise checks.InputError(f"a batch of shape {shape} cannot be laid "
                                 f"out by {leaf_sharding}: {error}") from error
    return sizes


def _split(order: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    bounds = np.cumsum([0, *sizes])
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _local_rows(shardings: list[Sharding], leaves: list[np.ndarray],
                batch_size: int) -> int:
    """How many rows of a global batch this process's devices hold."""
    shares = set()
    for leaf, sharding in zip(leaves, shardings, strict=True):
        shape = (batch_size, *leaf.shape[1:])
        index_map = sharding.addressable_devices_indices_map(shape)
        ranges = {_row_range(index[0], batch_size)
                  for index in index_map.values()}
        shares.add(sum(stop - start for start, stop in ranges))
    if len(shares) != 1:
        raise checks.InputError(
            f"the shardings give this process different numbers of batch "
            f"rows per leaf ({sorted(shares)}); use one batch-axis sharding "
            f"for every leaf.")
    share = shares.pop()
    if batch_size % share:
        raise checks.InputError(
            f"this process holds {share} of the {batch_size} rows of a batch, "
            f"not an even share: spread the batch axis evenly over processes.")
    return share


# ------------------------------------------------------------------------ looking at a batch

#: A box of :func:`rows_by_device` shows at most this many of its block's values.
VALUES_PER_BOX = 8


def rows_by_device(batch_leaf: jax.Array, *, title: str | None = None) -> Html:
    """Which rows (examples) of one batch leaf each device holds, with their values.

    One coloured box per block, in the order of its rows: the devices holding it (``D3``) and
    its values (at most :data:`VALUES_PER_BOX`, then ``...``). The boxes wrap onto new lines
    on a narrow screen instead of shrinking, so no value is ever cut off; ``str()`` gives the
    same as text. For a whole-array picture laid out like the array, see
    :func:`spmd_guide.meshes.show.layout_grid`.
    """
    if title is not None and not isinstance(title, str):
        raise checks.InputTypeError(f"title must be a string, got {title!r}.")
    blocks = show.shard_blocks(batch_leaf, data=True)
    boxes, lines = [], []
    for block in blocks:
        flat = [] if block.data is None else [str(v) for v in np.ravel(block.data)]
        shown = " ".join(flat[:VALUES_PER_BOX]) + (" ..." if len(flat) > VALUES_PER_BOX else "")
        rows = f"rows {block.bounds[0][0]}-{block.bounds[0][1] - 1}"
        colour = PALETTE[block.devices[0] % len(PALETTE)]
        boxes.append(
            f"<div style='background:{colour};color:{TEXT};padding:3px 8px;border-radius:3px;"
            f"white-space:nowrap;{MONO_CSS}' title='{rows}'>"
            f"<span style='font-weight:600'>{html.escape(block.label)}</span> "
            f"{html.escape(shown)}</div>")
        lines.append(f"{block.label} ({rows}): {shown}")
    caption = show.describe(batch_leaf)
    heading = (f"<div style='font-weight:600;margin-bottom:2px'>{html.escape(title)}</div>"
               if title else "")
    markup = (f"<div style='margin:4px 0;color:{TEXT}'>{heading}"
              "<div style='display:flex;flex-wrap:wrap;gap:4px;max-width:100%'>"
              f"{''.join(boxes)}</div>"
              f"<div style='font-size:0.8em;color:#555;margin-top:2px;{MONO_CSS}'>"
              f"{html.escape(caption)}</div></div>")
    text = "\n".join(filter(None, [title, caption, *lines]))
    return Html(html=markup, text=text)
