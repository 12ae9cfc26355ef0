"""What each collective of a compiled program carries: its pass, source line and mesh axis.

XLA keeps, for every op it compiles, the JAX operation and the Python stack frame it came
from (``op_name`` and ``stack_frame_id`` metadata, with source tables at the top of the
module's text). :func:`collective_breakdown` reads them back, so a page can say *which line
of the model* each all-reduce belongs to, forward or backward, and over which mesh axis,
instead of guessing from buffer sizes (Part IX).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from spmd_guide.core import checks, hlo

_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _source_tables(text: str) -> dict[str, dict[int, str]]:
    """The numbered tables an HLO module's text starts with (source files, locations and
    stack frames), which the ops' ``stack_frame_id`` metadata points into."""
    tables: dict[str, dict[int, str]] = {name: {} for name in _TABLES}
    section = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in tables:
            section = stripped
            continue
        entry = re.match(r"(\d+) (.*)", stripped) if section else None
        if entry:
            tables[section][int(entry.group(1))] = entry.group(2)
        elif stripped or (section and tables[section]):
            section = None
    return tables


def _frames(tables: dict[str, dict[int, str]], frame: int) -> list[tuple[str, int, int]]:
    """(file, line, column) of a stack frame and its parents, innermost first."""
    chain, seen = [], set()
    while frame in tables["StackFrames"] and frame not in seen:
        seen.add(frame)
        fields = dict(re.findall(r"(\w+)=(\d+)", tables["StackFrames"][frame]))
        loc = dict(re.findall(r"(\w+)=(\d+)",
                              tables["FileLocations"].get(int(fields["file_location_id"]), "")))
        if "file_name_id" in loc:
            name = tables["FileNames"].get(int(loc["file_name_id"]), "").strip('"')
            chain.append((name, int(loc["line"]), int(loc["column"])))
        frame = int(fields.get("parent_frame_id", frame))
    return chain


@functools.cache
def _expressions(path: str) -> dict[tuple[int, int], str]:
    """The largest expression that starts at each (line, column) of a Python file."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[tuple[int, int], tuple[int, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.expr) and not isinstance(node, (ast.Name, ast.Constant)):
            text = ast.get_source_segment(source, node) or ""
            where = (node.lineno, node.col_offset)
            if "\n" not in text and len(text) > found.get(where, (-1, ""))[0]:
                found[where] = (len(text), text)
    return {where: text for where, (_, text) in found.items()}


def _where(chain: list[tuple[str, int, int]], module: str) -> str:
    """The expression of the innermost frame in ``module`` (file name), else the innermost."""
    if not chain:
        return "?"
    inside = [frame for frame in chain if frame[0].rsplit("/", 1)[-1] == module]
    path, line, column = (inside or chain)[0]
    name = path.rsplit("/", 1)[-1]
    return _expressions(path).get((line, column), f"{name}:{line}")


def _op_name_parts(op_name: str) -> list[str]:
    """The ``op_name`` of each op the compiler combined into one: XLA writes their common
    prefix once and the rest in parentheses joined by ``:``
    (``jit(f)/transpose(jvp())/(dot_a:dot_b)``), or the whole names joined by ``:``."""
    if ":" in op_name and op_name.endswith(")"):
        depth = 0
        for i in range(len(op_name) - 1, -1, -1):   # the "(" that the final ")" closes
            depth += {")": 1, "(": -1}.get(op_name[i], 0)
            if depth == 0:
                break
        if depth == 0 and i > 0 and op_name[i - 1] == "/":
            return [op_name[:i] + part for part in op_name[i + 1:-1].split(":")]
    return op_name.split(":")


def _pass(op_name: str) -> str:
    """forward, backward, or both, from an op's ``op_name`` (``transpose(...)`` is the
    backward pass, in an op's own name or in the prefix that combined ops share)."""
    backward = ["transpose(" in part for part in _op_name_parts(op_name)]
    if all(backward):
        return "backward"
    return "forward + backward" if any(backward) else "forward"


def _axes(groups: tuple[tuple[int, ...], ...], mesh: Mesh) -> str:
    """The mesh axes along which an op's device groups (or permute pairs) vary."""
    shape = tuple(mesh.devices.shape)
    if not groups:
        return ", ".join(mesh.axis_names)
    varying = set()
    for group in groups:
        coords = [np.unravel_index(d, shape) for d in group]
        varying |= {i for i in range(len(shape)) if len({c[i] for c in coords}) > 1}
    return ", ".join(name for i, name in enumerate(mesh.axis_names) if i in varying) or "none"


