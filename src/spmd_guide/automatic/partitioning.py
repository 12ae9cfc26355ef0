"""The small programs Part II reads, and helpers that put what the compiler did beside them.

Part II lets ``jax.jit`` split the work from the shardings of its inputs. Each example here
is a few lines on purpose: the lesson is not the function but what the compiler made of it.
:func:`partitioning` compiles a function once and returns the shardings that went in, the
sharding that came out, and the collectives (with the bytes one device sends) that the
compiler inserted, read by :mod:`spmd_guide.core.hlo`. :func:`partitioning_table` puts several
of those side by side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.core.devices import build_mesh
from spmd_guide.core.display import Table
from spmd_guide.core.hlo_text import Instruction, entry_instructions
from spmd_guide.core.timing import Timing, time_fn

# --------------------------------------------------------------------------- meshes and arrays


def auto_mesh(shape: Sequence[int] | int, names: Sequence[str], *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh whose axes are all Auto: the compiler picks what you leave open.

    ``jax.make_mesh`` makes Explicit axes by default. ``devices`` defaults to
    the first ``prod(shape)`` of ``jax.devices()`` (:func:`spmd_guide.core.devices.build_mesh`).
    """
    return build_mesh(shape, names, devices=devices, axis_types="auto")


def place(array: Any, mesh: Mesh, spec: P) -> jax.Array:
    """Put ``array`` on ``mesh`` laid out by ``spec``, after checking that it splits evenly.

    A dimension sharded over mesh axes of total size ``n`` must be divisible by ``n``:
    the examples in this book teach even layouts, so an uneven one is an error here.
    """
    array = checks.array("array", array)
    checks.mesh("mesh", mesh)
    checks.spec_fits("the array", np.shape(array), spec, mesh)
    return jax.device_put(array, NamedSharding(mesh, spec))


# --------------------------------------------------------------------------- the example programs


def elementwise(x: jax.Array) -> jax.Array:
    """``2 sin(x) + 1``: every output element needs only its own input
    element."""
    return 2 * jnp.sin(x) + 1


def column_sums(x: jax.Array) -> jax.Array:
    """Sum over the rows (axis 0): devices with different rows must add up."""
    return x.sum(axis=0)


