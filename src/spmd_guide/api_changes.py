"""The API changes a reader of older JAX code meets, each checked against the installed JAX.

Every entry names the old spelling, its replacement, the JAX version of the change (read
from the released ``jax`` wheels), a one-line example, and a probe that asks the installed
JAX what the old spelling does *today*: ``"removed"``, ``"deprecated"`` (works but warns) or
a config default. The book's appendix prints the table with the probe's answer, and the
tests pin it, so the table cannot silently go stale when JAX is upgraded.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import jax


def resolve(dotted: str) -> str:
    """``"removed"``, ``"deprecated"`` or ``"present"`` for a dotted name such as ``jax.tree_map``.

    The name is imported module by module and then looked up attribute by attribute. JAX
    keeps a module-level ``_deprecations`` table of names that warn (or, with no object left,
    raise); it is read directly because JAX caches its warning and gives it only once per
    process. A ``DeprecationWarning`` on import (a deprecated module) counts too.
    """
    parts = dotted.split(".")
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
                    return "removed"
                obj = getattr(obj, name)
            break
        else:
            return "removed"
    if any(issubclass(w.category, DeprecationWarning) for w in caught):
        return "deprecated"
    return "present"


def _shard_map_argument(name: str) -> Callable[[], str]:
    def probe() -> str:
        return "present" if name in inspect.signature(jax.shard_map).parameters else "removed"

    return probe


def _config_default(flag: str) -> Callable[[], str]:
    def probe() -> str:
        return f"{flag} = {getattr(jax.config, flag)}"

    return probe


def _make_mesh_default() -> str:

    axis_types = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1]).axis_types
    return f"default axis type {axis_types[0]}"


def _with_mesh_block() -> str:
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mesh:
            pass
    return "deprecated" if any(issubclass(w.category, DeprecationWarning) for w in caught) else "present"


@dataclass(frozen=True)
class ApiChange:
    """One change: what old code says, what to write now, when it changed, and today's status."""

    old: str
    new: str
    version: str
    example: str
    probe: Callable[[], str]
    part: str

    def status(self) -> str:
        """What the installed JAX does with the old spelling."""
        return self.probe()


