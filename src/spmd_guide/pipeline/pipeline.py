"""Pipeline parallelism: a stack of equal layers split into stages, microbatches flowing through.

The model is ``n_layers`` identical layers ``x -> tanh(x @ W + b)`` of width ``width``, with
every parameter stacked on axis 0 (``w: [L, width, width]``, ``b: [L, width]``), so splitting
the stack into ``S`` stages is sharding axis 0 over a mesh axis named ``stage``. The loss is
Part IV's squared error (:func:`stack_loss`); the pipelined losses reproduce it and its
gradients.

How a pipelined loss runs: inside ``jax.shard_map`` each device holds its stage's layers and
executes a :class:`~spmd_guide.pipeline.schedules.Schedule` step by step (a ``lax.scan`` over the
schedule's rows). At each step it runs what the table says for its stage -- the forward of a
microbatch, its backward, or nothing -- and then two ``ppermute``s move the activation it
produced to the next stage and the input gradient it produced to the previous one. A
forward stores the stage's *input* in one of ``n_slots`` buffers; the backward recomputes the
stage from that input with ``jax.vjp`` (GPipe's re-materialization) and frees the slot. The
number of buffers is the schedule's peak of microbatches in flight: ``M`` for GPipe, ``S`` for
1F1B, which is 1F1B's saving. The loss is a ``jax.custom_vjp``: its gradients are the ones the
schedule's backward steps computed, so ``jax.grad`` runs the pipeline's own backward pass.

Meshes may have Auto or Explicit axes (``jax.make_mesh``'s default): the loss lays out its
inputs itself. Arguments are checked first (:mod:`spmd_guide.core.checks`; NumPy scalars
accepted, a NaN learning rate refused); the values inside arrays are not inspected.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.core.devices import build_mesh
from spmd_guide.core.display import Table
from spmd_guide.pipeline.schedules import (  # noqa: F401  (re-exported: the Part's one face)
    BACKWARD,
    FORWARD,
    IDLE,
    SCHEDULES,
    Schedule,
    bubble_fraction,
    build_schedule,
    closed_form_bubble,
    draw_schedule,
    in_flight_rows,
)

#: ``{"w": [L, width, width], "b": [L, width]}``.
Params = dict[str, jax.Array]
#: ``(x, y)``, both ``[batch_size, width]``.
Batch = tuple[jax.Array, jax.Array]
LossFn = Callable[[Params, Batch], jax.Array]


# --------------------------------------------------------------------------- the model


def init_stack(key: Any, n_layers: int, width: int, *, dtype: Any = jnp.float32) -> Params:
    """``n_layers`` layers of width ``width``: ``w`` drawn from N(0, 1/width), ``b`` zeros,
    each stacked on axis 0."""
    key = checks.key("key", key)
    n_layers = checks.count("n_layers", n_layers)
    width = checks.count("width", width)
    return _init_stack(key, n_layers, width, _float_dtype(dtype))


def _float_dtype(dtype: Any) -> np.dtype:
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise checks.InputTypeError(f"dtype must be a float dtype such as jnp.float32, got "
                                    f"{dtype!r}.") from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise checks.InputTypeError(f"dtype must be a float dtype (the layers are trained), "
                                    f"got {dtype}.")
    return dtype


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_stack(key: jax.Array, n_layers: int, width: int, dtype: Any) -> Params:
    w = jax.random.normal(key, (n_layers, width, width), dtype) / math.sqrt(width)
    return {"w": w, "b": jnp.zeros((n_layers, width), dtype)}


def apply_layers(params: Params, x: jax.Array) -> jax.Array:
    """Run ``x: [B, width]`` through every layer of ``params`` in order, so the same function
    is the whole model and one stage's share of it."""
    check_stack(params, (x, x))  # shapes and dtypes, or a clear error
    for w, b in zip(params["w"], params["b"], strict=True):
        x = jnp.tanh(x @ w + b)
    return x


