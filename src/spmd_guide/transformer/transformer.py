"""Ways to train the transformer of :mod:`spmd_guide.transformer.lm` on many devices, behind one interface.

The interface of Part IV::

    strategy = STRATEGIES["tp"]
    mesh = strategy.mesh(jax.devices())
    params, tokens = strategy.shard(params, tokens, mesh)
    loss_fn = strategy.loss(mesh, config)        # equals lm_loss, gradients included

Every strategy is ``jax.jit`` with shardings on a mesh of ``AxisType.Auto`` axes: the strategy
places the parameters and pins the layout of each activation (``constrain``), and the compiler
writes the collectives. Context parallelism adds the one piece the compiler cannot invent,
ring attention, written with ``jax.shard_map`` in :mod:`spmd_guide.transformer.attention`.
:func:`train_step` pins parameters and optimizer state to the layouts they came in with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.core.devices import build_mesh
from spmd_guide.transformer.attention import layout_positions, ring_attention_in_layout
from spmd_guide.transformer.lm import (
    Config,
    Params,
    check_tokens,
    cross_entropy,
    forward,
    init_params,
    lm_loss,
)

__all__ = ["Config", "init_params", "lm_loss", "STRATEGIES", "Strategy", "train_step"]

# Which mesh axis (if any) splits each dimension of each kind of leaf, for tensor parallelism.
_TP = {"wq": (None, "model", None), "wk": (None, "model", None), "wv": (None, "model", None),
       "wo": ("model", None, None), "w_up": (None, "model"), "w_down": ("model", None),
       "unembed": (None, "model")}


def _leaf_name(path: tuple[Any, ...]) -> str:
    return str(getattr(path[-1], "key", ""))


def _add_fsdp(spec: tuple[Any, ...], shape: Sequence[int], size: int) -> tuple[Any, ...]:
    """Shard the first free dimension that splits evenly over ``data`` (ZeRO-3)."""
    for dim, (entry, length) in enumerate(zip(spec, shape, strict=True)):
        if entry is None and length % size == 0:
            return spec[:dim] + ("data",) + spec[dim + 1:]
    return spec


@dataclass(frozen=True)
class Strategy:
    """One layout of parameters, tokens and activations on a mesh, and its loss function."""

    name: str
    summary: str
    axes: tuple[str, ...]
    tensor: bool = False          # Megatron specs over "model"
    fsdp: bool = False            # parameters (and so optimizer state) split over "data"
    seq_axis: str | None = None   # the axis that splits the residual stream's sequence
    ring: str | None = None       # ring-attention layout over "seq" (context parallelism)

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        if len(self.axes) == 1:
            return (n_devices,)
        model = 2 if n_devices % 2 == 0 else 1
        return (n_devices // model, model)

    def mesh(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        """A mesh with this strategy's axis names (Auto axes) over ``devices``."""
        devices = list(jax.devices() if devices is None else devices)
        return build_mesh(self.mesh_shape(len(devices)), self.axes, devices=devices)

    def _size(self, mesh: Mesh, axis: str) -> int:
        return int(mesh.shape[axis]) if axis in mesh.shape else 1

    # -- where things live ---------------------------------------------------------------

    def param_specs(self, params: Params, mesh: Mesh) -> Any:
        """A ``PartitionSpec`` for every parameter leaf."""
        def spec(path, leaf):
            entries = _TP.get(_leaf_name(path), (None,) * leaf.ndim) if self.tensor else \
                (None,) * leaf.ndim
            if self.fsdp:
                entries = _add_fsdp(tuple(entries), leaf.shape, self._size(mesh, "data"))
            return P(*entries)
        return jax.tree_util.tree_map_with_path(spec, params)

    def token_spec(self) -> P:
        return P("data", None) if "data" in self.axes else P()

    def activation_specs(self) -> dict[str, P]:
        """The layout of each kind of activation: residual stream, per-head, MLP hidden,
        logits (dimensions ``[batch, seq, ...]``)."""
        b = "data" if "data" in self.axes else None
        s = self.seq_axis
        m = "model" if self.tensor else None
        return {"residual": P(b, s, None), "heads": P(b, s if self.ring else None, m, None),
                "hidden": P(b, s if not self.tensor else None, m),
                "logits": P(b, s if not self.tensor else None, m)}

    def shardings(self, params: Params, mesh: Mesh) -> Any:
        return jax.tree.map(lambda s: NamedSharding(mesh, s), self.param_specs(params, mesh))

    def check(self, config: Config, mesh: Mesh) -> None:
        """Refuse sizes the mesh cannot split, naming the size and the divisor."""
        checks.mesh("mesh", mesh)
        for axis in self.axes:
            checks.axis(mesh, axis, name="mesh axis")
        if self.tensor:
            n = self._size(mesh, "model")
            for what in ("n_heads", "d_ff", "vocab"):
                checks.divisible(f"config.{what}", getattr(config, what), n,
                                 why="over mesh axis 'model'")
        if self.seq_axis:
            n = self._size(mesh, self.seq_axis)
            parts = 2 * n if self.ring == "zigzag" else n
            checks.divisible("config.seq_len", config.seq_len, parts,
                             why=f"over mesh axis {self.seq_axis!r} ({self.ring or 'contiguous'})")

    def shard(self, params: Params, tokens: jax.Array, mesh: Mesh) -> tuple[Params, jax.Array]:
        """Place ``params`` and ``tokens`` on ``mesh`` as this strategy lays them out."""
        checks.mesh("mesh", mesh)
        checks.array_tree("params", params)
        tokens = checks.array("tokens", tokens, ndim=2, dtype_kind="iu")
        specs = self.param_specs(params, mesh)
        for (path, leaf), spec in zip(jax.tree_util.tree_leaves_with_path(params),
                                      jax.tree.leaves(specs), strict=True):
            checks.spec_fits(f"params{jax.tree_util.keystr(path)}", leaf.shape, spec, mesh)
        checks.spec_fits("tokens", tokens.shape, self.token_spec(), mesh)
        return (jax.device_put(params, self.shardings(params, mesh)),
                jax.device_put(tokens, NamedSharding(mesh, self.token_spec())))

    # -- the loss ------------------------------------------------------------------------

    def loss(self, mesh: Mesh, config: Config) -> Callable[[Params, jax.Array], jax.Array]:
        """``loss_fn(params, tokens)``, equal to ``lm_loss`` with its gradients."""
        self.check(config, mesh)
        acts = {k: NamedSharding(mesh, s) for k, s in self.activation_specs().items()}

        def constrain(x, kind):
            return jax.lax.with_sharding_constraint(x, acts[kind])

        attend = None
        order = np.arange(config.seq_len)
        if self.ring:
            n = self._size(mesh, "seq")
            order = layout_positions(config.seq_len, n, self.ring).reshape(-1)

            def attend(q, k, v):
                return ring_attention_in_layout(q, k, v, mesh, "seq", causal=True,
                                                layout=self.ring)

        def loss_fn(params: Params, tokens: jax.Array) -> jax.Array:
            tokens = check_tokens(tokens, config)
            inputs, targets = tokens[:, :-1][:, order], tokens[:, 1:][:, order]
            extra = {"attend": attend} if attend else {}
            logits = forward(params, inputs, positions=order, constrain=constrain, **extra)
            return cross_entropy(logits, targets)

        return loss_fn


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("dp", "data parallel: batch split, parameters replicated", ("data",)),
    Strategy("fsdp", "ZeRO-3: batch split, parameters and optimizer state split", ("data",),
             fsdp=True),
    Strategy("tp", "Megatron tensor parallel: heads and d_ff split", ("model",), tensor=True),
    Strategy("tp_sp", "tensor + sequence parallel: norms and residuals split over sequence",
             ("model",), tensor=True, seq_axis="model"),
    Strategy("cp", "context parallel: sequence split, ring attention", ("seq",),
             seq_axis="seq", ring="contiguous"),
    Strategy("cp_zigzag", "context parallel with the zig-zag layout (balanced causal work)",
             ("seq",), seq_axis="seq", ring="zigzag"),
    Strategy("fsdp_tp", "2-D mesh: ZeRO-3 over data, Megatron over model", ("data", "model"),
             tensor=True, fsdp=True),
)}


