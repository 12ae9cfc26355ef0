"""Ways to train the MLP of :mod:`spmd_guide.nn` on many devices, all behind one interface.

A :class:`Strategy` answers three questions, so one training loop can run any of them::

    strategy = STRATEGIES["dp"]
    mesh = strategy.mesh(jax.devices())              # which devices, which named axes
    params, batch = strategy.shard(params, batch, mesh)  # where each array lives
    loss_fn = strategy.loss(mesh)                    # loss_fn(params, batch) -> scalar
    step = nn.make_sgd_step(loss_fn, learning_rate=0.01)
    params, loss = step(params, batch)               # layouts stay as shard() made them

``loss_fn`` and its gradient equal :func:`spmd_guide.nn.mlp_loss` on one device (up to float
rounding); only where the arithmetic runs and which collectives move data differ.

Two families:

* ``auto_*`` -- plain ``jax.jit``: the strategy only *places* the arrays (``NamedSharding``
  on a mesh with ``AxisType.Auto`` axes) and the compiler's partitioner decides the rest.
* ``dp``, ``fsdp``, ``tp`` -- ``jax.shard_map``: the strategy writes the per-device program
  and its collectives by hand.

To feed a strategy from a data loader, lay batches out with ``strategy.batch_sharding(mesh)``
(one sharding for both ``x: [B, d_in]`` and ``y: [B, d_out]``); in a multi-process run build
each global batch with ``jax.make_array_from_process_local_data(sharding, local_rows)``.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxprs_in_params, subjaxprs
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import hlo
from spmd_guide.nn import Batch, LossFn, Params, make_sgd_step, mlp_loss, param_bytes_per_device
from spmd_guide.timing import Timing, time_fn

Specs = list[tuple[P, P]]


# --------------------------------------------------------------------------------------
# The interface and the checks every strategy shares
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    """One way to lay out the MLP and its batch on a mesh, and the loss
    function that goes with it.

    Subclasses set ``axis_names`` and say where each array lives
    (``param_specs``, ``batch_spec``); the ``shard_map`` ones also write the
    per-device loss.
    """

    name: ClassVar[str] = "single"
    #: "jit" (the compiler partitions) or "shard_map" (the code partitions).
    kind: ClassVar[str] = "jit"
    summary: ClassVar[str] = "one device, the reference"
    axis_names: ClassVar[tuple[str, ...]] = ("batch",)

    # -- where things live ---------------------------------------------------

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        """The mesh shape this strategy builds from ``n_devices`` devices."""
        return (1,)

    def mesh(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        """A mesh with this strategy's axis names over ``devices`` (default:
        all of ``jax.devices()``).

        The axes are ``AxisType.Auto``: outside ``shard_map`` the compiler
        propagates shardings.
        """
        devices = list(jax.devices() if devices is None else devices)
        if not devices:
            raise ValueError(
                f"strategy {self.name!r}: got an empty list of devices."
            )
        shape = self.mesh_shape(len(devices))
        used = devices[: math.prod(shape)]
        return jax.make_mesh(
            shape,
            self.axis_names,
            axis_types=(AxisType.Auto,) * len(shape),
            devices=used,
        )

    def param_specs(self, params: Params) -> Specs:
        """One ``(W spec, b spec)`` pair per layer."""
        return [(P(), P()) for _ in params]

    def batch_spec(self) -> P:
        """The ``PartitionSpec`` of ``x: [B, d_in]`` and of ``y: [B, d_out]``."""
        return P()

    def param_shardings(self, params: Params, mesh: Mesh) -> list[tuple[NamedSharding, NamedSharding]]:
        """``NamedSharding``s for ``params`` on ``mesh`` (what :meth:`shard` uses)."""
        return [
            (NamedSharding(mesh, w_spec), NamedSharding(mesh, b_spec))
            for w_spec, b_spec in self.param_specs(params)
        ]

    def batch_sharding(self, mesh: Mesh) -> NamedSharding:
        """The sharding of ``x`` and of ``y``: give it to a data loader to feed this strategy."""
        self._check_mesh(mesh)
        return NamedSharding(mesh, self.batch_spec())

    # -- the interface -------------------------------------------------------

    def shard(
        self, params: Params, batch: Batch, mesh: Mesh
    ) -> tuple[Params, Batch]:
        """Place ``params`` and ``batch`` on ``mesh`` as this strategy needs
        them.

        The arrays go through host memory (``jax.device_get``, then
        ``jax.device_put`` of the NumPy values): each device receives its
        slice, and nothing is compiled. That suits arrays this process holds
        whole. In a multi-process run every process must pass the same values
        (``jax.device_put`` checks); there a batch is better built from each
        process's own rows with
        ``jax.make_array_from_process_local_data(sharding, rows)`` (where
        ``sharding = batch_sharding(mesh)``), and a model too big for one host
        created already sharded
        (``jax.jit(init, out_shardings=param_shardings(...))``).

        Raises ``ValueError`` (naming the size and the divisor) when the batch
        size or a layer width does not split evenly over the mesh axis that
        shards it.
        """
        self.check(params, batch, mesh)
        param_shardings = self.param_shardings(params, mesh)
        params = jax.device_put(jax.device_get(params), param_shardings)
        sharding = self.batch_sharding(mesh)
        x, y = jax.device_get(batch)
        batch = (jax.device_put(x, sharding), jax.device_put(y, sharding))
        return params, batch

    def loss(self, mesh: Mesh) -> LossFn:
        """``loss_fn(params, batch)``: equal to ``mlp_loss`` in value and gradient.

        It checks the shapes (``ValueError`` for an uneven split) each time it is traced. The
        same strategy and mesh give the same function object, so jitted steps built on it
        compile once.
        """
        self._check_mesh(mesh)
        return _loss_fn(self, mesh)

    def _loss(self, params: Params, batch: Batch, mesh: Mesh) -> jax.Array:
        return mlp_loss(params, batch)

    # -- validation at the boundary ------------------------------------------

    def _check_mesh(self, mesh: Mesh) -> None:
        if tuple(mesh.axis_names) != self.axis_names:
            raise ValueError(
                f"strategy {self.name!r} needs a mesh with axes {self.axis_names}, got a mesh with "
                f"axes {tuple(mesh.axis_names)}; build it with STRATEGIES[{self.name!r}].mesh(devices)."
            )

    def check(self, params: Params, batch: Batch, mesh: Mesh) -> None:
        """Raise ``ValueError`` unless every array splits evenly as this strategy lays it out."""
        self._check_mesh(mesh)
        if not params or any(len(layer) != 2 for layer in params):
            raise ValueError(
                f"strategy {self.name!r}: params must be a non-empty list of (W, b) pairs, as "
                "made by spmd_guide.nn.init_mlp."
            )
        x, y = batch
        if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"strategy {self.name!r}: the batch must be (x: [B, d_in], y: [B, d_out]) with the "
                f"same B, got x {tuple(x.shape)} and y {tuple(y.shape)}."
            )
        if x.shape[1] != params[0][0].shape[0] or y.shape[1] != params[-1][0].shape[1]:
            raise ValueError(
                f"strategy {self.name!r}: x {tuple(x.shape)} and y {tuple(y.shape)} do not fit "
                f"an MLP from {params[0][0].shape[0]} to {params[-1][0].shape[1]} features."
            )
        spec = self.batch_spec()
        _check_split(self.name, "x", x.shape, spec, mesh, ("batch size", "input width"))
        _check_split(self.name, "y", y.shape, spec, mesh, ("batch size", "output width"))
        for i, ((w, b), (w_spec, b_spec)) in enumerate(zip(params, self.param_specs(params))):
            _check_split(self.name, f"layer {i}'s W", w.shape, w_spec, mesh, ("layer width",) * 2)
            _check_split(self.name, f"layer {i}'s b", b.shape, b_spec, mesh, ("layer width",))


@functools.cache
def _loss_fn(strategy: Strategy, mesh: Mesh) -> LossFn:
    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        strategy.check(params, batch, mesh)
        return strategy._loss(params, batch, mesh)

    loss_fn.__name__ = f"{strategy.name}_loss"
    return loss_fn


def _check_split(
    strategy: str, what: str, shape: tuple[int, ...], spec: P, mesh: Mesh, meanings: tuple[str, ...]
) -> None:
    """Raise ``ValueError`` if a dimension of ``shape`` does not divide by the mesh axes ``spec`` puts on it.

    ``meanings`` names each dimension for the message ("batch size", "layer width", ...).
    """
    for size, axes, meaning in zip(shape, spec, meanings):
        if axes is None:
            continue
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        parts = math.prod(mesh.shape[a] for a in axes)
        if size % parts:
            axes_text = " x ".join(f"{a!r} (size {mesh.shape[a]})" for a in axes)
            raise ValueError(
                f"strategy {strategy!r}: {what} has shape {tuple(shape)}; its {meaning} {size} must "
                f"split into {parts} equal parts over mesh axis {axes_text}, but {size} is not "
                f"divisible by {parts}. Make the {meaning} a multiple of {parts}, or lay it out "
                f"over a mesh axis whose size divides {size}."
            )


def _check_devices(strategy: str, n_devices: int, divisor: int, axis: str) -> None:
    if n_devices % divisor:
        raise ValueError(
            f"strategy {strategy!r} needs a device count divisible by its {axis!r} axis size "
            f"{divisor}, got {n_devices} devices; pass a multiple of {divisor} devices."
        )


# --------------------------------------------------------------------------------------
# Automatic: jit places the arrays, the compiler partitions the program
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AutoDataParallel(Strategy):
    """Batch split over ``'batch'``, every parameter replicated; the
    compiler adds the gradient all-reduce."""

    name: ClassVar[str] = "auto_dp"
    summary: ClassVar[str] = "jit: batch P('batch'), params replicated"

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (n_devices,)

    def batch_spec(self) -> P:
        return P("batch")


@dataclass(frozen=True)
class AutoDataTensorParallel(Strategy):
    """``('batch', 'model')`` mesh: batch over ``'batch'``; hidden layers split over ``'model'`` in pairs.

    First and last layers replicated. The hidden layers alternate column-split
    ``W: P(None, 'model')`` (bias ``P('model')``) and row-split ``W: P('model', None)``, so the
    activation between a pair stays split over its features.
    """

    model_size: int = 2
    name: ClassVar[str] = "auto_dp_tp"
    summary: ClassVar[str] = "jit: batch P('batch'), middle layers P(None,'model') / P('model',None)"
    axis_names: ClassVar[tuple[str, ...]] = ("batch", "model")

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        _check_devices(self.name, n_devices, self.model_size, "model")
        return (n_devices // self.model_size, self.model_size)

    def param_specs(self, params: Params) -> Specs:
        specs = []
        for i in range(len(params)):
            if i == 0 or i == len(params) - 1:
                specs.append((P(), P()))
            elif i % 2 == 1:  # column-split: output features over 'model'
                specs.append((P(None, "model"), P("model")))
            else:  # row-split: input features over 'model', result summed over 'model'
                specs.append((P("model", None), P()))
        return specs

    def batch_spec(self) -> P:
        return P("batch")


@dataclass(frozen=True)
class Auto2D(Strategy):
    """Every weight and the batch ``P('data', 'model')``: rows over
    ``'data'``, columns over ``'model'``."""

    model_size: int = 2
    name: ClassVar[str] = "auto_2d"
    summary: ClassVar[str] = "jit: x, y and every W P('data','model')"
    axis_names: ClassVar[tuple[str, ...]] = ("data", "model")

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        _check_devices(self.name, n_devices, self.model_size, "model")
        return (n_devices // self.model_size, self.model_size)

    def param_specs(self, params: Params) -> Specs:
        return [(P("data", "model"), P("model")) for _ in params]

    def batch_spec(self) -> P:
        return P("data", "model")


@dataclass(frozen=True)
class AutoFSDP(Strategy):
    """Batch and every parameter split over ``'batch'`` (weights on their
    first axis).

    The loss asks for each weight whole (a sharding constraint to ``P()``)
    right where a layer uses it, so the compiler all-gathers weights instead
    of moving activations.
    """

    name: ClassVar[str] = "auto_fsdp"
    summary: ClassVar[str] = (
        "jit: batch and params P('batch'), constrained to P() before use"
    )

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (n_devices,)

    def param_specs(self, params: Params) -> Specs:
        return [(P("batch", None), P("batch")) for _ in params]

    def batch_spec(self) -> P:
        return P("batch")

    def _loss(self, params: Params, batch: Batch, mesh: Mesh) -> jax.Array:
        whole = NamedSharding(mesh, P())
        gathered = [
            (
                jax.lax.with_sharding_constraint(w, whole),
                jax.lax.with_sharding_constraint(b, whole),
            )
            for w, b in params
        ]
        return mlp_loss(gathered, batch)


# --------------------------------------------------------------------------------------
# Manual: shard_map, the per-device program and its collectives written by hand
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ShardMapStrategy(Strategy):
    kind: ClassVar[str] = "shard_map"

    def _loss(self, params: Params, batch: Batch, mesh: Mesh) -> jax.Array:
        batch_specs = (self.batch_spec(), self.batch_spec())
        per_device = jax.shard_map(
            self.local_loss,
            mesh=mesh,
            in_specs=(self.param_specs(params), batch_specs),
            out_specs=P(),
        )
        return per_device(params, batch)

    def local_loss(self, params: Params, batch: Batch) -> jax.Array:
        """The loss as one device computes it from its shards; the same
        number on every device."""
        raise NotImplementedError


@dataclass(frozen=True)
class DataParallel(_ShardMapStrategy):
    """Each device: the loss of its slice of the batch, then ``pmean`` over
    ``'batch'``.

    Parameters come in replicated (``P()``). Differentiating through
    ``shard_map`` turns the implicit broadcast of each parameter into a
    ``psum`` of its gradient: the all-reduce.
    """

    name: ClassVar[str] = "dp"
    summary: ClassVar[str] = "shard_map: local loss, then pmean"

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (n_devices,)

    def batch_spec(self) -> P:
        return P("batch")

    def local_loss(self, params: Params, batch: Batch) -> jax.Array:
        return jax.lax.pmean(mlp_loss(params, batch), "batch")


def gathered_affine(
    w_shard: jax.Array, b_shard: jax.Array, x: jax.Array, axis_name: str
) -> jax.Array:
    """``x @ W + b`` with ``W`` and ``b`` all-gathered from their shards
    right before use.

    ``w_shard: [n_in / k, n_out]``, ``b_shard: [n_out / k]`` (``k`` devices
    on ``axis_name``), ``x: [B_local, n_in]``; returns ``[B_local, n_out]``.
    """
    w = jax.lax.all_gather(w_shard, axis_name, axis=0, tiled=True)
    b = jax.lax.all_gather(b_shard, axis_name, axis=0, tiled=True)
    return x @ w + b


#: The rematerialization policy of FSDP: keep the matmul outputs for the backward pass and
#: recompute everything else -- above all the all-gathered weights.
FSDP_REMAT_POLICY = jax.checkpoint_policies.dots_saveable


@dataclass(frozen=True)
class FSDP(_ShardMapStrategy):
    """Fully sharded data parallel: batch *and* parameters split over
    ``'batch'``.

    Every weight lives as a ``1/k`` slice of its rows (bias: of its
    entries). Each layer all-gathers its weight right before use; with
    ``remat=True`` the layer runs under
    ``jax.checkpoint(policy=FSDP_REMAT_POLICY)``, so the gathered weight is
    not kept for the backward pass but gathered again there. The gradient of
    an all-gather is a reduce-scatter, so each device ends with the gradient
    of its own slice.
    """

    remat: bool = True
    name: ClassVar[str] = "fsdp"
    summary: ClassVar[str] = (
        "shard_map: params P('batch'), all_gather before use, remat"
    )

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (n_devices,)

    def param_specs(self, params: Params) -> Specs:
        return [(P("batch", None), P("batch")) for _ in params]

    def batch_spec(self) -> P:
        return P("batch")

    def local_loss(self, params: Params, batch: Batch) -> jax.Array:
        layer = functools.partial(gathered_affine, axis_name="batch")
        if self.remat:
            layer = jax.checkpoint(layer, policy=FSDP_REMAT_POLICY)
        x, y = batch
        *hidden, (w_last, b_last) = params
        for w_shard, b_shard in hidden:
            x = jax.nn.relu(layer(w_shard, b_shard, x))
        error = layer(w_last, b_last, x) - y
        return jax.lax.pmean(jnp.mean(jnp.sum(error**2, axis=-1)), "batch")


def row_parallel_affine(
    w_shard: jax.Array,
    b_shard: jax.Array,
    x_shard: jax.Array,
    axis_name: str,
) -> jax.Array:
    """``x @ W + b`` with ``x`` split over its features and ``W`` over its
    rows (input features).

    ``x_shard: [B, n_in / k]``, ``w_shard: [n_in / k, n_out]``,
    ``b_shard: [n_out / k]``. The local matmul gives a partial sum
    ``[B, n_out]``; ``psum_scatter`` adds the ``k`` partial sums and leaves
    each device its ``[B, n_out / k]`` slice of the features -- the layout
    the next layer's input needs.
    """
    partial_sum = x_shard @ w_shard
    out = jax.lax.psum_scatter(
        partial_sum, axis_name, scatter_dimension=1, tiled=True
    )
    return out + b_shard


@dataclass(frozen=True)
class TensorParallel(_ShardMapStrategy):
    """Tensor parallel over ``'model'``: activations split over features,
    weights over input features.

    The whole batch is on every device. The squared error of the last layer
    covers only this device's output features, so the sum over features
    needs a ``psum`` before the mean.
    """

    name: ClassVar[str] = "tp"
    summary: ClassVar[str] = (
        "shard_map: x P(None,'model'), W P('model',None), psum_scatter"
    )
    axis_names: ClassVar[tuple[str, ...]] = ("model",)

    def mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (n_devices,)

    def param_specs(self, params: Params) -> Specs:
        return [(P("model", None), P("model")) for _ in params]

    def batch_spec(self) -> P:
        return P(None, "model")

    def local_loss(self, params: Params, batch: Batch) -> jax.Array:
        x, y = batch  # x: [B, d_in / k], y: [B, d_out / k]
        *hidden, (w_last, b_last) = params
        for w_shard, b_shard in hidden:
            x = jax.nn.relu(row_parallel_affine(w_shard, b_shard, x, "model"))
        prediction = row_parallel_affine(w_last, b_last, x, "model")
        error = prediction - y  # [B, d_out / k]
        # sum over all features: this device's, then every device's
        squared_error = jax.lax.psum(jnp.sum(error**2), "model")
        return squared_error / x.shape[0]


#: Every strategy by name. ``single`` is the one-device reference; ``auto_*`` use ``jax.jit``
#: with shardings, ``dp``/``fsdp``/``tp`` use ``jax.shard_map``.
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(),
        AutoDataParallel(),
        AutoDataTensorParallel(),
        Auto2D(),
        AutoFSDP(),
        DataParallel(),
        FSDP(),
        TensorParallel(),
    )
}


# --------------------------------------------------------------------------------------
# Reading the traced program
# --------------------------------------------------------------------------------------


def primitive_counts(fn: Callable[..., Any], *args: Any) -> Counter[str]:
    """How often each primitive appears in the jaxpr of ``fn(*args)``, nested jaxprs included.

    This is the program JAX *traced* (``jax.make_jaxpr``), before the compiler optimizes it:
    ``primitive_counts(jax.grad(loss), params, batch)["all_gather"]`` counts the all-gathers
    the gradient program asks for, forward and backward.
    """

    def count(jaxpr: Any) -> Counter[str]:
        counts = Counter(eqn.primitive.name for eqn in jaxpr.eqns)
        for inner in subjaxprs(jaxpr):
            counts.update(count(inner))
        return counts

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


def traced_collectives(fn: Callable[..., Any], *args: Any) -> list[tuple[int, str, str]]:
    """The collectives of the jaxpr of ``fn(*args)`` in program order, nested jaxprs included.

    One ``(top, primitive, shapes)`` per collective: ``top`` is the index of the top-level
    equation it sits in (for ``jax.grad`` of a ``shard_map`` loss the forward and the backward
    pass are two top-level ``shard_map`` equations), ``shapes`` reads ``in -> out``.
    """
    names = {"all_gather", "reduce_scatter", "psum", "psum_invariant", "all_to_all", "ppermute"}
    found: list[tuple[int, str, str]] = []

    def visit(jaxpr: Any, top: int | None) -> None:
        for index, eqn in enumerate(jaxpr.eqns):
            where = index if top is None else top
            if eqn.primitive.name in names:
                shapes = (
                    ", ".join(str(v.aval.str_short()) for v in eqn.invars)
                    + " -> "
                    + ", ".join(str(v.aval.str_short()) for v in eqn.outvars)
                )
                found.append((where, eqn.primitive.name, shapes))
            for inner in jaxprs_in_params(eqn.params):
                visit(inner, where)

    visit(jax.make_jaxpr(fn)(*args).jaxpr, None)
    return found


@dataclass(frozen=True)
class ReferenceCheck:
    """A strategy's loss and gradient next to ``mlp_loss``'s on one device."""

    strategy: str
    loss: float
    reference_loss: float
    max_grad_error: float
    max_grad: float

    def row(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "loss": f"{self.loss:.6f}",
            "one-device loss": f"{self.reference_loss:.6f}",
            "largest |gradient difference|": f"{self.max_grad_error:.1e}",
            "largest |gradient|": f"{self.max_grad:.2f}",
        }


@jax.jit
def _reference_value_and_grad(params: Params, batch: Batch) -> tuple[jax.Array, Params]:
    return jax.value_and_grad(mlp_loss)(params, batch)


def check_against_reference(
    strategy: Strategy | str,
    params: Params,
    batch: Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> ReferenceCheck:
    """Loss and gradient of ``strategy`` on ``devices`` against ``mlp_loss``
    on the first device alone."""
    if isinstance(strategy, str):
        strategy = _lookup(strategy)
    mesh = strategy.mesh(devices)
    placed_params, placed_batch = strategy.shard(params, batch, mesh)
    value_and_grad = jax.jit(jax.value_and_grad(strategy.loss(mesh)))
    loss, grads = value_and_grad(placed_params, placed_batch)
    first_device = mesh.devices.flat[0]
    one_device = jax.device_put(jax.device_get((params, batch)), first_device)
    reference_loss, reference_grads = _reference_value_and_grad(*one_device)
    grads, reference_grads = jax.device_get(
        (jax.tree.leaves(grads), jax.tree.leaves(reference_grads))
    )
    grad_errors = [
        np.max(np.abs(g - r)) for g, r in zip(grads, reference_grads)
    ]
    return ReferenceCheck(
        strategy=strategy.name,
        loss=float(loss),
        reference_loss=float(reference_loss),
        max_grad_error=float(max(grad_errors)),
        max_grad=max(float(np.max(np.abs(r))) for r in reference_grads),
    )


# --------------------------------------------------------------------------------------
# Measuring one training step of each strategy
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepProfile:
    """What one SGD step of a strategy costs per device, read from its compiled program.

    ``report`` holds the collectives and the compiler's memory analysis
    (:func:`spmd_guide.hlo.report`); ``param_bytes`` is what one device stores of the
    parameters; ``step`` is the measured wall-clock time of the whole step. ``peak_bytes``
    is the memory analysis' upper bound (arguments + outputs + temporaries, as if all were
    live at once).
    """

    strategy: str
    kind: str
    mesh_axes: dict[str, int]
    report: hlo.Report
    param_bytes: int
    step: Timing

    @property
    def counts(self) -> dict[str, int]:
        return self.report.counts

    @property
    def n_collectives(self) -> int:
        return len(self.report.ops)

    @property
    def comm_bytes(self) -> int:
        return self.report.total_bytes

    @property
    def peak_bytes(self) -> int:
        return self.report.memory.peak_bytes

    @property
    def mesh_text(self) -> str:
        return " x ".join(f"{name}={size}" for name, size in self.mesh_axes.items())

    def row(self) -> dict[str, Any]:
        """A table row: every number per device, times in milliseconds."""
        used = ", ".join(f"{n} {kind}" for kind, n in self.counts.items() if n) or "none"
        low, high = self.step.spread
        return {
            "strategy": self.strategy,
            "mesh": self.mesh_text,
            "collectives per step": used,
            "bytes sent": hlo.format_bytes(self.comm_bytes),
            "param bytes": hlo.format_bytes(self.param_bytes),
            "peak memory (bound)": hlo.format_bytes(self.peak_bytes),
            "step ms: median (min-max)": f"{self.step.median * 1e3:.2f} ({low * 1e3:.2f}-{high * 1e3:.2f})",
        }


def profile_step(
    strategy: Strategy | str,
    params: Params,
    batch: Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
    learning_rate: float = 0.01,
    runs: int = 10,
) -> StepProfile:
    """Lay out ``params``/``batch`` with ``strategy`` on ``devices``, compile
    one SGD step, measure it.

    The collectives, bytes and memory come from the one compiled program
    (:func:`spmd_guide.hlo.report`); the time from
    :func:`spmd_guide.timing.time_fn` (``runs`` timed calls after a compiling
    warm-up), on whatever hardware ``devices`` are.
    """
    if isinstance(strategy, str):
        strategy = _lookup(strategy)
    mesh = strategy.mesh(devices)
    params, batch = strategy.shard(params, batch, mesh)
    step = make_sgd_step(strategy.loss(mesh), learning_rate=learning_rate)
    report = hlo.report(step, params, batch, title=strategy.name)
    timing = time_fn(step, params, batch, runs=runs, label=strategy.name)
    return StepProfile(
        strategy=strategy.name,
        kind=strategy.kind,
        mesh_axes=dict(mesh.shape),
        report=report,
        param_bytes=param_bytes_per_device(params),
        step=timing,
    )


def _lookup(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}.")
    return STRATEGIES[name]


def compare(
    names: Sequence[str],
    params: Params,
    batch: Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
    learning_rate: float = 0.01,
    runs: int = 10,
) -> list[StepProfile]:
    """:func:`profile_step` for each strategy in ``names``, on the same model, batch and devices."""
    strategies = [_lookup(name) for name in names]  # fail on a bad name before any compiling
    return [
        profile_step(s, params, batch, devices=devices, learning_rate=learning_rate, runs=runs)
        for s in strategies
    ]


def comparison_table(profiles: Sequence[StepProfile], *, tablefmt: str = "html") -> str:
    """The profiles side by side, one row per strategy (``tablefmt`` as in ``tabulate``)."""
    from tabulate import tabulate

    rows = [p.row() for p in profiles]
    return tabulate(rows, headers="keys", tablefmt=tablefmt, disable_numparse=True)


def plot_comparison(profiles: Sequence[StepProfile]) -> Any:
    """A matplotlib figure: one horizontal bar chart per column of :func:`comparison_table`.

    Collectives per step are stacked by kind; bytes are in KiB; the step time bar is the median
    with a line from the fastest to the slowest run. The sixth panel says what ran where.
    Sized for the book's text column (two charts a row), no text under 8.5 pt (11 CSS px).
    """
    from spmd_guide.drawing import subplots

    names = [p.strategy for p in profiles]
    rows = np.arange(len(profiles))
    fig, grid = subplots(3, 2, figsize=(7.0, 3 * (0.28 * len(profiles) + 1.0)), keep_open=True,
                         alt="Bar charts comparing " + ", ".join(names) + " per device and SGD "
                         "step: collectives, bytes sent, parameter bytes, peak memory, step time.")
    axes = grid.ravel()
    left = np.zeros(len(profiles))
    for i, kind in enumerate(hlo.KINDS):
        counts = np.array([p.counts[kind] for p in profiles])
        if counts.any():
            axes[0].barh(rows, counts, left=left, label=kind, color=f"C{i}")
            left += counts
    axes[0].set_title("collectives per step")
    panels = [
        ("bytes sent per device (KiB)", [p.comm_bytes / 1024 for p in profiles]),
        ("parameter bytes per device (KiB)", [p.param_bytes / 1024 for p in profiles]),
        ("peak memory per device, bound (KiB)", [p.peak_bytes / 1024 for p in profiles]),
    ]
    for ax, (title, values) in zip(axes[1:4], panels, strict=True):
        ax.barh(rows, values, color="C7")
        ax.set_title(title)
    medians = np.array([p.step.median * 1e3 for p in profiles])
    lows = np.array([p.step.spread[0] * 1e3 for p in profiles])
    highs = np.array([p.step.spread[1] * 1e3 for p in profiles])
    axes[4].barh(rows, medians, xerr=[medians - lows, highs - medians], color="C9", capsize=2)
    axes[4].set_title("step time (ms, median, min-max)")
    for ax in axes[:5]:
        ax.set_yticks(rows, names)
        ax.invert_yaxis()
        ax.title.set_fontsize(9.5)
        ax.tick_params(labelsize=8.5)
        ax.xaxis.get_offset_text().set_fontsize(8.5)
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[5].axis("off")
    axes[5].legend(handles, labels, title="collective kinds", loc="upper left", fontsize=8.5,
                   title_fontsize=9)
    if profiles:
        axes[5].text(0.0, 0.0, "per device, one SGD step\ntimes measured on "
                     f"{profiles[0].step.device_kind} devices", transform=axes[5].transAxes,
                     fontsize=8.5)
    fig.tight_layout()
    return fig
