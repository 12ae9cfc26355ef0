"""Sharded checkpoints with Orbax: save a pytree of sharded arrays, restore it in any layout.

Three calls are the contract::

    save(directory, state, step=100)          # returns when step 100 is complete on disk
    restore(directory, like=abstract_state)   # the latest complete step, laid out as `like`
    latest_step(directory)                    # 100, or None

``state`` is any pytree of arrays (parameters, an optax state, a data position, a typed PRNG
key from ``jax.random.key``). Orbax names each array by its keys joined with dots
(``params.blocks.0.wq``), so a key that holds a dot, or two paths that give one name, are
refused before anything is written: they would be saved under one name. Each array
is written by the devices that hold it, each distinct piece once, into a step directory
``<directory>/<step>`` that appears only when the whole step is on disk: Orbax writes into
``<step>.orbax-checkpoint-tmp`` and renames it when every write has finished, so a process
killed mid-save leaves the previous step as the latest complete one. :func:`start_save` is
the same save without the wait: it returns once the arrays are copied to host memory, and the
files are written while training goes on.

``like`` says how to lay the values out: a pytree with the checkpoint's structure whose
leaves are ``jax.Array`` or ``jax.ShapeDtypeStruct`` with a sharding, on any mesh of any
size. Each device reads only the pieces its slice needs. Shapes and dtypes must match the
checkpoint: Orbax would cast to another dtype without a word, so :func:`restore` refuses.

A step counts only when it is complete: a directory named by its number alone that holds
Orbax's commit marker ``commit_success.txt``, which Orbax writes as the last file of a save
(before the rename from ``<step>.orbax-checkpoint-tmp``). A complete step whose files cannot be
read (deleted, truncated or overwritten) raises :class:`DamagedCheckpointError`, which names
the step and the directory, with Orbax's or TensorStore's error as its cause. A ``like`` whose
structure differs from the checkpoint's (a dict where the checkpoint has a list) is the
caller's mistake, not damage: it is refused with both structures shown, before any read.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src import asyncio_utils
from orbax.checkpoint._src.metadata import array_metadata, array_metadata_store

from spmd_guide.checkpointing.names import is_key, physical, structure_name
from spmd_guide.checkpointing.names import leaf_name as _name
from spmd_guide.checkpointing.names import named_leaves as _leaves
from spmd_guide.core import checks

__all__ = ["DamagedCheckpointError", "PendingSave", "RestoreTarget", "SavedArray", "latest_step",
           "restore", "restore_target", "save", "saved_arrays", "saved_layout", "saved_structure",
           "start_save", "steps"]

#: The suffix Orbax gives a step directory while it is being written.
TMP_SUFFIX = ".orbax-checkpoint-tmp"
#: The item a step directory holds: ``CheckpointManager`` names a single item ``default``.
ITEM = "default"
#: The file Orbax 0.12 writes last into a step directory (``AtomicRenameTemporaryPath.
#: finalize`` writes it, then renames the temporary directory): a step is complete with it.
COMMIT_MARKER = "commit_success.txt"


class DamagedCheckpointError(checks.InputError):
    """A complete step (its commit marker is there) whose files cannot be read."""


# --------------------------------------------------------------------------- checks


def _directory(directory: Any, *, must_exist: bool, name: str = "directory") -> pathlib.Path:
    """``directory`` as an absolute path; refuses what is not a path, an empty or blank
    path (it would mean the current directory) and a file."""
    path = checks.path(name, directory, what="a path to a directory")
    if not path.parts:  # Path('') and '.' are both Path('.'): the current directory, unnamed
        raise checks.InputError(
            f"{name} must not be empty or '.', got {checks.value_text(directory)}: it would "
            f"mean the current directory; name a directory explicitly (e.g. './checkpoints').")
    path = checks.directory(name, path, must_exist=False)  # not a file, nor below one
    if must_exist and not path.exists():
        raise checks.InputError(
            f"{name} {str(path)!r} does not exist: there is no checkpoint to restore.")
    return path


def _step(step: Any) -> int:
    return checks.count("step", step, minimum=0)


def _state_leaves(state: Any) -> Any:
    """``state`` with every leaf an array (NumPy scalars and Python numbers become 0-d).
    ``None`` is an empty subtree, as in JAX (optax states have some)."""
    named = _leaves("state", state)   # refuses a tree JAX cannot flatten (mixed key types)
    if jax.tree.structure(state).num_nodes == 1 and named:  # one bare leaf
        raise checks.InputTypeError(
            f"state must be a pytree of arrays (a dict, a list...), got one leaf "
            f"{checks.value_text(state)}; wrap a single array, e.g. {{'x': x}}.")
    if not named:
        raise checks.InputError(f"state must hold at least one array, got "
                                f"{checks.value_text(state)}.")

    def leaf(path, x):
        checks.array(f"state leaf {_name(path)!r}", x)
        if isinstance(x, jax.ShapeDtypeStruct):
            raise checks.InputTypeError(
                f"state leaf {_name(path)!r} is a ShapeDtypeStruct, which has no values to "
                f"save; pass arrays.")
        if isinstance(x, jax.core.Tracer):
            raise checks.InputTypeError(
                f"state leaf {_name(path)!r} is a traced value: save outside jax.jit.")
        if isinstance(x, (jax.Array, np.ndarray)):
            return x
        x = np.asarray(x)  # a Python or NumPy scalar: JAX's dtype for it (int32 unless x64)
        typed = x.astype(jax.dtypes.canonicalize_dtype(x.dtype))
        if typed.dtype != x.dtype and typed != x:
            raise checks.InputError(
                f"state leaf {_name(path)!r} is {x.item()}, which does not fit {typed.dtype} "
                f"(JAX's type for it): it would be saved as {typed.item()}. Save a smaller "
                f"number, or a NumPy array of a wider dtype.")
        return typed

    return jax.tree_util.tree_map_with_path(leaf, state)


# --------------------------------------------------------------------------- steps


def _complete(entry: pathlib.Path) -> bool:
    return entry.name.isdigit() and entry.is_dir() and (entry / COMMIT_MARKER).is_file()


def steps(directory: Any) -> list[int]:
    """The complete steps in ``directory``, oldest first (``[]`` if it is missing or empty).

    A step is complete when its directory carries the step number alone (``3``, not
    ``backup_3``) and holds Orbax's commit marker: a save still being written, or killed
    while writing, is ``<step>.orbax-checkpoint-tmp`` and does not count, nor does an empty
    or half-copied ``<step>`` directory.
    """
    path = _directory(directory, must_exist=False)
    if not path.exists():
        return []
    return sorted(int(entry.name) for entry in path.iterdir() if _complete(entry))


def latest_step(directory: Any) -> int | None:
    """The latest complete step in ``directory``, or ``None`` when there is none (yet)."""
    done = steps(directory)
    return done[-1] if done else None


def _unfinished(path: pathlib.Path) -> list[str]:
    """Entries that look like steps but are not complete: temporary directories of saves
    that never finished, and step directories without the commit marker."""
    if not path.exists():
        return []
    return sorted(p.name for p in path.iterdir() if TMP_SUFFIX in p.name or (
        p.name.isdigit() and not _complete(p)))


# --------------------------------------------------------------------------- save


@dataclass
class PendingSave:
    """A save under way (from :func:`start_save`): the arrays are already copied to host
    memory, so the caller may overwrite or donate them; the files are still being written."""

    step: int
    path: pathlib.Path
    _manager: Any = field(repr=False)

    def done(self) -> bool:
        """Whether the step is complete on disk (never blocks)."""
        return self._manager is None or not self._manager.is_saving_in_progress()

    def wait(self) -> pathlib.Path:
        """Block until the step is complete on disk (committed); return its directory."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            try:
                manager.wait_until_finished()
            finally:
                manager.close()
                _IN_FLIGHT.discard(self.path)
        return self.path


