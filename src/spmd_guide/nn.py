"""The model of Part IV: a ReLU MLP, its losses, plain SGD, and a synthetic task to learn.

Everything here runs on one device and is the *reference* every parallel strategy must
reproduce. The strategies themselves live in :mod:`spmd_guide.strategies`; their registry is
re-exported here as ``spmd_guide.nn.STRATEGIES`` (with the ``Strategy`` interface), so

    from spmd_guide.nn import STRATEGIES, init_mlp, mlp_loss

gives the whole public surface of Part IV.

Shapes in docstrings use ``B`` for the batch size, ``d_in``/``d_out`` for the input and
output widths and ``n_i`` for the width of layer boundary ``i``
(``layer_sizes = [n_0, n_1, ..., n_L]``, ``n_0 = d_in``, ``n_L = d_out``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # only for type checkers: the runtime import is lazy (see __getattr__)
    from spmd_guide.strategies import STRATEGIES, Strategy  # noqa: F401

#: ``[(W_0, b_0), ..., (W_{L-1}, b_{L-1})]`` with ``W_i: [n_i, n_{i+1}]`` and ``b_i: [n_{i+1}]``.
Params = list[tuple[jax.Array, jax.Array]]
#: ``(x, y)`` with ``x: [B, d_in]`` and ``y: [B, d_out]`` (or integer labels ``y: [B]`` for
#: :func:`cross_entropy_loss`).
Batch = tuple[jax.Array, jax.Array]
#: ``loss_fn(params, batch) -> scalar``.
LossFn = Callable[[Params, Batch], jax.Array]


def _check_layer_sizes(layer_sizes: Sequence[int]) -> list[int]:
    sizes = list(layer_sizes)
    if len(sizes) < 2 or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes
    ):
        raise ValueError(
            "layer_sizes must list at least two positive integer widths [d_in, ..., d_out], "
            f"got {layer_sizes!r}."
        )
    return sizes


def init_mlp(
    key: jax.Array, layer_sizes: Sequence[int], *, dtype: Any = jnp.float32
) -> Params:
    """Random MLP parameters: ``W_i: [n_i, n_{i+1}]`` drawn from N(0, 2/n_i),
    ``b_i: [n_{i+1}]`` zeros.

    The 2/n_i variance ("He" scaling) keeps the size of ReLU activations
    roughly constant from layer to layer, so a deep stack neither explodes
    nor dies at initialization. ``key`` is a typed key from
    ``jax.random.key``.
    """
    sizes = tuple(_check_layer_sizes(layer_sizes))
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
    shapes = list(zip(sizes[:-1], sizes[1:]))
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
    *hidden, (w_last, b_last) = params
    for weights, bias in hidden:
        x = jax.nn.relu(x @ weights + bias)
    return x @ w_last + b_last


def layer_outputs(params: Params, x: jax.Array) -> list[jax.Array]:
    """Every layer's output for ``x: [B, d_in]``: ``[B, n_1], ..., [B, n_L]`` (the last equals :func:`predict`).

    Jit it to see where a partitioner puts the activations between the layers.
    """
    outputs = []
    for i, (weights, bias) in enumerate(params):
        x = x @ weights + bias
        x = x if i == len(params) - 1 else jax.nn.relu(x)
        outputs.append(x)
    return outputs


def mlp_loss(params: Params, batch: Batch) -> jax.Array:
    """Squared error: mean over the batch of the error summed over features.

    ``batch = (x: [B, d_in], y: [B, d_out])``.
    """
    x, y = batch
    error = predict(params, x) - y  # [B, d_out]
    return jnp.mean(jnp.sum(error**2, axis=-1))


def cross_entropy_loss(params: Params, batch: Batch) -> jax.Array:
    """Classification loss: mean over the batch of
    ``-log softmax(logits)[label]``.

    ``batch = (x: [B, d_in], labels: [B])`` with integer labels in
    ``[0, d_out)``; the MLP's outputs ``[B, d_out]`` are the logits.
    ``logsumexp`` keeps it stable for large logits.
    """
    x, labels = batch
    logits = predict(params, x)  # [B, d_out]
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)  # [B, 1]
    picked = picked[:, 0]  # [B]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def sgd_update(
    params: Params, grads: Params, *, learning_rate: float
) -> Params:
    """One plain gradient-descent update: ``p - learning_rate * g`` for
    every array."""
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


@functools.cache
def make_sgd_step(
    loss_fn: LossFn, *, learning_rate: float
) -> Callable[[Params, Batch], tuple[Params, jax.Array]]:
    """A jitted ``step(params, batch) -> (new_params, loss)`` doing one SGD
    step on ``loss_fn``.

    ``loss_fn`` is :func:`mlp_loss` or a strategy's ``loss(mesh)``. The step
    is one compiled program (forward, backward and update), so its
    collectives and memory are those of one training step. It adds no
    sharding constraint: the new parameters get their layout from the
    compiler's propagation, which for every strategy of this book is the
    layout the parameters came in with.
    Cached, so the same loss and rate give the same jitted step (and one
    compilation).
    """
    if not learning_rate > 0:
        raise ValueError(
            f"learning_rate must be positive, got {learning_rate!r}."
        )

    def step(params: Params, batch: Batch) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return sgd_update(params, grads, learning_rate=learning_rate), loss

    return jax.jit(step)


def train(
    step: Callable[[Params, Batch], tuple[Params, jax.Array]],
    params: Params,
    batch: Batch,
    *,
    steps: int,
) -> tuple[Params, list[float]]:
    """Run ``steps`` calls of ``step`` on the same batch; return the final
    params and each step's loss."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}.")
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
    sizes = (("batch_size", batch_size), ("d_in", d_in), ("d_out", d_out))
    for label, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{label} must be a positive integer, got {value!r}."
            )
    return _regression_batch(key, (batch_size, d_in, d_out), jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _regression_batch(key: jax.Array, sizes: tuple[int, int, int], dtype: Any) -> Batch:
    batch_size, d_in, d_out = sizes
    normal = jax.random.normal(key, ((batch_size + d_out) * d_in,), dtype)  # one draw: x and T
    x = normal[: batch_size * d_in].reshape(batch_size, d_in)
    teacher = normal[batch_size * d_in :].reshape(d_in, d_out) / math.sqrt(d_in)
    return x, jnp.tanh(x @ teacher)


def param_bytes_per_device(params: Params) -> int:
    """The most bytes of ``params`` any one device holds (its shards of every array)."""
    per_device: dict[int, int] = {}
    for leaf in jax.tree.leaves(params):
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
    return max(per_device.values())


def __getattr__(name: str) -> Any:
    """Expose ``STRATEGIES`` and ``Strategy`` from :mod:`spmd_guide.strategies` (imported on first use).

    The strategies are built on this module, so importing them lazily avoids a circular import.
    """
    if name in ("STRATEGIES", "Strategy"):
        from spmd_guide import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
