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

from spmd_guide.core import checks, hlo
from spmd_guide.transformer.attention import reference_attention

Params = dict[str, Any]

_SIZES = ("vocab", "d_model", "n_heads", "d_ff", "n_layers", "seq_len")


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
        for name in _SIZES:  # NumPy integers are stored as Python ints (hashable, printable)
            object.__setattr__(self, name, checks.count(f"Config.{name}", getattr(self, name)))
        checks.divisible("Config.d_model", self.d_model, self.n_heads, why="into n_heads heads")
        try:
            dtype = jnp.dtype(self.dtype)
        except TypeError:
            dtype = None
        if isinstance(self.dtype, bool) or dtype is None or \
                not jnp.issubdtype(dtype, jnp.floating):
            raise checks.InputTypeError(
                f"Config.dtype must name a floating dtype such as 'float32' or 'bfloat16', got "
                f"{self.dtype!r}.")
        object.__setattr__(self, "dtype", dtype.name)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def check_config(config: Any, *, name: str = "config") -> Config:
    """``config`` if it is a :class:`Config`, else a clear error."""
    if not isinstance(config, Config):
        raise checks.InputTypeError(
            f"{name} must be a spmd_guide.transformer.lm.Config such as Config(vocab=32), got "
            f"{checks.value_text(config)} ({type(config).__name__}).")
    return config


def init_params(key: jax.Array, config: Config) -> Params:
    """Random parameters: embeddings, ``n_layers`` blocks, final norm, untied output head."""
    key = checks.key("key", key)
    return _call(_init_params, key, check_config(config))


