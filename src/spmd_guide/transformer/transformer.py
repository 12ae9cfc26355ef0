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

A mesh with Explicit axes (``jax.make_mesh``'s default) works too: the loss then runs its
model under ``jax.sharding.auto_axes`` on an Auto copy of the mesh (same devices and names),
because sharding constraints may only name Auto axes and the embedding lookup's output
layout is ambiguous under Explicit axes; inputs and gradients keep their Explicit shardings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.devices import build_mesh
from spmd_guide.transformer.attention import layout_positions, ring_attention_in_layout
from spmd_guide.transformer.lm import (
    Config,
    Params,
    check_config,
    check_params,
    check_tokens,
    config_of,
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


def auto_mesh(mesh: Mesh) -> Mesh:
    """``mesh`` itself if all its axes are Auto, else a mesh of the same devices and axis
    names with Auto axes (what sharding constraints and the compiler's propagation need).
    Refuses Manual axes (inside ``shard_map``), where a strategy cannot place anything."""
    checks.mesh("mesh", mesh)
    types = tuple(mesh.axis_types)
    if all(t == AxisType.Auto for t in types):
        return mesh
    if any(t == AxisType.Manual for t in types):
        raise checks.InputError(
            f"mesh has Manual axes {types}: a strategy lays out whole arrays, so call it "
            f"outside shard_map, on a mesh of Auto or Explicit axes.")
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(types))


def _strategy(strategy: Any) -> Strategy:
    return checks.instance("strategy", strategy, Strategy,
                           example="one of STRATEGIES' values, such as STRATEGIES['tp']")


def _devices(devices: Any) -> list[jax.Device]:
    if isinstance(devices, (str, bytes, Mesh)) or not isinstance(devices, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"devices must be a list of jax devices such as jax.devices()[:4], got "
            f"{checks.value_text(devices)}.")
    devices = list(np.asarray(devices, dtype=object).reshape(-1))
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise checks.InputError(
            f"devices must be a non-empty list of jax devices such as jax.devices()[:4], got "
            f"{checks.value_text(devices)}.")
    checks.distinct_devices("devices", devices)
    return devices


def _host(x: Any) -> Any:
    """A one-device array as a NumPy array, so that ``device_put`` to a sharding is a plain
    copy: from a committed one-device ``jax.Array`` XLA:CPU compiles a resharding program
    per leaf (about a second for this model's 20 leaves, against milliseconds from host)."""
    if isinstance(x, jax.Array) and x.is_fully_addressable and len(x.sharding.device_set) == 1:
        return np.asarray(x)
    return x


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
        """The mesh shape over ``n_devices``: all on one axis, or ``model`` of 2 (when the
        count is even) for a 2-D strategy."""
        n_devices = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
        if len(self.axes) == 1:
            return (n_devices,)
        model = 2 if n_devices % 2 == 0 else 1
        return (n_devices // model, model)

    def mesh(self, devices: Sequence[jax.Device] | None = None, *,
             axis_types: str = "auto") -> Mesh:
        """A mesh with this strategy's axis names over ``devices`` (default: all). Auto
        axes unless ``axis_types="explicit"``; the strategy works on either."""
        devices = list(jax.devices() if devices is None else _devices(devices))
        return build_mesh(self.mesh_shape(len(devices)), self.axes, devices=devices,
                          axis_types=axis_types)

    def _size(self, mesh: Mesh, axis: str) -> int:
        return int(mesh.shape[axis]) if axis in mesh.shape else 1

    # -- where things live ---------------------------------------------------------------

    def param_specs(self, params: Params, mesh: Mesh) -> Any:
        """A ``PartitionSpec`` for every parameter leaf."""
        config_of(params)
        checks.mesh_axes("mesh", mesh, self.axes, why=f"(strategy {self.name!r} uses them)")

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
        check_config(config)
        checks.mesh("mesh", mesh)
        for axis in self.axes:
            checks.axis(mesh, axis, name=f"{self.name}'s mesh axis")
        if self.tensor:
            n = self._size(mesh, "model")
            for what in ("n_heads", "d_ff", "vocab"):
                checks.divisible(f"config.{what}", getattr(config, what), n,
                                 why="over mesh axis 'model'")
        if self.seq_axis:
            n = self._size(mesh, self.seq_axis)
            parts = 2 * n if self.ring == "zigzag" else n
            layout = f" ({self.ring} ring layout)" if self.ring else ""
            checks.divisible("config.seq_len", config.seq_len, parts,
                             why=f"over mesh axis {self.seq_axis!r}{layout}")

    def shard(self, params: Params, tokens: jax.Array, mesh: Mesh) -> tuple[Params, jax.Array]:
        """Place ``params`` and ``tokens`` on ``mesh`` (Auto or Explicit axes) as this
        strategy lays them out. ``tokens`` are int ids ``[batch, seq_len + 1]`` in ``[0,
        vocab)`` of the model ``params`` describe."""
        checks.mesh("mesh", mesh)
        for axis in self.axes:
            checks.axis(mesh, axis, name=f"{self.name}'s mesh axis")
        config = config_of(params)
        tokens = check_tokens(tokens, config)
        specs = self.param_specs(params, mesh)
        for (path, leaf), spec in zip(jax.tree_util.tree_leaves_with_path(params),
                                      jax.tree.leaves(specs), strict=True):
            checks.spec_fits(f"params{jax.tree_util.keystr(path)}", leaf.shape, spec, mesh)
        checks.spec_fits("tokens", tokens.shape, self.token_spec(), mesh)
        return (jax.device_put(jax.tree.map(_host, params), self.shardings(params, mesh)),
                jax.device_put(_host(tokens), NamedSharding(mesh, self.token_spec())))

    # -- the loss ------------------------------------------------------------------------

    def loss(self, mesh: Mesh, config: Config) -> Callable[[Params, jax.Array], jax.Array]:
        """``loss_fn(params, tokens)``, equal to ``lm_loss`` with its gradients.

        ``mesh`` may have Auto or Explicit axes (see the module's docstring). ``loss_fn``
        checks ``params`` against ``config`` and the tokens' shape; the token ids when they
        are concrete (under ``jit`` they are traced: check them before, as ``shard`` does).
        """
        self.check(config, mesh)
        explicit, mesh = mesh, auto_mesh(mesh)
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
            check_params(params, config)
            tokens = check_tokens(tokens, config)
            inputs, targets = tokens[:, :-1][:, order], tokens[:, 1:][:, order]
            extra = {"attend": attend} if attend else {}
            logits = forward(params, inputs, positions=order, constrain=constrain, **extra)
            return cross_entropy(logits, targets)

        if explicit is mesh:
            return loss_fn
        return jax.sharding.auto_axes(loss_fn, out_sharding=NamedSharding(explicit, P()))


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
    checks.mesh("mesh", mesh)
    checks.array_tree("params", params)
    checks.same_structure("param_shardings", param_shardings, params, other="params")
    for s in jax.tree.leaves(param_shardings):
        checks.sharding("a leaf of param_shardings", s)
    for leaf in jax.tree.leaves(state, is_leaf=lambda x: x is None):
        checks.array("a leaf of state", leaf)
    by_path = {tuple(map(str, path)): (leaf.shape, s) for (path, leaf), s in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(param_shardings),
        strict=True)}

    def pick(path, leaf):
        keys = tuple(map(str, path))
        for start in range(len(keys)):
            shape, sharding = by_path.get(keys[start:], (None, None))
            if sharding is not None and tuple(shape) == tuple(np.shape(leaf)):
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
    ZeRO (``fsdp``) keeps Adam's moments split like the parameters. ``mesh`` may have Auto
    or Explicit axes.
    """
    strategy = _strategy(strategy)
    check_params(params, config)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise checks.InputTypeError(
            f"optimizer must be an optax.GradientTransformation such as lm.optimizer(), got "
            f"{checks.value_text(optimizer)}.")
    donate = checks.flag("donate", donate)
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


def _check_sizes(strategy: Any, mesh: Mesh, config: Config, params: Params,
                 batch: Any) -> tuple[Strategy, int]:
    """The arguments the formulas share: a strategy whose axes ``mesh`` has and whose sizes
    split, ``params`` made for ``config``, and a batch that splits over ``data``."""
    strategy = _strategy(strategy)
    strategy.check(config, mesh)
    check_params(params, config)
    batch = checks.count("batch", batch)
    if "data" in strategy.axes:
        checks.divisible("batch", batch, int(mesh.shape["data"]),
                         why="over mesh axis 'data' (each device takes a whole slice)")
    return strategy, batch


def _param_bytes(strategy: Strategy, mesh: Mesh, params: Params) -> int:
    p_sh = strategy.shardings(params, mesh)
    return sum(int(np.prod(s.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
               for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(p_sh), strict=True))