#: The step directories this process is writing now (started, not yet waited for).
_IN_FLIGHT: set[pathlib.Path] = set()


def start_save(directory: Any, state: Any, *, step: int) -> PendingSave:
    """Start writing ``state`` as ``step`` of ``directory``; return once the arrays are in
    host memory, with the files still being written in the background.

    Every input is checked before anything touches the disk; a step that is already complete
    is refused (a checkpoint is never overwritten). What an earlier save of the same step left
    when it was killed (``<step>.orbax-checkpoint-tmp``) is removed first.
    """
    path = _directory(directory, must_exist=False)
    step = _step(step)
    state = _state_leaves(state)
    if step in steps(path):
        raise checks.InputError(
            f"step {step} is already saved in {str(path)!r}; a complete step is never "
            f"overwritten: save a later step, or delete {str(path / str(step))!r} first.")
    if path / str(step) in _IN_FLIGHT:
        raise checks.InputError(
            f"step {step} of {str(path)!r} is being written by a save this process started; "
            f"wait() for it before saving that step again.")
    if (path / str(step)).exists():
        raise checks.InputError(
            f"{str(path / str(step))!r} exists but is not a complete step (it has no "
            f"{COMMIT_MARKER}: a copy that did not finish, or not Orbax's); the save would "
            f"not replace it. Delete it, or save another step.")
    for stale in _unfinished(path):
        # What a save of this step killed mid-write left behind. Orbax would remove it too,
        # with a warning; the new save replaces it.
        if TMP_SUFFIX in stale and stale.split(".")[0] == str(step):
            shutil.rmtree(path / stale)
    manager = ocp.CheckpointManager(
        path, options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True))
    try:
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
    except BaseException:
        manager.close()
        raise
    _IN_FLIGHT.add(path / str(step))
    return PendingSave(step=step, path=path / str(step), _manager=manager)