# --------------------------------------------------------------------------- training


def state_shardings(state: Any, params: Params, param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings for an optax state: leaves shaped like a parameter (Adam's ``mu``, ``nu``)
    take that parameter's sharding, everything else (the step count) is replicated."""
    by_path = {tuple(map(str, path)): (leaf.shape, s) for (path, leaf), s in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(param_shardings),
        strict=True)}

    def pick(path, leaf):
        keys = tuple(map(str, path))
        for start in range(len(keys)):
            shape, sharding = by_path.get(keys[start:], (None, None))
            if sharding is not None and tuple(shape) == tuple(leaf.shape):
                return sharding
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(pick, state)


@dataclass(frozen=True)
class Trainer:
    """A strategy's compiled pieces: ``init(params)`` (optimizer state), ``grads(params,
    tokens)`` and ``step(params, state, tokens)``, all with pinned output shardings."""

    init: Callable[..., Any]
    grads: Callable[..., Any]
    step: Callable[..., Any]
    param_shardings: Any
    state_shardings: Any


def train_step(strategy: Strategy, mesh: Mesh, config: Config, params: Params, *,
               optimizer: optax.GradientTransformation, donate: bool = True) -> Trainer:
    """Compile a training step for ``strategy`` whose outputs keep their input layouts.

    ``params`` only lends its structure and shapes. Gradients come out in the parameters'
    shardings and the optimizer state in the shardings :func:`state_shardings` gives it, so
    ZeRO (``fsdp``) keeps Adam's moments split like the parameters.
    """
    loss_fn = strategy.loss(mesh, config)
    p_sh = strategy.shardings(params, mesh)
    s_sh = state_shardings(jax.eval_shape(optimizer.init, params), params, p_sh, mesh)
    scalar = NamedSharding(mesh, P())

    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return Trainer(
        init=jax.jit(optimizer.init, out_shardings=s_sh),
        grads=jax.jit(jax.value_and_grad(loss_fn), out_shardings=(scalar, p_sh)),
        step=jax.jit(step, out_shardings=(p_sh, s_sh, scalar),
                     donate_argnums=(0, 1) if donate else ()),
        param_shardings=p_sh, state_shardings=s_sh)


# --------------------------------------------------------------------------- accounting


def _bytes_per_device(tree: Any) -> int:
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


def predicted_bytes(strategy: Strategy, mesh: Mesh, config: Config, params: Params,
                    batch: int) -> dict[str, int]:
    """Bytes per device by formula: parameters (each leaf divided by the devices that split
    it), gradients (the same), AdamW state (two moments), and the activations the backward
    pass keeps, estimated as ``n_layers * (10 d_model + 3 d_ff + 2 heads seq) * 4`` bytes per
    local token plus the logits."""
    p_sh = strategy.shardings(params, mesh)
    p = sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
            for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(p_sh), strict=True))
    size = dict(mesh.shape)
    tokens = batch * config.seq_len // size.get("data", 1)
    heads_here, ff_here, vocab_here = config.n_heads, config.d_ff, config.vocab
    if strategy.tensor:
        heads_here //= size["model"]
        ff_here //= size["model"]
        vocab_here //= size["model"]
    if strategy.seq_axis:
        tokens //= size[strategy.seq_axis]
    per_token = config.n_layers * (10 * config.d_model + 3 * ff_here
                                   + 2 * heads_here * config.seq_len) + 2 * vocab_here
    return {"parameters": p, "gradients": p, "optimizer state": 2 * p,
            "activations": 4 * tokens * per_token}


