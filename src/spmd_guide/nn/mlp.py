"""The model of Part IV: a ReLU MLP, its losses, plain SGD, and a synthetic task to learn.

Everything here runs on one device and is the *reference* every parallel strategy of
:mod:`spmd_guide.nn.strategies` must reproduce. :mod:`spmd_guide.nn` is the face of Part IV
that re-exports this module's names with the strategies.

Shapes in docstrings use ``B`` for the batch size, ``d_in``/``d_out`` for the input and
output widths and ``n_i`` for the width of layer boundary ``i``
(``layer_sizes = [n_0, n_1, ..., n_L]``, ``n_0 = d_in``, ``n_L = d_out``).

Every public function checks its arguments (:mod:`spmd_guide.core.checks`) from static facts
(types and shapes), so the checks also hold, for free, when the function runs under ``jit``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spmd_guide.core import checks

#: ``[(W_0, b_0), ..., (W_{L-1}, b_{L-1})]`` with ``W_i: [n_i, n_{i+1}]`` and ``b_i: [n_{i+1}]``.
Params = list[tuple[jax.Array, jax.Array]]
#: ``(x, y)`` with ``x: [B, d_in]`` and ``y: [B, d_out]`` (or integer labels ``y: [B]`` for
#: :func:`cross_entropy_loss`).
Batch = tuple[jax.Array, jax.Array]
#: ``loss_fn(params, batch) -> scalar``.
LossFn = Callable[[Params, Batch], jax.Array]


def check_params(params: Any, *, name: str = "params") -> Params:
    """``params`` must be a non-empty list of ``(W: [n_i, n_i+1], b: [n_i+1])`` pairs whose
    widths chain, as :func:`init_mlp` makes them."""
    if not isinstance(params, (list, tuple)) or not params:
        raise checks.InputTypeError(
            f"{name} must be a non-empty list of (W, b) pairs as made by init_mlp, got "
            f"{type(params).__name__}.")
    for i, layer in enumerate(params):
        if not isinstance(layer, (list, tuple)) or len(layer) != 2:
            raise checks.InputTypeError(
                f"{name}[{i}] must be a (W, b) pair as made by init_mlp, got {layer!r:.60}.")
        w = checks.array(f"{name}[{i}][0] (W)", layer[0], ndim=2)
        b = checks.array(f"{name}[{i}][1] (b)", layer[1], ndim=1)
        if b.shape[0] != w.shape[1]:
            raise checks.InputError(
                f"layer {i}: b has {b.shape[0]} entries but W {tuple(w.shape)} has "
                f"{w.shape[1]} output features.")
        if i and w.shape[0] != params[i - 1][0].shape[1]:
            raise checks.InputError(
                f"layer {i}: W {tuple(w.shape)} takes {w.shape[0]} features, but layer "
                f"{i - 1} gives {params[i - 1][0].shape[1]}.")
    return params


def check_batch(params: Params, batch: Any, *, targets: str = "values") -> Batch:
    """``batch`` must be ``(x: [B, d_in], y)`` fitting ``params``: ``y: [B, d_out]`` for
    ``targets="values"``, integer ``y: [B]`` for ``targets="labels"``."""
    if isinstance(batch, dict):
        raise checks.InputTypeError(
            f"batch must be a pair (x, y), got a dict with keys {sorted(batch)}; pass "
            "(batch['x'], batch['y']).")
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        raise checks.InputTypeError(f"batch must be a pair (x, y), got {batch!r:.60}.")
    d_in, d_out = params[0][0].shape[0], params[-1][0].shape[1]
    x = checks.array("x", batch[0], ndim=2)
    if x.shape[1] != d_in:
        raise checks.InputError(
            f"x has shape {tuple(x.shape)}, but the MLP takes {d_in} input features: x must "
            f"be [B, {d_in}].")
    if targets == "labels":
        y = checks.array("labels", batch[1])
        if y.ndim == 2 and y.shape == (x.shape[0], d_out):
            raise checks.InputError(
                f"labels must be integer class ids of shape [B] = [{x.shape[0]}], got what "
                f"looks like one-hot rows {tuple(y.shape)}; pass labels.argmax(-1).")
        checks.array("labels", y, ndim=1, dtype_kind="iu")
        expected: tuple[int, ...] = (x.shape[0],)
    else:
        y = checks.array("y", batch[1])
        expected = (x.shape[0], d_out)
    if tuple(y.shape) != expected:
        what = "labels" if targets == "labels" else "y"
        hint = (" (a 1-D y would broadcast against the [B, 1] output to [B, B]; use "
                "y[:, None])") if y.ndim == 1 and targets != "labels" else ""
        raise checks.InputError(
            f"{what} has shape {tuple(y.shape)}, but x {tuple(x.shape)} and an MLP with "
            f"{d_out} outputs need {what} of shape {expected}{hint}.")
    return x, y


def init_mlp(
    key: jax.Array, layer_sizes: Sequence[int], *, dtype: Any = jnp.float32
) -> Params:
    """Random MLP parameters: ``W_i: [n_i, n_{i+1}]`` drawn from N(0, 2/n_i),
    ``b_i: [n_{i+1}]`` zeros.

    The 2/n_i variance ("He" scaling) keeps the size of ReLU activations
    roughly constant from layer to layer, so a deep stack neither explodes
    nor dies at initialization. ``key`` is a typed key from
    ``jax.random.key`` (an int seed is accepted too).
    """
    key = checks.key("key", key)
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    return _init_layers(key, sizes, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _init_layers(
    key: jax.Array, sizes: tuple[int, ...], dtype: Any
) -> Params:
    """One standard-normal draw for all the weights, cut into layers and
    scaled by sqrt(2 / n_i).

    A single jitted draw compiles once per list of sizes; a draw per layer
    would compile a random-number program per layer shape.
    """
    shapes = list(zip(sizes[:-1], sizes[1:], strict=True))
    n_weights = sum(n_in * n_out for n_in, n_out in shapes)
    normal = jax.random.normal(key, (n_weights,), dtype)
    params, start = [], 0
    for fan_in, fan_out in shapes:
        size = fan_in * fan_out
        block = normal[start : start + size].reshape(fan_in, fan_out)
        weights = math.sqrt(2.0 / fan_in) * block
        params.append((weights, jnp.zeros((fan_out,), dtype)))
        start += size
    return params


def predict(params: Params, x: jax.Array) -> jax.Array:
    """The MLP's output ``[B, d_out]`` for inputs ``x: [B, d_in]``.

    ReLU between layers, none after the last.
    """
    check_params(params)
    if checks.array("x", x, ndim=2).shape[1] != params[0][0].shape[0]:
        raise checks.InputError(
            f"x has shape {tuple(x.shape)}, but the MLP takes {params[0][0].shape[0]} input "
            "features.")
    *hidden, (w_last, b_last) = params
    for weights, bias in hidden:
        x = jax.nn.relu(x @ weights + bias)
    return x @ w_last + b_last


def layer_outputs(params: Params, x: jax.Array) -> list[jax.Array]:
    """Every layer's output for ``x: [B, d_in]``: ``[B, n_1], ..., [B, n_L]`` (the last equals :func:`predict`).

    Jit it to see where a partitioner puts the activations between the layers.
    """
    check_params(params)
    outputs = []
    for i, (weights, bias) in enumerate(params):
        x = x @ weights + bias
        x = x if i == len(params) - 1 else jax.nn.relu(x)
        outputs.append(x)
    return outputs


def mlp_loss(params: Params, batch: Batch) -> jax.Array:
    """Squared error: mean over the batch of the error summed over features.

    ``batch = (x: [B, d_in], y: [B, d_out])``. ``y`` must have exactly that shape: a 1-D
    ``y: [B]`` would broadcast against the ``[B, 1]`` output to ``[B, B]`` and give a wrong
    loss, so it is refused.
    """
    x, y = check_batch(check_params(params), batch)
    error = predict(params, x) - y  # [B, d_out]
    return jnp.mean(jnp.sum(error**2, axis=-1))


def cross_entropy_loss(params: Params, batch: Batch) -> jax.Array:
    """Classification loss: mean over the batch of
    ``-log softmax(logits)[label]``.

    ``batch = (x: [B, d_in], labels: [B])`` with integer labels in
    ``[0, d_out)``; the MLP's outputs ``[B, d_out]`` are the logits.
    ``logsumexp`` keeps it stable for large logits. Concrete labels outside ``[0, d_out)``
    raise ``InputError``; traced ones (under ``jit``) cannot be checked, so the loss is
    ``nan`` for them rather than a number for another class.
    """
    x, labels = check_batch(check_params(params), batch, targets="labels")
    d_out = params[-1][0].shape[1]
    if not isinstance(labels, jax.core.Tracer):
        values = np.asarray(labels)
        if values.size and (values.min() < 0 or values.max() >= d_out):
            raise checks.InputError(
                f"labels must be class ids in [0, {d_out}), got values from {values.min()} "
                f"to {values.max()}.")
    logits = predict(params, x)  # [B, d_out]
    valid = (labels >= 0) & (labels < d_out)
    picked = jnp.take_along_axis(logits, jnp.clip(labels, 0, d_out - 1)[:, None], axis=-1)
    losses = jax.nn.logsumexp(logits, axis=-1) - picked[:, 0]  # [B]
    return jnp.mean(jnp.where(valid, losses, jnp.nan))


def sgd_update(
    params: Params, grads: Params, *, learning_rate: float
) -> Params:
    """One plain gradient-descent update: ``p - learning_rate * g`` for
    every array (``learning_rate`` positive and finite)."""
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    if jax.tree.structure(params) != jax.tree.structure(grads):
        raise checks.InputError(
            "grads must have the structure of params (as jax.grad returns it), got "
            f"{jax.tree.structure(grads)} for params {jax.tree.structure(params)}.")
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


def make_sgd_step(
    loss_fn: LossFn, *, learning_rate: float, param_shardings: Any = None,
    donate: bool = False,
) -> Callable[[Params, Batch], tuple[Params, jax.Array]]:
    """A jitted ``step(params, batch) -> (new_params, loss)`` doing one SGD
    step on ``loss_fn``.

    ``loss_fn`` is :func:`mlp_loss` or a strategy's ``loss(mesh)``. The step
    is one compiled program (forward, backward and update), so its
    collectives and memory are those of one training step.

    ``param_shardings`` (a pytree of shardings shaped like ``params``, e.g.
    ``strategy.param_shardings(params, mesh)``) pins the new parameters to
    those layouts. Without it the compiler's propagation chooses the layout of
    the new parameters, and it may choose another one than the parameters
    came in with: the next step then sees new input shardings, recompiles, and
    moves data the strategy never asked for. Pinning the outputs is the same as
    ``jax.jit(step, out_shardings=(param_shardings, None))``.

    ``donate=True`` donates the old parameters (``donate_argnums=0``): the compiled step
    may write the new parameters into their buffers, and the arrays passed in are deleted
    after the call, so keep using only what the step returns.

    Cached, so the same loss, rate, shardings and donation give the same jitted step (and
    one compilation).
    """
    checks.function("loss_fn", loss_fn)
    rate = checks.real("learning_rate", learning_rate, positive=True)
    if param_shardings is not None:
        leaves = jax.tree.leaves(param_shardings)
        if not leaves or not all(isinstance(s, jax.sharding.Sharding) for s in leaves):
            raise checks.InputTypeError(
                "param_shardings must be a pytree of jax.sharding.Sharding shaped like the "
                "params (e.g. strategy.param_shardings(params, mesh)), got "
                f"{param_shardings!r:.80}.")
        param_shardings = _freeze(param_shardings)
    return _sgd_step(loss_fn, rate, param_shardings, checks.flag("donate", donate))


def _freeze(tree: Any) -> Any:
    """Lists to tuples, so a pytree of shardings can be a cache key."""
    if isinstance(tree, (list, tuple)):
        return tuple(_freeze(t) for t in tree)
    return tree


@functools.cache
def _sgd_step(loss_fn: LossFn, learning_rate: float, param_shardings: Any, donate: bool
              ) -> Callable[[Params, Batch], tuple[Params, jax.Array]]:
    def step(params: Params, batch: Batch) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return sgd_update(params, grads, learning_rate=learning_rate), loss

    donated = (0,) if donate else ()
    if param_shardings is None:
        return jax.jit(step, donate_argnums=donated)
    # The new parameters in exactly the given shardings (the very objects, so the next call
    # finds the same input shardings and reuses this compilation); the loss replicated.
    leaves = jax.tree.leaves(param_shardings)
    loss_sharding = jax.sharding.NamedSharding(leaves[0].mesh, jax.P()) if isinstance(
        leaves[0], jax.sharding.NamedSharding) else None
    as_list = [tuple(layer) for layer in param_shardings]
    return jax.jit(step, out_shardings=(as_list, loss_sharding), donate_argnums=donated)


def train(
    step: Callable[[Params, Batch], tuple[Params, jax.Array]],
    params: Params,
    batch: Batch,
    *,
    steps: int,
) -> tuple[Params, list[float]]:
    """Run ``steps`` calls of ``step`` on the same batch; return the final
    params and each step's loss."""
    checks.function("step", step)
    steps = checks.count("steps", steps)
    losses = []
    for _ in range(steps):
        params, loss = step(params, batch)
        losses.append(float(loss))
    return params, losses


