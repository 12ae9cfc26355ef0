"""Generating text from the Part VIII transformer with a KV cache, on one device or many.

Greedy generation asks the model for the most likely next token, appends it, and asks again.
A causal model's keys and values at a position never change once computed, so they are kept
in a *KV cache* (one ``[batch, heads, max_len, head_dim]`` array of keys and one of values
per block) instead of being recomputed for every new token:

* **prefill** runs the whole prompt through the model once and writes its keys and values
  into the cache;
* **decode** then feeds one token at a time: its query attends to everything cached.

Both are the same function, :func:`_step`, on different shapes. It is the model's own
:func:`~spmd_guide.transformer.lm.forward` with its ``attend`` hook (the hook context
parallelism used for ring attention) replaced by :class:`CacheWriter`, which writes the new
keys and values into the cache and attends over it. Sharded, the cache takes the layout a
Part VIII strategy gives the per-head activations: split over the batch (``dp``, ``fsdp``),
over the heads (``tp``), or both (``fsdp_tp``).

The cache keeps the heads before the positions so that attention's two matmuls read it in
place, with ``batch`` and ``heads`` as their batch dimensions; stored in the activations'
order ``[batch, max_len, heads, head_dim]``, XLA:CPU transposes the whole cache at every
step (the tests pin both facts).
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
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.transformer.lm import (
    Config,
    Params,
    check_config,
    check_params,
    forward,
    param_shapes,
)
from spmd_guide.transformer.transformer import STRATEGIES, Strategy

__all__ = ["SERVED", "CacheWriter", "Server", "abstract_params", "cache_bytes",
           "cached_attention", "compiled_step", "decode_collectives", "donation_rows",
           "generate", "generate_with_logits", "init_cache", "recompute_generate", "server"]

Cache = list[dict[str, jax.Array]]

#: The Part VIII strategies that can serve, and why the others cannot.
SERVED = ("dp", "fsdp", "tp", "fsdp_tp")
_NOT_SERVED = {name: "it splits the sequence, and a decode step has a single position"
               for name in ("tp_sp", "cp", "cp_zigzag")}
_NEG = -1e30  # the masked score of reference_attention: exp() of it is exactly 0


# --------------------------------------------------------------------------- attention


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, start: jax.Array
                     ) -> jax.Array:
    """Causal attention of ``s`` new queries ``[batch, s, heads, head_dim]`` at positions
    ``start .. start + s - 1`` over a cache of keys and values ``[batch, heads, max_len,
    head_dim]``. A query sees the keys at its own position and before; later slots (not
    yet written) are masked. ``start`` may be traced; a concrete one must leave room for the
    ``s`` queries in the cache."""
    q = checks.array("q", q, ndim=4, dtype_kind="f")
    k = checks.array("k", k, ndim=4, dtype_kind="f")
    v = checks.array("v", v, ndim=4, dtype_kind="f")
    b, s, heads, dim = q.shape
    if k.shape[0] != b or k.shape[1] != heads or k.shape[3] != dim or v.shape != k.shape:
        raise checks.InputError(
            f"k and v must be caches [batch, heads, max_len, head_dim] = [{b}, {heads}, max_len, "
            f"{dim}] for q of shape {tuple(q.shape)} [batch, s, heads, head_dim], got k "
            f"{tuple(k.shape)} and v {tuple(v.shape)}.")
    max_len = k.shape[2]
    if not checks.is_traced(start):
        if isinstance(start, jax.Array) and start.shape == ():
            start = np.asarray(start)  # a concrete JAX scalar: checked as a NumPy one
        start = checks.count("start", start, minimum=0, maximum=max_len - s)
    scores = jnp.einsum("bqhd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    q_pos = start + jnp.arange(s)
    scores = jnp.where(jnp.arange(max_len)[None, :] <= q_pos[:, None], scores, _NEG)
    return jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(scores, axis=-1), v)


class CacheWriter:
    """The model's ``attend(q, k, v)`` hook for generation. Block ``i``'s call writes that
    block's new keys and values into ``cache[i]`` at ``start`` and attends over the cache;
    after the forward pass, ``.cache`` holds the updated cache. A new writer is made for each
    traced step, so it holds no state between calls. ``place`` pins the cache's layout."""

    def __init__(self, cache: Cache, start: jax.Array,
                 place: Callable[[jax.Array], jax.Array]) -> None:
        self.old, self.start, self.place = cache, start, place
        self.cache: Cache = []

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        layer = self.old[len(self.cache)]
        at = (0, 0, self.start, 0)
        k_all, v_all = (self.place(jax.lax.dynamic_update_slice(
            layer[name], new.transpose(0, 2, 1, 3).astype(layer[name].dtype), at))
            for name, new in (("k", k), ("v", v)))
        self.cache.append({"k": k_all, "v": v_all})
        return cached_attention(q, k_all, v_all, start=self.start)


