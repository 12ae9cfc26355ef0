"""Orbax without the book's wrapper: the calls a reader writes in their own code
(checkpointing/plain_orbax).

:func:`save` and :func:`restore` are the plain Orbax 0.12 calls, a ``CheckpointManager`` with
``ocp.args.StandardSave`` / ``ocp.args.StandardRestore``, each behind the package's input
checks, which run before Orbax touches the disk (a refused call writes nothing).
:func:`abstract_target` is the restore target: ``jax.ShapeDtypeStruct`` leaves that carry the
shardings to restore into. :func:`restore_elsewhere` restores in a fresh Python that has
another number of devices, as a job restarted on a smaller slice would.

The page's example state is :func:`example_state`, laid out by :func:`example_shardings` on any
``("data", "model")`` mesh.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import checkpoint
from spmd_guide.checkpointing.names import leaf_name
from spmd_guide.core import checks

__all__ = ["abstract_target", "example_shardings", "example_state", "restore",
           "restore_elsewhere", "save"]


# --------------------------------------------------------------------------- the example


def example_state(*, width: int = 64) -> dict[str, Any]:
    """A small training state: a weight ``[width, width // 2]``, a bias and a step counter,
    with values that say where they came from (``arange``), so a restore is checked exactly."""
    width = checks.count("width", width, minimum=2)
    half = width // 2
    return {"params": {"w": jnp.arange(width * half, dtype=jnp.float32).reshape(width, half),
                       "b": jnp.arange(half, dtype=jnp.float32)},
            "step": jnp.int32(7)}


def example_shardings(mesh: Mesh) -> dict[str, Any]:
    """The example's layout on a ``("data", "model")`` mesh of any size: ``w`` split both
    ways, ``b`` over ``model``, the step replicated."""
    checks.mesh_axes("mesh", mesh, ["data", "model"])
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    return {"params": {"w": s("data", "model"), "b": s("model")}, "step": s()}


# --------------------------------------------------------------------------- the calls


def abstract_target(shapes: Any, shardings: Any) -> Any:
    """The restore target: for each leaf of ``shapes`` (arrays, or the
    ``jax.ShapeDtypeStruct``s of ``jax.eval_shape(init)``, which allocate nothing) a
    ``jax.ShapeDtypeStruct`` with its shape and dtype and the sharding from ``shardings``
    (a tree of the same structure)."""
    checks.same_structure("shardings", shardings, shapes, other="shapes")
    for s in jax.tree.leaves(shardings):
        checks.sharding("a leaf of shardings", s)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)


def _save(directory: pathlib.Path, state: Any, step: int, save_args: Any) -> None:
    with ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(create=True)) as manager:
        manager.save(step, args=ocp.args.StandardSave(state, save_args=save_args))
        manager.wait_until_finished()       # the save runs in the background until here


def _restore(directory: pathlib.Path, target: Any, step: int | None) -> Any:
    with ocp.CheckpointManager(directory) as manager:
        step = manager.latest_step() if step is None else step
        return manager.restore(step, args=ocp.args.StandardRestore(target))


def save(directory: Any, state: Any, *, step: int, save_args: Any = None) -> None:
    """Save ``state`` (a pytree of arrays) as step ``step`` of ``directory`` with Orbax's
    ``CheckpointManager`` and ``ocp.args.StandardSave``; ``save_args`` is ``None`` or a tree
    of ``ocp.SaveArgs`` with ``state``'s structure. Returns when the step is on disk."""
    path = checkpoint._directory(directory, must_exist=False)
    step = checkpoint._step(step)
    state = checkpoint._state_leaves(state)
    if save_args is not None:
        checks.same_structure("save_args", save_args, state, other="state")
        for arg in jax.tree.leaves(save_args):
            checks.instance("a leaf of save_args", arg, ocp.SaveArgs,
                            example="ocp.SaveArgs(dtype=jnp.bfloat16)")
    if step in checkpoint.steps(path) or (path / str(step)).exists():
        raise checks.InputError(
            f"step {step} already exists in {str(path)!r}; Orbax would refuse to overwrite "
            "it. Save under a new step number, or delete that step first.")
    _save(path, state, step, save_args)


def restore(directory: Any, target: Any, *, step: int | None = None) -> Any:
    """Restore step ``step`` (default: the latest) of ``directory`` into ``target``, a tree
    of ``jax.ShapeDtypeStruct`` (or arrays) carrying shardings: each device reads the pieces
    its shard needs, on whatever devices the shardings name."""
    path = checkpoint._directory(directory, must_exist=True)
    step = checkpoint._chosen_step(path, step)

    def leaf(key_path, x):
        name = leaf_name(key_path)
        if not isinstance(x, (jax.ShapeDtypeStruct, jax.Array)):
            raise checks.InputTypeError(
                f"target leaf {name!r} must be a jax.ShapeDtypeStruct with a sharding (or a "
                f"jax.Array), got {checks.value_text(x)}.")
        if getattr(x, "sharding", None) is None:
            raise checks.InputError(
                f"target leaf {name!r} has no sharding; Orbax would fall back to the saved "
                "layout, which exists only on the devices that saved it (on others: "
                "'Topology mismatch detected'). Build the target with abstract_target.")

    jax.tree_util.tree_map_with_path(leaf, target)
    target = checkpoint.abstract(target, name="target")   # shardings that fit the shapes
    try:
        checkpoint._check_like(target, checkpoint._saved_arrays(path, step),
                               f"step {step} of {str(path)!r}")
    except checks.InputError as error:   # the book's checks call the target "like"
        raise type(error)(re.sub(r"\blike\b", "target", str(error))) from None
    return _restore(path, target, step)


# --------------------------------------------------------------------------- another device count


def _child(directory: str, n_devices: int, out: str, width: int) -> None:
    """What :func:`restore_elsewhere` runs in a fresh Python with ``n_devices`` devices."""
    from spmd_guide import ensure_devices
    ensure_devices(n_devices)
    from spmd_guide.core.devices import build_mesh

    mesh = build_mesh((n_devices // 2, 2) if n_devices > 1 else (1, 1), ("data", "model"))
    shapes = jax.eval_shape(lambda: example_state(width=width))   # allocates nothing
    target = abstract_target(shapes, example_shardings(mesh))
    state = _restore(pathlib.Path(directory), target, None)
    report = {"devices": len(jax.devices()), "mesh": dict(mesh.shape), "leaves": {}}
    arrays = {}
    for key_path, array in jax.tree_util.tree_leaves_with_path(state):
        name = leaf_name(key_path)
        wanted = jax.tree_util.tree_leaves(target)[len(arrays)].sharding
        report["leaves"][name] = {
            "spec": str(array.sharding.spec), "devices": len(array.sharding.device_set),
            "piece": list(array.sharding.shard_shape(array.shape)),
            "as the target says": bool(array.sharding.is_equivalent_to(wanted, array.ndim))}
        arrays[name] = np.asarray(array)
    bare = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), target)
    try:
        _restore(pathlib.Path(directory), bare, None)
        report["without shardings"] = "restored"
    except ValueError as error:
        report["without shardings"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    np.savez(pathlib.Path(out) / "restored.npz", **arrays)
    (pathlib.Path(out) / "report.json").write_text(json.dumps(report))


_RUN_CHILD = ("import sys; from spmd_guide.checkpointing import plain_orbax; "
              "plain_orbax._child(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))")


def restore_elsewhere(directory: Any, *, n_devices: int, width: int = 64,
                      timeout: float = 120) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Restore the latest step of ``directory`` (saved from :func:`example_state` of
    ``width``) in a
    fresh Python with ``n_devices`` CPU devices, on a ``(n_devices // 2, 2)`` mesh laid out by
    :func:`example_shardings`. Returns the child's report (per leaf: the restored spec, its
    devices, one device's piece, whether it is the target's layout; and what a target without
    shardings gives) and the restored values, by leaf name."""
    path = checkpoint._directory(directory, must_exist=True)
    n_devices = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    if n_devices > 1 and n_devices % 2:
        raise checks.InputError(f"n_devices must be 1 or even (a (n/2, 2) mesh), got "
                                f"{n_devices}.")
    if not checkpoint.steps(path):
        raise checks.InputError(f"{str(path)!r} holds no complete step to restore.")
    width = checks.count("width", width, minimum=2)
    timeout = checks.real("timeout", timeout, positive=True)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-c", _RUN_CHILD, str(path), str(n_devices),
                               out, str(width)], capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode:
            raise RuntimeError(f"the restore on {n_devices} device(s) failed:\n"
                               f"{proc.stderr[-3000:]}")
        report = json.loads((pathlib.Path(out) / "report.json").read_text())
        with np.load(pathlib.Path(out) / "restored.npz") as values:
            return report, {name: values[name] for name in values.files}
