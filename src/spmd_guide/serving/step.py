"""The KV cache and the one serving step, prefill or decode, on one device or sharded.

Greedy generation asks the model for the most likely next token, appends it, and asks again.
A causal model's keys and values at a position never change once computed, so they are kept
in a *KV cache* (one ``[batch, heads, max_len, head_dim]`` array of keys and one of values
per block) instead of being recomputed for every new token:

* **prefill** runs the whole prompt through the model once and writes its keys and values
  into the cache;
* **decode** then feeds one token at a time: its query attends to everything cached.

Both are the same function, :func:`_step`, on different shapes. It is the model's own
forward pass (:func:`spmd_guide.transformer.lm.forward`'s body) with two of its hooks
replaced: ``attend`` by :class:`CacheWriter`, which writes the new keys and values into the
cache and attends over it, and ``constrain``, which sees every activation, by
:class:`KeepLast`, which keeps only each row's last prompt position before the output head
(prefill needs one position's logits, not ``prompt_len`` of them). Every row has its own
position, so prompts of different lengths share a batch. Sharded, the cache takes the layout
a Part IX strategy gives the per-head activations: split over the batch (``dp``,
``fsdp``), over the heads (``tp``), or both (``fsdp_tp``).

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
from spmd_guide.serving import sampling
from spmd_guide.transformer.lm import Config, Params, _forward, check_config, check_params
from spmd_guide.transformer.transformer import STRATEGIES, Strategy

__all__ = ["SERVED", "CacheWriter", "KeepLast", "Server", "cache_bytes", "cached_attention",
           "check_length", "check_prompt", "init_cache", "server"]

Cache = list[dict[str, jax.Array]]

#: The Part IX strategies that can run this decode step, and why the others cannot.
SERVED = ("dp", "fsdp", "tp", "fsdp_tp")
_NOT_SERVED = {name: "it splits the sequence, and this decode step has a single position"
               for name in ("tp_sp", "cp", "cp_zigzag")}
_NEG = -1e30  # the masked score of reference_attention: exp() of it is exactly 0


# --------------------------------------------------------------------------- attention


def _starts(start: Any, batch: int, room: int) -> Any:
    """``start`` (a scalar, kept one, or one per row, ``[batch]``) as int32; concrete values
    must lie in ``[0, room]``."""
    if checks.is_traced(start):
        if start.ndim not in (0, 1) or (start.ndim == 1 and start.shape != (batch,)):
            raise checks.InputError(f"start must be a scalar or [{batch}], got {start.shape}.")
        return start.astype(jnp.int32)
    if isinstance(start, (jax.Array, np.ndarray)) and start.ndim == 1:
        values = checks.array("start", np.asarray(jax.device_get(start)), dtype_kind="iu")
        checks.same_shape("start", values, (batch,), other="one per row of the batch")
        for value in values:
            checks.count("start", value, minimum=0, maximum=room)
        return jnp.asarray(values, jnp.int32)
    if isinstance(start, jax.Array):
        start = np.asarray(start)  # a concrete JAX scalar: checked as a NumPy one
    return jnp.int32(checks.count("start", start, minimum=0, maximum=room))


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, start: Any) -> jax.Array:
    """Causal attention of ``s`` new queries ``[batch, s, heads, head_dim]`` at positions
    ``start .. start + s - 1`` over a cache of keys and values ``[batch, heads, max_len,
    head_dim]``. ``start`` is one position for every row or one per row (``[batch]``). A
    query sees the keys at its own position and before; later slots are masked. ``start``
    may be traced; a concrete one must leave room for the ``s`` queries in the cache."""
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
    start = jnp.broadcast_to(_starts(start, b, max_len - s), (b,))
    scores = jnp.einsum("bqhd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    q_pos = start[:, None] + jnp.arange(s)  # [batch, s]
    seen = jnp.arange(max_len) <= q_pos[:, :, None]  # [batch, s, max_len]
    scores = jnp.where(seen[:, None], scores, _NEG)
    return jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def _write(cache: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """``new`` ``[batch, heads, s, head_dim]`` written into ``cache`` at each row's
    ``start`` (one position for all rows: a dynamic slice, written in place in the donated
    cache; or one per row). One token per row (decode) is a scatter of one slot per row, done in place in the
    donated cache; a prompt (prefill) is selected into its slots."""
    s, max_len = new.shape[2], cache.shape[2]
    if start.ndim == 0:  # every row at the same position: a slice, in place
        return jax.lax.dynamic_update_slice(cache, new, (0, 0, start, 0))
    if s == 1:
        return cache.at[jnp.arange(cache.shape[0]), :, start].set(new[:, :, 0])
    offset = jnp.arange(max_len)[None, :] - start[:, None]  # [batch, max_len]
    inside = ((offset >= 0) & (offset < s))[:, None, :, None]
    new = jnp.take_along_axis(new, jnp.clip(offset, 0, s - 1)[:, None, :, None], axis=2)
    return jnp.where(inside, new, cache)


class CacheWriter:
    """The model's ``attend(q, k, v)`` hook for generation. Block ``i``'s call writes that
    block's new keys and values into ``cache[i]`` at each row's ``start`` and attends over
    the cache; after the forward pass, ``.cache`` holds the updated cache. A new writer is
    made for each traced step, so it holds no state between calls. ``place`` pins the
    cache's layout."""

    def __init__(self, cache: Cache, start: jax.Array,
                 place: Callable[[jax.Array], jax.Array]) -> None:
        self.old, self.start, self.place = cache, start, place
        self.cache: Cache = []

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        layer = self.old[len(self.cache)]
        k_all, v_all = (self.place(_write(layer[name], new.transpose(0, 2, 1, 3).astype(
            layer[name].dtype), self.start)) for name, new in (("k", k), ("v", v)))
        self.cache.append({"k": k_all, "v": v_all})
        return cached_attention(q, k_all, v_all, start=self.start)