def matmul(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    """``lhs @ rhs``, left for the compiler to partition."""
    return lhs @ rhs


def resharded_sine(
    sharding: NamedSharding,
) -> Callable[[jax.Array], jax.Array]:
    """A jitted ``sin(x) + 1`` with ``sin(x)`` constrained to ``sharding``.

    The constraint computes nothing: it tells the partitioner which layout
    that value must have, and the partitioner adds the communication.
    """

    @jax.jit
    def sine_then_add(x: jax.Array) -> jax.Array:
        y = jax.lax.with_sharding_constraint(jnp.sin(x), sharding)
        return y + 1

    return sine_then_add


# --------------------------------------------------------------------------- what the compiler did


def spec_text(spec: P) -> str:
    """``P('a', None)`` with trailing ``None`` entries dropped (they mean the same layout)."""
    if not isinstance(spec, P):
        raise checks.InputTypeError(
            f"spec_text needs a PartitionSpec such as P('x', None), got {spec!r:.60}.")
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return "P(" + ", ".join(repr(e) for e in entries) + ")"


def sharding_text(sharding: jax.sharding.Sharding | None) -> str:
    """A sharding as its PartitionSpec (``P('a', 'b')``); a ``SingleDeviceSharding`` (an array on
    one device, such as a fresh ``jnp.ones(8)``) by that name; any other fully replicated one
    as ``P()``; a PartitionSpec as itself; ``None`` (no sharding) as ``-``."""
    if isinstance(sharding, P):
        return spec_text(sharding)
    if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
        raise checks.InputTypeError(
            f"sharding_text needs a jax.sharding.Sharding, got {type(sharding).__name__}.")
    if isinstance(sharding, NamedSharding):
        return spec_text(sharding.spec)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return "SingleDeviceSharding"  # one device, not a spec over a mesh
    if sharding is not None and getattr(sharding, "is_fully_replicated", False):
        return "P()"
    return type(sharding).__name__ if sharding is not None else "-"


def _describe_ops(ops: Sequence[hlo.Collective]) -> list[str]:
    """``["1 all-reduce in groups of 4"]``: one phrase per kind and group size."""
    parts: dict[tuple[str, int], int] = {}
    for op in ops:
        parts[(op.kind, op.group_size)] = parts.get((op.kind, op.group_size), 0) + 1
    return [f"{n} {kind} in groups of {size}" for (kind, size), n in parts.items()]


def ring_arithmetic(op: hlo.Collective) -> str:
    """The ring-model sum behind ``op.bytes_sent``, for a reader to redo:
    ``"2 × (4 − 1) / 4 × 16 B = 24 B"`` for an all-reduce of 16 bytes over 4 devices.

    All-reduce: twice (n − 1)/n of the buffer; all-gather, reduce-scatter, all-to-all: once;
    collective-permute: the buffer itself (see :func:`spmd_guide.core.hlo.ring_bytes`).
    """
    if not isinstance(op, hlo.Collective):
        raise checks.InputTypeError(
            f"ring_arithmetic needs an hlo.Collective (from hlo.collectives), got {op!r:.60}.")
    n, size, sent = op.group_size, op.buffer_bytes, op.bytes_sent
    if op.kind == "collective-permute":
        return f"{size} B = {sent} B"
    factor = "2 × " if op.kind == "all-reduce" else ""
    return f"{factor}({n} − 1) / {n} × {size} B = {sent} B"


@dataclass(frozen=True)
class Partitioning:
    """How the compiler partitioned one call: shardings in and out, collectives, bytes."""

    what: str
    input_specs: tuple[str, ...]
    output_sharding: jax.sharding.Sharding
    ops: tuple[hlo.Collective, ...]
    compiled: jax.stages.Compiled = field(repr=False, compare=False)
    """The compiled program: call it on the same arguments to run it without recompiling."""

    @property
    def output_spec(self) -> str:
        return sharding_text(self.output_sharding)

    @property
    def counts(self) -> dict[str, int]:
        return hlo.count_kinds(self.ops)

    @property
    def bytes_sent(self) -> int:
        """Bytes one device sends, ring model (see :mod:`spmd_guide.core.hlo`)."""
        return sum(op.bytes_sent for op in self.ops)

    @property
    def collectives_text(self) -> str:
        """The collectives in words, e.g. ``"1 all-reduce in groups of 4"``; ``"none"``."""
        return " and ".join(_describe_ops(self.ops)) or "none"

    def row(self) -> dict[str, str]:
        """A table row; several inputs or collectives go on separate lines."""
        return {
            "what": self.what,
            "inputs": "\n".join(self.input_specs),
            "output": self.output_spec,
            "collectives": "\n".join(_describe_ops(self.ops)) or "none",
            "bytes sent": hlo.format_bytes(self.bytes_sent),
        }


def partitioning(fn: Callable[..., Any], *args: Any, what: str | None = None) -> Partitioning:
    """Compile ``fn`` (jitted or not) on ``args`` once and say how it was partitioned."""
    compiled = hlo.compile(fn, *args)
    out = compiled.output_shardings
    if not isinstance(out, jax.sharding.Sharding):
        leaves = jax.tree.leaves(out)
        if len(leaves) != 1:
            raise checks.InputError(f"partitioning() reads functions with one array output; "
                             f"{getattr(fn, '__name__', 'fn')} returns {len(leaves)}.")
        out = leaves[0]
    return Partitioning(
        what=what or getattr(fn, "__name__", "fn"),
        input_specs=tuple(sharding_text(getattr(a, "sharding", None)) for a in args),
        output_sharding=out,
        ops=tuple(hlo.collectives(compiled)),
        compiled=compiled,
    )


def partitioning_table(results: Sequence[Partitioning]) -> Table:
    """Several :class:`Partitioning` results side by side, one row each."""
    return Table([r.row() for r in results])


# --------------------------------------------------------------------------- matmul cases


@dataclass(frozen=True)
class MatmulCase:
    """One way to shard ``lhs @ rhs`` over a mesh with axes ``a`` and ``b``."""

    lhs: P
    rhs: P
    out: P | None = None  # None: let the compiler choose the output sharding


MATMUL_CASES: dict[str, MatmulCase] = {
    "rows x columns": MatmulCase(P("a", None), P(None, "b")),
    "sharded contraction": MatmulCase(P(None, "a"), P("a", None)),
    "sharded contraction, rows out": MatmulCase(P(None, "a"), P("a", None), P("a", None)),
}
"""The matmul layouts the Auto-mode chapter compares, by name."""


def matmul_partitioning(name: str, mesh: Mesh, *, m: int = 16, k: int = 32,
                        n: int = 16) -> Partitioning:
    """Place an ``(m, k) @ (k, n)`` product as :data:`MATMUL_CASES` ``[name]`` says; compile it.

    The cases ask what the *compiler* chooses, so they run on Auto axes: an Explicit
    ``mesh`` is used with its axes switched to Auto (same devices, same order). On Explicit
    axes the sharded contraction would be a type error that asks for ``out_sharding``
    (Part II's explicit-sharding chapter shows it).
    """
    checks.one_of("matmul case name", name, MATMUL_CASES)
    checks.axis(mesh, "a", name="the mesh's first axis")
    checks.axis(mesh, "b", name="the mesh's second axis")
    mesh = Mesh(mesh.devices, mesh.axis_names,
                axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names))
    m, k, n = (checks.count(label, v) for label, v in (("m", m), ("k", k), ("n", n)))
    case = MATMUL_CASES[name]
    lhs = place(jnp.arange(m * k, dtype=jnp.float32).reshape(m, k) / (m * k), mesh, case.lhs)
    rhs = place(jnp.ones((k, n), jnp.float32), mesh, case.rhs)
    fn = matmul
    if case.out is not None:
        fn = jax.jit(matmul, out_shardings=NamedSharding(mesh, case.out))
    return partitioning(fn, lhs, rhs, what=name)


