"""What a sharded checkpoint is: who writes which piece, the files, who reads what back.

Orbax writes an array the way it lies on the devices. Each distinct piece (shard) is written
once, by the process that owns a device holding it; when several devices hold copies of a
piece, the copies split the writing between them (Orbax's *replica-parallel* save, its
default except on GPU: each copy writes ``1/r`` of the piece along its first dimension that
``r`` divides). Every piece a process writes goes into that process's own key-value store
(``ocdbt.process_<i>/``, OCDBT), as one zstd-compressed zarr chunk (a piece larger than
OCDBT's target data-file size, 2 GiB locally and 400 MiB on GCS, is cut into chunks of at most
that size: ``orbax/checkpoint/_src/serialization/tensorstore_utils.py``,
``calculate_chunk_byte_size``, then ``arrays/subchunking.choose_chunk_shape``); at the commit the stores
are merged under one index. A restore in another layout reads, for each distinct slice the
new layout asks for, the saved chunks that slice overlaps: whole chunks, since a compressed
chunk is decoded whole (an upper bound in one process, where TensorStore reads a chunk that
several slices share once; :func:`file_bytes_read` measures it).

These functions compute each of those facts from the arrays, the files and the metadata, so
the pages can print them and the tests can pin them against Orbax.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
from collections import defaultdict
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from spmd_guide.checkpointing import checkpoint
from spmd_guide.checkpointing.names import is_key, leaf_name, named_leaves, physical
from spmd_guide.core import checks
from spmd_guide.rooflines.hardware import Chip, get_chip

__all__ = ["FILE_BYTES_READ", "bytes_per_device", "file_bytes_read", "files", "fits", "layouts",
           "listing", "read_plan", "read_summary", "state_bytes", "write_plan",
           "written_pieces"]

#: TensorStore's counter of the bytes its file key-value store has read, in this process.
FILE_BYTES_READ = "/tensorstore/kvstore/file/bytes_read"


def _index_bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int],
                                                                              ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=False)) + tuple(
        (0, n) for n in shape[len(index):])


def _arrays(name: str, tree: Any) -> list[tuple[str, jax.Array]]:
    """The arrays of ``tree`` by the names Orbax would save them under (refused as a save
    refuses them: names that collide); typed PRNG keys as the key data Orbax writes."""
    leaves = named_leaves(name, tree)
    if not leaves:
        raise checks.InputError(f"{name} must hold at least one array.")
    for path, x in leaves:
        if not isinstance(x, jax.Array):
            raise checks.InputTypeError(
                f"{name} leaf {leaf_name(path)!r} must be a jax.Array (placed on "
                f"devices), got {checks.value_text(x)}.")
    return [(leaf_name(path), _stored(x)) for path, x in leaves]


def _stored(x: jax.Array) -> jax.Array:
    return jax.random.key_data(x) if is_key(x) else x


def _laid_out(name: str, tree: Any, *, stored: bool = True) -> list[tuple[str, Any]]:
    """Leaves that say a layout: arrays, or ShapeDtypeStructs with a sharding (refused as
    :func:`~spmd_guide.checkpointing.checkpoint.restore` refuses a ``like``). With
    ``stored``, typed PRNG keys are the key data Orbax stores (uint32, a trailing axis)."""
    return [(leaf_name(p), physical(x) if stored else x)
            for p, x in jax.tree_util.tree_leaves_with_path(
                checkpoint.abstract(tree, name=name))]


def state_bytes(tree: Any) -> int:
    """The bytes of a pytree's values, each array counted once (however many copies the
    devices hold; a typed PRNG key as its key data)."""
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
               for _, x in _laid_out("tree", tree))


def bytes_per_device(tree: Any) -> dict[int, int]:
    """The bytes each device holds of a pytree laid out by its shardings (arrays, or
    ``jax.ShapeDtypeStruct`` with shardings: nothing needs to be allocated)."""
    held: dict[int, int] = defaultdict(int)
    for _, x in _laid_out("tree", tree):
        size = math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
        for device in x.sharding.device_set:
            held[device.id] += size
    return dict(sorted(held.items()))


def fits(tree: Any, chip: str | Chip) -> dict[str, Any]:
    """Whether the layout of ``tree`` fits in ``chip``'s HBM: the most any device holds
    against the chip's capacity. Only the state itself: a training step needs room for
    gradients and activations on top."""
    chip = get_chip(chip)
    held = bytes_per_device(tree)
    most = max(held.values())
    return {"chip": chip.key, "devices": len(held), "most per device": most,
            "hbm": int(chip.hbm_bytes), "fits": most <= chip.hbm_bytes}


def _spec_text(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return type(sharding).__name__
    return "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"


def layouts(tree: Any, *, names: Any = None) -> list[dict[str, Any]]:
    """One row per leaf (or per leaf named in ``names``, in that order): its shape, the mesh
    and ``PartitionSpec`` that lay it out, the shape of each device's piece and how many
    devices hold each piece."""
    leaves = dict(_laid_out("tree", tree, stored=False))
    if names is not None:
        if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)):
            raise checks.InputTypeError(
                f"names must be a list of leaf names such as ['params.embed'], got "
                f"{checks.value_text(names)}.")
        names = [checks.one_of("leaf name", n, leaves) for n in names]
    rows = []
    for name in names if names is not None else leaves:
        x = leaves[name]
        mesh = getattr(x.sharding, "mesh", None)
        pieces = len({_index_bounds(i, tuple(x.shape)) for i in
                      x.sharding.devices_indices_map(tuple(x.shape)).values()})
        rows.append({"leaf": name, "shape": tuple(x.shape),
                     "mesh": " x ".join(f"{k}={v}" for k, v in mesh.shape.items())
                     if mesh is not None else f"{len(x.sharding.device_set)} device(s)",
                     "spec": _spec_text(x.sharding),
                     "piece": tuple(x.sharding.shard_shape(tuple(x.shape))),
                     "copies": len(x.sharding.device_set) // pieces})
    return rows


# --------------------------------------------------------------------------- writing


def _default_replica_parallel() -> bool:
    # Orbax's own default (jax_array_handlers._get_default_use_replica_parallel): on unless
    # JAX_PLATFORMS names a GPU.
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    return not ("gpu" in platforms or "cuda" in platforms)


def written_pieces(array: jax.Array, *, replica_parallel: bool | None = None
                   ) -> list[tuple[jax.Device, tuple[tuple[int, int], ...]]]:
    """The pieces of ``array`` a save writes: ``(device, ((start, stop), ...))``, each element
    of the array in exactly one piece. ``replica_parallel`` defaults to Orbax's default."""
    if not isinstance(array, jax.Array):
        raise checks.InputTypeError(f"array must be a jax.Array, got {checks.value_text(array)}.")
    array = _stored(array)
    replica_parallel = _default_replica_parallel() if replica_parallel is None else \
        checks.flag("replica_parallel", replica_parallel)
    shape = tuple(array.shape)
    copies: dict[tuple[tuple[int, int], ...], list[Any]] = defaultdict(list)
    for shard in array.addressable_shards:
        copies[_index_bounds(shard.index, shape)].append(shard)
    pieces = []
    for bounds, shards in copies.items():
        shards = sorted(shards, key=lambda s: s.replica_id)
        local = [b - a for a, b in bounds]
        r = len(shards)
        axis = next((d for d, n in enumerate(local) if n % r == 0), None) \
            if replica_parallel and r > 1 and math.prod(local) > 0 else None
        if axis is None:
            pieces.append((shards[0].device, bounds))
            continue
        size = local[axis] // r
        for shard in shards:
            start = bounds[axis][0] + shard.replica_id * size
            pieces.append((shard.device, bounds[:axis] + ((start, start + size),)
                           + bounds[axis + 1:]))
    return pieces