def _weight_shapes(c: Config) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each random weight of a block: its shape and fan-in."""
    qkv = ((c.d_model, c.n_heads, c.head_dim), c.d_model)
    return {"wq": qkv, "wk": qkv, "wv": qkv, "wo": ((c.n_heads, c.head_dim, c.d_model), c.d_model),
            "w_up": ((c.d_model, c.d_ff), c.d_model), "w_down": ((c.d_ff, c.d_model), c.d_ff)}


def _call(jitted: Any, key: jax.Array, *static: Any) -> Any:
    """``jitted(key, *static)``. Called at the top level (a concrete key), it runs a program
    compiled once per key type and static arguments without LLVM's code optimization: these
    programs run once, so compile time is all that counts (XLA:CPU takes over a second to
    optimize a random draw). Inside a trace it calls the plain ``jit``, which nests (a jit
    with compile options may not be nested)."""
    if checks.is_traced(key):
        return jitted(key, *static)
    return _fast_program(jitted, tuple(key.shape), key.dtype, static)(key)


@functools.lru_cache(maxsize=64)
def _fast_program(jitted: Any, shape: tuple[int, ...], dtype: Any, static: tuple[Any, ...]):
    lowered = jitted.lower(jax.ShapeDtypeStruct(shape, dtype), *static)
    return lowered.compile(compiler_options=hlo.FAST_COMPILE)


def param_shapes(config: Config) -> Params:
    """The shape of every parameter ``init_params(key, config)`` makes, as the same pytree."""
    c = check_config(config)
    block = {"norm1": (c.d_model,)} | {n: s for n, (s, _) in _weight_shapes(c).items()
                                       if n in ("wq", "wk", "wv", "wo")}
    block |= {"norm2": (c.d_model,), "w_up": (c.d_model, c.d_ff), "w_down": (c.d_ff, c.d_model)}
    return {"embed": (c.vocab, c.d_model), "pos": (c.seq_len, c.d_model),
            "blocks": [dict(block) for _ in range(c.n_layers)], "norm_f": (c.d_model,),
            "unembed": (c.d_model, c.vocab)}


def _leaf(params: Any, *path: Any) -> Any:
    """``params[path[0]][path[1]]...``, or a clear error naming the missing entry."""
    node, where = params, "params"
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            raise checks.InputError(
                f"params has no entry {where}[{key!r}]: it must be the pytree "
                f"init_params(key, config) returns (embed, pos, blocks, norm_f, unembed).") \
                from None
        where += f"[{key!r}]"
    return checks.array(where, node, min_ndim=1, dtype_kind="f")


def config_of(params: Params) -> Config:
    """The :class:`Config` (sizes and dtype) that ``params`` were made for, read from their
    shapes; every leaf is then checked against it, so a pytree whose shapes disagree with
    each other is refused instead of giving wrong numbers."""
    if not isinstance(params, dict):
        raise checks.InputTypeError(
            f"params must be the dict init_params(key, config) returns, got "
            f"{checks.value_text(params)}.")
    embed, pos, wq = _leaf(params, "embed"), _leaf(params, "pos"), \
        _leaf(params, "blocks", 0, "wq")
    if len(embed.shape) != 2 or len(pos.shape) != 2 or len(wq.shape) != 3:
        raise checks.InputError(
            f"params['embed'] and params['pos'] must be 2-D and each block's wq 3-D, got "
            f"shapes {tuple(embed.shape)}, {tuple(pos.shape)} and {tuple(wq.shape)}.")
    blocks = params["blocks"]
    if not isinstance(blocks, (list, tuple)):
        raise checks.InputTypeError(
            f"params['blocks'] must be a list of blocks, got {checks.value_text(blocks)}.")
    try:
        config = Config(vocab=embed.shape[0], d_model=embed.shape[1], n_heads=wq.shape[1],
                        d_ff=_leaf(params, "blocks", 0, "w_up").shape[-1],
                        n_layers=len(blocks), seq_len=pos.shape[0],
                        dtype=jnp.dtype(embed.dtype).name)
    except checks.InputError as e:
        raise checks.InputError(f"params do not describe a model: {e}") from None
    _compare(params, config, "the sizes read from embed, pos and block 0")
    return config


def _compare(params: Params, config: Config, against: str) -> None:
    want = param_shapes(config)
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_leaves_with_path(want, is_leaf=lambda x: isinstance(x, tuple))]
    if jax.tree.structure(params) != jax.tree.structure(
            jax.tree.map(lambda _: 0, want, is_leaf=lambda x: isinstance(x, tuple))):
        raise checks.InputError(
            "params must have the structure init_params(key, config) returns (embed, pos, "
            f"{config.n_layers} block(s) of norm1, wq, wk, wv, wo, norm2, w_up, w_down, "
            "norm_f, unembed).")
    got = jax.tree.leaves(params)
    for path, leaf, shape in zip(paths, got, jax.tree.leaves(
            want, is_leaf=lambda x: isinstance(x, tuple)), strict=True):
        checks.array(f"params{path}", leaf, dtype_kind="f")
        if tuple(leaf.shape) != tuple(shape):
            raise checks.InputError(
                f"params{path} has shape {tuple(leaf.shape)}, but {against} "
                f"({_sizes_text(config)}) need {tuple(shape)}.")


def _sizes_text(config: Config) -> str:
    return ", ".join(f"{name}={getattr(config, name)}" for name in _SIZES)


def check_params(params: Params, config: Config) -> Params:
    """``params`` if they are the pytree ``init_params(key, config)`` makes for this
    ``config`` (every leaf's shape); otherwise an error naming the size that differs.

    Shapes are static, so this costs nothing inside ``jax.jit``; leaves may be arrays,
    tracers or ``jax.ShapeDtypeStruct``.
    """
    config = check_config(config)
    have = config_of(params)
    differ = [f"{name} {getattr(have, name)}" for name in _SIZES
              if getattr(have, name) != getattr(config, name)]
    if differ:
        wanted = ", ".join(f"{name} {getattr(config, name)}" for name in _SIZES
                           if getattr(have, name) != getattr(config, name))
        raise checks.InputError(
            f"params were made for {', '.join(differ)}, but config says {wanted}; pass the "
            f"Config the parameters were initialised with.")
    return params


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

    The arguments are checked first: ``params`` must agree with themselves
    (:func:`config_of`), ``inputs`` must be integers with at most as many columns as
    ``params["pos"]`` has positions, and, when they are concrete (not traced by ``jit``), every
    token id must be in ``[0, vocab)`` and every position in range: JAX's indexing would
    otherwise clamp a bad id silently and return logits for another token. Under ``jit`` only
    shapes and dtypes can be checked (a traced value has none yet); check the values before
    the call, as :func:`lm_loss` and the strategies' ``shard`` do.
    """
    config = config_of(params)
    inputs = _check_ids("inputs", inputs, config.vocab, ndim=2)
    seq = inputs.shape[1]
    if positions is None:
        if seq > config.seq_len:
            raise checks.InputError(
                f"inputs has {seq} positions, but params['pos'] holds {config.seq_len}; feed "
                f"at most seq_len={config.seq_len} tokens (or pass positions).")
        positions = jnp.arange(seq)
    else:
        positions = _check_ids("positions", positions, config.seq_len, ndim=1,
                               what="position", bound_name="seq_len")
        checks.same_shape("positions", positions, (seq,), other="inputs' sequence")
    checks.function("constrain", constrain)
    checks.function("attend", attend)
    return _forward(params, inputs, positions, constrain, attend)


def _forward(params: Params, inputs: jax.Array, positions: Any,
             constrain: Callable[[jax.Array, str], jax.Array],
             attend: Callable[..., jax.Array]) -> jax.Array:
    """:func:`forward` without the checks (its callers have made them)."""
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


@jax.jit
def _min_max(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.min(x), jnp.max(x)


def _check_ids(name: str, value: Any, bound: int, *, ndim: int, what: str = "token id",
               bound_name: str = "vocab") -> Any:
    """Integers of ``ndim`` dimensions, each in ``[0, bound)`` when the values are concrete.

    A traced value (inside ``jit``) has only its shape and dtype checked: its numbers do not
    exist yet. Concrete values cost one small reduction (a ``jax.Array`` stays on its devices).
    """
    value = checks.array(name, value, ndim=ndim, dtype_kind="iu")
    if any(d == 0 for d in value.shape):
        raise checks.InputError(f"{name} is empty (shape {tuple(value.shape)}).")
    if checks.is_traced(value) or isinstance(value, jax.ShapeDtypeStruct):
        return value
    if isinstance(value, jax.Array):
        # A concrete array closed over by a function being traced: compute now, not staged.
        with jax.ensure_compile_time_eval():
            low, high = (int(v) for v in jax.device_get(_min_max(value)))
    else:
        value = np.asarray(value)
        low, high = int(value.min()), int(value.max())
    if low < 0 or high >= bound:
        bad = low if low < 0 else high
        raise checks.InputError(
            f"{name} holds {what} {bad}, but every {what} must be in [0, {bound}) "
            f"({bound_name} {bound}).")
    return value


def check_tokens(tokens: Any, config: Config) -> Any:
    """Int tokens ``[batch, seq_len + 1]`` with ids in ``[0, vocab)``, or a clear error.

    The ids are checked when ``tokens`` is concrete; under ``jit`` (traced tokens) only the
    shape and dtype are, since the values do not exist until the program runs.
    """
    config = check_config(config)
    tokens = checks.array("tokens", tokens, ndim=2, dtype_kind="iu")
    if tokens.shape[1] != config.seq_len + 1:
        raise checks.InputError(
            f"tokens must have shape [batch, seq_len + 1] = [batch, {config.seq_len + 1}], "
            f"got {tuple(tokens.shape)}; the inputs are tokens[:, :-1], targets tokens[:, 1:].")
    return _check_ids("tokens", tokens, config.vocab, ndim=2)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over every predicted position.

    ``logits`` ``[..., vocab]`` (floats), ``targets`` the integer ids ``[...]`` (checked to lie
    in ``[0, vocab)`` when concrete). Shapes, dtypes and ids are checked; the values inside
    ``logits`` are not (that would cost a pass over the array and cannot be done under
    ``jit``): a NaN or infinite logit gives a NaN loss, as in JAX.
    """
    logits = checks.array("logits", logits, min_ndim=1, dtype_kind="f")
    if hasattr(targets, "shape") and len(targets.shape) != len(logits.shape) - 1:
        raise checks.InputError(
            f"targets has shape {tuple(targets.shape)} and logits {tuple(logits.shape)}: "
            f"targets must have logits' shape without its last (vocab) axis.")
    targets = _check_ids("targets", targets, logits.shape[-1], ndim=len(logits.shape) - 1)
    checks.same_shape("targets", targets, logits.shape[:-1], other="logits without its last axis")
    return _cross_entropy(logits, targets)


def _cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def lm_loss(params: Params, tokens: jax.Array, *, config: Config) -> jax.Array:
    """The one-device reference: mean cross-entropy of predicting ``tokens[:, 1:]``.

    ``params`` must be the pytree ``init_params(key, config)`` makes (:func:`check_params`)
    and ``tokens`` pass :func:`check_tokens`.
    """
    check_params(params, config)
    tokens = check_tokens(tokens, config)
    return _cross_entropy(_forward(params, tokens[:, :-1], jnp.arange(config.seq_len),
                                   _no_constraint, _causal_attention), tokens[:, 1:])


def counting_task(key: jax.Array, *, batch: int, config: Config,
                  strides: tuple[int, ...] = (1, 2, 3)) -> jax.Array:
    """Sequences that count modulo ``vocab``, each with its own stride from ``strides``.

    Token ``t`` is ``(start + t * stride) % vocab``. The first token is random and never a
    target; the second reveals the stride, so only the first prediction is uncertain (one of
    ``len(strides)`` tokens) and a model that learns the rule predicts every later token
    exactly: the loss (a mean over ``seq_len`` predictions) falls from about ``log(vocab)``
    towards ``log(len(strides)) / seq_len`` (distinct strides below ``vocab``).
    """
    key = checks.key("key", key)
    batch = checks.count("batch", batch)
    config = check_config(config)
    strides = checks.counts("strides", strides)
    for i, stride in enumerate(strides):  # a stride of vocab (or more) counts by stride % vocab
        checks.count(f"strides[{i}]", stride, maximum=config.vocab - 1)
    return _call(_counting_task, key, batch, config, strides)


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
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    weight_decay = checks.real("weight_decay", weight_decay, minimum=0)
    return optax.adamw(learning_rate, weight_decay=weight_decay)


def against_uniform(loss: float, vocab: int) -> str:
    """Words placing ``loss`` against ``log(vocab)``, the loss of a uniform guess over the
    vocabulary: ``"above the 3.47 nats of a uniform guess"`` (or ``below``, or ``at``, two
    decimals). An untrained model starts above it: its random logits guess unevenly, and when
    the target is independent of the logits, ``logsumexp(z) >= log(vocab) + mean(z)`` makes
    an uneven guess cost at least as much as an even one on average."""
    loss = checks.real("loss", loss, minimum=0)  # a cross-entropy is never negative
    vocab = checks.count("vocab", vocab)
    uniform = math.log(vocab)
    where = "at" if f"{loss:.2f}" == f"{uniform:.2f}" else \
        "above" if loss > uniform else "below"
    return f"{where} the {uniform:.2f} nats of a uniform guess"


def param_count(params: Params) -> int:
    """Number of parameters of the model ``params`` describes (checked as :func:`config_of`
    reads it: the pytree ``init_params`` makes)."""
    config_of(params)
    return sum(int(np.prod(x.shape)) for x in checks.array_tree("params", params))


def train_one_device(key: jax.Array, config: Config, *, steps: int, batch: int,
                     learning_rate: float = 3e-3) -> list[float]:
    """Train on :func:`counting_task` on one device; the loss after each step."""
    steps = checks.count("steps", steps)
    config = check_config(config)
    batch = checks.count("batch", batch)
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
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
    # Compiled without LLVM's code optimization: for this small model that cuts the compile
    # from about 6 s to 1.5 s and costs a fraction of a second in the run.
    keys = jax.random.split(dkey, steps)
    train = jax.jit(lambda params, state, keys: jax.lax.scan(step, (params, state), keys))
    compiled = train.lower(params, state, keys).compile(compiler_options=hlo.FAST_COMPILE)
    _, losses = compiled(params, state, keys)
    return [float(x) for x in jax.device_get(losses)]
