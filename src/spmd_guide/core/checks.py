"""One vocabulary of input checks, so bad input gets a clear error and never a wrong answer.

Every public function of the package checks its arguments here, before any computation.
Each message says four things: which argument, the value received, the rule it broke, and
the fix. The errors are :class:`InputError` (a ``ValueError``) and :class:`InputTypeError`
(a ``TypeError``), so a caller can catch "the package refused my input" in one place.

The checks look at static facts (Python types, shapes, dtypes, mesh axes), which are known
while ``jax.jit`` traces, so they cost nothing inside a compiled program. Values (a learning
rate, a label) are checked only where they are concrete; under ``jit`` a traced value passes.
"""

from __future__ import annotations

import math
import numbers
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

#: More CPU mock devices than this makes JAX start slowly (10,000 took 31 s); more
#: accelerators than this are not on one host.
MAX_DEVICES = 4096


class InputError(ValueError):
    """An argument has the right type but a value the function cannot use."""


class InputTypeError(InputError, TypeError):
    """An argument has a type the function cannot use."""


def value_text(value: Any) -> str:
    """``repr(value)`` cut to 60 characters: how every error message quotes the bad value."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a tracer (inside ``jit``/``grad``): its values cannot be checked,
    only its shape and dtype."""
    return isinstance(value, jax.core.Tracer)


# --------------------------------------------------------------------------- numbers


def count(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as a Python ``int`` if it is an integer (``numbers.Integral``, NumPy ints
    and concrete 0-d integer NumPy/JAX arrays included; not ``bool``) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, (np.ndarray, jax.Array)) and not is_traced(value) and \
                value.ndim == 0 and _kind(value.dtype) in "iu":
            value = value.item()
        else:
            raise InputTypeError(
                f"{name} must be an integer, got {value_text(value)} ({type(value).__name__}).")
    value = int(value)
    if value < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {value}.")
    if maximum is not None and value > maximum:
        raise InputError(f"{name} must be at most {maximum}, got {value}.")
    return value


def axis_names(name: str, names: Any, shape: tuple[int, ...]) -> tuple[str, ...]:
    """Mesh axis names: a tuple or list of distinct, non-empty strings, one per axis of
    ``shape`` (the book's mesh builders, CPU or TPU, share this rule)."""
    if isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise InputTypeError(
            f"{name} must be a tuple of strings such as ('data', 'model'), got "
            f"{value_text(names)}.")
    names = tuple(names)
    if len(names) != len(shape) or len(set(names)) != len(names) or not all(
            isinstance(n, str) and n for n in names):
        raise InputError(
            f"{name} must give one distinct axis name (a non-empty string) per axis of the "
            f"shape {shape}, got {names!r}.")
    return names