def _carries(op: hlo.Collective) -> str:
    if len(op.buffers) > 3:
        return f"{len(op.buffers)} arrays, {hlo.format_bytes(op.buffer_bytes)}"
    return op.shape_text


def collectives(text: str) -> tuple[hlo.Collective, ...]:
    """``hlo.collectives_in_text(text)``, remembered: a page reads the same program's
    collectives several times (counts, breakdowns), and parsing its text is the slow part."""
    if not isinstance(text, str):
        raise checks.InputTypeError(
            f"text must be a compiled program's text (compiled.as_text()), got "
            f"{checks.value_text(text)}.")
    if "ENTRY" not in text:
        raise checks.InputError(
            f"text must be a compiled program's text (compiled.as_text()), with an ENTRY "
            f"computation; got {checks.value_text(text)}.")
    return _collectives(text)


@functools.lru_cache(maxsize=32)
def _collectives(text: str) -> tuple[hlo.Collective, ...]:
    return tuple(hlo.collectives_in_text(text))


def _check_mesh_fits(text: str, mesh: Mesh) -> None:
    """``mesh`` can be the program's: as many devices as it has partitions x replicas, the
    same axis sizes where the program prints its mesh by ``mesh``'s axis names, and every
    device group a grid along the mesh's axes (as a collective over mesh axes or sub-axes
    makes). Which physical devices the program ran on is not in its text; this is what is."""
    partitions = re.search(r"num_partitions=(\d+)", text)
    replicas = re.search(r"replica_count=(\d+)", text)
    n = (int(partitions.group(1)) if partitions else 1) * (int(replicas.group(1)) if replicas
                                                           else 1)
    if n != mesh.size:
        raise checks.InputError(
            f"mesh has {mesh.size} devices {dict(mesh.shape)}, but the program runs on {n} "
            f"(num_partitions x replica_count): pass the mesh it was compiled for.")
    shape = tuple(mesh.devices.shape)
    for op in collectives(text):
        printed = re.search(r"replica_groups=mesh\[([^\]]*)\]", op.line)
        named = dict((name, int(n)) for name, n in re.findall(r"'?([^',=\s]+)'?=(\d+)",
                                                      printed.group(1))) if printed else {}
        if set(named) == set(mesh.axis_names) and named != dict(mesh.shape):
            raise checks.InputError(
                f"{op.name} names the mesh {named}, but mesh is {dict(mesh.shape)}: pass the "
                f"mesh the program was compiled for.")
        if op.kind == "collective-permute" or not op.groups:
            continue
        for group in op.groups:  # a collective over mesh (sub-)axes spans a sub-grid
            coords = np.array([np.unravel_index(d, shape) for d in group]).reshape(len(group), -1)
            spans = [len(set(coords[:, i])) for i in range(coords.shape[1])]
            if int(np.prod(spans)) != len(group):
                raise checks.InputError(
                    f"the device groups of {op.name} ({op.kind}) do not follow the axes of mesh "
                    f"{dict(mesh.shape)}: group {group} is not a grid of its devices along the "
                    f"mesh's axes. Pass the mesh the program was compiled for.")


