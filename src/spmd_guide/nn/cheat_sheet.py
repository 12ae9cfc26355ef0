"""The PartitionSpec cheat sheet of Part IV, read from what the strategies' compiled programs produce.

Nothing here is typed by hand: for each strategy of :data:`spmd_guide.nn.STRATEGIES` the sheet
places a model with the strategy's own ``shard``, compiles the programs a training step is made
of, and reads back the layouts of what they return:

* weights, biases and the batch: the ``.sharding`` of the arrays ``shard`` made;
* activations: the output shardings of ``jax.jit(nn.layer_outputs)`` on those arrays (the
  layout the partitioner picks for each layer's output from this placement);
* gradients: the output shardings of ``jax.jit(jax.grad(loss))``;
* parameters after one SGD step: the output shardings of ``nn.make_sgd_step(loss)``;
* optimizer state: the output shardings of ``jax.jit(optax.adamw(...).init)`` on the placed
  parameters (AdamW's first and second moments ``mu`` and ``nu``), bare and with the layout
  pinned by :func:`pinned_init`;
* memory and traffic: parameter bytes per device from the arrays' shards, collectives and
  bytes sent per step from the compiled SGD step (:func:`spmd_guide.core.hlo.report`).

Only the public face of a strategy is used (``name``, ``kind``, ``summary``, ``axis_names``,
``mesh``, ``shard``, ``loss``), so the sheet follows the strategies wherever they change.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import nn
from spmd_guide.core import checks, hlo
from spmd_guide.core.display import Table

#: The strategies the sheet covers, in the order it lists them: by family, manual before auto.
SHEET_STRATEGIES: tuple[str, ...] = (
    "dp", "auto_dp", "fsdp", "auto_fsdp", "tp", "auto_dp_tp", "auto_2d",
)

#: The model and batch the sheet is computed on unless told otherwise (small, divides by 8).
DEFAULT_LAYER_SIZES: tuple[int, ...] = (16, 64, 64, 64, 16)
DEFAULT_BATCH_SIZE = 64


def spec_text(sharding: Any, ndim: int) -> str:
    """``"P('batch', None)"``: the PartitionSpec of ``sharding`` written out for all ``ndim`` dims.

    Trailing ``None`` entries are filled in, so equal layouts always read the same; a fully
    replicated layout reads ``P()``; everything on one device reads ``"device 0 only"``. Any other
    sharding is shown as JAX prints it.
    """
    checks.sharding("sharding", sharding)
    spec_len = len(sharding.spec) if isinstance(sharding, NamedSharding) else 0
    ndim = checks.count("ndim", ndim, minimum=spec_len)
    if isinstance(sharding, SingleDeviceSharding):
        (device,) = sharding.device_set
        return f"device {device.id} only"
    if not isinstance(sharding, NamedSharding):
        return str(sharding)
    entries = list(sharding.spec) + [None] * (ndim - len(sharding.spec))
    if all(e is None for e in entries):
        return "P()"

    def one(entry: Any) -> str:
        axes = checks.spec_axes(entry)
        if not axes:
            return "None"
        if len(axes) == 1:
            return repr(axes[0])
        return "(" + ", ".join(repr(a) for a in axes) + ")"

    return "P(" + ", ".join(one(e) for e in entries) + ")"


def family(mesh_shape: dict[str, int], batch_spec: str, weight_specs: Sequence[str]) -> str:
    """Which parallelism a layout is, read from the layout itself.

    Two mesh axes of size > 1: ``"2-D"``. One: ``"DP"`` if the weights are replicated and the
    batch split, ``"FSDP"`` if weights and batch are split over the same axis, ``"TP"`` if the
    weights are split and the batch's rows are not. The specs are :func:`spec_text`'s text.
    """
    if not isinstance(mesh_shape, Mapping) or not mesh_shape or not all(
            isinstance(a, str) for a in mesh_shape):
        raise checks.InputTypeError(
            f"mesh_shape must map axis names to sizes, such as dict(mesh.shape), got "
            f"{mesh_shape!r:.60}.")
    mesh_shape = {a: checks.count(f"mesh_shape[{a!r}]", n) for a, n in mesh_shape.items()}
    batch_spec = _spec_string("batch_spec", batch_spec, mesh_shape)
    weight_specs = tuple(_spec_string(f"weight_specs[{i}]", w, mesh_shape)
                         for i, w in enumerate(_strings("weight_specs", weight_specs)))
    used = [a for a, n in mesh_shape.items() if n > 1]
    if len(used) > 1:
        return "2-D"
    weights_split = any("'" in s for s in weight_specs)
    rows_split = _splits_rows(batch_spec)
    if not weights_split:
        return "DP" if rows_split else "replicated"
    return "FSDP" if rows_split else "TP"


@dataclass(frozen=True)
class Layout:
    """Where everything of one strategy lives, per layer, as PartitionSpec text.

    Each ``*_specs`` field holds one ``(W spec, b spec)`` pair per layer; ``activations`` one
    spec per layer output. ``adam_mu``/``adam_nu`` are AdamW's moment estimates as a bare
    ``jax.jit(init)`` lays them out, ``adam_pinned`` its ``mu`` from :func:`pinned_init`.
    """

    strategy: str
    kind: str
    family: str
    summary: str
    mesh_shape: dict[str, int]
    batch: str
    params: tuple[tuple[str, str], ...]
    activations: tuple[str, ...]
    grads: tuple[tuple[str, str], ...]
    updated: tuple[tuple[str, str], ...]
    adam_mu: tuple[tuple[str, str], ...]
    adam_nu: tuple[tuple[str, str], ...]
    adam_pinned: tuple[tuple[str, str], ...]
    param_bytes_per_device: int
    param_bytes_total: int
    collective_counts: dict[str, int]
    bytes_sent: int

    @property
    def grads_match_params(self) -> bool:
        """Whether every gradient comes out in its parameter's layout."""
        return self.grads == self.params

    @property
    def step_keeps_layout(self) -> bool:
        """Whether one SGD step returns every parameter in the layout it came in with."""
        return self.updated == self.params

    @property
    def adam_matches_params(self) -> bool:
        """Whether AdamW's state, initialised under ``jit``, is laid out like the parameters."""
        return self.adam_mu == self.params and self.adam_nu == self.params

    def row(self, *, full_name: bool = True) -> dict[str, str]:
        """One table row: every layout as per-layer text, memory and traffic per device.

        Cells and headers carry line breaks so that each half of the sheet fits the text
        column. ``full_name=False`` leaves the family, kind and mesh out of the strategy cell
        (shown once, in the first table).
        """
        full_name = checks.flag("full_name", full_name)
        used = "\n".join(f"{n} {k}" for k, n in self.collective_counts.items() if n) or "none"
        mesh = " x\n".join(f"{a}={n}" for a, n in self.mesh_shape.items())
        name = (f"{self.strategy}\n{self.family}, {self.kind}\n{mesh}" if full_name
                else self.strategy)
        return {
            "strategy": name,
            "x, y": self.batch,
            "W": per_layer([w for w, _ in self.params]),
            "b": per_layer([b for _, b in self.params]),
            "activations": per_layer(list(self.activations)),
            "grad W": per_layer([w for w, _ in self.grads]),
            "params /\ndevice": f"{hlo.format_bytes(self.param_bytes_per_device)}\n"
                                f"of {hlo.format_bytes(self.param_bytes_total)}",
            "collectives\n/ step": used,
            "sent /\nstep": hlo.format_bytes(self.bytes_sent),
            ADAM_BARE: per_layer([w for w, _ in self.adam_mu]),
            ADAM_PINNED: per_layer([w for w, _ in self.adam_pinned]),
        }