def make_regression_batch(
    key: jax.Array,
    batch_size: int,
    d_in: int,
    d_out: int,
    *,
    dtype: Any = jnp.float32,
) -> Batch:
    """A learnable synthetic task: ``x: [B, d_in]`` standard normal,
    ``y = tanh(x @ T): [B, d_out]``.

    ``T`` is a fixed random "teacher" matrix scaled by ``1/sqrt(d_in)``, so
    ``y`` depends smoothly on ``x`` and an MLP's loss goes down when it
    trains on it.
    """
    key = checks.key("key", key)
    sizes = tuple(checks.count(label, value) for label, value in
                  (("batch_size", batch_size), ("d_in", d_in), ("d_out", d_out)))
    return _regression_batch(key, sizes, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _regression_batch(key: jax.Array, sizes: tuple[int, int, int], dtype: Any) -> Batch:
    batch_size, d_in, d_out = sizes
    normal = jax.random.normal(key, ((batch_size + d_out) * d_in,), dtype)  # one draw: x and T
    x = normal[: batch_size * d_in].reshape(batch_size, d_in)
    teacher = normal[batch_size * d_in :].reshape(d_in, d_out) / math.sqrt(d_in)
    return x, jnp.tanh(x @ teacher)


def param_bytes_per_device(params: Params) -> int:
    """The most bytes of ``params`` any one device holds (its shards of every array)."""
    leaves = jax.tree.leaves(params)
    if not leaves or not all(isinstance(leaf, jax.Array) for leaf in leaves):
        raise checks.InputTypeError(
            "params must be a pytree of jax.Array (placed on devices), e.g. from "
            "strategy.shard(...).")
    per_device: dict[int, int] = {}
    for leaf in jax.tree.leaves(params):
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
    return max(per_device.values())