def measured_bytes(trainer: Trainer, params: Params, state: Any, tokens: jax.Array
                   ) -> dict[str, int]:
    """Bytes per device of the compiled training step (``memory_analysis``): parameters and
    optimizer state as held (arguments), and the temporaries (gradients + activations)."""
    mem = hlo.memory_per_device(trainer.step, params, state, tokens)
    return {"parameters": _bytes_per_device(params), "optimizer state": _bytes_per_device(state),
            "arguments": mem.argument_bytes, "temporaries": mem.temp_bytes,
            "peak": mem.peak_bytes}


# --------------------------------------------------------------------------- page helpers


def _spec_text(spec: P) -> str:
    return "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"


class StrategyCheck(dict):
    """A row of :func:`check_strategy` (a plain dict to display) that also keeps the compiled
    program's text (``.hlo``, for :func:`collective_breakdown`) and the two losses as floats
    (``.loss``, ``.ref_loss``)."""

    hlo: str = ""
    loss: float = 0.0
    ref_loss: float = 0.0


@functools.cache
def _reference_grad(config: Config) -> Callable[..., Any]:
    """``lm_loss`` and its gradient, jitted once per config (so pages compile it once)."""
    return jax.jit(jax.value_and_grad(functools.partial(lm_loss, config=config)))