def save(directory: Any, state: Any, *, step: int) -> pathlib.Path:
    """Write ``state`` (a pytree of sharded arrays) as ``step`` of ``directory``; return the
    step's directory once the step is complete on disk."""
    return start_save(directory, state, step=step).wait()


# --------------------------------------------------------------------------- restore


def _chosen_step(path: pathlib.Path, step: Any) -> int:
    done = steps(path)
    if not done:
        extra = (f"; it holds only unfinished saves {_unfinished(path)} (a process stopped "
                 f"while writing, or a copy that did not finish)") if _unfinished(path) else ""
        raise checks.InputError(
            f"directory {str(path)!r} holds no complete checkpoint{extra}.")
    if step is None:
        return done[-1]
    step = _step(step)
    if step not in done:
        why = (" (its save never finished: only a temporary directory is left)"
               if any(n.startswith(f"{step}.") for n in _unfinished(path)) else
               f" (its directory has no {COMMIT_MARKER}: a save or a copy that did not "
               f"finish)" if str(step) in _unfinished(path) else "")
        raise checks.InputError(
            f"step {step} is not a complete checkpoint in {str(path)!r}{why}; complete "
            f"steps: {done}.")
    return step


def abstract(like: Any, *, name: str = "like") -> Any:
    """``like`` as ``jax.ShapeDtypeStruct`` leaves with shardings (what Orbax restores into);
    refuses leaves that say no layout, and trees whose leaves would share a name."""
    if not _leaves(name, like):
        raise checks.InputError(
            f"{name} must hold at least one array, got {checks.value_text(like)}.")

    def leaf(path, x):
        leaf_name = _name(path)
        if isinstance(x, jax.Array) or (isinstance(x, jax.ShapeDtypeStruct)
                                        and x.sharding is not None):
            checks.sharding(f"the sharding of {name} leaf {leaf_name!r}", x.sharding)
            try:
                x.sharding.shard_shape(tuple(x.shape))
            except ValueError as error:  # jax's IndivisibleError is a ValueError
                raise checks.InputError(
                    f"{name} leaf {leaf_name!r} of shape {tuple(x.shape)} cannot be laid out by "
                    f"{x.sharding}: {error}") from None
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        raise checks.InputTypeError(
            f"{name} leaf {leaf_name!r} must be a jax.Array or a jax.ShapeDtypeStruct with a "
            f"sharding (jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, "
            f"spec))), got {checks.value_text(x)}.")

    return jax.tree_util.tree_map_with_path(leaf, like)


@dataclass(frozen=True)
class SavedArray:
    """One array of a checkpoint as its metadata describes it. ``chunk_shape`` is the piece
    each write produced (a zarr chunk, compressed as a whole, so a read takes it whole).
    A typed PRNG key is stored as its key data: ``shape`` and ``dtype`` are those of the key
    data, and ``key_impl`` names the key's implementation (``None`` for other arrays)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    key_impl: str | None = None


def _key_dtype(impl: str) -> Any:
    return jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype


#: What Orbax 0.12 says when a restore target's tree differs from the saved one
#: (``base_pytree_checkpoint_handler``): the caller's mistake, never damage.
_STRUCTURE_MISMATCH = "User-provided restore item and on-disk value metadata tree"


@contextlib.contextmanager
def _reading(path: pathlib.Path, step: int) -> Iterator[None]:
    """Turns any failure to read a complete step's files into :class:`DamagedCheckpointError`
    (the package's own refusals pass through, and so does Orbax's complaint that a target's
    structure differs from the checkpoint's, as an :class:`~spmd_guide.core.checks.InputError`:
    the files are intact)."""
    try:
        yield
    except checks.InputError:
        raise
    except MemoryError:
        raise
    except Exception as error:
        cause = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        if _STRUCTURE_MISMATCH in str(error):
            raise checks.InputError(
                f"like's structure differs from that of step {step} of {str(path)!r} (Orbax: "
                f"{cause}); the checkpoint is intact: build like with the checkpoint's "
                f"structure (saved_structure(directory) lists it).") from error
        others = [s for s in steps(path) if s != step]
        raise DamagedCheckpointError(
            f"step {step} of {str(path)!r} is damaged: it is marked complete, but its files "
            f"cannot be read ({type(error).__name__}: {cause}). Restore another step "
            f"({others if others else 'there is none'}); if its files are indeed lost (deleted "
            f"or truncated), {str(path / str(step))!r} cannot be read again.") from error


def _metadata(path: pathlib.Path, step: int) -> tuple[Any, dict[str, str]]:
    """Orbax's metadata tree of a complete step, and the key impl of each typed PRNG key."""
    item = epath.Path(path / str(step) / ITEM)
    with _reading(path, step):
        handler = ocp.StandardCheckpointHandler()
        try:
            tree = handler.metadata(item)
        finally:
            handler.close()
        found = asyncio_utils.run_sync(array_metadata_store.Store().read(item)) or {}
        impls = {m.param_name: m.ext_metadata[array_metadata.RANDOM_KEY_IMPL]
                 for metas in found.values() for m in metas
                 if isinstance(m.ext_metadata, dict)
                 and m.ext_metadata.get(array_metadata.RANDOM_KEY_IMPL)}
        if not jax.tree.leaves(tree.tree):
            raise ValueError("its metadata lists no arrays")
    return tree, impls