def _step(params: Params, tokens: jax.Array, start: jax.Array, cache: Cache, *,
          constrain: Callable[[jax.Array, str], jax.Array]
          ) -> tuple[jax.Array, jax.Array, Cache]:
    """Feed ``tokens`` (``[batch, s]``, at positions ``start ..``) through the model with the
    cache: the greedy next token ``[batch]``, its logits ``[batch, vocab]``, the new cache.
    Prefill is this on the prompt (``start = 0``), decode on one token."""
    writer = CacheWriter(cache, start, lambda x: constrain(x, "cache"))
    positions = start + jnp.arange(tokens.shape[1])
    logits = forward(params, tokens, positions=positions, constrain=constrain,
                     attend=writer)[:, -1]
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits, writer.cache


# --------------------------------------------------------------------------- layouts


def _no_constraint(x: jax.Array, kind: str) -> jax.Array:
    return x  # one device: nothing to pin


def _strategy(strategy: Any) -> Strategy | None:
    if strategy is None:
        return None
    if isinstance(strategy, Strategy):
        strategy = strategy.name
    if strategy in _NOT_SERVED:
        raise checks.InputError(
            f"strategy {strategy!r} cannot serve: {_NOT_SERVED[strategy]}; choose one of "
            f"{', '.join(map(repr, SERVED))}.")
    return STRATEGIES[checks.one_of("strategy", strategy, SERVED)]


def _auto(mesh: Mesh) -> Mesh:
    """``mesh`` with Auto axes (itself if they are). The model pins its layouts with
    sharding constraints, which only Auto axes accept; the devices and names stay."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)


@dataclass(frozen=True)
class Server:
    """One way of serving a config: the strategy (``None`` for one device), its mesh (Auto
    axes), the layouts, and the compiled step (:func:`_step`, cache donated)."""

    config: Config
    strategy: Strategy | None
    mesh: Mesh | None
    step: Any

    def spec(self, kind: str) -> P:
        """The layout of ``"cache"`` (each ``[batch, heads, max_len, head_dim]`` array),
        ``"tokens"`` (``[batch, s]``) or ``"next"`` (the last position's logits, ``[batch,
        vocab]``), or of an activation (``"residual"``, ``"heads"``, ...)."""
        if self.strategy is None:
            return P()
        return _specs(self.strategy)[kind]

    def sharding(self, kind: str) -> Any:
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return NamedSharding(self.mesh, self.spec(kind))

    def check_batch(self, batch: int) -> int:
        """``batch`` if the mesh can split it as the cache's layout asks."""
        batch = checks.count("batch", batch)
        if self.mesh is not None:
            checks.spec_fits("the batch", (batch,), P(self.spec("cache")[0]), self.mesh)
        return batch

    def place_params(self, params: Params) -> Params:
        """``params`` laid out as the strategy lays out parameters. A leaf laid out otherwise
        is placed from the host, as a checkpoint is loaded (resharding it on the devices
        would compile a program per leaf shape). Refuses parameters of another shape than
        ``config``'s."""
        _check_params(params, self.config)
        targets = (jax.tree.map(lambda _: self.sharding("tokens"), params) if self.mesh is None
                   else self.strategy.shardings(params, self.mesh))

        def place(leaf: Any, target: Any) -> jax.Array:
            if isinstance(leaf, jax.Array) and leaf.sharding == target:
                return leaf
            return jax.device_put(np.asarray(leaf), target)

        return jax.tree.map(place, params, targets)

    def place_tokens(self, tokens: jax.Array) -> jax.Array:
        return jax.device_put(tokens, self.sharding("tokens"))

    def feed(self, params: Params, tokens: jax.Array, start: int, cache: Cache
             ) -> tuple[jax.Array, jax.Array, Cache]:
        """One compiled step (prefill or decode) on placed arrays: ``tokens`` ``[batch, s]``
        at positions ``start .. start + s - 1``. Refuses positions past the cache's end (the
        step would write nowhere and attend to the wrong keys). The cache is donated: use the
        returned one."""
        max_len = cache[0]["k"].shape[2]
        start = checks.count("start", start, minimum=0)
        if start + tokens.shape[1] > max_len:
            raise checks.InputError(
                f"tokens at positions {start}..{start + tokens.shape[1] - 1} do not fit a "
                f"cache of max_len={max_len}; make the cache with a larger max_len.")
        return self.step(params, tokens, np.int32(start), cache)

    def cache_shapes(self, batch: int, max_len: int) -> Cache:
        """The cache as ``jax.ShapeDtypeStruct``s with their shardings: nothing allocated."""
        c = self.config
        one = jax.ShapeDtypeStruct((batch, c.n_heads, max_len, c.head_dim),
                                   jnp.dtype(c.dtype), sharding=self.sharding("cache"))
        return [{"k": one, "v": one} for _ in range(c.n_layers)]