def stack_loss(params: Params, batch: Batch) -> jax.Array:
    """The one-device reference: mean over the batch of the squared error summed over
    features."""
    check_stack(params, batch)
    x, y = batch
    error = apply_layers(params, x) - y
    return jnp.mean(jnp.sum(error**2, axis=-1))


#: ``(loss, grads)`` of :func:`stack_loss`, jitted once for the module.
reference_value_and_grad = jax.jit(jax.value_and_grad(stack_loss))


def make_batch(key: Any, batch_size: int, width: int) -> Batch:
    """A synthetic regression batch: ``x`` standard normal, ``y = tanh(x @ T)`` for a fixed
    random teacher ``T`` scaled by ``1/sqrt(width)``."""
    key = checks.key("key", key)
    return _make_batch(key, checks.count("batch_size", batch_size), checks.count("width", width))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _make_batch(key: jax.Array, batch_size: int, width: int) -> Batch:
    kx, kt = jax.random.split(key)
    x = jax.random.normal(kx, (batch_size, width))
    teacher = jax.random.normal(kt, (width, width)) / math.sqrt(width)
    return x, jnp.tanh(x @ teacher)


def check_stack(params: Any, batch: Any) -> tuple[int, int, int]:
    """``(n_layers, width, batch_size)`` of a stacked model and its batch, or a clear error."""
    if not isinstance(params, dict) or set(params) != {"w", "b"}:
        raise checks.InputTypeError(
            "params must be a dict {'w': [L, width, width], 'b': [L, width]} as "
            f"init_stack returns, got {type(params).__name__}.")
    w = checks.array("params['w']", params["w"], ndim=3, dtype_kind="f")
    n_layers, width, width2 = w.shape
    if width != width2:
        raise checks.InputError(f"params['w'] must be [L, width, width], got {w.shape}.")
    checks.same_shape("params['b']", checks.array("params['b']", params["b"], dtype_kind="f"),
                      (n_layers, width), other="[L, width] of params['w']")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise checks.InputTypeError("batch must be a pair (x, y) of [batch_size, width] arrays.")
    x = checks.array("x", batch[0], ndim=2, dtype_kind="f")
    checks.same_shape("y", checks.array("y", batch[1], ndim=2, dtype_kind="f"), x.shape,
                      other="x")
    if x.shape[1] != width:
        raise checks.InputError(
            f"x has {x.shape[1]} features but the layers have width {width}.")
    return n_layers, width, int(x.shape[0])


# --------------------------------------------------------------------------- execution


def _varying(a: jax.Array, *, axes: tuple[str, ...]) -> jax.Array:
    """``a`` marked as varying over ``axes`` (``shard_map``'s type of a per-device value)."""
    missing = tuple(n for n in axes if n not in jax.typeof(a).mat.varying)
    return jax.lax.pcast(a, missing, to="varying") if missing else a