def counts(name: str, values: Any, *, minimum: int = 1, min_length: int = 1) -> tuple[int, ...]:
    """A sequence of integers (list, tuple or 1-D integer array), each at least ``minimum``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise InputTypeError(
            f"{name} must be a sequence of integers such as (4, 2), got {value_text(values)}.")
    items = [count(f"{name}[{i}]", v, minimum=minimum) for i, v in enumerate(list(values))]
    if len(items) < min_length:
        raise InputError(f"{name} needs at least {min_length} entries, got {value_text(values)}.")
    return tuple(items)


def real(name: str, value: Any, *, positive: bool = False, minimum: float | None = None,
         maximum: float | None = None, inclusive_max: bool = True) -> Any:
    """A finite real number (Python, NumPy or concrete JAX scalar), optionally bounded.

    A traced value (inside ``jit``) is returned unchecked. Concrete values come back as
    ``float`` so they can be cached and hashed.
    """
    if is_traced(value):
        return value
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None or (
            getattr(value, "dtype", None) is not None and getattr(value.dtype, "kind", "") == "b"):
        raise InputTypeError(f"{name} must be a real number, got {value_text(value)}.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputTypeError(f"{name} must be a real number, got {value_text(value)}.") from None
    if not math.isfinite(number):
        raise InputError(f"{name} must be a finite number, got {number}.")
    if positive and number <= 0:
        raise InputError(f"{name} must be positive, got {number}.")
    if minimum is not None and number < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {number}.")
    if maximum is not None and (number > maximum if inclusive_max else number >= maximum):
        bound = "at most" if inclusive_max else "below"
        raise InputError(f"{name} must be {bound} {maximum}, got {number}.")
    return number


def dimension(name: str, value: Any, ndim: int) -> int:
    """An index of one of ``ndim`` dimensions, as NumPy takes it (``-1`` is the last; NumPy
    and concrete JAX integer scalars are integers), returned in ``[0, ndim)``."""
    try:
        index = count(name, value, minimum=-ndim, maximum=ndim - 1)
    except InputError as error:
        raise type(error)(f"{error} {name} picks one of the {ndim} dimension(s): an integer "
                          f"in [-{ndim}, {ndim}).") from None
    return index % ndim


def divisible(what: str, size: int, divisor: int, *, why: str = "") -> None:
    """The one even-split check: ``size`` must split into ``divisor`` equal parts.

    ``what`` names the size ("batch size", "dimension 0 of x"), ``why`` says what splits it
    ("over mesh axis 'data' of size 4").
    """
    if divisor < 1:
        raise InputError(f"cannot split {what} into {divisor} parts.")
    if size % divisor:
        reason = f" {why}" if why else ""
        raise InputError(
            f"{what} is {size}, which does not split into {divisor} equal parts{reason}: "
            f"{size} is not divisible by {divisor}. Use a multiple of {divisor}.")


# --------------------------------------------------------------------------- JAX values


def key(name: str, value: Any) -> jax.Array:
    """A PRNG key: a typed key (``jax.random.key(0)``), a legacy raw ``uint32[2]`` key, or
    an int seed, which becomes ``jax.random.key(seed)``.

    Refuses floats, strings and arrays of other shapes with a message that shows the fix.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return jax.random.key(int(value))
    if (isinstance(value, (jax.Array, np.ndarray)) and not is_traced(value)
            and value.ndim == 0 and _kind(value.dtype) in "iu"):
        return jax.random.key(int(value))  # a NumPy or JAX integer scalar seed
    if isinstance(value, (jax.Array, np.ndarray)) or is_traced(value):
        dtype = value.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            if value.shape != ():
                raise InputError(
                    f"{name} must be one key, got an array of {value.shape} keys; pick one, "
                    f"e.g. {name}[0], or split with jax.random.split.")
            return value
        if np.dtype(dtype) == np.uint32 and value.shape == (2,):
            return value
    raise InputTypeError(
        f"{name} must be a random key such as jax.random.key(0) (or an int seed), got "
        f"{value_text(value)}.")


def array(name: str, value: Any, *, ndim: int | None = None, min_ndim: int = 0,
          dtype_kind: str | None = None) -> Any:
    """An array-like: a ``jax.Array``, NumPy array, tracer, scalar or nested list of numbers.

    Lists and scalars are converted with ``np.asarray``; strings, ``None`` and objects that
    are not numbers are refused. ``dtype_kind`` is a string of NumPy kinds (``"iu"`` for
    integers, ``"f"`` for floats) the dtype must be one of.
    """
    if value is None or isinstance(value, (str, bytes, Mapping)):
        raise InputTypeError(f"{name} must be an array, got {value_text(value)}.")
    if not (isinstance(value, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))
            or is_traced(value)):
        try:
            value = np.asarray(value)
        except (TypeError, ValueError):
            raise InputTypeError(f"{name} must be an array, got {value_text(value)}.") from None

    if isinstance(value, np.ndarray) and _kind(value.dtype) in "OSUV":
        raise InputTypeError(
            f"{name} must be an array of numbers, got {value_text(value)} (dtype {value.dtype}).")
    if ndim is not None and len(value.shape) != ndim:
        raise InputError(
            f"{name} must have {ndim} dimension(s), got shape {tuple(value.shape)}.")
    if len(value.shape) < min_ndim:
        raise InputError(
            f"{name} needs at least {min_ndim} dimension(s), got shape {tuple(value.shape)}.")
    if dtype_kind is not None and _kind(value.dtype) not in dtype_kind:
        kinds = {"i": "signed integer", "u": "unsigned integer", "f": "floating",
                 "b": "boolean", "c": "complex"}
        wanted = " or ".join(kinds.get(k, k) for k in dtype_kind)
        raise InputTypeError(f"{name} must have a {wanted} dtype, got {value.dtype}.")
    return value