def _strings(name: str, values: Any) -> tuple[str, ...]:
    """A non-empty list of strings, one per layer; refuses a lone string (whose characters
    would be read as layers) with the fix."""
    if isinstance(values, (str, bytes)):
        raise checks.InputTypeError(
            f"{name} must be a list with one spec per layer, got the string {values!r:.60}; "
            f"wrap it: [{values!r:.40}].")
    if not isinstance(values, (Sequence, np.ndarray)) or not len(values):
        raise checks.InputError(
            f"{name} must be a non-empty list of spec strings, one per layer, got {values!r:.60}.")
    items = tuple(values)
    bad = next((v for v in items if not isinstance(v, str)), None)
    if bad is not None:
        raise checks.InputTypeError(
            f"{name} must hold spec strings such as \"P('batch', None)\" (spec_text makes "
            f"them), got {bad!r:.60}.")
    return tuple(str(v) for v in items)


_SPEC_ENTRY = r"(?:None|'[^',()]+'|\('[^',()]+'(?:, '[^',()]+')*\))"
_SPEC = re.compile(rf"P\((?:{_SPEC_ENTRY}(?:, {_SPEC_ENTRY})*)?\)")


def _spec_string(name: str, value: Any, axes: Mapping[str, int] | None = None) -> str:
    """A spec as :func:`spec_text` writes it (``"P()"``, ``"P('batch', None)"``, ``"P(('a',
    'b'))"``), naming only the axes of ``axes`` when given."""
    if not isinstance(value, str):
        raise checks.InputTypeError(
            f"{name} must be a spec string such as \"P('batch', None)\" (spec_text makes it), "
            f"got {value!r:.60}.")
    if not _SPEC.fullmatch(value):
        raise checks.InputError(
            f"{name} {value!r:.60} is not a spec as spec_text writes it, such as "
            f"\"P('batch', None)\" or \"P()\".")
    named = re.findall(r"'([^']+)'", value)
    if axes is not None and any(a not in axes for a in named):
        unknown = next(a for a in named if a not in axes)
        raise checks.InputError(
            f"{name} {value!r:.60} names axis {unknown!r}, which mesh_shape {dict(axes)} lacks.")
    return str(value)


