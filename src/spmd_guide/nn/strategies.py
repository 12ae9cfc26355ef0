"""Ways to train the MLP of :mod:`spmd_guide.nn.mlp` on many devices, all behind one interface.

A :class:`Strategy` answers three questions, so one training loop can run any of them::

    strategy = STRATEGIES["dp"]
    mesh = strategy.mesh(jax.devices())                  # which devices, which named axes
    params, batch = strategy.shard(params, batch, mesh)  # where each array lives
    loss_fn = strategy.loss(mesh)                        # loss_fn(params, batch) -> scalar
    step = strategy.sgd_step(mesh, params, learning_rate=0.01)
    params, loss = step(params, batch)                   # layouts stay as shard() made them

``loss_fn`` and its gradient equal :func:`spmd_guide.nn.mlp.mlp_loss` on one device (up to
float rounding); only where the arithmetic runs and which collectives move data differ. The
gradients come out in the parameters' own shardings, and ``sgd_step`` pins the updated
parameters to them, so a layout never drifts from one step to the next.

Two families:

* ``auto_*`` -- plain ``jax.jit``: the strategy only *places* the arrays (``NamedSharding``
  on a mesh with ``AxisType.Auto`` axes) and the compiler's partitioner decides the rest.
* ``dp``, ``fsdp``, ``tp`` -- ``jax.shard_map``: the strategy writes the per-device program
  and its collectives by hand.

Every method that takes a mesh also takes one with ``AxisType.Explicit`` axes (what
``jax.make_mesh`` gives by default), as long as its axis names are the strategy's. There the
loss first reshards its inputs to the strategy's layout (``jax.sharding.reshard``: under
Explicit axes a sharding is part of an array's type, and a constraint is refused), then runs
the same program, with the axes made Auto for its duration (``jax.sharding.auto_axes``) so
that the compiler partitions it as on an Auto mesh.

To feed a strategy from a data loader, lay batches out with ``strategy.batch_sharding(mesh)``
(one sharding for both ``x: [B, d_in]`` and ``y: [B, d_out]``); in a multi-process run build
each global batch with ``jax.make_array_from_process_local_data(sharding, local_rows)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.devices import build_mesh
from spmd_guide.nn.mlp import (
    Batch,
    LossFn,
    Params,
    check_batch,
    check_params,
    make_sgd_step,
    mlp_loss,
)
from spmd_guide.nn.placement import (
    auto_twin,
    check_device_count,
    check_split,
    device_list,
    trimmed,
)

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
        return self._mesh_shape(checks.count("n_devices", n_devices))

    def _mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (1,)

    def mesh(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        """A mesh with this strategy's axis names over ``devices`` (default:
        all of ``jax.devices()``).

        The axes are ``AxisType.Auto``: outside ``shard_map`` the compiler
        propagates shardings. (A mesh with the same axis names and Explicit axes works with
        every method too; see the module's notes.)
        """
        devices = device_list(devices)
        if not devices:
            raise checks.InputError(f"strategy {self.name!r}: got an empty list of devices.")
        return build_mesh(self.mesh_shape(len(devices)), self.axis_names, devices=devices)

    def param_specs(self, params: Params) -> Specs:
        """One ``(W spec, b spec)`` pair per layer."""
        return [(P(), P()) for _ in params]

    def batch_spec(self) -> P:
        """The ``PartitionSpec`` of ``x: [B, d_in]`` and of ``y: [B, d_out]``."""
        return P()

    def param_shardings(self, params: Params, mesh: Mesh
                        ) -> list[tuple[NamedSharding, NamedSharding]]:
        """``NamedSharding``s for ``params`` on ``mesh`` (what :meth:`shard` uses).

        Trailing ``None`` entries are dropped (``P('model', None)`` becomes ``P('model')``,
        the same layout): that is how a compiled program spells its output shardings, and
        ``jax.jit`` compares shardings by spelling when it decides whether to recompile.
        """
        self._check_mesh(mesh)
        return [
            (NamedSharding(mesh, trimmed(w_spec)), NamedSharding(mesh, trimmed(b_spec)))
            for w_spec, b_spec in self.param_specs(check_params(params))
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
        x, y = jax.device_get(tuple(batch))
        batch = (jax.device_put(x, sharding), jax.device_put(y, sharding))
        return params, batch

    def loss(self, mesh: Mesh) -> LossFn:
        """``loss_fn(params, batch)``: equal to ``mlp_loss`` in value and gradient.

        It checks the shapes (``ValueError`` for an uneven split) each time it is traced,
        and it pins the parameters to this strategy's layout on entry, so ``jax.grad``
        returns each gradient in its parameter's sharding. The same strategy and mesh give
        the same function object, so jitted steps built on it compile once.
        """
        self._check_mesh(mesh)
        return _loss_fn(self, mesh)

    def sgd_step(self, mesh: Mesh, params: Params, *, learning_rate: float,
                 donate: bool = False) -> Callable[[Params, Batch], tuple[Params, jax.Array]]:
        """The jitted SGD step on :meth:`loss`, with the new parameters pinned to
        :meth:`param_shardings` (:func:`spmd_guide.nn.mlp.make_sgd_step`; ``donate`` as there)."""
        return make_sgd_step(self.loss(mesh), learning_rate=learning_rate,
                             param_shardings=self.param_shardings(params, mesh), donate=donate)

    def _loss(self, params: Params, batch: Batch, mesh: Mesh) -> jax.Array:
        return mlp_loss(params, batch)

    # -- validation at the boundary ------------------------------------------

    def _check_mesh(self, mesh: Mesh) -> None:
        checks.mesh("mesh", mesh)
        if tuple(mesh.axis_names) != self.axis_names:
            raise checks.InputError(
                f"strategy {self.name!r} needs a mesh with axes {self.axis_names}, got a mesh "
                f"with axes {tuple(mesh.axis_names)}; build it with "
                f"STRATEGIES[{self.name!r}].mesh(devices).")

    def check(self, params: Params, batch: Batch, mesh: Mesh) -> None:
        """Raise ``ValueError`` unless every array splits evenly as this strategy lays it out."""
        self._check_mesh(mesh)
        check_params(params)
        if isinstance(batch, (list, tuple)) and len(batch) == 2:
            x, y = (checks.array(n, v, ndim=2) for n, v in zip("xy", batch, strict=True))
            if x.shape[0] != y.shape[0]:
                raise checks.InputError(
                    f"strategy {self.name!r}: the batch must be (x: [B, d_in], y: [B, d_out]) "
                    f"with the same B, got x {tuple(x.shape)} and y {tuple(y.shape)}.")
        x, y = check_batch(params, batch)
        spec = self.batch_spec()
        check_split(self.name, "x", x.shape, spec, mesh, ("batch size", "input width"))
        check_split(self.name, "y", y.shape, spec, mesh, ("batch size", "output width"))
        for i, ((w, b), (w_spec, b_spec)) in enumerate(zip(params, self.param_specs(params), strict=True)):
            check_split(self.name, f"layer {i}'s W", w.shape, w_spec, mesh, ("layer width",) * 2)
            check_split(self.name, f"layer {i}'s b", b.shape, b_spec, mesh, ("layer width",))


@functools.cache
def _loss_fn(strategy: Strategy, mesh: Mesh) -> LossFn:
    auto = auto_twin(mesh)

    def program(params: Params, batch: Batch) -> jax.Array:
        """The loss on Auto axes: constraints pin the parameters of a jit strategy (a
        shard_map strategy's in_specs pin them already)."""
        if strategy.kind == "jit":
            params = jax.lax.with_sharding_constraint(
                params, strategy.param_shardings(params, auto))
        return strategy._loss(params, batch, auto)

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        strategy.check(params, batch, mesh)
        if auto is mesh:
            return program(params, batch)
        # Explicit axes: lay the inputs out by resharding, then the same program on Auto axes.
        rows = strategy.batch_sharding(mesh)
        params, batch = jax.sharding.reshard(
            (params, tuple(batch)), (strategy.param_shardings(params, mesh), (rows, rows)))
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return jax.sharding.auto_axes(program, out_sharding=P())(params, batch)

    loss_fn.__name__ = f"{strategy.name}_loss"
    return loss_fn


# --------------------------------------------------------------------------------------
# Automatic: jit places the arrays, the compiler partitions the program
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSplit(Strategy):
    """The data-parallel layout (for ``jit`` or ``shard_map``): a 1-D mesh ``'batch'``, the
    batch split over it, every parameter replicated."""

    def _mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        return (n_devices,)

    def batch_spec(self) -> P:
        return P("batch")


@dataclass(frozen=True)
class BatchAndParamsSplit(BatchSplit):
    """The FSDP layout: :class:`BatchSplit`, and every parameter split over ``'batch'``
    too (weights by rows, biases by entries)."""

    def param_specs(self, params: Params) -> Specs:
        return [(P("batch", None), P("batch")) for _ in params]


@dataclass(frozen=True)
class AutoDataParallel(BatchSplit):
    """Batch split over ``'batch'``, every parameter replicated; the
    compiler adds the gradient all-reduce."""

    name: ClassVar[str] = "auto_dp"
    summary: ClassVar[str] = "jit: batch P('batch'), params replicated"


@dataclass(frozen=True)
class TwoAxisMesh(Strategy):
    """A 2-D mesh: ``model_size`` devices along the second axis, the rest along the first."""

    model_size: int = 2

    def __post_init__(self) -> None:
        # Checked when built, not when a mesh is first asked for (NumPy/JAX ints become int).
        object.__setattr__(self, "model_size", checks.count(
            "model_size", self.model_size, maximum=checks.MAX_DEVICES))

    def _mesh_shape(self, n_devices: int) -> tuple[int, ...]:
        check_device_count(self.name, n_devices, self.model_size, self.axis_names[1])
        return (n_devices // self.model_size, self.model_size)


@dataclass(frozen=True)
class AutoDataTensorParallel(TwoAxisMesh):
    """``('batch', 'model')`` mesh: batch over ``'batch'``; hidden layers split over ``'model'`` in pairs.

    First and last layers replicated. The hidden layers alternate column-split
    ``W: P(None, 'model')`` (bias ``P('model')``) and row-split ``W: P('model', None)``, so the
    activation between a pair stays split over its features.
    """

    name: ClassVar[str] = "auto_dp_tp"
    summary: ClassVar[str] = "jit: batch P('batch'), middle layers P(None,'model') / P('model',None)"
    axis_names: ClassVar[tuple[str, ...]] = ("batch", "model")

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
class Auto2D(TwoAxisMesh):
    """Every weight and the batch ``P('data', 'model')``: rows over
    ``'data'``, columns over ``'model'``."""

    name: ClassVar[str] = "auto_2d"
    summary: ClassVar[str] = "jit: x, y and every W P('data','model')"
    axis_names: ClassVar[tuple[str, ...]] = ("data", "model")

    def param_specs(self, params: Params) -> Specs:
        return [(P("data", "model"), P("model")) for _ in params]

    def batch_spec(self) -> P:
        return P("data", "model")


@dataclass(frozen=True)
class AutoFSDP(BatchAndParamsSplit):
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
class DataParallel(_ShardMapStrategy, BatchSplit):
    """Each device: the loss of its slice of the batch, then ``pmean`` over
    ``'batch'``.

    Parameters come in replicated (``P()``). Differentiating through
    ``shard_map`` turns the implicit broadcast of each parameter into a
    ``psum`` of its gradient: the all-reduce.
    """

    name: ClassVar[str] = "dp"
    summary: ClassVar[str] = "shard_map: local loss, then pmean"

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
class FSDP(_ShardMapStrategy, BatchAndParamsSplit):
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

    def _mesh_shape(self, n_devices: int) -> tuple[int, ...]:
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