def check_strategy(strategy: Strategy, mesh: Mesh, config: Config, params: Params,
                   tokens: jax.Array) -> dict[str, Any]:
    """Compile the strategy's loss-and-gradient once; compare with ``lm_loss`` on one device
    and read its collectives. One row of the pages' tables."""
    ref_loss, ref_grads = _reference_grad(config)(params, tokens)
    sp, st = strategy.shard(params, tokens, mesh)
    p_sh = strategy.shardings(params, mesh)
    fn = jax.jit(jax.value_and_grad(strategy.loss(mesh, config)),
                 out_shardings=(NamedSharding(mesh, P()), p_sh))
    compiled = hlo.compile(fn, sp, st, compiler_options=hlo.FAST_COMPILE)
    loss, grads = compiled(sp, st)
    ops = hlo.collectives_in_text(compiled.as_text())
    kinds = {}
    for op in ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    same = all(g.sharding.is_equivalent_to(p.sharding, g.ndim)
               for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(sp), strict=True))
    grad_err = max(float(np.max(np.abs(np.asarray(g) - np.asarray(r))))
                   for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads),
                                   strict=True))
    row = StrategyCheck({
            "strategy": strategy.name,
            "mesh": " x ".join(f"{k}={v}" for k, v in mesh.shape.items()),
            "|loss - ref|": f"{abs(float(loss) - float(ref_loss)):.1e}",
            "max |grad - ref|": f"{grad_err:.1e}",
            "grads in param layout": same,
            "collectives": ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "none",
            "bytes sent": sum(op.bytes_sent for op in ops)})
    row.hlo = compiled.as_text()
    row.loss, row.ref_loss = float(loss), float(ref_loss)
    return row


def spec_table(params: Params, meshes: dict[str, Mesh]) -> list[dict[str, str]]:
    """Rows: one per parameter of the first block and the embeddings, one column per
    strategy giving that parameter's ``PartitionSpec``."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    specs = {name: jax.tree.leaves(STRATEGIES[name].param_specs(params, mesh))
             for name, mesh in meshes.items()}
    rows = []
    for i, (path, _) in enumerate(leaves):
        key = jax.tree_util.keystr(path)
        if "[1]" in key or any(f"[{j}]" in key for j in range(2, 64)):
            continue  # later blocks repeat block 0
        rows.append({"parameter": key.replace("['blocks'][0]", "block.")
                     .replace("['", "").replace("']", "")}
                    | {name: _spec_text(s[i]) for name, s in specs.items()})
    return rows


def predicted_comm_bytes(strategy: Strategy, mesh: Mesh, config: Config, params: Params,
                         batch: int) -> dict[str, int]:
    """Bytes one device sends in a forward + backward pass, by the textbook formula (ring
    model), split into parameter/gradient traffic and activation traffic.

    ``P`` = parameter bytes, ``A = batch * seq_len * d_model * 4`` the residual stream,
    ``L`` layers. dp: all-reduce grads, ``2 (n-1)/n P``. fsdp: all-gather params once and
    reduce-scatter grads, ``2 (n-1)/n P``. tp and tp_sp: four all-reduces (or all-gather +
    reduce-scatter pairs, the same bytes) of ``A`` per layer, ``4 L 2 (m-1)/m A``. cp:
    ``n - 1`` sends of the local K and V blocks per layer forward and as many of their
    gradients backward, ``4 L (n-1) A / n``, plus the dp all-reduce of the grads. fsdp_tp:
    the fsdp term on ``P / m`` and the tp term on ``A / d``.
    """
    size = dict(mesh.shape)
    p = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    a = batch * config.seq_len * config.d_model * 4
    d = size.get("data", 1)
    m = size.get("model", 1)
    s = size.get("seq", 1)
    grads = 2 * (d - 1) * p // d if strategy.fsdp or "data" in strategy.axes else 0
    if strategy.tensor:
        grads //= m
        acts = 4 * config.n_layers * 2 * (m - 1) * (a // d) // m
    elif strategy.ring:
        grads = 2 * (s - 1) * p // s
        acts = 4 * config.n_layers * (s - 1) * a // s
    else:
        acts = 0
    return {"parameters and gradients": grads, "activations": acts, "total": grads + acts}


def memory_row(strategy: Strategy, devices: Sequence[jax.Device], config: Config,
               params: Params, tokens: jax.Array) -> dict[str, Any]:
    """Predicted and measured bytes per device of one donated AdamW training step."""
    mesh = strategy.mesh(devices)
    sp, st = strategy.shard(params, tokens, mesh)
    trainer = train_step(strategy, mesh, config, sp, optimizer=optax.adamw(1e-3))
    state = jax.eval_shape(trainer.init, sp)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         state, trainer.state_shardings)
    mem = hlo.memory_per_device(hlo.compile(trainer.step, sp, state, st,
                                            compiler_options=hlo.FAST_COMPILE))
    pred = predicted_bytes(strategy, mesh, config, params, tokens.shape[0])
    held = _bytes_per_device(sp)
    opt = sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
              for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(trainer.state_shardings),
                              strict=True))
    return {"strategy": strategy.name, "devices": len(devices),
            "params": held, "params (formula)": pred["parameters"],
            "opt state": opt, "opt state (formula)": pred["optimizer state"],
            "grads + activations (formula)": pred["gradients"] + pred["activations"],
            "temporaries (measured)": mem.temp_bytes,
            "arguments (measured)": mem.argument_bytes}