class KeepLast:
    """The model's ``constrain(x, kind)`` hook, passed through, except that after the last
    block's residual stream (the model's ``1 + 2 n_layers``-th ``"residual"``) it keeps only
    position ``last[i]`` of each row ``i`` (the last position if ``last`` is ``None``): the final norm and the output head, a
    ``d_model x vocab`` matmul, then run on one position per row instead of all of them."""

    def __init__(self, constrain: Callable[[jax.Array, str], jax.Array], n_layers: int,
                 last: jax.Array | None) -> None:
        self.constrain, self.left, self.last = constrain, 1 + 2 * n_layers, last

    def __call__(self, x: jax.Array, kind: str) -> jax.Array:
        x = self.constrain(x, kind)
        if kind == "residual":
            self.left -= 1
            if self.left == 0:
                x = self.constrain(x[:, -1:] if self.last is None else
                                   jnp.take_along_axis(x, self.last[:, None, None], axis=1),
                                   "residual")
        return x


def _step(params: Params, tokens: jax.Array, start: jax.Array, cache: Cache,
          last: jax.Array | None, draw: tuple[jax.Array, jax.Array], *,
          constrain: Callable[[jax.Array, str], jax.Array], sampler: sampling.Sampler
          ) -> tuple[jax.Array, jax.Array, Cache]:
    """Feed ``tokens`` (``[batch, s]``, row ``i`` at positions ``start[i] ..``, or all at
    ``start ..`` if it is a scalar) through the
    model with the cache: the next token ``[batch]`` (chosen by ``sampler`` from the logits at
    each row's position ``last[i]`` of ``tokens`` (``None``: the last), with the key of step ``draw = (key,
    t)``), those logits ``[batch, vocab]``, and the new cache. Prefill is this on the prompt
    (``start = 0``), decode on one token."""
    writer = CacheWriter(cache, start, lambda x: constrain(x, "cache"))
    keep = KeepLast(constrain, len(cache), last)
    positions = (start if start.ndim == 0 else start[:, None]) + jnp.arange(tokens.shape[1])
    logits = _forward(params, tokens, positions, keep, writer)[:, 0]
    if keep.left != 0:
        raise AssertionError("the model's forward pass no longer constrains its residual "
                             "stream once per block half; KeepLast must follow it.")
    if not sampler.greedy:  # each row whole where it is drawn: a draw that ignores the layout
        logits = constrain(logits, "whole rows")
    token = sampling.sample(logits, sampling.step_key(*draw), sampler)
    return token, logits, writer.cache


# --------------------------------------------------------------------------- layouts


def _no_constraint(x: jax.Array, kind: str) -> jax.Array:
    return x  # one device: nothing to pin