def write_plan(state: Any, *, replica_parallel: bool | None = None) -> list[dict[str, Any]]:
    """One row per device: its process, the bytes it holds and the pieces and bytes it
    writes when ``state`` is saved. The writes add up to :func:`state_bytes`."""
    if replica_parallel is not None:
        replica_parallel = checks.flag("replica_parallel", replica_parallel)
    rows: dict[int, dict[str, Any]] = {}
    for _, x in _arrays("state", state):
        item = np.dtype(x.dtype).itemsize
        for shard in x.addressable_shards:
            row = rows.setdefault(shard.device.id, {
                "device": shard.device.id, "process": shard.device.process_index,
                "holds": 0, "pieces written": 0, "bytes written": 0})
            row["holds"] += shard.data.size * item
        for device, bounds in written_pieces(x, replica_parallel=replica_parallel):
            rows[device.id]["pieces written"] += 1
            rows[device.id]["bytes written"] += math.prod(b - a for a, b in bounds) * item
    return [rows[d] for d in sorted(rows)]


# --------------------------------------------------------------------------- the files


def _role(relative: pathlib.PurePath) -> str:
    parts = relative.parts
    if parts[-1] == "commit_success.txt":
        return "commit markers"
    for part in parts:
        if m := re.fullmatch(r"ocdbt\.process_(\d+)", part):
            return f"data written by process {m.group(1)}"
    if parts[-1] == "manifest.ocdbt" or (len(parts) > 1 and parts[-2] == "d"):
        return "merged index of all processes' data"
    return "metadata: tree, shapes, dtypes, saved shardings"


