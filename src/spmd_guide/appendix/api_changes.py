"""The API changes a reader of older JAX code meets, each checked against the installed JAX.

The entries live in ``api_changes.toml`` beside this module (data, not code): the old
spelling, its replacement, the JAX version of the change (read from the released ``jax``
wheels), a one-line example, and a *probe* that asks the installed JAX what the old spelling
does today: ``"removed"``, ``"deprecated"`` (works but warns) or a config default. The book's
appendix prints the table with the probes' answers and the tests pin them, so the table
cannot silently go stale when JAX is upgraded.
"""

from __future__ import annotations

import importlib
import inspect
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax

from spmd_guide.core import checks


def resolve(dotted: str) -> str:
    """``"present"``, ``"deprecated"``, ``"removed"`` or ``"absent"`` for a dotted name.

    The name (e.g. ``jax.tree_map``) is imported module by module, then looked
    up attribute by attribute. JAX keeps a module-level ``_deprecations``
    table of names that warn (or, with no object left, raise); it is read
    directly, because JAX caches its warning and gives it only once per
    process. A ``DeprecationWarning`` on import (a deprecated module) counts
    too. A name the installed JAX lacks is ``"removed"`` only when something
    records that it once existed (JAX's ``_deprecations`` or this module's table
    of changes); otherwise it is ``"absent"``: a typo such as ``jax.tree_mapp``
    or a change the table does not list. A name whose top-level package cannot
    be imported (``jaxx.tree_map``) is refused.
    """
    parts = _dotted_parts(dotted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for name in parts[i:]:
                deprecated = getattr(obj, "_deprecations", {}).get(name)
                if deprecated is not None:
                    return "removed" if deprecated[1] is None else "deprecated"
                if not hasattr(obj, name):
                    return _missing(dotted)
                obj = getattr(obj, name)
            break
        else:
            return _missing(dotted)
    if any(issubclass(w.category, DeprecationWarning) for w in caught):
        return "deprecated"
    return "present"


def _missing(dotted: str) -> str:
    """A name the installed JAX lacks: removed if the table of changes records it (its own
    probe, or a name under it), absent otherwise."""
    known = {c.probe.split(":", 1)[1] for c in CHANGES if c.probe.startswith("resolve:")}
    return "removed" if any(dotted == k or dotted.startswith(k + ".") for k in known) else "absent"


def _dotted_parts(dotted: object) -> list[str]:
    """The parts of a dotted name whose first part is an importable package."""
    parts = dotted.split(".") if isinstance(dotted, str) else []
    if not parts or not all(part.isidentifier() for part in parts):
        raise checks.InputError(
            f"resolve needs a dotted Python name such as 'jax.tree_map', got {dotted!r}.")
    try:
        importlib.import_module(parts[0])
    except ImportError:
        raise checks.InputError(
            f"cannot import {parts[0]!r}, the package {dotted!r} would be in: check the "
            "spelling (a name that never existed was not removed).") from None
    return parts


def _shard_map_argument(name: str) -> str:
    return "present" if name in inspect.signature(jax.shard_map).parameters else "removed"


def _experimental_shard_map_argument(name: str) -> str:
    """Run the old spelling, ``jax.experimental.shard_map.shard_map(..., name=False)``, on a
    one-device mesh: ``deprecated`` if it runs with a warning, ``present`` if it runs
    without, ``removed`` if the function or the argument is gone."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            module = importlib.import_module("jax.experimental.shard_map")
            old = module.shard_map
        except (ImportError, AttributeError):
            return "removed"
        if name not in inspect.signature(old).parameters:
            return "removed"
        mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1],
                             axis_types=(jax.sharding.AxisType.Auto,))
        spec = jax.sharding.PartitionSpec("i")
        old(lambda x: x * 2, mesh, spec, spec, **{name: False})(jax.numpy.ones(2))
    warned = any(issubclass(w.category, DeprecationWarning) for w in caught)
    return "deprecated" if warned else "present"


def _requires_python(_: str) -> str:
    from importlib.metadata import metadata

    return f"requires Python {metadata('jax')['Requires-Python']}"


def _module_or_namespace(dotted: str) -> str:
    """``module`` if ``dotted`` imports as a module (``from jax.x import y`` works), else
    what kind of object the attribute is."""
    try:
        importlib.import_module(dotted)
        return "module"
    except ImportError:
        pass
    parent, _, name = dotted.rpartition(".")
    obj = getattr(importlib.import_module(parent), name, None)
    if obj is None:
        return "removed"
    return f"{type(obj).__name__}, not a module"


def _same_object(pair: str) -> str:
    """``alias`` if the two dotted names (``a=b``) are one object, else which is missing."""
    first, _, second = pair.partition("=")
    found = []
    for dotted in (first, second):
        parent, _, name = dotted.rpartition(".")
        found.append(getattr(importlib.import_module(parent), name, None))
    if found[0] is None or found[1] is None:
        return f"only {first if found[1] is None else second}" if any(found) else "removed"
    return "alias" if found[0] is found[1] else "different"


def _replica_groups_spelling(_: str) -> str:
    """How the compiled program of a ``shard_map`` psum writes its device groups."""
    from spmd_guide.core import hlo
    from spmd_guide.core.device_groups import replica_groups_text

    if len(jax.devices()) < 2:
        return "needs 2 devices to probe"
    mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2],
                         axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.PartitionSpec("i")
    psum = jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=spec,
                         out_specs=jax.sharding.PartitionSpec())
    (op,) = hlo.collectives(psum, jax.numpy.ones(2))
    groups = replica_groups_text(op.line) or ""
    return "mesh axes" if groups.startswith("mesh[") else "explicit list"


def _compiled_parameter_sharding(_: str) -> str:
    """Whether a compiled program's parameters still carry ``sharding={...}``."""
    if len(jax.devices()) < 2:
        return "needs 2 devices to probe"
    mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2],
                         axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.device_put(jax.numpy.ones(2), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("i")))
    text = jax.jit(lambda t: t * 2).lower(x).compile().as_text()
    printed = any("parameter(" in line and "sharding={" in line for line in text.splitlines())
    return "printed" if printed else "not printed"