def strategy_of(strategy: Any) -> Strategy | None:
    """The served :class:`Strategy` named ``strategy`` (or given), ``None`` for one device."""
    if strategy is None:
        return None
    if isinstance(strategy, Strategy):
        strategy = strategy.name
    if isinstance(strategy, str) and strategy in _NOT_SERVED:
        raise checks.InputError(
            f"strategy {strategy!r} cannot run this decode step: {_NOT_SERVED[strategy]}; "
            f"choose one of {', '.join(map(repr, SERVED))}.")
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
    axes), the layouts, and the compiled greedy step (:func:`_step`, cache donated);
    :meth:`stepper` gives the step for another sampler."""

    config: Config
    strategy: Strategy | None
    mesh: Mesh | None
    step: Any

    def spec(self, kind: str) -> P:
        """The layout of ``"cache"`` (each ``[batch, heads, max_len, head_dim]`` array),
        ``"tokens"`` (``[batch, s]``), ``"rows"`` (one value per row, ``[batch]``),
        ``"next"`` (the last position's logits, ``[batch, vocab]``), ``"whole rows"`` (those
        logits with the vocabulary unsplit, as a draw needs them), ``"replicated"``, or of an
        activation (``"residual"``, ``"heads"``, ``"hidden"``, ``"logits"``)."""
        kind = checks.one_of("kind", kind, KINDS)
        if self.strategy is None:
            return P()
        return _specs(self.strategy)[kind]

    def sharding(self, kind: str) -> Any:
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return NamedSharding(self.mesh, self.spec(kind))

    def stepper(self, sampler: sampling.Sampler) -> Any:
        """The compiled step that chooses tokens with ``sampler``."""
        checks.instance("sampler", sampler, sampling.Sampler,
                        example="a Sampler such as sampling.Sampler(0.8) or sampling.GREEDY")
        return _compiled_step(self.config, None if self.strategy is None else
                              self.strategy.name, self.mesh, sampler)

    def constrain(self) -> Callable[[jax.Array, str], jax.Array]:
        """The ``constrain`` hook that pins each kind of activation to its layout."""
        if self.strategy is None:
            return _no_constraint
        acts = {k: NamedSharding(self.mesh, s) for k, s in _specs(self.strategy).items()}
        return lambda x, kind: jax.lax.with_sharding_constraint(x, acts[kind])

    def check_batch(self, batch: int, *, name: str = "batch") -> int:
        """``batch`` if the mesh can split it as the cache's layout asks (``name``: the
        argument the caller passed it as)."""
        batch = checks.count(name, batch)
        if self.mesh is not None:
            checks.spec_fits(name, (batch,), P(self.spec("cache")[0]), self.mesh)
        return batch

    def place_params(self, params: Params) -> Params:
        """``params`` laid out as the strategy lays out parameters. A leaf laid out otherwise
        is placed from the host, as a checkpoint is loaded (resharding it on the devices
        would compile a program per leaf shape). Refuses parameters of another shape than
        ``config``'s."""
        check_params_for(params, self.config)
        targets = (jax.tree.map(lambda _: self.sharding("tokens"), params) if self.mesh is None
                   else self.strategy.shardings(params, self.mesh))

        def place(leaf: Any, target: Any) -> jax.Array:
            if isinstance(leaf, jax.Array) and leaf.sharding == target:
                return leaf
            return jax.device_put(np.asarray(leaf), target)

        return jax.tree.map(place, params, targets)

    def place_tokens(self, tokens: Any) -> jax.Array:
        return jax.device_put(tokens, self.sharding("tokens"))

    def place_key(self, key: jax.Array) -> jax.Array:
        """``key`` on every device of the mesh (a key committed elsewhere would not mix)."""
        return jax.device_put(key, self.sharding("tokens") if self.mesh is None
                              else NamedSharding(self.mesh, P()))

    def feed(self, params: Params, tokens: Any, start: Any, cache: Cache, *,
             last: Any = None, key: Any = None, t: int = 0,
             sampler: sampling.Sampler = sampling.GREEDY
             ) -> tuple[jax.Array, jax.Array, Cache]:
        """One compiled step (prefill or decode): ``tokens`` ``[batch, s]`` (ids in the
        vocabulary) at positions ``start .. start + s - 1`` (one start, or one per row),
        the next token chosen from position ``last`` of each row (default ``s - 1``) by
        ``sampler`` with the key of step ``t``. Refuses positions past the cache's end (the
        step would write nowhere and attend to the wrong keys). The cache is donated: use
        the returned one."""
        tokens = check_prompt(tokens, self.config, name="tokens")
        check_params_for(params, self.config)
        batch, s = tokens.shape
        max_len = check_cache(cache, self.config, batch=batch)
        given = start
        if isinstance(start, (jax.Array, np.ndarray, list, tuple)):
            given = np.ravel(np.asarray(jax.device_get(start), dtype=object))
        values = [checks.count("start", x, minimum=0) for x in np.atleast_1d(given)]
        if len(values) not in (1, batch):
            raise checks.InputError(f"start must be one position or one per row ({batch}), "
                                    f"got {len(values)}.")
        if max(values) + s > max_len:
            raise checks.InputError(
                f"tokens at positions {max(values)}..{max(values) + s - 1} do not fit a cache "
                f"of max_len={max_len}; make the cache with a larger max_len.")
        start = np.int32(values[0]) if len(values) == 1 else np.asarray(values, np.int32)
        if last is not None:
            last = np.asarray([checks.count("last", x, minimum=0, maximum=s - 1)
                               for x in np.ravel(np.asarray(last, dtype=object))], np.int32)
            checks.same_shape("last", last, (batch,), other="one per row of the batch")
        key = jax.random.key(0) if key is None else checks.key("key", key)
        draw = (self.place_key(key), np.int32(checks.count("t", t, minimum=0)))
        return self.stepper(sampler)(params, self.place_tokens(np.asarray(tokens, np.int32)),
                                     start, cache, last, draw)

    def cache_shapes(self, batch: int, max_len: int) -> Cache:
        """The cache as ``jax.ShapeDtypeStruct``s with their shardings: nothing allocated.
        ``batch`` must split over the mesh; ``max_len`` is at most ``config.seq_len``."""
        batch = self.check_batch(batch)
        max_len = check_max_len(self.config, max_len)
        c = self.config
        one = jax.ShapeDtypeStruct((batch, c.n_heads, max_len, c.head_dim),
                                   jnp.dtype(c.dtype), sharding=self.sharding("cache"))
        return [{"k": one, "v": one} for _ in range(c.n_layers)]


