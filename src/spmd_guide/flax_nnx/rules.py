"""Strategies as tables of logical-axis rules, and how a table lays out one array.

A parameter's dimensions have logical names (``embed``, ``heads``, ``mlp``, ``vocab``, ...);
a rule table maps each name to a mesh axis, a tuple of mesh axes, or None (keep whole).
:data:`RULES` holds Part IX's four parameter layouts as such tables and :func:`mesh_spec`
turns names, a shape and a table into a ``PartitionSpec`` on a mesh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks

__all__ = ["ACTIVATION_NAMES", "NAMES", "PARAM_NAMES", "RULES", "Rules", "check_rules",
           "mesh_spec", "rules_of"]

Rules = tuple[tuple[str, Any], ...]

#: The logical names of each parameter's dimensions (a block's under ``blocks``).
PARAM_NAMES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_in", "embed"), "pos": ("position", "embed"), "norm_f": ("embed",),
    "unembed": ("embed", "vocab"),
    "norm1": ("embed",), "wq": ("embed", "heads", "head_dim"),
    "wk": ("embed", "heads", "head_dim"), "wv": ("embed", "heads", "head_dim"),
    "wo": ("heads", "head_dim", "embed"), "norm2": ("embed",),
    "w_up": ("embed", "mlp"), "w_down": ("mlp", "embed"),
}
#: The logical names of each kind of activation (Part IX's ``constrain`` kinds).
ACTIVATION_NAMES: dict[str, tuple[str, ...]] = {
    "residual": ("batch", "length", "embed"), "heads": ("batch", "length", "heads", "head_dim"),
    "hidden": ("batch", "length", "mlp"), "logits": ("batch", "length", "vocab"),
}
#: Every logical name the model uses.
NAMES = ("batch", "length", "vocab_in", "position", "embed", "heads", "head_dim", "mlp", "vocab")


def _table(**targets: Any) -> Rules:
    """A rule for every logical name, in :data:`NAMES` order: unnamed ones map to None."""
    return tuple((name, targets.get(name)) for name in NAMES)


#: Part IX's four parameter layouts as rule tables (mesh axes ``data`` and ``model``).
#: Every name is listed (None: keep whole), so Flax's own ``nnx.logical_axis_rules`` can read
#: the tables too: it renames each name and would pass an unlisted one through as a mesh axis.
RULES: dict[str, Rules] = {
    "dp": _table(batch="data"),
    "fsdp": _table(batch="data", vocab_in="data", position="data", embed="data",
                   heads="data", head_dim="data", mlp="data", vocab="data"),
    "tp": _table(heads="model", mlp="model", vocab="model"),
    "fsdp_tp": _table(batch="data", vocab_in="data", position="data", embed="data",
                      heads="model", head_dim="data", mlp="model", vocab="model"),
}


# --------------------------------------------------------------------------- rules


def check_rules(rules: Any, mesh: Mesh | None = None) -> Rules:
    """``rules`` as a tuple of ``(logical name, mesh axis | tuple of axes | None)`` pairs;
    with a ``mesh``, every mesh axis a rule names must be one of its axes."""
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
        raise checks.InputTypeError(
            f"rules must be a tuple of (logical name, mesh axis) pairs such as "
            f"(('batch', 'data'),), got {checks.value_text(rules)}.")
    out = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, Sequence) or isinstance(rule, (str, bytes)) or len(rule) != 2 \
                or not isinstance(rule[0], str):
            raise checks.InputTypeError(
                f"rules[{i}] must be a pair (logical name, mesh axis or None), got "
                f"{checks.value_text(rule)}.")
        name, target = rule
        axes = target if isinstance(target, tuple) else () if target is None else (target,)
        if not all(isinstance(a, str) for a in axes):
            raise checks.InputTypeError(
                f"rules[{i}] maps {name!r} to {checks.value_text(target)}; a rule's target "
                f"is a mesh axis name, a tuple of them, or None.")
        if len(set(axes)) != len(axes):
            raise checks.InputError(
                f"rules[{i}] maps {name!r} to {target!r}, which names a mesh axis twice; a "
                f"mesh axis can split a dimension once.")
        if mesh is not None:
            missing = [a for a in axes if a not in mesh.shape]
            if missing:
                raise checks.InputError(
                    f"the rule ({name!r}, {target!r}) names mesh axis {missing[0]!r}, but the "
                    f"mesh has axes {tuple(mesh.axis_names)}; use a mesh with that axis (size "
                    f"1 is fine) or a table for this mesh.")
        out.append((name, target))
    return tuple(out)


def rules_of(strategy: Any) -> Rules:
    """``RULES[strategy]``, or a clear error for a name that is not one of its keys."""
    if not isinstance(strategy, str):
        raise checks.InputTypeError(
            f"strategy must be a name such as 'fsdp', one of {tuple(RULES)}, got "
            f"{checks.value_text(strategy)}.")
    return RULES[checks.one_of("strategy", strategy, RULES)]


def mesh_spec(names: Sequence[str | None], shape: Sequence[int], rules: Rules,
              mesh: Mesh, *, skip_indivisible: bool = True) -> P:
    """The ``PartitionSpec`` ``rules`` give an array whose dimensions are called ``names``.

    Dimensions are resolved in order. Each takes the first rule for its name whose mesh axes
    no earlier dimension of this array uses and whose total size divides the dimension; a rule
    mapping the name to None, or none that fits, keeps it whole. (Flax's
    ``nnx.logical_axis_rules`` only renames: ``('embed', 'data')`` would put ``data`` on every
    ``embed`` dimension, twice in one array if need be.)

    With ``skip_indivisible=False`` (how activations are pinned) a rule whose axes do not
    divide the dimension keeps it whole and still claims the axes: a batch too small to split
    over ``data`` is then computed whole on each device, rather than split along another
    dimension that the compiler would have to move back.
    """
    mesh = checks.mesh("mesh", mesh)
    rules = check_rules(rules, mesh)
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not all(
            n is None or isinstance(n, str) for n in names):
        raise checks.InputTypeError(
            f"names must be a sequence of logical names (str or None) such as ('embed', "
            f"'mlp'), got {checks.value_text(names)}.")
    names = tuple(names)
    shape = checks.counts("shape", shape, minimum=0, min_length=0)
    skip_indivisible = checks.flag("skip_indivisible", skip_indivisible)
    if len(names) != len(shape):
        raise checks.InputError(
            f"names {names} give {len(names)} dimensions, but the shape {shape} has "
            f"{len(shape)}.")
    used: set[str] = set()
    entries: list[Any] = []
    for name, size in zip(names, shape, strict=True):
        entry = None
        for logical, target in rules:
            if logical != name:
                continue
            axes = checks.spec_axes(target)
            if not axes:
                break
            if used & set(axes):
                continue
            if size % math.prod(mesh.shape[a] for a in axes):
                if skip_indivisible:
                    continue
                used |= set(axes)
                break
            entry, used = target, used | set(axes)
            break
        entries.append(entry)
    return P(*entries)