def collective_breakdown(text: str, mesh: Mesh | None = None, *,
                         by: Sequence[str] = ("pass", "where"),
                         module: str = "lm.py") -> list[dict[str, Any]]:
    """The collectives of a compiled program grouped by where they come from, one row per
    group, so a page can say what each one carries.

    Each op is labelled from the program itself: ``pass`` (``forward``, ``backward``, or
    ``forward + backward`` for an op the compiler combined from both) from its ``op_name``
    metadata (the backward pass is JAX's ``transpose``); ``where``, the source expression in
    the file ``module`` that its stack frame points at (a long one cut at 52 characters; an
    op the compiler combined from several adds ``+ n more``: its other parts, such as the
    gradients that ride in one all-reduce, come from other lines; an op that lays an
    argument out anew before its first use, which JAX 0.12 names by the argument's path
    with no source line, reads ``argument params['embed']``);
    ``axis``, the axes of ``mesh`` along which its device groups vary. Rows group the ops
    with equal ``by`` labels and kind, in program order, with the op count, the buffers each
    op carries, and the bytes one device sends (ring model, :mod:`spmd_guide.core.hlo`).
    """
    if isinstance(text, jax.stages.Compiled):
        text = text.as_text()
    if not isinstance(text, str):
        raise checks.InputTypeError(
            f"text must be a compiled program's text (compiled.as_text()) or the compiled "
            f"program, got {checks.value_text(text)}.")
    if isinstance(by, str) or not isinstance(by, Sequence) or not by:
        raise checks.InputTypeError(
            f"by must be a non-empty sequence of keys such as ('pass', 'where'), got "
            f"{checks.value_text(by)}.")
    for key in by:
        checks.one_of("breakdown key", key, ("pass", "where", "axis"))
    if "axis" in by or mesh is not None:
        checks.mesh("mesh", mesh)
        _check_mesh_fits(text, mesh)
    if not isinstance(module, str) or not module:
        raise checks.InputTypeError(
            f"module must be a file name such as 'lm.py', got {checks.value_text(module)}.")
    tables = _source_tables(text)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for op in collectives(text):
        meta = re.search(r'op_name="([^"]*)"(?:\s+stack_frame_id=(\d+))?', op.line)
        chain = _frames(tables, int(meta.group(2))) if meta and meta.group(2) else []
        op_name = meta.group(1) if meta else ""
        where = _where(chain, module)
        if not chain and op_name and "/" not in op_name:
            # JAX 0.12 names an op that lays out an argument anew by the argument's path
            where = "argument " + op_name.replace("\\'", "'").replace('\\"', '"')
        combined = op_name.count(":")  # ops the compiler merged into this one, beyond the first
        more = f" + {combined} more" if combined else ""
        limit = 52 - len(more)
        where = (where if len(where) <= limit else where[:limit - 1] + "\u2026") + more
        label = {"pass": _pass(op_name),
                 "where": where,
                 "axis": _axes(op.groups, mesh) if "axis" in by else ""}
        key = tuple(label[k] for k in by) + (op.kind,)
        row = groups.setdefault(key, {k: label[k] for k in by} | {
            "collective": op.kind, "ops": 0, "each carries": [], "bytes sent": 0})
        row["ops"] += 1
        row["bytes sent"] += op.bytes_sent
        if _carries(op) not in row["each carries"]:
            row["each carries"].append(_carries(op))
    rows = list(groups.values())
    for row in rows:
        shown = row["each carries"]
        row["each carries"] = "; ".join(shown) if len(shown) <= 2 else f"{len(shown)} shapes"
    return rows


def scatter_forms(mesh: Mesh, axis_name: str) -> dict[str, str]:
    """The collectives this backend compiles for one sum-then-split written two ways, over
    mesh axis ``axis_name``: a row-parallel matmul under ``jax.jit`` whose output is pinned
    split by rows (the partitioner writes the sum), and the same matmul under ``shard_map``
    with an explicit ``jax.lax.psum_scatter``. On a backend that rewrites "all-reduce, then
    keep my slice" into a reduce-scatter both show a reduce-scatter; XLA:CPU does not.

    Works on a mesh of Auto or Explicit axes (it places its own inputs, on an Auto copy).
    """
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = checks.axis(mesh, axis_name)
    auto = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.shape))
    x = jax.ShapeDtypeStruct((2 * n, 4 * n), np.float32,
                             sharding=NamedSharding(auto, P(None, axis_name)))
    w = jax.ShapeDtypeStruct((4 * n, 8), np.float32,
                             sharding=NamedSharding(auto, P(axis_name, None)))
    rows = NamedSharding(auto, P(axis_name, None))
    partitioned = jax.jit(lambda x, w: x @ w, out_shardings=rows)
    explicit = jax.jit(jax.shard_map(
        lambda x, w: jax.lax.psum_scatter(x @ w, axis_name, tiled=True), mesh=auto,
        in_specs=(P(None, axis_name), P(axis_name, None)), out_specs=P(axis_name, None)))
    forms = {}
    for label, fn in (("jax.jit, output pinned split by rows", partitioned),
                      ("shard_map with psum_scatter", explicit)):
        ops = hlo.collectives_in_text(fn.lower(x, w).compile(
            compiler_options=hlo.FAST_COMPILE).as_text())
        kinds: dict[str, int] = {}
        for op in ops:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        forms[label] = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "none"
    return forms