def saved_arrays(directory: Any, *, step: int | None = None) -> dict[str, SavedArray]:
    """Each array of a checkpoint by name (``params.blocks.0.wq``), read from its metadata
    (step default: the latest complete step)."""
    path = _directory(directory, must_exist=True)
    step = _chosen_step(path, step)
    return _saved_arrays(path, step)


def _saved_arrays(path: pathlib.Path, step: int) -> dict[str, SavedArray]:
    metadata, impls = _metadata(path, step)
    found = {}
    with _reading(path, step):
        for leaf in jax.tree.leaves(metadata):
            chunks = getattr(getattr(leaf, "storage", None), "chunk_shape", None)
            found[leaf.name] = SavedArray(tuple(leaf.shape), np.dtype(leaf.dtype),
                                          tuple(chunks) if chunks else tuple(leaf.shape),
                                          impls.get(leaf.name))
    return found


def saved_structure(directory: Any, *, step: int | None = None) -> list[str]:
    """The checkpoint's leaves by :func:`~spmd_guide.checkpointing.names.structure_name`
    (``blocks[0].wq`` where ``blocks`` was saved as a list or tuple, ``blocks.0.wq`` where it
    was a dict), sorted: the structure a ``like`` must have (step default: the latest)."""
    path = _directory(directory, must_exist=True)
    step = _chosen_step(path, step)
    return _saved_structure(path, step)


def _saved_structure(path: pathlib.Path, step: int) -> list[str]:
    metadata, _ = _metadata(path, step)
    with _reading(path, step):
        return sorted(structure_name(p) for p, _ in
                      jax.tree_util.tree_leaves_with_path(metadata.tree))


def saved_layout(directory: Any, *, step: int | None = None) -> Any:
    """The checkpoint's own layout as a ``like``: its arrays' shapes and dtypes with the
    shardings they were saved with (on the same devices, so only in a process that has
    them; arrays saved from NumPy on the first device). The tree has the saved structure,
    with optax's named tuples as plain dicts and lists; typed PRNG keys are keys again."""
    path = _directory(directory, must_exist=True)
    step = _chosen_step(path, step)
    metadata, impls = _metadata(path, step)
    first = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def leaf(m):  # an array saved from NumPy has no sharding: it comes back on one device
        try:
            sharding = first if m.sharding is None else m.sharding.to_jax_sharding()
        except ValueError as error:  # the saved devices are not in this process
            raise checks.InputError(
                f"step {step} of {str(path)!r} was saved on devices this process does not "
                f"have ({str(error).splitlines()[0][:120]}); build a like on this process's "
                f"devices instead, e.g. with training.state_like.") from None
        if m.name not in impls:
            return jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding)
        dtype = _key_dtype(impls[m.name])
        ndim = len(m.shape) - len(jax.eval_shape(
            jax.random.key_data, jax.ShapeDtypeStruct((), dtype)).shape)
        if isinstance(sharding, jax.sharding.NamedSharding):
            sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(
                *sharding.spec[:ndim]))
        return jax.ShapeDtypeStruct(tuple(m.shape[:ndim]), dtype, sharding=sharding)

    return jax.tree.map(leaf, metadata)


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} array{'s' if len(names) > 1 else ''} ({shown})"