def check_cache(cache: Any, config: Config, *, batch: int) -> int:
    """``cache`` must be the cache :func:`init_cache` makes for ``config`` and ``batch``
    rows: a list of ``config.n_layers`` dicts of ``"k"`` and ``"v"`` arrays ``[batch,
    n_heads, max_len, head_dim]``. Returns ``max_len``."""
    want = (f"init_cache(config, batch={batch}, max_len=...)'s cache: a list of "
            f"{config.n_layers} dicts (one per block) of 'k' and 'v' arrays [batch, n_heads, "
            f"max_len, head_dim] = [{batch}, {config.n_heads}, max_len, {config.head_dim}]")
    if not isinstance(cache, list) or not all(isinstance(layer, dict) and set(layer) ==
                                              {"k", "v"} for layer in cache):
        raise checks.InputTypeError(f"cache must be {want}, got {checks.value_text(cache)}.")
    if len(cache) != config.n_layers:
        raise checks.InputError(
            f"cache has {len(cache)} blocks but the model has config.n_layers="
            f"{config.n_layers}: it was made for another config. Pass {want}.")
    shapes = {tuple(checks.array(f"cache[{i}][{n!r}]", layer[n], ndim=4).shape)
              for i, layer in enumerate(cache) for n in ("k", "v")}
    first = next(iter(shapes))
    if len(shapes) != 1 or first[:2] != (batch, config.n_heads) or first[3] != config.head_dim:
        raise checks.InputError(f"cache must be {want}, got arrays of shapes "
                                f"{sorted(shapes)}.")
    return int(first[2])


def check_params_for(params: Params, config: Config) -> None:
    """``params`` must be the pytree ``init_params(key, config)`` makes (the model's check)."""
    checks.array_tree("params", params)
    check_params(params, config)


def fast() -> dict[str, Any] | None:
    """XLA:CPU compiles twice as fast without LLVM's code optimization (same program,
    :data:`spmd_guide.core.hlo.FAST_COMPILE`); on an accelerator, compile in full."""
    return hlo.FAST_COMPILE if jax.default_backend() == "cpu" else None


def _specs(strategy: Strategy) -> dict[str, P]:
    """The strategy's activation layouts, plus the cache's (the per-head activations' batch
    and heads entries), a value per row, the last position's logits, and whole rows."""
    acts = strategy.activation_specs()
    heads, logits = acts["heads"], acts["logits"]
    return acts | {"cache": P(heads[0], heads[2], None, None), "rows": P(heads[0]),
                   "tokens": strategy.token_spec(), "next": P(logits[0], logits[2]),
                   "whole rows": P(logits[0], None), "replicated": P()}


#: The kinds of array :meth:`Server.spec` knows (every strategy has the same ones).
KINDS = ("residual", "heads", "hidden", "logits", "cache", "rows", "tokens", "next",
         "whole rows", "replicated")