#: The message JAX 0.10 and 0.11 gave a matmul whose contracting dimensions are sharded
#: differently on its two sides, and the one JAX 0.12 gives every matmul whose contracting
#: dimension is sharded on both.
OLD_CONTRACTING_ERROR = "dot_general requires contracting dimensions to have consistent sharding"
NEW_CONTRACTING_ERROR = "Contracting dimensions are sharded and it is ambiguous"


def _contracting_error(_: str) -> str:
    """Which wording the sharding type error of ``a @ b`` has, ``a`` columns over one axis
    and ``b`` rows over another (Explicit axes)."""
    if len(jax.devices()) < 4:
        return "needs 4 devices to probe"
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:4],
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    spec = jax.sharding.PartitionSpec
    a = jax.device_put(jax.numpy.ones((4, 4)), jax.sharding.NamedSharding(mesh, spec("x", "y")))
    b = jax.device_put(jax.numpy.ones((4, 4)), jax.sharding.NamedSharding(mesh, spec("x", None)))
    try:
        jax.eval_shape(lambda s, t: s @ t, a, b)
    except Exception as error:  # noqa: BLE001 - the class is private (jax._src.core)
        message = str(error)
        if message.startswith(NEW_CONTRACTING_ERROR):
            return "new wording"
        return "old wording" if message.startswith(OLD_CONTRACTING_ERROR) else "other wording"
    return "no error"


def _config_default(flag: str) -> str:
    return f"{flag} = {getattr(jax.config, flag)}"


def _config_option(flag: str) -> str:
    return "present" if hasattr(jax.config, flag) else "removed"


def _make_mesh_default(_: str) -> str:
    axis_types = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1]).axis_types
    return f"default axis type {axis_types[0]}"