def _check_params(params: Params, config: Config) -> None:
    """``params`` must be the pytree ``init_params(key, config)`` makes (the model's check)."""
    checks.array_tree("params", params)
    check_params(params, config)


def _fast() -> dict[str, Any] | None:
    """XLA:CPU compiles twice as fast without LLVM's code optimization (same program,
    :data:`spmd_guide.core.hlo.FAST_COMPILE`); on an accelerator, compile in full."""
    return hlo.FAST_COMPILE if jax.default_backend() == "cpu" else None


def _specs(strategy: Strategy) -> dict[str, P]:
    """The strategy's activation layouts, plus the cache's (the per-head activations' batch
    and heads entries) and the last position's logits."""
    acts = strategy.activation_specs()
    heads, logits = acts["heads"], acts["logits"]
    return acts | {"cache": P(heads[0], heads[2], None, None),
                   "tokens": strategy.token_spec(), "next": P(logits[0], logits[2])}


@functools.cache
def _server(config: Config, name: str | None, mesh: Mesh | None) -> Server:
    strategy = None if name is None else STRATEGIES[name]
    if strategy is None:
        return Server(config, None, None, jax.jit(functools.partial(
            _step, constrain=_no_constraint), donate_argnums=3, compiler_options=_fast()))
    acts = {k: NamedSharding(mesh, s) for k, s in _specs(strategy).items()}

    def constrain(x: jax.Array, kind: str) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, acts[kind])

    plain = Server(config, strategy, mesh, None)
    cache = [{"k": plain.sharding("cache"), "v": plain.sharding("cache")}] * config.n_layers
    step = jax.jit(functools.partial(_step, constrain=constrain), donate_argnums=3,
                   out_shardings=(NamedSharding(mesh, P(plain.spec("cache")[0])),
                                  plain.sharding("next"), cache),
                   compiler_options=_fast())
    return Server(config, strategy, mesh, step)


def server(config: Config, *, strategy: Any = None, mesh: Mesh | None = None) -> Server:
    """The :class:`Server` for ``config`` served by ``strategy`` (a name of :data:`SERVED`,
    or ``None`` for one device) on ``mesh`` (default: the strategy's mesh over every
    device). A mesh of Explicit axes is used as its Auto twin: same devices, same names.
    Refuses a strategy it cannot serve and sizes the mesh cannot split."""
    if not isinstance(config, Config):
        raise checks.InputTypeError(f"config must be a Config, got {type(config).__name__}.")
    chosen = _strategy(strategy)
    if chosen is None:
        if mesh is not None:
            raise checks.InputError(
                "a mesh was given without a strategy; pass strategy= (one of "
                f"{', '.join(map(repr, SERVED))}) to serve on it, or no mesh for one device.")
        return _server(config, None, None)
    mesh = chosen.mesh() if mesh is None else _auto(checks.mesh("mesh", mesh))
    chosen.check(config, mesh)
    return _server(config, chosen.name, mesh)