def _run_schedule(params: Params, x: jax.Array, y: jax.Array, *,
                  schedule: Schedule, data_axis: str | None) -> tuple:
    """The per-device program: run ``schedule`` on this stage's layers and
    this data group's batch. Returns ``(loss, grads, dx, dy)``."""
    n_stages, n_micro = schedule.n_stages, schedule.n_microbatches
    stage = jax.lax.axis_index("stage")
    first, last = stage == 0, stage == n_stages - 1
    batch_size, width = x.shape
    xs = x.reshape(n_micro, -1, width)  # [M, mb, width]
    ys = y.reshape(n_micro, -1, width)
    axes = ("stage",) if data_axis is None else ("stage", data_axis)
    vary = functools.partial(_varying, axes=axes)
    # Per-group parameters: else autodiff of the data-replicated parameters
    # would psum each microbatch's gradient over 'data' in every backward.
    params = jax.tree.map(vary, params)
    zero_mb = vary(jnp.zeros_like(xs[0]))
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    zero_loss = vary(jnp.zeros((), x.dtype))
    to_next = [(s, s + 1) for s in range(n_stages - 1)]
    to_prev = [(s + 1, s) for s in range(n_stages - 1)]

    # A branch sees one microbatch: its stored input, the gradient received
    # for it, its target. It returns (loss term, parameter gradients,
    # activation to send on, gradient to send back, d loss / d y).
    def idle(x_in, g_in, y_m):
        return zero_loss, zero_grads, zero_mb, zero_mb, zero_mb

    def forward(x_in, g_in, y_m):
        out = apply_layers(params, x_in)
        err = jnp.sum((out - y_m) ** 2) / batch_size
        return jnp.where(last, err, 0.0), zero_grads, out, zero_mb, zero_mb

    def backward(x_in, g_in, y_m):
        # recompute the stage from its stored input, then pull back
        out, vjp = jax.vjp(apply_layers, params, x_in)
        d_out = 2 * (out - y_m) / batch_size  # on the last stage
        d_params, d_in = vjp(jnp.where(last, d_out, g_in))
        return zero_loss, d_params, zero_mb, d_in, -d_out

    def step(c: dict, row: dict) -> tuple[dict, None]:
        op = {k: v[stage] for k, v in row.items()}  # this stage's entry
        kind, m, slot = op["kind"], op["micro"], op["slot"]
        is_b = kind == BACKWARD
        # stage 0 reads its forward's input from the batch
        x_in = jnp.where(first & (kind == FORWARD), xs[m], c["stash"][slot])
        loss, d_params, send_f, send_b, d_y = jax.lax.switch(
            kind, [idle, forward, backward], x_in, c["grad_in"][slot], ys[m])
        # the slot buffers are updated out here, in place
        c = {"loss": c["loss"] + loss,
             "grads": jax.tree.map(jnp.add, c["grads"], d_params),
             "stash": c["stash"].at[slot].set(x_in),
             "grad_in": c["grad_in"],
             "dx": c["dx"].at[m].set(jnp.where(is_b, send_b, c["dx"][m])),
             "dy": c["dy"].at[m].set(jnp.where(is_b, d_y, c["dy"][m]))}
        got_f = jax.lax.ppermute(send_f, "stage", to_next)  # to s + 1
        got_b = jax.lax.ppermute(send_b, "stage", to_prev)  # to s - 1
        for buf, got, to in (("stash", got_f, op["recv_f"]),
                             ("grad_in", got_b, op["recv_b"])):
            keep = c[buf][jnp.maximum(to, 0)]
            c[buf] = c[buf].at[jnp.maximum(to, 0)].set(
                jnp.where(to >= 0, got, keep))
        return c, None

    slots = jnp.zeros((schedule.n_slots, *xs.shape[1:]), x.dtype)
    carry = {"stash": slots, "grad_in": slots, "grads": zero_grads,
             "loss": zero_loss, "dx": jnp.zeros_like(xs),
             "dy": jnp.zeros_like(ys)}
    tables = {k: jnp.asarray(v) for k, v in schedule.tables().items()}
    carry, _ = jax.lax.scan(step, jax.tree.map(vary, carry), tables)

    loss = jax.lax.psum(carry["loss"], "stage")
    dx = jax.lax.psum(jnp.where(first, carry["dx"], 0.0), "stage")
    dy = jax.lax.psum(jnp.where(last, carry["dy"], 0.0), "stage")
    dx, dy, grads = dx.reshape(x.shape), dy.reshape(y.shape), carry["grads"]
    if data_axis is not None:  # the loss is the mean of the groups' losses
        n_data = jax.lax.axis_size(data_axis)
        loss = jax.lax.pmean(loss, data_axis)
        grads = jax.lax.pmean(grads, data_axis)
        dx, dy = dx / n_data, dy / n_data
    return loss, grads, dx, dy