def _splits_rows(spec: str) -> bool:
    """Whether a spec text splits its first dimension."""
    return spec.startswith("P('") or spec.startswith("P((")


def _layouts(name: str, layouts: Any) -> list[Layout]:
    """A non-empty list of :class:`Layout` (as :func:`cheat_sheet` returns)."""
    if isinstance(layouts, Layout):
        raise checks.InputTypeError(
            f"{name} must be a list of layouts, got one Layout; wrap it: [layout].")
    if not isinstance(layouts, Sequence) or isinstance(layouts, (str, bytes)) or not layouts:
        raise checks.InputError(
            f"{name} needs at least one layout (a list, as cheat_sheet() returns), got "
            f"{layouts!r:.60}.")
    bad = next((lay for lay in layouts if not isinstance(lay, Layout)), None)
    if bad is not None:
        raise checks.InputTypeError(
            f"{name} must hold Layout objects from layout() or cheat_sheet(), got {bad!r:.60}.")
    return list(layouts)


def _names(name: str, values: Any) -> list[str]:
    """Strategy names, each one of ``nn.STRATEGIES``; refuses a lone string."""
    if isinstance(values, (str, bytes)):
        raise checks.InputTypeError(
            f"{name} must be a list of strategy names, got the string {values!r}; wrap it: "
            f"[{values!r}].")
    if not isinstance(values, (Sequence, np.ndarray)) or not len(values):
        raise checks.InputError(
            f"{name} must name at least one strategy, e.g. ['dp'], got {values!r:.60}.")
    return [checks.one_of("strategy", str(v) if isinstance(v, np.str_) else v, nn.STRATEGIES)
            for v in values]


def per_layer(specs: Sequence[str]) -> str:
    """One spec if every layer has it, else ``"L0: ..."`` lines grouping equal neighbours."""
    specs = _strings("specs", specs)
    if len(set(specs)) == 1:
        return specs[0]
    lines, start = [], 0
    for i in range(1, len(specs) + 1):
        if i == len(specs) or specs[i] != specs[start]:
            label = f"L{start}" if i - start == 1 else f"L{start}-{i - 1}"
            lines.append(f"{label}: {specs[start]}")
            start = i
    return "\n".join(lines)


def _pairs(shardings: Sequence[tuple[Any, Any]], params: nn.Params) -> tuple[tuple[str, str], ...]:
    return tuple(
        (spec_text(ws, w.ndim), spec_text(bs, b.ndim))
        for (ws, bs), (w, b) in zip(shardings, params, strict=True)
    )


def gradient_program(loss: nn.LossFn) -> Callable[..., Any]:
    """``jax.jit(jax.grad(loss))``, one per loss function, so asking again compiles nothing."""
    return _gradient_program(checks.function("loss", loss))


@functools.cache
def _gradient_program(loss: nn.LossFn) -> Callable[..., Any]:
    return jax.jit(jax.grad(loss))


@functools.cache
def adamw() -> Any:
    """The optimizer the sheet lays out: ``optax.adamw(1e-3)`` (one object, so its ``init``
    compiles once per layout)."""
    import optax

    return optax.adamw(1e-3)


def _adam_moments(state: Any) -> tuple[Any, Any]:
    """``(mu, nu)`` of an ``optax.adamw`` state (a chain whose first part is Adam's state)."""
    adam = next(part for part in state if hasattr(part, "mu"))
    return adam.mu, adam.nu