def _step_directory(step_directory: Any) -> pathlib.Path:
    """One step's directory (``<directory>/<step>``, or the temporary directory of a save
    that did not finish); refuses a checkpoint root, which holds several steps."""
    path = checkpoint._directory(step_directory, must_exist=True, name="step_directory")
    unfinished = r"\d+" + re.escape(checkpoint.TMP_SUFFIX) + r"(-\d+)?"
    if not (path.name.isdigit() or re.fullmatch(unfinished, path.name)):
        held = checkpoint.steps(path)
        hint = (f"; it holds steps {held}: pass one, e.g. {str(path / str(held[-1]))!r}"
                if held else "")
        raise checks.InputError(
            f"step_directory {str(path)!r} is not one step's directory (named by its step "
            f"number, <directory>/<step>){hint}.")
    return path


def listing(step_directory: Any) -> str:
    """The tree of one saved step as text, each file with its size; a directory of data
    files named by hashes (OCDBT's ``d/``) is one line with its count and total."""
    path = _step_directory(step_directory)
    lines = [f"{path.name}/"]

    def walk(folder: pathlib.Path, depth: int) -> None:
        pad = "  " * depth
        for entry in sorted(folder.iterdir(), key=lambda p: (p.is_dir(), p.name)):
            if entry.is_dir() and entry.name == "d":
                sizes = [f.stat().st_size for f in entry.iterdir()]
                lines.append(f"{pad}d/  ({len(sizes)} data files, {sum(sizes):,} bytes)")
            elif entry.is_dir():
                lines.append(f"{pad}{entry.name}/")
                walk(entry, depth + 1)
            else:
                lines.append(f"{pad}{entry.name}  ({entry.stat().st_size:,} bytes)")

    walk(path, 1)
    return "\n".join(lines)


def files(step_directory: Any) -> list[dict[str, Any]]:
    """The files of one saved step (a ``<directory>/<step>`` directory, complete or not),
    grouped by role: how many, and their bytes."""
    path = _step_directory(step_directory)
    groups: dict[str, list[int]] = defaultdict(list)
    for root, _, names in os.walk(path):
        for name in names:
            full = pathlib.Path(root) / name
            groups[_role(full.relative_to(path))].append(full.stat().st_size)
    if not groups:
        raise checks.InputError(f"{str(path)!r} holds no files: it is not a saved step.")
    return [{"role": role, "files": len(sizes), "bytes": sum(sizes)}
            for role, sizes in sorted(groups.items())]


# --------------------------------------------------------------------------- reading


def _chunks_overlapping(bounds: tuple[tuple[int, int], ...], chunk: tuple[int, ...]) -> int:
    count = 1
    for (start, stop), c in zip(bounds, chunk, strict=True):
        count *= 0 if stop <= start else (stop - 1) // c - start // c + 1
    return count