# --------------------------------------------------------------------------- the cache


def _check_max_len(config: Config, max_len: Any) -> int:
    return checks.count("max_len", max_len, maximum=config.seq_len)


def init_cache(config: Config, *, batch: int, max_len: int, strategy: Any = None,
               mesh: Mesh | None = None) -> Cache:
    """The empty cache: per block, zero keys ``"k"`` and values ``"v"`` of shape ``[batch,
    n_heads, max_len, head_dim]`` in ``config.dtype``, laid out as ``strategy`` serves them
    on ``mesh`` (one device if no strategy). ``max_len`` is at most ``config.seq_len``, the
    positions the model has embeddings for."""
    srv = server(config, strategy=strategy, mesh=mesh)
    batch = srv.check_batch(batch)
    shapes = srv.cache_shapes(batch, _check_max_len(config, max_len))
    return _zeros(tuple((s.shape, s.dtype, s.sharding) for s in jax.tree.leaves(shapes)),
                  config.n_layers)


def _zeros(leaves: tuple[Any, ...], n_layers: int) -> Cache:
    arrays = [jnp.zeros(shape, dtype, device=sharding) for shape, dtype, sharding in leaves]
    return [{"k": arrays[2 * i], "v": arrays[2 * i + 1]} for i in range(n_layers)]


def cache_bytes(cache: Cache) -> dict[str, int]:
    """Bytes of ``cache``: ``"total"`` (every array whole) and ``"per device"`` (the largest
    amount any one device holds)."""
    leaves = checks.array_tree("cache", cache)
    held: dict[Any, int] = {}
    for leaf in leaves:
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return {"total": sum(x.nbytes for x in leaves), "per device": max(held.values())}


# --------------------------------------------------------------------------- generation


def check_prompt(prompt: Any, config: Config) -> np.ndarray | jax.Array:
    """Int tokens ``[batch, prompt_len]`` with ids in ``[0, vocab)``, or a clear error."""
    prompt = checks.array("prompt", prompt, ndim=2, dtype_kind="iu")
    if 0 in prompt.shape:
        raise checks.InputError(f"prompt must hold at least one token per row, got shape "
                                f"{tuple(prompt.shape)}.")
    values = np.asarray(jax.device_get(prompt))
    if values.min() < 0 or values.max() >= config.vocab:
        raise checks.InputError(
            f"prompt token ids must be in [0, vocab) = [0, {config.vocab}), got ids from "
            f"{values.min()} to {values.max()}.")
    return prompt


def _check_length(config: Config, prompt_len: int, steps: int) -> int:
    total = prompt_len + steps
    if total > config.seq_len:
        raise checks.InputError(
            f"a prompt of {prompt_len} tokens plus steps={steps} is {total} positions, more "
            f"than the model's config.seq_len={config.seq_len} position embeddings; "
            f"generate at most {config.seq_len - prompt_len} steps.")
    return total


def generate(params: Params, prompt: Any, *, config: Config, steps: int,
             strategy: Any = None, mesh: Mesh | None = None) -> jax.Array:
    """Greedy decoding of ``steps`` new tokens after ``prompt`` (int ``[batch, prompt_len]``)
    with a KV cache: ``[batch, prompt_len + steps]`` int32. With ``strategy`` (a name of
    :data:`SERVED`) and ``mesh`` it runs sharded and returns the same tokens."""
    return generate_with_logits(params, prompt, config=config, steps=steps, strategy=strategy,
                                mesh=mesh)[0]


