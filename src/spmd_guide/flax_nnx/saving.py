"""Save an NNX model's parameters with Orbax (Part XI's ``checkpoint``) and restore them into
any rule table's layout, on any mesh.

The checkpoint holds the state as a plain nested dict of arrays (``nnx.to_pure_dict``), so it
names no mesh and no table: a restore lays each array out as the target table says, and each
device reads only the pieces of the files its shards need.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from spmd_guide.checkpointing import checkpoint
from spmd_guide.core import checks
from spmd_guide.flax_nnx import logical

__all__ = ["restore", "save"]


def save(directory: Any, model: logical.Model, *, step: int) -> Any:
    """Write ``model``'s parameters as ``step`` of ``directory`` (returns the step's path)."""
    model = logical.check_model(model)
    return checkpoint.save(directory, nnx.to_pure_dict(nnx.state(model)), step=step)


def restore(directory: Any, config: Any, *, strategy: str, mesh: Any, step: int | None = None,
            param_dtype: Any = jnp.float32, compute_dtype: Any = None) -> logical.Model:
    """A model for ``config`` whose parameters are read from ``directory`` (default: its latest
    complete step), laid out by ``RULES[strategy]`` on ``mesh``; nothing is initialised."""
    model = logical.abstract_model(config, strategy=strategy, mesh=mesh,
                                   param_dtype=param_dtype, compute_dtype=compute_dtype)
    if step is not None:
        step = checks.count("step", step, minimum=0)
    state = nnx.state(model)
    values = checkpoint.restore(directory, like=nnx.to_pure_dict(state), step=step)
    nnx.replace_by_pure_dict(state, values)
    nnx.update(model, state)
    return model
