"""Memory of a sharded training step: what ``jax.checkpoint`` does with the all-gathers the
partitioner inserts, hybrid sharding against the accumulation factor, and refused donations.

The subject is a stack of square ``tanh`` layers run by ``lax.scan`` (as real models run their
layers), with its weights ``[layers, width, width]`` sharded FSDP-style on the rows, under
``jit`` on a mesh with Auto axes: the partitioner, not the program, inserts the all-gathers.

* :func:`remat_grad` builds the gradient of that stack in the ways :data:`REMAT_VARIANTS`
  names; :func:`remat_row` compiles one and reads its peak memory and its all-gathers.
* :func:`hybrid_step` is one SGD-with-momentum step with the parameters sharded over
  ``fsdp`` only and the gradients and momentum over ``("fsdp", "data")``, accumulating the
  gradient of ``k`` microbatches; :func:`hybrid_row` compiles it and reads its memory.
* :func:`check_donation` compiles a jitted function and returns the donation warnings JAX
  gave (captured, not printed) and the bytes XLA aliased.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo

__all__ = ["REMAT_VARIANTS", "DonationCheck", "check_donation", "hybrid_row", "hybrid_step",
           "init_stack", "remat_grad", "remat_row"]

#: The ways :func:`remat_grad` builds the gradient, and what each does with a layer's weight.
REMAT_VARIANTS: dict[str, str] = {
    "no remat": "the partitioner gathers the weight; nothing names the gathered copy",
    "gathered, no remat": "the layer gathers its weight itself (a sharding constraint)",
    "gathered outside remat": "the weight is gathered, then passed to jax.checkpoint(layer)",
    "gathered inside remat": "jax.checkpoint(layer), the layer gathers its weight",
    "inside remat, save gathered": "the same, with save_only_these_names('gathered')",
    "inside remat, dots_saveable": "the same, with dots_saveable (keeps matmul outputs)",
    "inside remat, input pinned": "jax.checkpoint(layer), the weight constrained sharded "
                                  "as it enters and gathered inside",
}


def _auto_mesh(name: str, mesh: Any, axes: Sequence[str]) -> Mesh:
    checks.mesh_axes(name, mesh, axes)
    explicit = [a for a, t in zip(mesh.axis_names, mesh.axis_types, strict=True)
                if t == jax.sharding.AxisType.Explicit]
    if explicit:
        raise checks.InputError(
            f"{name} has Explicit axes {tuple(explicit)}; this lesson is about the all-gathers "
            "the partitioner inserts, which needs Auto axes: build the mesh with "
            "spmd_guide.core.devices.build_mesh(..., axis_types='auto').")
    return mesh


def init_stack(key: Any, *, layers: int, width: int, dtype: Any = jnp.float32) -> jax.Array:
    """Weights ``[layers, width, width]`` of the layer stack, scaled so ``tanh`` stays in its
    linear range (a gradient of useful size). Placed on the default device; shard them with
    ``jax.device_put``."""
    key = checks.key("key", key)
    layers = checks.count("layers", layers)
    width = checks.count("width", width)
    return (jax.random.normal(key, (layers, width, width), dtype) / jnp.sqrt(width)).astype(dtype)


def _check_stack(ws: Any, x: Any) -> None:
    checks.array("ws", ws, ndim=3)
    checks.array("x", x, min_ndim=2)
    if ws.shape[1] != ws.shape[2]:
        raise checks.InputError(f"ws must be [layers, width, width], got shape {ws.shape}.")
    if x.shape[-1] != ws.shape[1]:
        raise checks.InputError(
            f"x's last dimension ({x.shape[-1]}) must equal the layers' width ({ws.shape[1]}).")


def stack_loss(ws: jax.Array, x: jax.Array, *, layer: Callable[..., Any] | None = None,
               unrolled: bool = False) -> jax.Array:
    """Mean square of the stack's output on ``x`` ``[batch, width]``; ``layer(h, w) -> (h,
    None)`` runs one layer (default: ``tanh(h @ w)``, unconstrained). The layers run in a
    ``lax.scan``, or with ``unrolled=True`` in a Python loop (one copy per layer)."""
    unrolled = checks.flag("unrolled", unrolled)
    if layer is not None:
        checks.function("layer", layer)
    layer = layer or (lambda h, w: (jnp.tanh(h @ w), None))
    if unrolled:
        h = x
        for i in range(ws.shape[0]):
            h, _ = layer(h, ws[i])
    else:
        h, _ = jax.lax.scan(layer, x, ws)
    return jnp.mean(h ** 2)


def fsdp_layer(mesh: Mesh, *, gather: bool, batch_axes: Any = "x") -> Callable[..., Any]:
    """One layer ``(h, w) -> (tanh(h @ w), None)`` with its output kept batch-sharded.

    With ``gather=True`` the layer gathers its weight itself, a sharding constraint to
    replicated, and names the gathered copy ``"gathered"`` (``checkpoint_name``), so that a
    remat policy can save it or not. With ``gather=False`` the weight enters the matmul
    sharded and the partitioner inserts the all-gather, after JAX's autodiff has run.
    """
    gather = checks.flag("gather", gather)
    axes = checks.spec_axes(batch_axes)
    if not axes or not all(isinstance(a, str) for a in axes):
        raise checks.InputTypeError(
            f"batch_axes must be a mesh axis name or a tuple of them, got "
            f"{checks.value_text(batch_axes)}.")
    checks.mesh_axes("mesh", mesh, axes, why="(batch_axes names them)")
    batch = NamedSharding(mesh, P(batch_axes, None))
    whole = NamedSharding(mesh, P())

    def layer(h, w):
        if gather:
            w = jax.lax.with_sharding_constraint(w, whole)   # the all-gather, in the program
            w = checkpoint_name(w, "gathered")               # a name a remat policy can use
        return jax.lax.with_sharding_constraint(jnp.tanh(h @ w), batch), None
    return layer


def remat_grad(mesh: Mesh, *, variant: str, axis: str = "x", unrolled: bool = False
               ) -> Callable[..., Any]:
    """``jit(grad(stack_loss))`` built the way ``variant`` (a key of :data:`REMAT_VARIANTS`)
    says, on ``mesh`` (Auto axes) with the batch sharded over ``axis``; the layers in a
    ``lax.scan``, or unrolled (:func:`stack_loss`)."""
    unrolled = checks.flag("unrolled", unrolled)
    variant = checks.one_of("variant", variant, REMAT_VARIANTS)
    mesh = _auto_mesh("mesh", mesh, [checks.text("axis", axis)])
    whole = NamedSharding(mesh, P())
    policies = jax.checkpoint_policies
    if variant == "no remat":
        layer = fsdp_layer(mesh, gather=False, batch_axes=axis)
    elif variant == "gathered, no remat":
        layer = fsdp_layer(mesh, gather=True, batch_axes=axis)
    elif variant == "gathered outside remat":
        inner = jax.checkpoint(fsdp_layer(mesh, gather=False, batch_axes=axis))

        def layer(h, w):
            return inner(h, jax.lax.with_sharding_constraint(w, whole))
    elif variant == "gathered inside remat":
        layer = jax.checkpoint(fsdp_layer(mesh, gather=True, batch_axes=axis))
    elif variant == "inside remat, save gathered":
        layer = jax.checkpoint(fsdp_layer(mesh, gather=True, batch_axes=axis),
                               policy=policies.save_only_these_names("gathered"))
    elif variant == "inside remat, dots_saveable":
        layer = jax.checkpoint(fsdp_layer(mesh, gather=True, batch_axes=axis),
                               policy=policies.dots_saveable)
    else:
        inner = jax.checkpoint(fsdp_layer(mesh, gather=True, batch_axes=axis))
        sharded = NamedSharding(mesh, P(axis, None))

        def layer(h, w):
            return inner(h, jax.lax.with_sharding_constraint(w, sharded))
    # The gradient leaves laid out as the weights are, as a training step's would: left to
    # the partitioner, it may come out whole on every device and hide the difference.
    return jax.jit(jax.grad(lambda ws, x: stack_loss(ws, x, layer=layer, unrolled=unrolled)),
                   out_shardings=NamedSharding(mesh, P(None, axis, None)))


def remat_row(mesh: Mesh, ws: jax.Array, x: jax.Array, *, variant: str, axis: str = "x",
              unrolled: bool = False) -> dict[str, Any]:
    """Compile :func:`remat_grad` for ``variant`` on ``ws``/``x`` and read the program: its
    all-gathers per layer (a scan's forward and backward bodies each appear once in the
    program, an unrolled stack has a copy per layer; 1 per layer means each weight is
    gathered once and kept, 2 that it is gathered again for the backward pass) and one
    device's peak memory (:class:`spmd_guide.core.hlo.MemoryStats`)."""
    _check_stack(ws, x)
    fn = remat_grad(mesh, variant=variant, axis=axis, unrolled=unrolled)
    compiled = hlo.compile(fn, ws, x, compiler_options=hlo.FAST_COMPILE)
    memory = hlo._memory(compiled)
    gathers = hlo.count_kinds(hlo.collectives_in_text(compiled.as_text()))["all-gather"]
    copies = ws.shape[0] if unrolled else 1
    per_layer = gathers // copies if gathers % copies == 0 else gathers / copies
    return {"variant": variant, "all-gathers per layer": per_layer,
            "weight": "re-gathered" if per_layer > 1 else "kept",
            "peak": memory.peak_bytes, "temporaries": memory.temp_bytes}