def generate_with_logits(params: Params, prompt: Any, *, config: Config, steps: int,
                         strategy: Any = None, mesh: Mesh | None = None
                         ) -> tuple[jax.Array, jax.Array]:
    """:func:`generate`, and the logits each new token was chosen from, ``[batch, steps,
    vocab]``: one prefill, then ``steps - 1`` decode steps, each donating the cache."""
    srv = server(config, strategy=strategy, mesh=mesh)
    prompt = check_prompt(prompt, config)
    steps = checks.count("steps", steps)
    batch, prompt_len = srv.check_batch(prompt.shape[0]), prompt.shape[1]
    total = _check_length(config, prompt_len, steps)
    params = srv.place_params(params)
    prompt = srv.place_tokens(jnp.asarray(prompt, jnp.int32))
    cache = init_cache(config, batch=batch, max_len=total, strategy=srv.strategy,
                       mesh=srv.mesh)
    token, logits, cache = srv.feed(params, prompt, 0, cache)
    tokens, all_logits = [token], [logits]
    for position in range(prompt_len, total - 1):
        token, logits, cache = srv.feed(params, token[:, None], position, cache)
        tokens.append(token)
        all_logits.append(logits)
    # Assembled on the host: a few bytes per token, and no program to compile per layout.
    new = np.stack([np.asarray(t) for t in tokens], axis=1)
    return (jnp.asarray(np.concatenate([np.asarray(prompt), new], axis=1)),
            jnp.asarray(np.stack([np.asarray(x) for x in all_logits], axis=1)))


@functools.cache
def _recompute_step() -> Callable[..., tuple[jax.Array, jax.Array]]:
    """One step of the reference: the whole buffer through the model, the logits of the
    position before ``position``, and the buffer with their argmax written at ``position``.
    ``position`` is traced, so every step runs the same compiled program."""
    def step(params: Params, tokens: jax.Array, position: jax.Array
             ) -> tuple[jax.Array, jax.Array]:
        logits = jax.lax.dynamic_index_in_dim(forward(params, tokens), position - 1, axis=1,
                                              keepdims=False)
        new = jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]
        return logits, jax.lax.dynamic_update_slice_in_dim(tokens, new, position, axis=1)
    return jax.jit(step, compiler_options=_fast())


def recompute_generate(params: Params, prompt: Any, *, config: Config, steps: int
                       ) -> tuple[jax.Array, jax.Array]:
    """The reference without a cache, on one device: for each new token, run the model on
    the whole sequence so far and take the last position's argmax. (One compiled program on
    a ``[batch, prompt_len + steps]`` buffer: by causality the logits at a position do not
    depend on the unfilled slots after it.) Returns tokens and logits as
    :func:`generate_with_logits` does."""
    prompt = check_prompt(prompt, config)
    steps = checks.count("steps", steps)
    batch, prompt_len = prompt.shape
    total = _check_length(config, prompt_len, steps)
    tokens = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(prompt)
    all_logits = []
    for position in range(prompt_len, total):
        logits, tokens = _recompute_step()(params, tokens, np.int32(position))
        all_logits.append(logits)
    return tokens, jnp.stack(all_logits, axis=1)


# --------------------------------------------------------------------------- compiled steps


def abstract_params(config: Config, srv: Server) -> Params:
    """The parameters of ``config`` as ``jax.ShapeDtypeStruct``s laid out as ``srv`` places
    them: a model of any size, nothing allocated."""
    config = check_config(config)
    if not isinstance(srv, Server):
        raise checks.InputTypeError(
            f"srv must be a Server from server(config, strategy=..., mesh=...), got "
            f"{checks.value_text(srv)}.")
    dtype = jnp.dtype(config.dtype)
    shapes = jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape, dtype), param_shapes(config),
                          is_leaf=lambda x: isinstance(x, tuple))
    shardings = (jax.tree.map(lambda _: srv.sharding("tokens"), shapes) if srv.mesh is None
                 else srv.strategy.shardings(shapes, srv.mesh))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)


