"""Sharded checkpoints with Orbax: save a pytree of sharded arrays, restore it in any layout.

Three calls are the contract::

    save(directory, state, step=100)          # returns when step 100 is complete on disk
    restore(directory, like=abstract_state)   # the latest complete step, laid out as `like`
    latest_step(directory)                    # 100, or None

``state`` is any pytree of arrays (parameters, an optax state, a data position). Each array
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
"""

from __future__ import annotations

import os
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from spmd_guide.core import checks

__all__ = ["PendingSave", "SavedArray", "latest_step", "restore", "save", "saved_arrays",
           "saved_layout", "start_save", "steps"]

#: The suffix Orbax gives a step directory while it is being written.
TMP_SUFFIX = ".orbax-checkpoint-tmp"
#: The item a step directory holds: ``CheckpointManager`` names a single item ``default``.
ITEM = "default"


# --------------------------------------------------------------------------- checks


def _directory(directory: Any, *, must_exist: bool) -> pathlib.Path:
    if isinstance(directory, bytes) or not isinstance(directory, (str, os.PathLike)):
        raise checks.InputTypeError(
            f"directory must be a path (a str or pathlib.Path), got {checks.value_text(directory)}.")
    path = pathlib.Path(directory).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise checks.InputError(f"directory {str(path)!r} is a file, not a directory.")
    if must_exist and not path.exists():
        raise checks.InputError(
            f"directory {str(path)!r} does not exist: there is no checkpoint to restore.")
    return path


def _step(step: Any) -> int:
    return checks.count("step", step, minimum=0)


def _name(path: tuple[Any, ...]) -> str:
    """A leaf's name as Orbax writes it: its keys joined by dots (``params.blocks.0.wq``)."""
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def _state_leaves(state: Any) -> Any:
    """``state`` with every leaf an array (NumPy scalars and Python numbers become 0-d).
    ``None`` is an empty subtree, as in JAX (optax states have some)."""
    if not jax.tree.leaves(state):
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
        return x.astype(jax.dtypes.canonicalize_dtype(x.dtype))

    return jax.tree_util.tree_map_with_path(leaf, state)


# --------------------------------------------------------------------------- steps


def steps(directory: Any) -> list[int]:
    """The complete steps in ``directory``, oldest first (``[]`` if it is missing or empty).

    A step is complete when its directory carries the step number alone: a save still being
    written, or killed while writing, is ``<step>.orbax-checkpoint-tmp`` and does not count.
    """
    path = _directory(directory, must_exist=False)
    if not path.exists():
        return []
    return sorted(ocp.step.checkpoint_steps(path))


def latest_step(directory: Any) -> int | None:
    """The latest complete step in ``directory``, or ``None`` when there is none (yet)."""
    done = steps(directory)
    return done[-1] if done else None


def _unfinished(path: pathlib.Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if TMP_SUFFIX in p.name) if path.exists() \
        else []


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
        return self.path


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
    for stale in _unfinished(path):
        # What a save of this step killed mid-write left behind. Orbax would remove it too,
        # with a warning; the new save replaces it.
        if stale.split(".")[0] == str(step):
            shutil.rmtree(path / stale)
    manager = ocp.CheckpointManager(
        path, options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True))
    try:
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
    except BaseException:
        manager.close()
        raise
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
                 f"while writing)") if _unfinished(path) else ""
        raise checks.InputError(
            f"directory {str(path)!r} holds no complete checkpoint{extra}.")
    if step is None:
        return done[-1]
    step = _step(step)
    if step not in done:
        why = (" (its save never finished: only a temporary directory is left)"
               if any(n.startswith(f"{step}.") for n in _unfinished(path)) else "")
        raise checks.InputError(
            f"step {step} is not a complete checkpoint in {str(path)!r}{why}; complete "
            f"steps: {done}.")
    return step


def abstract(like: Any) -> Any:
    """``like`` as ``jax.ShapeDtypeStruct`` leaves with shardings (what Orbax restores into);
    refuses leaves that say no layout."""
    if not jax.tree.leaves(like):
        raise checks.InputError(f"like must hold at least one array, got {checks.value_text(like)}.")

    def leaf(path, x):
        name = _name(path)
        if isinstance(x, jax.Array) or (isinstance(x, jax.ShapeDtypeStruct)
                                        and x.sharding is not None):
            checks.sharding(f"the sharding of like leaf {name!r}", x.sharding)
            try:
                x.sharding.shard_shape(tuple(x.shape))
            except ValueError as error:  # jax's IndivisibleError is a ValueError
                raise checks.InputError(
                    f"like leaf {name!r} of shape {tuple(x.shape)} cannot be laid out by "
                    f"{x.sharding}: {error}") from None
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        raise checks.InputTypeError(
            f"like leaf {name!r} must be a jax.Array or a jax.ShapeDtypeStruct with a "
            f"sharding (jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, "
            f"spec))), got {checks.value_text(x)}.")

    return jax.tree_util.tree_map_with_path(leaf, like)