def adam_state_shardings(params: nn.Params, *, how: str = "jit") -> tuple[Any, Any]:
    """The shardings of AdamW's ``mu`` and ``nu`` for ``params``, initialised ``how``.

    ``"jit"``: ``jax.jit(optimizer.init)`` with nothing pinned (read from the compiled program).
    ``"eager"``: ``optimizer.init(params)`` run op by op. ``"pinned"``: ``jax.jit`` with
    ``out_shardings`` taken from the parameters (:func:`pinned_init`).
    """
    checks.one_of("how", how, ("jit", "eager", "pinned"))
    checks.array_tree("params", params)
    optimizer = adamw()
    if how == "eager":
        state = optimizer.init(params)
        return _adam_moments(jax.tree.map(lambda a: a.sharding, state))
    init = jax.jit(optimizer.init) if how == "jit" else pinned_init(optimizer, params)
    return _adam_moments(init.lower(params).compile(hlo.FAST_COMPILE).output_shardings)


def pinned_init(optimizer: Any, params: nn.Params) -> Any:
    """``jax.jit(optimizer.init)`` whose state comes out laid out like ``params``.

    Every parameter-shaped part of the state (``optax.tree_map_params``) gets its parameter's
    sharding; the rest (step counts) is replicated on the parameters' mesh.
    """
    import optax

    if not callable(getattr(optimizer, "init", None)):
        raise checks.InputTypeError(
            f"optimizer must be an optax GradientTransformation such as optax.adamw(1e-3), "
            f"got {optimizer!r:.60}.")
    leaves = checks.array_tree("params", params)
    if not all(isinstance(getattr(leaf, "sharding", None), NamedSharding) for leaf in leaves):
        raise checks.InputTypeError(
            "pinned_init needs params placed with NamedShardings on one mesh (as a strategy's "
            "shard() makes them); place them first, e.g. with jax.device_put(params, shardings).")
    mesh = leaves[0].sharding.mesh
    if any(leaf.sharding.mesh != mesh for leaf in leaves):
        raise checks.InputError(
            "pinned_init needs every leaf of params on one mesh; these lie on meshes "
            f"{sorted({str(dict(leaf.sharding.mesh.shape)) for leaf in leaves})}.")
    shapes = jax.eval_shape(optimizer.init, params)
    shardings = optax.tree_map_params(
        optimizer, lambda _, p: p.sharding, shapes, params,
        transform_non_params=lambda _: NamedSharding(mesh, P()),
    )
    return jax.jit(optimizer.init, out_shardings=shardings)


def layout(
    name: str,
    params: nn.Params,
    batch: nn.Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
    learning_rate: float = 0.01,
) -> Layout:
    """Compile one strategy's programs on ``params``/``batch`` and read back every layout."""
    checks.one_of("strategy name", name, nn.STRATEGIES)
    checks.array_tree("params", params)
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    strategy = nn.STRATEGIES[name]
    mesh = strategy.mesh(devices)
    placed, placed_batch = strategy.shard(params, batch, mesh)
    loss = strategy.loss(mesh)
    x = placed_batch[0]

    # Compiled to be read (hlo.FAST_COMPILE: XLA's passes in full, no LLVM optimization).
    fast = hlo.FAST_COMPILE
    acts = jax.jit(nn.layer_outputs).lower(placed, x).compile(fast).output_shardings
    grads = gradient_program(loss).lower(placed, placed_batch).compile(fast).output_shardings
    step = nn.make_sgd_step(loss, learning_rate=learning_rate)
    compiled_step = hlo.compile(step, placed, placed_batch, compiler_options=fast)
    updated, _ = compiled_step.output_shardings
    report = hlo.report(compiled_step)
    mu, nu = adam_state_shardings(placed)
    pinned_mu, _ = adam_state_shardings(placed, how="pinned")

    params_specs = tuple(
        (spec_text(w.sharding, w.ndim), spec_text(b.sharding, b.ndim)) for w, b in placed
    )
    weight_specs = [w for w, _ in params_specs]
    batch_text = spec_text(x.sharding, x.ndim)
    return Layout(
        strategy=name,
        kind=strategy.kind,
        family=family(dict(mesh.shape), batch_text, weight_specs),
        summary=strategy.summary,
        mesh_shape=dict(mesh.shape),
        batch=batch_text,
        params=params_specs,
        activations=tuple(
            spec_text(s, 2) for s in acts
        ),
        grads=_pairs(grads, placed),
        updated=_pairs(updated, placed),
        adam_mu=_pairs(mu, placed),
        adam_nu=_pairs(nu, placed),
        adam_pinned=_pairs(pinned_mu, placed),
        param_bytes_per_device=nn.param_bytes_per_device(placed),
        param_bytes_total=sum(leaf.nbytes for leaf in jax.tree.leaves(placed)),
        collective_counts=report.counts,
        bytes_sent=report.total_bytes,
    )