def pipelined_loss(mesh: Mesh, *, schedule: str, n_microbatches: int) -> LossFn:
    """``loss_fn(params, batch)`` equal to :func:`stack_loss`, run as the pipeline schedule
    ``schedule`` with ``n_microbatches`` microbatches on ``mesh`` (axis ``stage``, and
    optionally ``data``: one pipeline per data group, gradients averaged over groups).

    Its gradient (``jax.grad``) is the one the schedule's backward steps computed; asking only
    for the loss still runs the whole schedule. The mesh's axes may be Auto or Explicit
    (``jax.make_mesh``'s default): ``params`` and ``batch`` are laid out as the pipeline needs,
    wherever they are. On Explicit axes JAX itself runs ``jax.grad`` only under ``jax.jit``
    or inside ``jax.set_mesh(mesh)`` (its rule for any loss on such a mesh).
    """
    checks.mesh("mesh", mesh)
    checks.one_of("schedule", schedule, SCHEDULES)
    n_stages = checks.axis(mesh, "stage", name="pipeline axis")
    n_micro = checks.count("n_microbatches", n_microbatches, maximum=100_000)
    data_axis = "data" if "data" in mesh.shape else None
    extra = set(mesh.axis_names) - {"stage", "data"}
    if extra:
        raise checks.InputError(
            f"a pipeline mesh has axes 'stage' (and optionally 'data'); this one also has "
            f"{sorted(extra)}.")
    n_data = mesh.shape[data_axis] if data_axis else 1
    plan = build_schedule(schedule, n_stages, n_micro)
    batch_spec = P(data_axis)
    run = jax.jit(jax.shard_map(  # jitted: an eager call compiles once, not op by op
        functools.partial(_run_schedule, schedule=plan, data_axis=data_axis), mesh=mesh,
        in_specs=(P("stage"), batch_spec, batch_spec),
        out_specs=(P(), P("stage"), batch_spec, batch_spec)))

    def check(params: Params, batch: Batch) -> None:
        n_layers, _, batch_size = check_stack(params, batch)
        checks.divisible("n_layers", n_layers, n_stages,
                         why=f"(one group per stage of mesh axis 'stage', size {n_stages})")
        where = f" on each of the {n_data} groups of mesh axis 'data'" if data_axis else ""
        checks.divisible("batch size", batch_size, n_data * n_micro,
                         why=f"({n_micro} microbatches{where})")

    @jax.custom_vjp
    def loss_and_grads(params: Params, batch: Batch) -> jax.Array:
        return run(params, *batch)[0]

    def fwd(params: Params, batch: Batch) -> tuple[jax.Array, tuple]:
        loss, grads, dx, dy = run(params, *batch)
        return loss, (grads, dx, dy)

    def bwd(res: tuple, g: jax.Array) -> tuple[Params, Batch]:
        grads, dx, dy = res
        return jax.tree.map(lambda a: g * a, grads), (g * dx, g * dy)

    loss_and_grads.defvjp(fwd, bwd)

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        check(params, batch)
        # Laid out as shard_map's in_specs say: Explicit axes refuse any other layout, and
        # device_put (a no-op where the layout already holds) works on both axis types.
        params = jax.device_put(params, NamedSharding(mesh, P("stage")))
        batch = tuple(jax.device_put(a, NamedSharding(mesh, batch_spec)) for a in batch)
        return loss_and_grads(params, batch)

    loss_fn.__name__ = f"{schedule}_loss"
    return loss_fn