def _with_mesh_block(_: str) -> str:
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mesh:
            pass
    return "deprecated" if any(issubclass(w.category, DeprecationWarning) for w in caught) else "present"


def _p_alias(_: str) -> str:
    return "alias" if jax.P is jax.sharding.PartitionSpec else "different"


PROBES: dict[str, Callable[[str], str]] = {
    "resolve": resolve,
    "shard_map_argument": _shard_map_argument,
    "experimental_shard_map_argument": _experimental_shard_map_argument,
    "requires_python": _requires_python,
    "module_or_namespace": _module_or_namespace,
    "same_object": _same_object,
    "replica_groups_spelling": _replica_groups_spelling,
    "compiled_parameter_sharding": _compiled_parameter_sharding,
    "contracting_error": _contracting_error,
    "config_default": _config_default,
    "config_option": _config_option,
    "make_mesh_default": _make_mesh_default,
    "with_mesh_block": _with_mesh_block,
    "p_alias": _p_alias,
}
"""Probe kinds: ``kind`` or ``kind:argument`` in the TOML's ``probe`` field."""


@dataclass(frozen=True)
class ApiChange:
    """One change: what old code says, what to write now, when it changed, and today's status."""

    old: str
    new: str
    version: str
    example: str
    part: str
    probe: str

    def status(self) -> str:
        """What the installed JAX does with the old spelling."""
        kind, _, argument = self.probe.partition(":")
        return PROBES[kind](argument)


TABLE = Path(__file__).with_name("api_changes.toml")
"""The table of changes this module reads by default."""


def load(path: Path = TABLE) -> tuple[ApiChange, ...]:
    """The entries of the TOML table, checked for unknown probe kinds."""
    if not isinstance(path, (str, Path)):
        raise checks.InputTypeError(f"path must be the path of a TOML file, got {path!r}.")
    path = Path(path)
    with path.open("rb") as file:
        entries = tomllib.load(file)["change"]
    changes = tuple(
        ApiChange(old=e["old"], new=e["new"], version=e["changed_in"], example=e["example"],
                  part=e["part"], probe=e["probe"])
        for e in entries
    )
    unknown = {c.probe for c in changes if c.probe.partition(":")[0] not in PROBES}
    if unknown:
        raise checks.InputError(f"{path.name}: unknown probe kinds {sorted(unknown)}; known: {sorted(PROBES)}.")
    return changes


CHANGES: tuple[ApiChange, ...] = load()


def rows() -> list[dict[str, str]]:
    """The table of changes with a column computed from the installed JAX."""
    return [
        {
            "old": c.old,
            "new": c.new,
            "changed in": c.version,
            f"in JAX {jax.__version__}": c.status(),
            "example": c.example,
        }
        for c in CHANGES
    ]


_STATUS_COLOURS = {"removed": "#c0392b", "deprecated": "#b9770e"}


def table_html() -> str:
    """The changes as an HTML table that wraps inside a page: one row per change, its example below."""
    from html import escape

    head = (
        "<tr><th style='width:30%'>old</th><th style='width:30%'>now</th>"
        f"<th style='width:18%'>changed in</th><th style='width:22%'>in JAX {escape(jax.__version__)}</th></tr>"
    )
    body = []
    for c in CHANGES:
        status = c.status()
        colour = _STATUS_COLOURS.get(status, "#1e8449")
        body.append(
            "<tr>"
            f"<td><code>{escape(c.old)}</code></td><td>{escape(c.new)}</td>"
            f"<td>{escape(c.version)}</td>"
            f"<td><span style='color:{colour};font-weight:600'>{escape(status)}</span></td>"
            "</tr>"
            f"<tr><td colspan='4' style='padding-bottom:0.8em'>"
            f"<code style='white-space:pre-wrap;word-break:break-word'>{escape(c.example)}</code></td></tr>"
        )
    return (
        "<table style='display:table;table-layout:fixed;width:100%;overflow-wrap:anywhere'>"
        f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"
    )