def cheat_sheet(
    names: Sequence[str] = SHEET_STRATEGIES,
    *,
    layer_sizes: Sequence[int] = DEFAULT_LAYER_SIZES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    devices: Sequence[jax.Device] | None = None,
) -> list[Layout]:
    """:func:`layout` of each strategy in ``names`` on one MLP (``layer_sizes``) and batch."""
    names = _names("names", names)
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batch_size = checks.count("batch_size", batch_size)
    params = nn.init_mlp(jax.random.key(0), sizes)
    batch = nn.make_regression_batch(jax.random.key(1), batch_size, sizes[0], sizes[-1])
    return [layout(n, params, batch, devices=devices) for n in names]


#: Headers of the two optimizer-state columns: what a bare ``jax.jit(optimizer.init)`` does
#: (the trap), and the layout :func:`pinned_init` gives (the fix).
ADAM_BARE = "AdamW mu, nu\nof W: bare\njax.jit(init)"
ADAM_PINNED = "AdamW mu, nu\nof W: with\npinned_init"

#: The columns of each part of the sheet (a whole row is far too wide for the text column).
COLUMNS: dict[str, tuple[str, ...]] = {
    "layout": ("strategy", "x, y", "W", "b"),
    "compiled": ("strategy", "activations", "grad W", "params /\ndevice"),
    "step": ("strategy", "collectives\n/ step", "sent /\nstep", ADAM_BARE, ADAM_PINNED),
}


def sheet_table(layouts: Sequence[Layout], *, part: str | None = None) -> Table:
    """The sheet as a :class:`spmd_guide.core.display.Table`, one row per strategy.

    ``part="layout"``: the mesh and where the batch and parameters live; ``"compiled"``: the
    activations and gradients the compiled programs return, and parameter bytes per device;
    ``"step"``: collectives, bytes sent, and AdamW's state bare and pinned; ``None``: every
    column. Only the first part names each strategy's family, kind and mesh.
    """
    layouts = _layouts("layouts", layouts)
    if part is None:
        return Table([lay.row() for lay in layouts])
    columns = COLUMNS[checks.one_of("part", part, COLUMNS)]
    full = part == "layout"
    return Table([{c: lay.row(full_name=full)[c] for c in columns} for lay in layouts])


def spec_of(sharding: Any, ndim: int) -> P:
    """The :class:`~jax.sharding.PartitionSpec` behind :func:`spec_text` (for tests and readers)."""
    if not isinstance(sharding, NamedSharding):
        raise checks.InputTypeError(f"expected a NamedSharding, got {type(sharding).__name__}.")
    ndim = checks.count("ndim", ndim, minimum=len(sharding.spec))
    return P(*(list(sharding.spec) + [None] * (ndim - len(sharding.spec))))


def _listed(layouts: Sequence[Layout]) -> str:
    return ", ".join(f"`{lay.strategy}`" for lay in layouts)


def notes(layouts: Sequence[Layout]) -> str:
    """Sentences (Markdown) on what the sheet shows about drift: gradients, updated
    parameters and AdamW's state that come out in another layout than the parameters'.

    The page glues these rather than typing them, so they stay true as the strategies change.
    """
    layouts = _layouts("layouts", layouts)
    sentences = []
    for attribute, (one, many) in (
        ("grads_match_params", ("its gradients", "their gradients")),
        ("step_keeps_layout", ("the parameters after one SGD step",) * 2),
    ):
        kept = [lay for lay in layouts if getattr(lay, attribute)]
        drift = [lay for lay in layouts if not getattr(lay, attribute)]
        if not drift:
            sentences.append(f"Every strategy gets {one} back in the parameters' own layout.")
        else:
            single = len(kept) <= 1  # "No strategy gets", "`dp` gets", "`dp`, `tp` get"
            sentences.append(
                f"{_listed(kept) or 'No strategy'} get{'s' if single else ''} "
                f"{one if single else many} back in the parameters' own layout; "
                f"{_listed(drift)} {'does' if len(drift) == 1 else 'do'} not, and a training "
                f"step built on {'it' if len(drift) == 1 else 'them'} should pin the layout "
                "(`out_shardings`) or pay a reshard.")
    adam = [lay for lay in layouts if not lay.adam_matches_params]
    if adam:
        where = sorted({s for lay in adam for pair in lay.adam_mu for s in pair})
        who = "any strategy" if len(adam) == len(layouts) else _listed(adam)
        sentences.append(
            f"AdamW's state initialised under a bare `jax.jit` is *not* laid out like the "
            f"parameters for {who}: it lands as {', '.join(where)}.")
    else:
        sentences.append("AdamW's state initialised under `jax.jit` follows the parameters.")
    return " ".join(sentences)