@functools.cache
def _compiled_step(config: Config, name: str | None, mesh: Mesh | None,
                   sampler: sampling.Sampler) -> Any:
    plain = Server(config, None if name is None else STRATEGIES[name], mesh, None)
    step = functools.partial(_step, constrain=plain.constrain(), sampler=sampler)
    if mesh is None:
        return jax.jit(step, donate_argnums=3, compiler_options=fast())
    cache = [{"k": plain.sharding("cache"), "v": plain.sharding("cache")}] * config.n_layers
    return jax.jit(step, donate_argnums=3, compiler_options=fast(),
                   out_shardings=(plain.sharding("rows"), plain.sharding("next"), cache))


@functools.cache
def _server(config: Config, name: str | None, mesh: Mesh | None) -> Server:
    return Server(config, None if name is None else STRATEGIES[name], mesh,
                  _compiled_step(config, name, mesh, sampling.GREEDY))


def server(config: Config, *, strategy: Any = None, mesh: Mesh | None = None) -> Server:
    """The :class:`Server` for ``config`` served by ``strategy`` (a name of :data:`SERVED`,
    or ``None`` for one device) on ``mesh`` (default: the strategy's mesh over every
    device). A mesh of Explicit axes is used as its Auto twin: same devices, same names.
    Refuses a strategy it cannot serve and sizes the mesh cannot split."""
    if not isinstance(config, Config):
        raise checks.InputTypeError(f"config must be a Config, got {type(config).__name__}.")
    check_config(config)
    chosen = strategy_of(strategy)
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


def check_max_len(config: Config, max_len: Any) -> int:
    return checks.count("max_len", max_len, maximum=config.seq_len)


def check_length(config: Config, prompt_len: int, steps: int, *,
                 steps_name: str = "steps", prompt_name: str = "prompt") -> int:
    """The cache length a generation needs: ``prompt_len + steps - 1`` positions (the last
    new token is never fed back). The whole sequence, ``prompt_len + steps`` tokens, must fit
    ``config.seq_len``, the positions the model has embeddings for (a token past them has
    no position). ``steps_name`` and ``prompt_name`` are what the caller called them."""
    if prompt_len > config.seq_len - 1:
        raise checks.InputError(
            f"a {prompt_name} of {prompt_len} tokens is longer than the model's "
            f"config.seq_len={config.seq_len} positions leave room for (a new token must "
            f"fit after it); shorten it to at most {config.seq_len - 1} tokens.")
    if prompt_len + steps > config.seq_len:
        raise checks.InputError(
            f"a {prompt_name} of {prompt_len} tokens plus {steps_name}={steps} makes "
            f"{prompt_len + steps} tokens, more than the model's config.seq_len="
            f"{config.seq_len} positions (a token past them has no position to continue "
            f"from); generate at most {config.seq_len - prompt_len} new tokens "
            f"({steps_name}={config.seq_len - prompt_len}).")
    return prompt_len + steps - 1


def init_cache(config: Config, *, batch: int, max_len: int, strategy: Any = None,
               mesh: Mesh | None = None) -> Cache:
    """The empty cache: per block, zero keys ``"k"`` and values ``"v"`` of shape ``[batch,
    n_heads, max_len, head_dim]`` in ``config.dtype``, laid out as ``strategy`` serves them
    on ``mesh`` (one device if no strategy). ``max_len`` is at most ``config.seq_len``, the
    positions the model has embeddings for."""
    srv = server(config, strategy=strategy, mesh=mesh)
    batch = srv.check_batch(batch)
    shapes = srv.cache_shapes(batch, check_max_len(config, max_len))
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


def check_prompt(prompt: Any, config: Config, *, name: str = "prompt") -> np.ndarray:
    """Int tokens ``[batch, prompt_len]`` with ids in ``[0, vocab)`` (on the host), or a
    clear error."""
    if not isinstance(config, Config):
        raise checks.InputTypeError(f"config must be a Config, got {type(config).__name__}.")
    prompt = checks.array(name, prompt, ndim=2, dtype_kind="iu")
    if 0 in prompt.shape:
        raise checks.InputError(f"{name} must hold at least one token per row, got shape "
                                f"{tuple(prompt.shape)}.")
    values = np.asarray(jax.device_get(prompt))
    if values.min() < 0 or values.max() >= config.vocab:
        raise checks.InputError(
            f"{name} token ids must be in [0, vocab) = [0, {config.vocab}), got ids from "
            f"{values.min()} to {values.max()}.")
    return values