@dataclass(frozen=True)
class SavedArray:
    """One array of a checkpoint as its metadata describes it. ``chunk_shape`` is the piece
    each write produced (a zarr chunk, compressed as a whole, so a read takes it whole)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]


def _metadata(directory: Any, step: int | None) -> Any:
    """Orbax's metadata tree of a saved step (default: the latest complete one)."""
    path = _directory(directory, must_exist=True)
    step = _chosen_step(path, step)
    handler = ocp.StandardCheckpointHandler()
    try:
        return handler.metadata(epath.Path(path / str(step) / ITEM))
    finally:
        handler.close()


def saved_arrays(directory: Any, *, step: int | None = None) -> dict[str, SavedArray]:
    """Each array of a checkpoint by name (``params.blocks.0.wq``), read from its metadata
    (step default: the latest complete step)."""
    metadata = _metadata(directory, step)
    found = {}
    for leaf in jax.tree.leaves(metadata):
        chunks = getattr(getattr(leaf, "storage", None), "chunk_shape", None)
        found[leaf.name] = SavedArray(tuple(leaf.shape), np.dtype(leaf.dtype),
                                      tuple(chunks) if chunks else tuple(leaf.shape))
    return found


def saved_layout(directory: Any, *, step: int | None = None) -> Any:
    """The checkpoint's own layout as a ``like``: its arrays' shapes and dtypes with the
    shardings they were saved with (on the same devices, so only in a process that has
    them; arrays saved from NumPy on the first device). The tree has the saved structure,
    with optax's named tuples as plain dicts and lists."""
    metadata = _metadata(directory, step)
    first = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def leaf(m):  # an array saved from NumPy has no sharding: it comes back on one device
        sharding = first if m.sharding is None else m.sharding.to_jax_sharding()
        return jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding)

    return jax.tree.map(leaf, metadata)


def _check_like(like: Any, saved: dict[str, Any], where: str) -> None:
    wanted = {_name(p): (tuple(x.shape), np.dtype(x.dtype))
              for p, x in jax.tree_util.tree_leaves_with_path(like)}
    missing, extra = sorted(set(saved) - set(wanted)), sorted(set(wanted) - set(saved))
    if missing or extra:
        def some(names: list[str]) -> str:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            return f"{len(names)} array{'s' if len(names) > 1 else ''} ({shown})"
        parts = ([f"the checkpoint has {some(missing)} that like lacks"] if missing else []) + \
                ([f"like has {some(extra)} that the checkpoint lacks"] if extra else [])
        raise checks.InputError(
            f"like does not have the structure of {where}: {'; '.join(parts)}.")
    for name, (shape, dtype) in wanted.items():
        s_shape, s_dtype = saved[name].shape, saved[name].dtype
        if shape != s_shape:
            raise checks.InputError(
                f"like leaf {name!r} has shape {shape}, but {where} saved it with shape "
                f"{s_shape}; a restore reads values, it does not reshape them.")
        if jax.dtypes.canonicalize_dtype(dtype) != jax.dtypes.canonicalize_dtype(s_dtype):
            raise checks.InputError(
                f"like leaf {name!r} has dtype {dtype}, but {where} saved it as {s_dtype}; "
                f"Orbax would cast it silently. Restore as {s_dtype} and cast explicitly "
                f"(x.astype) if a cast is what you want.")


def restore(directory: Any, *, like: Any, step: int | None = None) -> Any:
    """The values of ``step`` (default: the latest complete step) laid out as ``like`` says.

    ``like`` has the saved pytree's structure, shapes and dtypes; its leaves' shardings may
    be on any mesh (Auto or Explicit axes, any device count). Each device reads only the
    pieces of the files its slice needs.
    """
    path = _directory(directory, must_exist=True)
    step = _chosen_step(path, step)
    target = abstract(like)
    _check_like(target, saved_arrays(path, step=step), f"step {step} of {str(path)!r}")
    # Not read_only: Orbax logs warnings for that mode. A manager that is not asked to save
    # writes nothing (create=False, no clean-up of unfinished saves).
    manager = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False))
    try:
        return manager.restore(step, args=ocp.args.StandardRestore(target))
    finally:
        manager.close()
