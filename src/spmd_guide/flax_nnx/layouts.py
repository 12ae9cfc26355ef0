"""How a rule table lays out an NNX model's state: a ``PartitionSpec`` per variable
(:func:`param_specs`), abstract states that carry those shardings (:func:`set_abstract`), and
the meshes the model runs on (all axes Auto or all Explicit)."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.flax_nnx.rules import NAMES, Rules, check_rules, mesh_spec

__all__ = ["param_specs", "set_abstract"]


def _auto(mesh: Mesh) -> Mesh:
    """``mesh`` with Auto axes (what sharding constraints may name)."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _check_mesh(mesh: Any) -> Mesh:
    mesh = checks.mesh("mesh", mesh)
    types = set(mesh.axis_types)
    if AxisType.Manual in types or len(types) > 1:
        raise checks.InputError(
            f"mesh must have all axes Auto or all Explicit, got {tuple(mesh.axis_types)}.")
    return mesh


def param_specs(model_or_state: Any, rules: Rules, mesh: Mesh) -> Any:
    """A ``PartitionSpec`` for every leaf of a model's state (parameters, or an optimizer
    state whose variables carry the parameters' names), by :func:`mesh_spec`. Leaves without
    logical names (the step count) are replicated. A rule for a logical name that neither
    the state nor the activations use is refused: it is a typo, and would lay out nothing."""
    mesh = _check_mesh(mesh)
    rules = check_rules(rules, mesh)
    state = nnx.state(model_or_state) if isinstance(model_or_state, nnx.Module) \
        else model_or_state
    variables = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    if not isinstance(state, nnx.State) or not variables or not all(
            isinstance(v, nnx.Variable) for v in variables):
        raise checks.InputTypeError(
            f"model_or_state must be an NNX module such as a logical.Model, or its nnx.state(...)"
            f" (variables that carry logical names), got {checks.value_text(model_or_state)}; "
            f"a plain pytree (lm.init_params, nnx.to_pure_dict) has no names to lay out.")
    logical = nnx.get_partition_spec(state)
    found = {n for spec in jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, P))
             for n in (spec.get_value() if isinstance(spec, nnx.Variable) else spec)
             if isinstance(n, str)}
    known = tuple(dict.fromkeys((*NAMES, *sorted(found))))
    for i, (name, _) in enumerate(rules):
        if name not in known:
            raise checks.InputError(
                f"rules[{i}] is for the logical name {name!r}, which no dimension of the model "
                f"has; the known names are {known}.")

    def spec(names, leaf):
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        names = tuple(names.get_value() if isinstance(names, nnx.Variable) else names)
        if not names:
            return P()
        return mesh_spec(names, value.shape, rules, mesh)

    return jax.tree.map(spec, logical, state,
                        is_leaf=lambda x: isinstance(x, (nnx.Variable, P)))


def set_abstract(state: Any, rules: Rules, mesh: Mesh) -> None:
    """Give every variable of an abstract state (from ``nnx.eval_shape``) a
    ``jax.ShapeDtypeStruct`` value that carries the sharding ``rules`` give it."""
    variables = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for var, sharding in zip(variables, jax.tree.leaves(_shardings(state, rules, mesh)),
                             strict=True):
        value = var.get_value()
        var.set_value(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding))


def _shardings(state: Any, rules: Rules, mesh: Mesh) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(state, rules, mesh))
