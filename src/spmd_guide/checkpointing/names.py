"""How Orbax names the leaves of a pytree, and what it stores for a typed PRNG key.

Orbax names each array of a checkpoint by the keys of its path joined with dots
(``params.blocks.0.wq``: dict keys, list and tuple indices, named-tuple and dataclass
fields, as ``orbax.checkpoint.tree.str_keypath`` writes them), and stores the arrays by
those names. Two leaves with one name would be saved as one, so :func:`named_leaves` refuses
a tree with a key that holds a dot or two paths that give one name, before anything is
written. Orbax's name does not say what kind of container a key came from (a list index and
a dict key ``0`` are both ``blocks.0``), and a restore needs the same kinds, so
:func:`structure_name` writes a sequence index as ``[0]`` (``blocks[0].wq`` against
``blocks.0.wq``) for the comparison of a target with a checkpoint. A typed PRNG key (``jax.random.key``) is stored as its key data, ``uint32`` with a
trailing dimension (:func:`physical`), and its implementation is recorded beside it.
"""

from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp

from spmd_guide.core import checks

__all__ = ["is_key", "leaf_name", "named_leaves", "physical", "structure_name"]


#: The key entries of a JAX key path (``jax.tree_util.tree_leaves_with_path``'s paths).
_KEYS = (jax.tree_util.DictKey, jax.tree_util.SequenceKey, jax.tree_util.GetAttrKey,
         jax.tree_util.FlattenedIndexKey)


def _path(path: Any) -> tuple[Any, ...]:
    """``path`` if it is a JAX key path: a tuple of key entries, not a string or a tuple of
    plain strings (``('a', 'b')`` is not the path of ``{'a': {'b': x}}``)."""
    if not isinstance(path, tuple) or any(isinstance(k, (str, bytes, int)) for k in path):
        raise checks.InputTypeError(
            f"path must be a key path as jax.tree_util.tree_leaves_with_path gives it (a tuple "
            f"of DictKey, SequenceKey, GetAttrKey... entries), got {checks.value_text(path)}.")
    return path


def leaf_name(path: tuple[Any, ...]) -> str:
    """A leaf's name as Orbax writes it: its keys joined by dots (``params.blocks.0.wq``)."""
    path = _path(path)
    try:
        return ".".join(ocp.tree.str_keypath(path))
    except ValueError:  # a key type Orbax cannot name
        return jax.tree_util.keystr(path)


def structure_name(path: tuple[Any, ...]) -> str:
    """A leaf's name with the kind of each container on its path: a list or tuple index as
    ``[0]``, a dict key, named-tuple or dataclass field as ``.name`` (``blocks[0].wq`` for a
    list of blocks, ``blocks.0.wq`` for a dict keyed by 0). Orbax restores a list into a tuple
    and a dict key ``0`` into ``'0'``, but not a list into a dict: these names differ where
    a restore would fail."""
    parts = []
    for key in _path(path):
        if isinstance(key, (jax.tree_util.SequenceKey, jax.tree_util.FlattenedIndexKey)):
            parts.append(f"[{key.idx if hasattr(key, 'idx') else key.key}]")
        else:
            try:
                parts.append("." + ".".join(ocp.tree.str_keypath((key,))))
            except ValueError:
                parts.append(jax.tree_util.keystr((key,)))
    return "".join(parts).lstrip(".")


def named_leaves(name: str, tree: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """The ``(path, leaf)`` pairs of ``tree``, refused unless every leaf has a name of its
    own: no key that holds a dot (Orbax joins keys with dots, so ``{'a.b': x}`` and
    ``{'a': {'b': x}}`` are both ``a.b``), and no two paths that give one name."""
    try:
        pairs = jax.tree_util.tree_leaves_with_path(tree)
    except (TypeError, ValueError) as error:  # e.g. dict keys of mixed types
        raise checks.InputTypeError(
            f"{name} is not a pytree JAX can flatten: {error}") from None
    seen: dict[str, tuple[Any, ...]] = {}
    for path, _ in pairs:
        found = leaf_name(path)
        if found in seen:
            raise checks.InputError(
                f"{name} has two leaves that Orbax would save under the one name "
                f"{found!r}: {jax.tree_util.keystr(seen[found])} and "
                f"{jax.tree_util.keystr(path)}; one would overwrite the other. Rename a key.")
        seen[found] = path
    for path, _ in pairs:
        for key in path:
            try:
                text = str(ocp.tree.str_keypath((key,))[0])
            except ValueError:
                raise checks.InputTypeError(
                    f"{name} has a node at {jax.tree_util.keystr(path)} whose key {key!r} "
                    f"Orbax cannot name; use dicts, lists, tuples, named tuples or "
                    f"dataclasses.") from None
            if "." in text:
                raise checks.InputError(
                    f"{name} has the key {text!r} (at {jax.tree_util.keystr(path)}), which "
                    f"holds a dot: Orbax names each array by its keys joined with dots, so "
                    f"the name {leaf_name(path)!r} would also be that of a nested path. Rename "
                    f"the key (e.g. {text.replace('.', '_')!r}).")
    return pairs


def is_key(x: Any) -> bool:
    """Whether ``x`` (an array or a ``ShapeDtypeStruct``) is a typed PRNG key."""
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def physical(x: Any) -> Any:
    """What Orbax stores for a leaf: a typed PRNG key as its key data (``uint32`` with the
    impl's trailing dimensions, the sharding's spec extended by ``None``, as Orbax's
    ``_physical_read_spec`` does), any other leaf as itself."""
    if not is_key(x):
        return x
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(
            *sharding.spec, *[None] * (data.ndim - len(sharding.spec))))
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