# --------------------------------------------------------------------------- hybrid sharding


def hybrid_shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    """The layouts of the hybrid step on a ``("data", "fsdp")`` mesh: parameters over
    ``fsdp`` only (whole on each ``data`` group), gradients and momentum over
    ``("fsdp", "data")`` (one eighth each on a 2x4 mesh), microbatches ``[k, b, width]``
    with ``b`` over both axes.

    The state's axis order is ``("fsdp", "data")``: each ``fsdp`` block of the parameters is
    then one contiguous run of state blocks, and turning the state into the parameters'
    layout is one all-gather over ``data``.
    """
    mesh = _auto_mesh("mesh", mesh, ["data", "fsdp"])
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    return {"params": s(None, "fsdp", None), "state": s(None, ("fsdp", "data"), None),
            "batch": s(None, ("data", "fsdp"), None)}


def hybrid_step(mesh: Mesh, *, k: int, learning_rate: float = 0.1, momentum: float = 0.9,
                loop: bool = True) -> Callable[..., Any]:
    """One SGD-with-momentum step of the layer stack under hybrid sharding
    (:func:`hybrid_shardings`), accumulating the gradient of ``k`` microbatches with
    ``lax.scan``: ``step(ws, mom, xs) -> (ws, mom)``, ``xs`` ``[k, b, width]``, the
    gradient the mean of the ``k`` microbatch gradients (each microbatch's loss a mean over
    ``b`` rows, so this is the gradient over all ``k b`` rows). ``ws`` and ``mom`` are donated.
    ``loop=False`` (only with ``k=1``) takes the gradient of the one microbatch directly: no
    loop and no accumulator, the step as written without accumulation.
    """
    k = checks.count("k", k)
    loop = checks.flag("loop", loop)
    if not loop and k != 1:
        raise checks.InputError(f"loop=False is the step without accumulation: it needs k=1, "
                                f"got k={k}.")
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    momentum = checks.real("momentum", momentum, minimum=0.0, maximum=1.0,
                           inclusive_max=False)
    lay = hybrid_shardings(mesh)
    batch_axes = ("data", "fsdp")
    layer = fsdp_layer(mesh, gather=False, batch_axes=batch_axes)
    grad = jax.grad(lambda ws, x: stack_loss(ws, x, layer=layer))
    constrain = jax.lax.with_sharding_constraint

    def step(ws, mom, xs):
        def accumulate(total, x):
            return total + constrain(grad(ws, x), lay["state"]), None
        if loop:
            zeros = constrain(jnp.zeros_like(ws), lay["state"])
            total, _ = jax.lax.scan(accumulate, zeros, xs)
        else:
            total = constrain(grad(ws, xs[0]), lay["state"])
        mom = momentum * mom + total / k
        return constrain(ws - learning_rate * constrain(mom, lay["params"]), lay["params"]), mom

    return jax.jit(step, donate_argnums=(0, 1), in_shardings=(lay["params"], lay["state"],
                   lay["batch"]), out_shardings=(lay["params"], lay["state"]))