def _kind(dtype: Any) -> str:
    """NumPy's kind letter, with JAX's extra floats (bfloat16, float8: NumPy kind ``V``) as
    ``f`` and PRNG key arrays as ``K``."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return "K"
    if jax.dtypes.issubdtype(dtype, np.floating):
        return "f"
    return np.dtype(dtype).kind


def array_tree(name: str, tree: Any) -> list[Any]:
    """The leaves of a pytree of arrays; refuses a tree with a string, ``None`` or object leaf.

    Returns the leaves (converted as :func:`array` does).
    """
    leaves = jax.tree.leaves(tree, is_leaf=lambda x: x is None)
    if not leaves:
        raise InputError(f"{name} must hold at least one array, got {value_text(tree)}.")
    return [array(f"a leaf of {name}", leaf) for leaf in leaves]


def same_shape(name: str, value: Any, expected: Sequence[int], *, other: str) -> None:
    """``value.shape`` must equal ``expected`` (the shape of ``other``)."""
    if tuple(value.shape) != tuple(expected):
        raise InputError(
            f"{name} has shape {tuple(value.shape)}, but it must match {other}'s shape "
            f"{tuple(expected)}.")


# --------------------------------------------------------------------------- meshes


def mesh(name: str, value: Any) -> Mesh:
    """A ``jax.sharding.Mesh``."""
    if not isinstance(value, Mesh):
        raise InputTypeError(
            f"{name} must be a jax.sharding.Mesh such as jax.make_mesh((8,), ('x',)), got "
            f"{value_text(value)}.")
    return value


def axis(mesh_: Mesh, axis_name: Any, *, name: str = "axis_name") -> int:
    """The size of mesh axis ``axis_name``; refuses a name the mesh does not have."""
    mesh(name="mesh", value=mesh_)
    if not isinstance(axis_name, str):
        raise InputTypeError(
            f"{name} must be a mesh axis name (a string), got {value_text(axis_name)}; this mesh "
            f"has axes {tuple(mesh_.axis_names)}.")
    if axis_name not in mesh_.shape:
        raise InputError(
            f"{name}={axis_name!r} is not an axis of the mesh, whose axes are "
            f"{tuple(mesh_.axis_names)}.")
    return int(mesh_.shape[axis_name])


def spec_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names: ``None``, ``'x'`` or ``('x', 'y')``."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def spec_fits(name: str, shape: Sequence[int], spec: Any, mesh_: Mesh) -> None:
    """``spec`` lays out an array of ``shape`` evenly on ``mesh_``: every axis it names is in
    the mesh, used once, and each sharded dimension divides by the axes' total size."""
    if not isinstance(spec, PartitionSpec):
        raise InputTypeError(
            f"the layout of {name} must be a PartitionSpec such as P('x', None), got "
            f"{value_text(spec)}.")
    if len(spec) > len(shape):
        raise InputError(
            f"{spec} names {len(spec)} dimensions, but {name} has shape {tuple(shape)}.")
    used = [a for entry in spec for a in spec_axes(entry)]
    if len(set(used)) != len(used):
        raise InputError(f"{spec} uses a mesh axis twice; each axis can split one dimension.")
    for dim, entry in enumerate(spec):
        axes = spec_axes(entry)
        for a in axes:
            if a not in mesh_.shape:
                raise InputError(
                    f"{spec} names mesh axis {a!r}, which the mesh "
                    f"{dict(mesh_.shape)} does not have.")
        ways = math.prod(mesh_.shape[a] for a in axes)
        over = " x ".join(f"{a!r} (size {mesh_.shape[a]})" for a in axes)
        divisible(f"dimension {dim} of {name}", int(shape[dim]), ways,
                  why=f"over mesh axis {over}" if axes else "")


def distinct_devices(name: str, devices: Sequence[Any]) -> None:
    """Each device at most once: a mesh over one device listed twice would be a mesh of
    fewer devices than its shape says (JAX's ``Mesh`` does not refuse it)."""
    seen: set[Any] = set()
    for device in devices:
        if device in seen:
            raise InputError(
                f"{name} lists {device} more than once; each device can hold one place in a "
                f"mesh (pass distinct devices, e.g. jax.devices()[:4]).")
        seen.add(device)


def sharding(name: str, value: Any) -> jax.sharding.Sharding:
    """A ``jax.sharding.Sharding`` (``NamedSharding(mesh, P('x'))``, a single device's...)."""
    if not isinstance(value, jax.sharding.Sharding):
        hint = (" (a PartitionSpec says how to cut; NamedSharding(mesh, spec) adds the mesh)"
                if isinstance(value, PartitionSpec) else "")
        raise InputTypeError(
            f"{name} must be a jax.sharding.Sharding such as NamedSharding(mesh, P('x')), got "
            f"{value_text(value)}{hint}.")
    return value


# --------------------------------------------------------------------------- choices


def one_of[T](name: str, value: Any, choices: Iterable[T] | Mapping[T, Any]) -> T:
    """``value`` if it is one of ``choices`` (a registry's keys, say)."""
    options = list(choices)
    try:
        ok = value in options
    except TypeError:
        ok = False
    if not ok:
        shown = ", ".join(repr(c) for c in options)
        raise InputError(f"unknown {name} {value_text(value)}; choose one of {shown}.")
    return value