# --------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class PipelineStrategy:
    """A pipeline schedule behind the Part IV interface: ``.mesh``, ``.shard``, ``.loss``."""

    name: str
    summary: str

    def mesh(self, devices: Sequence[jax.Device] | None = None, *, data: int = 1) -> Mesh:
        """A ``('stage',)`` mesh over ``devices`` (default all), or ``('data', 'stage')`` with
        ``data`` pipelines side by side."""
        devices = _devices(devices)
        data = checks.count("data", data)
        checks.divisible("number of devices", len(devices), data,
                         why="(the data-parallel groups)")
        if data == 1:
            return build_mesh((len(devices),), ("stage",), devices=devices)
        return build_mesh((data, len(devices) // data), ("data", "stage"), devices=devices)

    def param_shardings(self, mesh: Mesh) -> dict[str, NamedSharding]:
        """Every leaf split over ``stage`` on axis 0 (replicated over ``data``)."""
        checks.axis(mesh, "stage", name="pipeline axis")
        return {"w": NamedSharding(mesh, P("stage")), "b": NamedSharding(mesh, P("stage"))}

    def batch_sharding(self, mesh: Mesh) -> NamedSharding:
        """Batch rows split over ``data`` if the mesh has it; replicated over ``stage``."""
        checks.axis(mesh, "stage", name="pipeline axis")
        return NamedSharding(mesh, P("data" if "data" in mesh.shape else None))

    def shard(self, params: Params, batch: Batch, mesh: Mesh) -> tuple[Params, Batch]:
        """Place ``params`` and ``batch`` on ``mesh`` as this strategy's loss expects."""
        checks.mesh("mesh", mesh)
        n_stages = checks.axis(mesh, "stage", name="pipeline axis")
        n_layers, _, batch_size = check_stack(params, batch)
        checks.divisible("n_layers", n_layers, n_stages,
                         why=f"(one group per stage of mesh axis 'stage', size {n_stages})")
        if "data" in mesh.shape:
            checks.divisible("batch size", batch_size, mesh.shape["data"],
                             why="over mesh axis 'data'")
        batch_sharding = self.batch_sharding(mesh)
        return (jax.device_put(params, self.param_shardings(mesh)),
                tuple(jax.device_put(a, batch_sharding) for a in batch))

    def loss(self, mesh: Mesh, *, n_microbatches: int) -> LossFn:
        """``loss_fn(params, batch)``: :func:`pipelined_loss` with this schedule."""
        return pipelined_loss(mesh, schedule=self.name, n_microbatches=n_microbatches)


def _devices(devices: Any) -> list[jax.Device]:
    """``devices`` as a list of JAX devices (all of them when ``None``)."""
    if devices is None:
        return list(jax.devices())
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"devices must be a list of JAX devices such as jax.devices()[:4], got "
            f"{type(devices).__name__}.")
    devices = list(np.ravel(np.asarray(devices, dtype=object)))
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise checks.InputTypeError(
            f"devices must be a non-empty list of JAX devices such as jax.devices()[:4], got "
            f"{devices!r:.60}.")
    checks.distinct_devices("devices", devices)
    return devices


STRATEGIES: dict[str, PipelineStrategy] = {
    "gpipe": PipelineStrategy("gpipe", "all forwards, then all backwards"),
    "1f1b": PipelineStrategy("1f1b", "warm-up forwards, then one forward, one backward"),
}


def make_train_step(strategy: PipelineStrategy, mesh: Mesh, *, n_microbatches: int,
                    learning_rate: float) -> Callable[[Params, Batch], tuple[Params, jax.Array]]:
    """A jitted SGD ``step(params, batch) -> (params, loss)`` whose new parameters are pinned
    to the strategy's shardings (``out_shardings``), so the layout never drifts."""
    if not isinstance(strategy, PipelineStrategy):
        raise checks.InputTypeError(
            f"strategy must be a PipelineStrategy such as pipeline.STRATEGIES['1f1b'], got "
            f"{type(strategy).__name__}.")
    lr = checks.real("learning_rate", learning_rate, positive=True)
    loss_fn = strategy.loss(mesh, n_microbatches=n_microbatches)

    def step(params: Params, batch: Batch) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    return jax.jit(step, out_shardings=(strategy.param_shardings(mesh),
                                        NamedSharding(mesh, P())))


# --------------------------------------------------------------------------- memory


def activation_buffer_bytes(schedule: str, n_stages: int, n_microbatches: int, *,
                            batch_size: int, width: int, itemsize: int = 4) -> int:
    """Bytes of the per-stage buffers the executed schedule keeps: ``n_slots`` stored stage
    inputs plus ``n_slots`` received gradients, each ``[batch_size / M, width]``."""
    slots = build_schedule(schedule, n_stages, n_microbatches).n_slots
    batch_size = checks.count("batch_size", batch_size)
    checks.divisible("batch_size", batch_size, n_microbatches, why="into microbatches")
    width = checks.count("width", width)
    itemsize = checks.count("itemsize", itemsize)
    return 2 * slots * (batch_size // n_microbatches) * width * itemsize


def profile(params: Params, batch: Batch, mesh: Mesh, *,
            n_microbatches: int) -> list[dict[str, Any]]:
    """One compiled ``value_and_grad`` per schedule on ``mesh``, and what it shows: its
    largest difference from the reference (loss and gradients), its ``collective-permute``
    ops, microbatches in flight (from the schedule), the bytes of activation buffers that
    implies, and the temporaries XLA's memory analysis reports per device.

    Compiled with :data:`spmd_guide.core.hlo.FAST_COMPILE` (programs run once: the HLO, its
    collectives and its memory analysis are unchanged, the machine code less optimised).
    """
    n_stages = checks.axis(mesh, "stage", name="pipeline axis")
    n_microbatches = checks.count("n_microbatches", n_microbatches, maximum=100_000)
    _, width, batch_size = check_stack(params, batch)
    # The reference runs on one device, from host copies (on Explicit axes a stage-sharded
    # stack cannot be unstacked layer by layer).
    ref_loss, ref_grads = reference_value_and_grad(*jax.device_get((params, tuple(batch))))
    rows = []
    for name, strategy in STRATEGIES.items():
        plan = build_schedule(name, n_stages, n_microbatches)
        loss_fn = strategy.loss(mesh, n_microbatches=n_microbatches)
        compiled = hlo.compile(jax.jit(jax.value_and_grad(loss_fn)), params, batch,
                               compiler_options=hlo.FAST_COMPILE)
        loss, grads = compiled(params, batch)
        error = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                    zip(jax.tree.leaves((loss, grads)), jax.tree.leaves((ref_loss, ref_grads)), strict=True))
        buffers = activation_buffer_bytes(
            name, n_stages, n_microbatches, batch_size=batch_size // _data_size(mesh),
            width=width, itemsize=np.dtype(batch[0].dtype).itemsize)
        temp = hlo.memory_per_device(compiled).temp_bytes
        rows.append({"schedule": name, "max |error|": f"{error:.1e}",
                     "ppermutes": hlo.collective_counts(compiled)["collective-permute"],
                     "in flight": int(plan.n_slots),
                     "buffers": hlo.format_bytes(buffers),
                     "XLA temporaries": hlo.format_bytes(temp),
                     "_error": error, "_buffers": buffers, "_temp": temp})
    return rows


#: The columns each row of :func:`profile` holds (and :func:`profile_table` shows).
PROFILE_COLUMNS = ("schedule", "max |error|", "ppermutes", "in flight", "buffers",
                   "XLA temporaries")


def profile_table(rows: list[dict[str, Any]]) -> Table:
    """The rows of :func:`profile` as a page table (without the raw numbers)."""
    if not isinstance(rows, list) or not rows:
        raise checks.InputTypeError(
            f"rows must be the non-empty list that pipeline.profile returns, got "
            f"{checks.value_text(rows)}.")
    for i, row in enumerate(rows):
        checks.record(f"rows[{i}]", row, required=PROFILE_COLUMNS)
    return Table([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])


def _data_size(mesh: Mesh) -> int:
    return int(mesh.shape["data"]) if "data" in mesh.shape else 1
