"""Save an NNX model's parameters with Orbax (Part XI's ``checkpoint``) and restore them into
any rule table's layout, on any mesh.

The checkpoint holds the state as a plain nested dict of arrays (``nnx.to_pure_dict``): the
logical names are gone. Orbax still records, per array, the sharding it was saved with (mesh
axes, axis types, PartitionSpec, device ids; ``checkpoint.saved_layout`` reads them back), but a
restore with a target lays each array out as the target says and each device reads only the
pieces of the files its shards need: any table on any mesh can read it. A checkpoint of Part
IX's pytree (``lm.init_params``'s structure, ``blocks`` a list) is read as well.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from spmd_guide.checkpointing import checkpoint, names
from spmd_guide.core import checks
from spmd_guide.flax_nnx import logical

__all__ = ["restore", "save"]


def save(directory: Any, model: logical.Model, *, step: int) -> Any:
    """Write ``model``'s parameters as ``step`` of ``directory`` (returns the step's path)."""
    model = logical.check_model(model)
    logical.check_concrete(model)
    return checkpoint.save(directory, nnx.to_pure_dict(nnx.state(model)), step=step)


def restore(directory: Any, config: Any, *, strategy: str, mesh: Any, step: int | None = None,
            param_dtype: Any = jnp.float32, compute_dtype: Any = None) -> logical.Model:
    """A model for ``config`` whose parameters are read from ``directory`` (default: its latest
    complete step), laid out by ``RULES[strategy]`` on ``mesh``; nothing is initialised.
    ``config`` and ``param_dtype`` must be those the checkpoint was saved with (checked against
    its metadata before anything is read)."""
    model = logical.abstract_model(config, strategy=strategy, mesh=mesh,
                                   param_dtype=param_dtype, compute_dtype=compute_dtype)
    if step is not None:
        step = checks.count("step", step, minimum=0)
    saved = checkpoint.saved_arrays(directory, step=step)
    state = nnx.state(model)
    pure = nnx.to_pure_dict(state)
    _check_saved(saved, pure, model.config, jnp.dtype(param_dtype))
    part_ix = logical.to_lm_params(model)  # the same names, blocks as a list
    like = part_ix if checkpoint.saved_structure(directory, step=step) == _structure(part_ix) \
        else pure
    values = checkpoint.restore(directory, like=like, step=step)
    if like is part_ix:
        values = {**values, "blocks": dict(enumerate(values["blocks"]))}
    nnx.replace_by_pure_dict(state, values)
    nnx.update(model, state)
    return model


def _structure(tree: Any) -> list[str]:
    return sorted(names.structure_name(p) for p, _ in names.named_leaves("state", tree))


def _check_saved(saved: dict[str, Any], pure: Any, config: Any, param_dtype: Any) -> None:
    """The checkpoint holds this model's parameters: the same names, the shapes ``config``
    gives, in ``param_dtype``; each refusal names the argument to change."""
    wanted = {names.leaf_name(p): x for p, x in names.named_leaves("state", pure)}
    missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
    if missing or extra:
        def some(found: list[str]) -> str:
            return ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        parts = ([f"it lacks {some(missing)}"] if missing else []) + \
                ([f"it has {some(extra)}, which the model lacks"] if extra else [])
        raise checks.InputError(
            f"the checkpoint does not hold the parameters of a model for config ({config}): "
            f"{'; '.join(parts)}. Pass the config it was saved with (saving.save writes a "
            f"model's parameters only).")
    for name, x in wanted.items():
        if tuple(x.shape) != saved[name].shape:
            raise checks.InputError(
                f"config gives {name!r} the shape {tuple(x.shape)}, but the checkpoint saved it "
                f"as {saved[name].shape}: pass the config the model was saved with "
                f"({config} does not match).")
        if saved[name].dtype != param_dtype:
            raise checks.InputError(
                f"param_dtype is {param_dtype}, but the checkpoint saved {name!r} as "
                f"{saved[name].dtype}: pass param_dtype=jnp.{saved[name].dtype} (and cast "
                f"after the restore if another dtype is what you want).")