def hybrid_row(mesh: Mesh, *, k: int, layers: int, width: int, batch: int,
               loop: bool = True) -> dict[str, Any]:
    """Compile :func:`hybrid_step` (``loop`` as there) for a global batch of ``batch`` rows in
    ``k`` microbatches (abstract arguments: nothing is allocated) and read one device's
    memory."""
    k = checks.count("k", k)
    layers, width = checks.count("layers", layers), checks.count("width", width)
    batch = checks.count("batch", batch)
    checks.divisible("batch", batch, k, why="into k microbatches")
    lay = hybrid_shardings(mesh)
    micro = batch // k
    checks.divisible("the microbatch", micro, mesh.shape["data"] * mesh.shape["fsdp"],
                     why="over mesh axes ('data', 'fsdp')")
    checks.divisible("width", width, mesh.shape["data"] * mesh.shape["fsdp"],
                     why="over mesh axes ('fsdp', 'data')")
    ws = jax.ShapeDtypeStruct((layers, width, width), jnp.float32, sharding=lay["params"])
    mom = jax.ShapeDtypeStruct((layers, width, width), jnp.float32, sharding=lay["state"])
    xs = jax.ShapeDtypeStruct((k, micro, width), jnp.float32, sharding=lay["batch"])
    compiled = hlo.compile(hybrid_step(mesh, k=k, loop=loop), ws, mom, xs,
                           compiler_options=hlo.FAST_COMPILE)
    memory = hlo._memory(compiled)
    return {"k": k if loop else "1, no loop", "microbatch": micro, "arguments": memory.argument_bytes,
            "temporaries": memory.temp_bytes, "peak": memory.peak_bytes,
            "aliased": memory.alias_bytes}


# --------------------------------------------------------------------------- donation


@dataclass(frozen=True)
class DonationCheck:
    """What became of a compiled function's donations: ``refused`` holds the text of each
    "Some donated buffers were not usable" warning JAX gave while lowering (the shapes it
    names are per-device shard shapes); ``aliased_bytes`` is the output bytes XLA wrote into
    donated inputs (``memory_analysis().alias_size_in_bytes``), per device."""

    refused: tuple[str, ...]
    aliased_bytes: int

    @property
    def warned(self) -> bool:
        return bool(self.refused)


def check_donation(fn: Any, *args: Any) -> DonationCheck:
    """Lower and compile the jitted ``fn`` on ``args`` with warnings captured (not printed),
    and report the donation warnings and the aliased bytes (:class:`DonationCheck`)."""
    if not hasattr(fn, "lower"):
        raise checks.InputTypeError(
            f"fn must be a jitted function (jax.jit(f, donate_argnums=...)), got "
            f"{checks.value_text(fn)}.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = hlo.compile(fn.lower(*args), compiler_options=hlo.FAST_COMPILE)
    refused = tuple(str(w.message) for w in caught
                    if "donated buffers were not usable" in str(w.message))
    return DonationCheck(refused, hlo._memory(compiled).alias_bytes)