def function(name: str, value: Any) -> Callable[..., Any]:
    """A callable."""
    if not callable(value):
        raise InputTypeError(f"{name} must be a function, got {value_text(value)}.")
    return value


def flag(name: str, value: Any) -> bool:
    """A ``bool`` (not 0/1, not a string)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be True or False, got {value_text(value)}.")
    return bool(value)


def path(name: str, value: Any, *, what: str = "a path") -> pathlib.Path:
    """``value`` as a ``pathlib.Path``: a str or ``os.PathLike`` that is not empty or blank.

    An empty path would silently mean the current directory. ``pathlib`` turns ``''`` into
    ``.`` (``Path('') == Path('.')``, ``str(Path(''))`` is ``'.'``), so a ``PurePath`` with no
    parts is refused too: the caller cannot have meant the current directory by it any more
    than by ``''``. The string ``'.'`` and ``Path.cwd()`` name it explicitly. Bytes are refused.
    """
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise InputTypeError(f"{name} must be {what} (a str or pathlib.Path), "
                             f"got {value_text(value)}.")
    text_ = os.fspath(value)
    empty = not isinstance(text_, str) or not text_.strip() or (
        isinstance(value, pathlib.PurePath) and not value.parts)
    if empty:
        raise InputError(f"{name} must not be empty, got {value_text(value)}: an empty path "
                         f"would mean the current directory (pathlib writes Path('') as '.'); "
                         f"name it explicitly (e.g. './out', or Path.cwd()).")
    return pathlib.Path(text_)


def directory(name: str, value: Any, *, must_exist: bool, what: str = "a directory"
              ) -> pathlib.Path:
    """``value`` (checked by :func:`path`) as an absolute path to a directory: never a file,
    nor a path below a file; with ``must_exist``, one that exists. Reads nothing else and
    creates nothing, so a refused call leaves the disk as it was."""
    found = path(name, value, what=f"a path to {what}").expanduser().absolute()
    if found.exists() and not found.is_dir():
        raise InputError(f"{name} {str(found)!r} is a file, not {what}.")
    above = next((p for p in found.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(f"{name} {str(found)!r} lies below {str(above)!r}, which is a file, "
                         f"not a directory.")
    if must_exist and not found.exists():
        raise InputError(f"{name} {str(found)!r} does not exist.")
    return found


def text(name: str, value: Any, *, empty: bool = False) -> str:
    """A ``str`` (non-empty unless ``empty``): a title, a label, a name."""
    if not isinstance(value, str):
        raise InputTypeError(f"{name} must be a string, got {value_text(value)}.")
    if not empty and not value.strip():
        raise InputError(f"{name} must be a non-empty string, got {value!r}.")
    return value


def instance[T](name: str, value: Any, kind: type[T], *, example: str) -> T:
    """``value`` if it is a ``kind`` (``example`` shows the caller how to make one)."""
    if not isinstance(value, kind):
        raise InputTypeError(
            f"{name} must be {example}, got {value_text(value)} ({type(value).__name__}).")
    return value


def record(name: str, value: Any, *, required: Iterable[str]) -> Mapping[str, Any]:
    """A mapping (a table row, a config) holding every key of ``required``."""
    if not isinstance(value, Mapping):
        raise InputTypeError(f"{name} must be a dict, got {value_text(value)}.")
    missing = [k for k in required if k not in value]
    if missing:
        raise InputError(
            f"{name} lacks {', '.join(map(repr, missing))} (it has {sorted(map(str, value))}).")
    return value


def same_structure(name: str, tree: Any, like: Any, *, other: str) -> None:
    """Pytree ``tree`` has the structure of ``like`` (the same keys, the same leaf count), as
    every leaf of ``other`` needs one of ``tree``."""
    want, got = jax.tree.structure(like), jax.tree.structure(tree)
    if want != got:
        raise InputError(
            f"{name} must have one leaf per leaf of {other} ({want.num_leaves} leaves, the same "
            f"keys), got {got.num_leaves} leaves with structure {value_text(str(got))}.")


def mesh_axes(name: str, value: Any, axes: Iterable[str], *, why: str = "") -> Mesh:
    """A mesh that has every axis in ``axes`` (the ones a strategy or program names)."""
    mesh(name, value)
    missing = [a for a in axes if a not in value.shape]
    if missing:
        reason = f" {why}" if why else ""
        raise InputError(
            f"{name} has axes {tuple(value.axis_names)} but needs {', '.join(map(repr, missing))}"
            f"{reason}.")
    return value
