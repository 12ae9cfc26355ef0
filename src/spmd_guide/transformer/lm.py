"""A small decoder-only transformer in plain JAX, and a task it can learn in seconds.

Parameters are a plain pytree (dicts of arrays, one dict per block), so every leaf's sharding
can be printed and pinned. The forward pass takes two hooks that the parallel strategies of
:mod:`spmd_guide.transformer.transformer` fill in: ``constrain(x, kind)`` pins the layout of an activation
(``kind`` is ``"residual"``, ``"heads"``, ``"hidden"`` or ``"logits"``) and ``attend(q, k, v)``
replaces attention (ring attention for context parallelism). With the defaults it is the
one-device reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spmd_guide.core import checks
from spmd_guide.transformer.attention import reference_attention

Params = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Config:
    """Sizes of the model. ``seq_len`` is the number of input positions."""

    vocab: int = 32
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2
    seq_len: int = 16
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "n_heads", "d_ff", "n_layers", "seq_len"):
            checks.count(name, getattr(self, name))
        checks.divisible("d_model", self.d_model, self.n_heads, why="into n_heads heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def init_params(key: jax.Array, config: Config) -> Params:
    """Random parameters: embeddings, ``n_layers`` blocks, final norm, untied output head."""
    key = checks.key("key", key)
    if not isinstance(config, Config):
        raise checks.InputTypeError(f"config must be a Config, got {type(config).__name__}.")
    return _init_params(key, config)


def _weight_shapes(c: Config) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each random weight of a block: its shape and fan-in."""
    qkv = ((c.d_model, c.n_heads, c.head_dim), c.d_model)
    return {"wq": qkv, "wk": qkv, "wv": qkv, "wo": ((c.n_heads, c.head_dim, c.d_model), c.d_model),
            "w_up": ((c.d_model, c.d_ff), c.d_model), "w_down": ((c.d_ff, c.d_model), c.d_ff)}


@functools.partial(jax.jit, static_argnums=1)
def _init_params(key: jax.Array, config: Config) -> Params:
    # One compiled program and one random draw sliced into every weight: XLA:CPU compiles a
    # random draw per weight (or an eager call per weight) many times slower.
    c, dt = config, jnp.dtype(config.dtype)
    shapes = {"embed": ((c.vocab, c.d_model), 1), "pos": ((c.seq_len, c.d_model), 1),
              "unembed": ((c.d_model, c.vocab), c.d_model)}
    shapes |= {f"{i}.{name}": spec for i in range(c.n_layers)
               for name, spec in _weight_shapes(c).items()}
    draw = jax.random.normal(key, (sum(math.prod(s) for s, _ in shapes.values()),))
    weights, offset = {}, 0
    for name, (shape, fan_in) in shapes.items():
        size = math.prod(shape)
        weights[name] = (draw[offset:offset + size].reshape(shape) / math.sqrt(fan_in)).astype(dt)
        offset += size
    ones = jnp.ones((c.d_model,), dt)
    blocks = [{"norm1": ones, **{n: weights[f"{i}.{n}"] for n in ("wq", "wk", "wv", "wo")},
               "norm2": ones, "w_up": weights[f"{i}.w_up"], "w_down": weights[f"{i}.w_down"]}
              for i in range(c.n_layers)]
    return {"embed": weights["embed"], "pos": weights["pos"] * 0.1, "blocks": blocks,
            "norm_f": ones, "unembed": weights["unembed"]}


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _no_constraint(x: jax.Array, kind: str) -> jax.Array:
    return x


def _causal_attention(q, k, v):
    return reference_attention(q, k, v, causal=True)


def forward(params: Params, inputs: jax.Array, *, positions: jax.Array | None = None,
            constrain: Callable[[jax.Array, str], jax.Array] = _no_constraint,
            attend: Callable[..., jax.Array] = _causal_attention) -> jax.Array:
    """Logits ``[batch, seq, vocab]`` for int tokens ``[batch, seq]``.

    ``positions`` (default ``0..seq-1``) says which position each column holds, so a
    strategy may feed the sequence in another order (zig-zag) and get the same numbers.
    """
    seq = inputs.shape[1]
    positions = jnp.arange(seq) if positions is None else positions
    x = constrain(params["embed"][inputs] + params["pos"][positions], "residual")
    for block in params["blocks"]:
        h = _rms_norm(x, block["norm1"])
        q, k, v = (constrain(jnp.einsum("bsd,dhk->bshk", h, block[w]), "heads")
                   for w in ("wq", "wk", "wv"))
        a = constrain(attend(q, k, v), "heads")
        x = constrain(x + jnp.einsum("bshk,hkd->bsd", a, block["wo"]), "residual")
        h = _rms_norm(x, block["norm2"])
        u = constrain(jax.nn.gelu(h @ block["w_up"]), "hidden")
        x = constrain(x + u @ block["w_down"], "residual")
    x = _rms_norm(x, params["norm_f"])
    return constrain(x @ params["unembed"], "logits")