CHANGES: tuple[ApiChange, ...] = (
    ApiChange(
        "jax.sharding.PositionalSharding",
        "jax.sharding.NamedSharding over a jax.make_mesh mesh",
        "deprecated 0.6.0, removed 0.7.0",
        "PositionalSharding(devs).reshape(4, 2) -> NamedSharding(jax.make_mesh((4, 2), ('a', 'b')), P('a', 'b'))",
        lambda: resolve("jax.sharding.PositionalSharding"),
        "I",
    ),
    ApiChange(
        "jax.tree_map",
        "jax.tree.map",
        "deprecated 0.4.26, removed 0.6.0",
        "jax.tree_map(f, params) -> jax.tree.map(f, params)",
        lambda: resolve("jax.tree_map"),
        "all",
    ),
    ApiChange(
        "jax.random.PRNGKey(0) (raw uint32[2] key)",
        "jax.random.key(0) (typed key array)",
        "jax.random.key added 0.4.16; docs switched 0.4.26",
        "k = jax.random.PRNGKey(0) -> k = jax.random.key(0)",
        lambda: resolve("jax.random.PRNGKey"),
        "V",
    ),
    ApiChange(
        "jax.make_mesh default axis_types (Auto)",
        "Explicit axes by default; pass axis_types=(AxisType.Auto,) * n for the old behaviour",
        "warned 0.8.1, default changed 0.9.0",
        "jax.make_mesh((8,), ('x',), axis_types=(jax.sharding.AxisType.Auto,))",
        _make_mesh_default,
        "I",
    ),
    ApiChange(
        "jax.sharding.PartitionSpec (long name)",
        "jax.P (the same class, shorter)",
        "jax.P added 0.7.0",
        "from jax.sharding import PartitionSpec as P -> jax.P('x', None)",
        lambda: "alias" if jax.P is jax.sharding.PartitionSpec else "different",
        "II",
    ),
    ApiChange(
        "jax.sharding.use_mesh(mesh)",
        "jax.set_mesh(mesh) (a context manager or a global setter)",
        "removed 0.7.1",
        "with jax.sharding.use_mesh(mesh): ... -> with jax.set_mesh(mesh): ...",
        lambda: resolve("jax.sharding.use_mesh"),
        "II",
    ),
    ApiChange(
        "with mesh: (a Mesh as context manager)",
        "with jax.set_mesh(mesh):",
        "deprecated 0.10.1",
        "with mesh: f(x) -> with jax.set_mesh(mesh): f(x)",
        _with_mesh_block,
        "II",
    ),
    ApiChange(
        "jax.experimental.shard.reshard / auto_axes / explicit_axes",
        "jax.sharding.reshard / auto_axes / explicit_axes (reshard also as jax.reshard)",
        "moved 0.7.0",
        "from jax.sharding import reshard, auto_axes, explicit_axes",
        lambda: resolve("jax.experimental.shard"),
        "II",
    ),
    ApiChange(
        "GSPMD partitioner (jax_use_shardy_partitioner=False)",
        "Shardy partitioner (sdy dialect in the lowered program)",
        "Shardy default 0.7.0",
        "jax.config.update('jax_use_shardy_partitioner', False)  # opt out, while it exists",
        _config_default("jax_use_shardy_partitioner"),
        "II",
    ),
    ApiChange(
        "jax.experimental.shard_map.shard_map",
        "jax.shard_map",
        "jax.shard_map added 0.6.1; old spelling deprecated 0.8.0",
        "from jax.experimental.shard_map import shard_map -> jax.shard_map(f, mesh=m, in_specs=..., out_specs=...)",
        lambda: resolve("jax.experimental.shard_map.shard_map"),
        "III",
    ),
    ApiChange(
        "shard_map(..., check_rep=...)",
        "jax.shard_map(..., check_vma=...)",
        "with jax.shard_map, 0.6.1",
        "shard_map(f, mesh, in_specs, out_specs, check_rep=False) -> jax.shard_map(f, ..., check_vma=False)",
        _shard_map_argument("check_rep"),
        "III",
    ),
    ApiChange(
        "jax.lax.pvary(x, 'x')",
        "jax.lax.pcast(x, 'x', to='varying')",
        "deprecated 0.8.2, removed 0.10.0",
        "jax.lax.pvary(x, 'x') -> jax.lax.pcast(x, 'x', to='varying')",
        lambda: resolve("jax.lax.pvary"),
        "III",
    ),
    ApiChange(
        "jax.pmap",
        "jax.shard_map (jax.pmap is now built on jit + shard_map, in maintenance mode)",
        "0.8.0",
        "jax.pmap(f)(x) -> jax.shard_map(f, mesh=m, in_specs=P('x'), out_specs=P('x'))(x)",
        lambda: resolve("jax.pmap"),
        "III",
    ),
    ApiChange(
        "jax.device_put_sharded / jax.device_put_replicated",
        "jax.device_put(x, NamedSharding(mesh, spec))",
        "deprecated 0.8.1, removed 0.10.0",
        "jax.device_put_replicated(x, devs) -> jax.device_put(x, NamedSharding(mesh, P()))",
        lambda: resolve("jax.device_put_replicated"),
        "I",
    ),
    ApiChange(
        "jax.xla_computation(f)(x)",
        "jax.jit(f).lower(x).compile().as_text() (or .lower(x).as_text())",
        "deprecated 0.4.30, deleted by 0.4.35",
        "jax.xla_computation(f)(x).as_hlo_text() -> jax.jit(f).lower(x).as_text()",
        lambda: resolve("jax.xla_computation"),
        "II",
    ),
    ApiChange(
        "jax_threefry_partitionable=False (old, non-partitionable random bits)",
        "partitionable Threefry (the default)",
        "default True since 0.5.0",
        "jax.config.update('jax_threefry_partitionable', False)  # old random values",
        _config_default("jax_threefry_partitionable"),
        "V",
    ),
    ApiChange(
        "jax_cpu_enable_gloo_collectives=True",
        "jax_cpu_collectives_implementation='gloo'",
        "0.4.27",
        "jax.config.update('jax_cpu_collectives_implementation', 'gloo')",
        lambda: "removed" if not hasattr(jax.config, "jax_cpu_enable_gloo_collectives") else "present",
        "VI",
    ),
)


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
        "<tr><th style='width:36%'>old</th><th style='width:36%'>now</th>"
        f"<th style='width:14%'>changed in</th><th style='width:14%'>in JAX {escape(jax.__version__)}</th></tr>"
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
        "<table style='display:table;table-layout:fixed;width:100%'>"
        f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"
    )