def read_plan(directory: Any, *, like: Any, step: int | None = None) -> list[dict[str, Any]]:
    """One row per device of ``like``'s layout: the bytes it will hold after a restore of
    ``step`` (default: the latest) and the saved chunks its slices overlap (count, bytes).
    ``like`` is checked as :func:`~spmd_guide.checkpointing.checkpoint.restore` checks it."""
    target = checkpoint.restore_target(directory, like=like, step=step)
    rows: dict[int, dict[str, Any]] = {}
    for name, x in _laid_out("like", target.like):
        chunk = target.saved[name].chunk_shape
        item = np.dtype(x.dtype).itemsize
        for device, index in x.sharding.devices_indices_map(tuple(x.shape)).items():
            bounds = _index_bounds(index, tuple(x.shape))
            n = _chunks_overlapping(bounds, chunk) if x.shape else 1
            row = rows.setdefault(device.id, {"device": device.id, "holds": 0,
                                              "chunks read": 0, "chunk bytes": 0})
            row["holds"] += math.prod(b - a for a, b in bounds) * item
            row["chunks read"] += n
            row["chunk bytes"] += n * math.prod(chunk) * item
    return [rows[d] for d in sorted(rows)]


def read_summary(directory: Any, *, like: Any, step: int | None = None) -> dict[str, int]:
    """What a restore into ``like`` reads in all, if each distinct slice reads its chunks on
    its own: a slice held by several devices is read once and copied to each (Orbax reads
    per distinct slice). ``chunk bytes read`` over ``state bytes`` is the read amplification
    of cutting the saved chunks another way. It is an upper bound, reached when the slices
    are read by different processes: within one process, Orbax issues all the slice reads
    of an array at once and TensorStore shares the chunks they have in common
    (:func:`file_bytes_read` measures what one process reads)."""
    target = checkpoint.restore_target(directory, like=like, step=step)
    slices = chunks = chunk_bytes = placed = 0
    for name, x in _laid_out("like", target.like):
        chunk = target.saved[name].chunk_shape
        item = np.dtype(x.dtype).itemsize
        seen = set()
        for index in x.sharding.devices_indices_map(tuple(x.shape)).values():
            bounds = _index_bounds(index, tuple(x.shape))
            placed += math.prod(b - a for a, b in bounds) * item
            if bounds in seen:
                continue
            seen.add(bounds)
            n = _chunks_overlapping(bounds, chunk) if x.shape else 1
            slices += 1
            chunks += n
            chunk_bytes += n * math.prod(chunk) * item
    return {"devices": len(bytes_per_device(target.like)), "slices read": slices,
            "chunks read": chunks, "chunk bytes read": chunk_bytes,
            "bytes placed on devices": placed, "state bytes": state_bytes(target.like)}


def _counter() -> int:
    found = ts.experimental_collect_matching_metrics(FILE_BYTES_READ, include_zero_metrics=True)
    return sum(int(v.get("value", 0)) for m in found if m["name"] == FILE_BYTES_READ
               for v in m["values"])


def file_bytes_read(directory: Any, *, like: Any, step: int | None = None) -> int:
    """Restore ``step`` (default: the latest) into ``like`` and return the bytes TensorStore
    read from files meanwhile: its process-wide counter :data:`FILE_BYTES_READ` before and
    after (compressed data, the index and the metadata TensorStore reads; a save or restore
    running at the same time in this process would be counted too)."""
    before = _counter()
    checkpoint.restore(directory, like=like, step=step)
    return _counter() - before


def file_bytes_read_range(directory: Any, *, like: Any, step: int | None = None,
                          repeats: int = 3) -> tuple[int, int]:
    """The least and the most bytes :func:`file_bytes_read` counts over ``repeats`` restores.

    They differ: Orbax's read spec gives the saved arrays no chunk cache (the only cache pool
    it configures, ``cache_pool#ocdbt``, holds OCDBT's B-tree nodes), so TensorStore shares a
    chunk only between reads of it that are in flight at the same time, and what is in
    flight together depends on timing."""
    repeats = checks.count("repeats", repeats)
    read = [file_bytes_read(directory, like=like, step=step) for _ in range(repeats)]
    return min(read), max(read)