def compiled_step(config: Config, *, batch: int, length: int, max_len: int,
                  strategy: Any = None, mesh: Mesh | None = None) -> jax.stages.Compiled:
    """The serving step compiled for ``batch`` sequences feeding ``length`` tokens each (the
    prompt for prefill, 1 for decode) into a cache of ``max_len`` positions, laid out as
    ``strategy`` serves them on ``mesh``. Compiled for abstract arrays: nothing runs."""
    srv = server(config, strategy=strategy, mesh=mesh)
    batch = srv.check_batch(batch)
    max_len = _check_max_len(config, max_len)
    length = checks.count("length", length, maximum=max_len)
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=srv.sharding("tokens"))
    return hlo.compile(srv.step, abstract_params(config, srv), tokens,
                       jax.ShapeDtypeStruct((), jnp.int32), srv.cache_shapes(batch, max_len),
                       compiler_options=_fast())


def decode_collectives(config: Config, *, strategy: str, n_devices: int, batch: int,
                       max_len: int | None = None) -> dict[str, int]:
    """The collectives of one decode step of ``strategy`` on the first ``n_devices`` devices
    (kind -> count, kinds that occur only)."""
    mesh = _strategy(strategy).mesh(jax.devices()[:checks.count("n_devices", n_devices)])
    compiled = compiled_step(config, batch=batch, length=1, max_len=max_len or config.seq_len,
                             strategy=strategy, mesh=mesh)
    return {k: n for k, n in hlo.count_kinds(hlo.collectives_in_text(compiled.as_text())).items()
            if n}


def donation_rows(config: Config, *, batch: int, max_len: int) -> list[dict[str, Any]]:
    """The memory of one decode step on one device, compiled twice: with the cache donated
    (as :func:`generate` runs it) and without. Bytes: arguments, outputs, outputs aliased to
    donated arguments (written in place), temporaries."""
    srv = server(config)
    batch = srv.check_batch(batch)
    args = (abstract_params(config, srv), jax.ShapeDtypeStruct((batch, 1), jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32),
            srv.cache_shapes(batch, _check_max_len(config, max_len)))
    kept = jax.jit(functools.partial(_step, constrain=_no_constraint))
    rows = []
    for label, fn in (("cache donated", srv.step), ("not donated", kept)):
        mem = hlo.memory_per_device(hlo.compile(fn, *args, compiler_options=_fast()))
        rows.append({"step": label, "arguments": mem.argument_bytes,
                     "outputs": mem.output_bytes, "aliased": mem.alias_bytes,
                     "temporaries": mem.temp_bytes})
    return rows


def sharded_row(params: Params, prompt: Any, *, config: Config, steps: int, strategy: str,
                mesh: Mesh, reference: tuple[Any, Any]) -> dict[str, Any]:
    """One row of the sharded-serving table: ``strategy`` on ``mesh`` generates, and its
    tokens and logits are compared with ``reference`` (one device's ``(tokens, logits)``
    from :func:`generate_with_logits`); the bytes each device holds and the collectives of
    one decode step."""
    tokens, logits = generate_with_logits(params, prompt, config=config, steps=steps,
                                          strategy=strategy, mesh=mesh)
    srv = server(config, strategy=strategy, mesh=mesh)
    batch, total = tokens.shape
    cache = init_cache(config, batch=batch, max_len=total, strategy=strategy, mesh=srv.mesh)
    placed = srv.place_params(params)
    held = max(sum(s.data.nbytes for leaf in jax.tree.leaves(placed)
                   for s in leaf.addressable_shards if s.device == d)
               for d in srv.mesh.devices.flat)
    # The decode step generate just ran (the same arguments, so JAX's cache has it).
    token = srv.place_tokens(np.zeros((batch, 1), np.int32))
    ops = hlo.collectives_in_text(srv.step.lower(placed, token, np.int32(0), cache).compile())
    kinds = {k: n for k, n in hlo.count_kinds(ops).items() if n}
    return {"strategy": strategy,
            "mesh": " x ".join(f"{k}={v}" for k, v in srv.mesh.shape.items()),
            "same tokens": bool(np.array_equal(np.asarray(tokens), np.asarray(reference[0]))),
            "max |logit diff|": f"{np.max(np.abs(np.asarray(logits) - np.asarray(reference[1]))):.1e}",
            "cache / device": cache_bytes(cache)["per device"], "params / device": held,
            "collectives per decode step": ", ".join(f"{n} {k}" for k, n in kinds.items())
            or "none", "sent per decode step": sum(op.bytes_sent for op in ops)}