def _check_like(like: Any, saved: dict[str, SavedArray], where: str,
                structure: list[str] | None = None) -> None:
    wanted = {_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(like)}
    missing, extra = sorted(set(saved) - set(wanted)), sorted(set(wanted) - set(saved))
    if missing or extra:
        parts = ([f"the checkpoint has {_some(missing)} that like lacks"] if missing else []) + \
                ([f"like has {_some(extra)} that the checkpoint lacks"] if extra else [])
        raise checks.InputError(
            f"like does not have the structure of {where}: {'; '.join(parts)}.")
    if structure is not None:  # the same names: are the containers of the same kinds?
        ours = sorted(structure_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(like))
        theirs, mine = sorted(set(structure) - set(ours)), sorted(set(ours) - set(structure))
        if theirs or mine:
            raise checks.InputError(
                f"like's structure differs from that of {where}: the same array names, but "
                f"a list or tuple in one is a dict in the other (a[0] is an index, a.0 a dict "
                f"key): the checkpoint has {_some(theirs)}, like has {_some(mine)}. The "
                f"checkpoint is intact: build like with its structure.")
    for name, x in wanted.items():
        s = saved[name]
        if is_key(x) != (s.key_impl is not None):
            raise checks.InputError(
                f"like leaf {name!r} is {'a' if is_key(x) else 'not a'} typed PRNG key, but "
                f"{where} saved {'a key' if s.key_impl else 'an array of ' + str(s.dtype)}: "
                f"ask for {'jax.random.key(...) of ' + s.key_impl if s.key_impl else s.dtype}.")
        if s.key_impl is not None and x.dtype != _key_dtype(s.key_impl):
            raise checks.InputError(
                f"like leaf {name!r} is a key of dtype {x.dtype}, but {where} saved a "
                f"{s.key_impl} key ({_key_dtype(s.key_impl)}).")
        stored = physical(x)  # a key: compare its key data with what was stored
        if tuple(stored.shape) != s.shape:
            shown = (tuple(x.shape), s.shape[:len(s.shape) - (stored.ndim - x.ndim)])
            raise checks.InputError(
                f"like leaf {name!r} has shape {shown[0]}, but {where} saved it with shape "
                f"{shown[1]}; a restore reads values, it does not reshape them.")
        if is_key(x):
            continue
        dtype = np.dtype(x.dtype)
        if jax.dtypes.canonicalize_dtype(dtype) != jax.dtypes.canonicalize_dtype(s.dtype):
            raise checks.InputError(
                f"like leaf {name!r} has dtype {dtype}, but {where} saved it as {s.dtype}; "
                f"Orbax would cast it silently. Restore as {s.dtype} and cast explicitly "
                f"(x.astype) if a cast is what you want.")


@dataclass(frozen=True)
class RestoreTarget:
    """What :func:`restore` will read, checked: the step, its directory, ``like`` as
    ``jax.ShapeDtypeStruct`` leaves with shardings, and the saved arrays by name."""

    path: pathlib.Path
    step: int
    like: Any
    saved: dict[str, SavedArray]


def restore_target(directory: Any, *, like: Any, step: int | None = None) -> RestoreTarget:
    """Every check :func:`restore` makes, without reading any values: the directory, the
    step (default: the latest complete one), and ``like`` against the checkpoint's metadata
    (structure, shapes, dtypes, keys). The planning functions of
    :mod:`spmd_guide.checkpointing.anatomy` share it, so they refuse what a restore refuses."""
    path = _directory(directory, must_exist=True)
    step = _chosen_step(path, step)
    target = abstract(like)
    saved = _saved_arrays(path, step)
    _check_like(target, saved, f"step {step} of {str(path)!r}", _saved_structure(path, step))
    return RestoreTarget(path=path, step=step, like=target, saved=saved)


def restore(directory: Any, *, like: Any, step: int | None = None) -> Any:
    """The values of ``step`` (default: the latest complete step) laid out as ``like`` says.

    ``like`` has the saved pytree's structure, shapes and dtypes; its leaves' shardings may
    be on any mesh (Auto or Explicit axes, any device count). Each device reads only the
    pieces of the files its slice needs. A step whose files cannot be read raises
    :class:`DamagedCheckpointError`.
    """
    target = restore_target(directory, like=like, step=step)
    # Not read_only: Orbax logs warnings for that mode. A manager that is not asked to save
    # writes nothing (create=False, no clean-up of unfinished saves).
    with _reading(target.path, target.step):
        manager = ocp.CheckpointManager(target.path,
                                        options=ocp.CheckpointManagerOptions(create=False))
        try:
            return manager.restore(target.step, args=ocp.args.StandardRestore(target.like))
        finally:
            manager.close()