def check_tokens(tokens: Any, config: Config) -> jax.Array:
    """Int tokens ``[batch, seq_len + 1]`` with ids below ``vocab``, or a clear error."""
    tokens = checks.array("tokens", tokens, ndim=2, dtype_kind="iu")
    if tokens.shape[1] != config.seq_len + 1:
        raise checks.InputError(
            f"tokens must have shape [batch, seq_len + 1] = [batch, {config.seq_len + 1}], "
            f"got {tuple(tokens.shape)}; the inputs are tokens[:, :-1], targets tokens[:, 1:].")
    return tokens


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over every predicted position."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def lm_loss(params: Params, tokens: jax.Array, *, config: Config) -> jax.Array:
    """The one-device reference: mean cross-entropy of predicting ``tokens[:, 1:]``."""
    tokens = check_tokens(tokens, config)
    return cross_entropy(forward(params, tokens[:, :-1]), tokens[:, 1:])


def counting_task(key: jax.Array, *, batch: int, config: Config,
                  strides: tuple[int, ...] = (1, 2, 3)) -> jax.Array:
    """Sequences that count modulo ``vocab``, each with its own stride from ``strides``.

    Token ``t`` is ``(start + t * stride) % vocab``. The first token is random and the second
    reveals the stride, so a model that learns the rule predicts every later token exactly:
    the loss falls from ``log(vocab)`` towards ``2 / seq_len * log(vocab * len(strides))``.
    """
    key = checks.key("key", key)
    batch = checks.count("batch", batch)
    return _counting_task(key, batch, config, tuple(strides))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _counting_task(key: jax.Array, batch: int, config: Config,
                   strides: tuple[int, ...]) -> jax.Array:
    k1, k2 = jax.random.split(key)
    start = jax.random.randint(k1, (batch, 1), 0, config.vocab)
    stride = jnp.asarray(strides)[jax.random.randint(k2, (batch, 1), 0, len(strides))]
    return ((start + stride * jnp.arange(config.seq_len + 1)) % config.vocab).astype(jnp.int32)


def optimizer(learning_rate: float = 3e-3, *, weight_decay: float = 0.01
              ) -> optax.GradientTransformation:
    """AdamW from optax: its state is two pytrees shaped like the parameters, plus a count."""
    checks.real("learning_rate", learning_rate, positive=True)
    return optax.adamw(learning_rate, weight_decay=weight_decay)


def against_uniform(loss: float, vocab: int) -> str:
    """Words placing ``loss`` against ``log(vocab)``, the loss of a uniform guess over the
    vocabulary: ``"above the 3.47 nats of a uniform guess"`` (or ``below``, or ``at``, two
    decimals). An untrained model starts above it: its random logits guess unevenly, and when
    the target is independent of the logits, ``logsumexp(z) >= log(vocab) + mean(z)`` makes
    an uneven guess cost at least as much as an even one on average."""
    loss = checks.real("loss", loss)
    vocab = checks.count("vocab", vocab)
    uniform = math.log(vocab)
    where = "at" if f"{loss:.2f}" == f"{uniform:.2f}" else \
        "above" if loss > uniform else "below"
    return f"{where} the {uniform:.2f} nats of a uniform guess"


def param_count(params: Params) -> int:
    """Number of parameters."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def train_one_device(key: jax.Array, config: Config, *, steps: int, batch: int,
                     learning_rate: float = 3e-3) -> list[float]:
    """Train on :func:`counting_task` on one device; the loss after each step."""
    steps = checks.count("steps", steps)
    pkey, dkey = jax.random.split(checks.key("key", key))
    params = init_params(pkey, config)
    opt = optimizer(learning_rate)
    state = opt.init(params)

    def step(carry, key):
        params, state = carry
        tokens = counting_task(key, batch=batch, config=config)
        loss, grads = jax.value_and_grad(lm_loss)(params, tokens, config=config)
        updates, state = opt.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), loss

    # One compiled program for the whole run (a scan over steps): no per-step dispatch.
    train = jax.jit(lambda params, state, keys: jax.lax.scan(step, (params, state), keys))
    _, losses = train(params, state, jax.random.split(dkey, steps))
    return [float(x) for x in jax.device_get(losses)]