# --------------------------------------------------------------------------- timing


def single_vs_sharded(fn: Callable[..., Any], arrays: Sequence[Any], mesh: Mesh,
                      specs: Sequence[P], *, runs: int = 10,
                      label: str | None = None) -> tuple[Timing, Timing]:
    """Time jitted ``fn`` on ``arrays`` held by one device, then laid out by ``specs`` on ``mesh``.

    The single-device run uses the mesh's first device. Both runs compile first (untimed)
    and wait for their results, so the comparison is of steady-state calls.
    """
    checks.function("fn", fn)
    checks.mesh("mesh", mesh)
    runs = checks.count("runs", runs)
    for what, value in (("arrays", arrays), ("specs", specs)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise checks.InputTypeError(
                f"{what} must be a list (one entry per argument of fn), got "
                f"{checks.value_text(value)}.")
    if label is not None:
        checks.text("label", label)
    if len(arrays) != len(specs):
        raise checks.InputError(f"need one PartitionSpec per array: {len(arrays)} arrays, "
                                f"{len(specs)} specs.")
    name = label or getattr(fn, "__name__", "fn")
    jitted = jax.jit(fn)
    first = mesh.devices.flat[0]
    on_one = [jax.device_put(a, first) for a in arrays]
    sharded = [place(a, mesh, s) for a, s in zip(arrays, specs, strict=True)]
    single = time_fn(jitted, *on_one, runs=runs, label=f"{name}, 1 device")
    spread = time_fn(jitted, *sharded, runs=runs, label=f"{name}, {mesh.size} devices")
    return single, spread


# --------------------------------------------------------------------------- explicit mode


def result_types(ops: Mapping[str, Callable[..., Any]], *args: Any) -> Table:
    """For each named operation, the type ``jax.typeof`` gives its result, or the error.

    Types are computed abstractly (``jax.eval_shape``): nothing runs, as at trace time.
    """
    rows = []
    for name, op in ops.items():
        try:
            result = jax.typeof(jax.eval_shape(op, *args))
            text = str(result)
        except Exception as error:  # noqa: BLE001 - the table shows which operations fail
            text = f"{type(error).__name__}: {error}"
        rows.append({"operation": name, "result type": text})
    return Table(rows)


# --------------------------------------------------------------------------- under the hood


def dump_dot(fn: Callable[..., Any], *args: Any,
             directory: str | Path) -> list[Path]:
    """Compile ``fn`` on ``args`` with XLA's dump on; return the .dot files.

    XLA writes ``*.before_optimizations.dot`` and
    ``*.<backend>_after_optimizations.dot`` into ``directory``. Rendering
    them needs Graphviz (``dot -Tsvg``), which this book does not require.
    """
    checks.function("fn", fn)
    directory = checks.directory("directory", directory, must_exist=False)
    directory.mkdir(parents=True, exist_ok=True)
    before = set(directory.glob("*.dot"))
    hlo.compile(fn, *args, compiler_options={
        "xla_dump_to": str(directory),
        "xla_dump_hlo_as_dot": True,
    })
    return sorted(set(directory.glob("*.dot")) - before)


@dataclass(frozen=True)
class PassSnapshot:
    """The HLO module as it stood right after one of XLA's passes ran."""

    after: str
    text: str


#: The two steps that make per-device programs: Shardy's propagation (``shardy-xla``, which
#: writes a sharding on every instruction) and XLA's SPMD partitioner (``spmd-partitioning``,
#: which rewrites each instruction for one device's block and inserts the collectives).
PARTITIONER_PASSES = ("shardy-xla", "spmd-partitioning")


def partitioner_passes(fn: Callable[..., Any], *args: Any,
                       passes: Sequence[str] = PARTITIONER_PASSES) -> list[PassSnapshot]:
    """Compile ``fn`` on ``args`` with XLA's per-pass dump on, and return the module right
    after each of ``passes``, in the order the compiler ran them.

    A pass named here that never runs is an error rather than a shorter list: the point is
    to show which pass did what.
    """
    import re
    import tempfile

    if isinstance(passes, str) or not passes or not all(
            isinstance(p, str) and re.fullmatch(r"[\w\-]+", p) for p in passes):
        raise checks.InputTypeError(
            f"passes must be a sequence of XLA pass names such as {PARTITIONER_PASSES}, "
            f"got {passes!r:.60}.")
    with tempfile.TemporaryDirectory() as folder:
        hlo.compile(fn, *args, compiler_options={
            "xla_dump_to": folder,
            "xla_dump_hlo_pass_re": "^(" + "|".join(map(re.escape, passes)) + ")$",
        })
        found = []
        for path in sorted(Path(folder).glob("*.txt")):
            match = re.search(r"\.(\d{4})\.[\w\-]+\.after_([\w\-]+)\.before_", path.name)
            if match and match.group(2) in passes:
                found.append((int(match.group(1)), match.group(2), path.read_text()))
    missing = [p for p in passes if p not in {name for _, name, _ in found}]
    if missing:
        raise checks.InputError(
            f"the compiler ran no pass named {missing} for {getattr(fn, '__name__', 'fn')}; "
            f"the passes that make per-device programs are {PARTITIONER_PASSES}.")
    return [PassSnapshot(name, text) for _, name, text in sorted(found)]


def entry_dataflow(text: str | jax.stages.Compiled) -> list[Instruction]:
    """The instructions of the entry computation with only the operands it defines (literal
    operands such as ``parameter(0)``'s ``0`` dropped): the edges of its dataflow graph."""
    nodes: list[Instruction] = []
    defined: set[str] = set()
    for instruction in entry_instructions(text):
        operands = tuple(o for o in instruction.operands if o in defined)
        nodes.append(dataclasses.replace(instruction, operands=operands))
        defined.add(instruction.name)
    return nodes


def plot_dataflow(fn: Callable[..., Any], *args: Any, title: str | None = None):
    """Draw the entry computation of ``fn``'s compiled program with matplotlib; collectives red.

    Each box is one instruction (op and the per-device shape it produces); arrows go from
    operands to users, top to bottom. Returns the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    nodes = entry_dataflow(hlo.compiled_text(fn, *args))
    depth: dict[str, int] = {}
    for node in nodes:
        depth[node.name] = 1 + max((depth[o] for o in node.operands if o in depth), default=-1)
    for node in nodes:  # draw an input (no operands) just above its first user
        users = [depth[u.name] for u in nodes if node.name in u.operands]
        if not node.operands and users:
            depth[node.name] = min(users) - 1
    levels: dict[int, list[Instruction]] = {}
    for node in nodes:
        levels.setdefault(depth[node.name], []).append(node)
    width = max(len(v) for v in levels.values())
    step, box_w, box_h = 3.0, 2.6, 0.6
    fig, ax = plt.subplots(figsize=(max(4.0, 1.9 * step * width / 3 + 1.5),
                                    0.95 * len(levels) + 0.6))
    where: dict[str, tuple[float, float]] = {}
    for level, row in levels.items():
        for i, node in enumerate(row):
            x, y = (i - (len(row) - 1) / 2) * step, -float(level)
            where[node.name] = (x, y)
            colour = "#f4a6a6" if node.is_collective else "#dbe8f6"
            ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h,
                                        boxstyle="round,pad=0.02", fc=colour, ec="#555"))
            ax.text(x, y, f"{node.opcode}\n{node.shape_text}", ha="center", va="center", fontsize=8)
    for node in nodes:
        for operand in node.operands:
            if operand in where:
                (x0, y0), (x1, y1) = where[operand], where[node.name]
                ax.annotate("", xy=(x1, y1 + box_h / 2), xytext=(x0, y0 - box_h / 2),
                            arrowprops={"arrowstyle": "->", "color": "#555"})
    half = step * width / 2
    ax.set_xlim(-half, half)
    ax.set_ylim(-len(levels) + 0.4, 0.6)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
