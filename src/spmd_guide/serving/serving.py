"""Generating text from the Part IX transformer with a KV cache, on one device or many.

The face of Part XII's code: every name the pages and tests use is importable from here.

* :func:`generate` (the book's contract): prefill, then decode in a loop that runs on the
  device (``jax.lax.while_loop`` with the cache in its carry: one dispatch for the whole
  generation), greedy or sampled (:mod:`~spmd_guide.serving.sampling`), stopping rows at
  ``eos_id``, with prompts of different lengths in one batch;
* :func:`generate_with_logits`: the same from a Python loop, one dispatch per token, and the
  logits each token was chosen from; :func:`recompute_generate`, the reference without a cache;
* the step itself, the cache and the layouts live in :mod:`~spmd_guide.serving.step`,
  continuous batching (:func:`serve`) in :mod:`~spmd_guide.serving.batching`;
* :func:`compiled_step`, :func:`decode_collectives`, :func:`donation_rows`,
  :func:`sharded_row`: what the pages measure.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from spmd_guide.core import checks, hlo
from spmd_guide.serving import sampling
from spmd_guide.serving.batching import serve
from spmd_guide.serving.step import (
    SERVED,
    CacheWriter,
    KeepLast,
    Server,
    _step,
    cache_bytes,
    cached_attention,
    check_length,
    check_max_len,
    check_params_for,
    check_prompt,
    fast,
    init_cache,
    server,
    strategy_of,
)
from spmd_guide.transformer.lm import Config, Params, check_config, forward, param_shapes
from spmd_guide.transformer.transformer import STRATEGIES

__all__ = ["SERVED", "STRATEGIES", "CacheWriter", "Config", "KeepLast", "Server",
           "abstract_params", "cache_bytes", "cached_attention", "check_length",
           "check_prompt", "compiled_step", "decode_collectives", "dispatches", "LAUNCHES",
           "donation_rows", "generate", "generate_with_logits", "init_cache", "plan",
           "recompute_generate", "serve", "server", "sharded_row", "step_args"]


# --------------------------------------------------------------------------- the checks


def _lengths(prompt_lengths: Any, prompt: np.ndarray) -> np.ndarray:
    batch, width = prompt.shape
    if prompt_lengths is None:
        return np.full((batch,), width, np.int32)
    lengths = checks.array("prompt_lengths", prompt_lengths, ndim=1, dtype_kind="iu")
    checks.same_shape("prompt_lengths", lengths, (batch,), other="one per prompt row")
    values = np.asarray(jax.device_get(lengths))
    for i, n in enumerate(values):
        if not 1 <= n <= width:
            raise checks.InputError(
                f"prompt_lengths[{i}] is {n}: a prompt length must be at least 1 and at most "
                f"the prompt's {width} columns.")
    return values.astype(np.int32)


def _token_id(name: str, value: Any, vocab: int) -> int:
    return checks.count(name, value, minimum=0, maximum=vocab - 1)


@dataclass(frozen=True)
class Plan:
    """A checked generation: the server, placed parameters, the prompt trimmed to its longest
    row (``width`` columns), each row's length, the cache length, the sampler and its key."""

    srv: Server
    params: Params
    prompt: np.ndarray
    lengths: np.ndarray
    steps: int
    max_len: int
    sampler: sampling.Sampler
    key: jax.Array
    eos_id: int | None
    pad_id: int
    out_width: int

    @property
    def ragged(self) -> bool:
        return bool(np.any(self.lengths != self.lengths[0]))

    @property
    def last(self) -> np.ndarray | None:
        """Where each row's prompt ends (``None``: all at the last column)."""
        return self.lengths - 1 if self.ragged else None

    def starts(self, t: Any) -> Any:
        """Where step ``t``'s token goes: one position per row if the prompts differ in
        length, else one position for all (a cheaper write, see :func:`step._write`)."""
        return self.lengths + t - 1 if self.ragged else self.lengths[0] + t - 1

    def assemble(self, new: np.ndarray) -> jax.Array:
        """Output rows: each prompt, its ``steps`` new tokens, then ``pad_id``."""
        out = np.full((len(self.lengths), self.out_width), self.pad_id, np.int32)
        for i, n in enumerate(self.lengths):
            out[i, :n] = self.prompt[i, :n]
            out[i, n:n + self.steps] = new[i]
        return jnp.asarray(out)


def plan(params: Params, prompt: Any, *, config: Config, steps: int, strategy: Any = None,
         mesh: Mesh | None = None, temperature: Any = 0.0, top_k: Any = None,
         top_p: Any = None, key: Any = None, eos_id: Any = None, prompt_lengths: Any = None,
         pad_id: Any = 0) -> Plan:
    """Every check :func:`generate` makes, before anything runs."""
    srv = server(config, strategy=strategy, mesh=mesh)
    prompt = check_prompt(prompt, config)
    steps = checks.count("steps", steps)
    lengths = _lengths(prompt_lengths, prompt)
    chosen = sampling.sampler(temperature=temperature, top_k=top_k, top_p=top_p, key=key,
                              vocab=config.vocab)
    key = (sampling.check_key(key, batch=prompt.shape[0]) if key is not None
           else jax.random.key(0))
    eos_id = None if eos_id is None else _token_id("eos_id", eos_id, config.vocab)
    pad_id = _token_id("pad_id", pad_id, config.vocab)
    width = int(lengths.max())
    max_len = check_length(config, width, steps)
    srv.check_batch(prompt.shape[0], name="the prompt's rows")
    return Plan(srv, srv.place_params(params), prompt[:, :width], lengths, steps, max_len,
                chosen, srv.place_key(key), eos_id, pad_id, prompt.shape[1] + steps)


# --------------------------------------------------------------------------- generation


def generate(params: Params, prompt: Any, *, config: Config, steps: int, strategy: Any = None,
             mesh: Mesh | None = None, temperature: Any = 0.0, top_k: Any = None,
             top_p: Any = None, key: Any = None, eos_id: Any = None,
             prompt_lengths: Any = None, pad_id: Any = 0) -> jax.Array:
    """``steps`` new tokens after ``prompt`` (int ``[batch, prompt_len]``) with a KV cache:
    ``[batch, prompt_len + steps]`` int32.

    * ``temperature`` 0 is greedy; above 0 it samples (``key`` needed) from the softmax of
      ``logits / temperature`` cut to the ``top_k`` likeliest tokens and/or the smallest set
      reaching probability ``top_p``. The same key gives the same tokens on one device and
      under every served ``strategy`` (a name of :data:`SERVED`) on ``mesh``, as long as
      their logits agree (they differ in the last bits). ``key`` is one key, or one per
      prompt row (a ``[batch]`` key array, e.g. ``jax.random.split(key, batch)``): then row
      ``i`` draws exactly what its prompt would draw alone with the single key ``key[i]``.
    * ``eos_id``: every position after a row's first new ``eos_id`` is ``eos_id``; the loop
      stops once every row has one.
    * ``prompt_lengths`` (int ``[batch]``): row ``i``'s prompt is ``prompt[i, :n_i]``; its
      output row is that prompt, its ``steps`` new tokens, then ``pad_id``.

    The loop runs on the device: prefill and every decode step are one program
    (:func:`_device_program`), dispatched once."""
    p = plan(params, prompt, config=config, steps=steps, strategy=strategy, mesh=mesh,
             temperature=temperature, top_k=top_k, top_p=top_p, key=key, eos_id=eos_id,
             prompt_lengths=prompt_lengths, pad_id=pad_id)
    program = _device_program(p.srv, p.sampler, p.steps, p.eos_id, p.max_len, p.ragged)
    LAUNCHES["device loop"] += 1
    new, _ = program(p.params, p.srv.place_tokens(np.asarray(p.prompt, np.int32)),
                     p.lengths, p.key)  # lengths: unused, so not passed, when not ragged
    return p.assemble(np.asarray(new))


@functools.cache
def _device_program(srv: Server, sampler: sampling.Sampler, steps: int, eos_id: int | None,
                    max_len: int, ragged: bool) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """Prefill, then up to ``steps - 1`` decode steps in a ``jax.lax.while_loop`` whose carry
    holds the cache (made inside, ``max_len`` positions): one compiled program. Returns the
    new tokens ``[batch, steps]`` and the steps run (fewer once every row met ``eos_id``)."""
    constrain = srv.constrain()
    step = functools.partial(_step, constrain=constrain, sampler=sampler)

    def run(params: Params, prompt: jax.Array, lengths: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
        batch = prompt.shape[0]
        cache = [{name: constrain(jnp.zeros(s.shape, s.dtype), "cache") for name, s in
                  layer.items()} for layer in srv.cache_shapes(batch, max_len)]
        token, _, cache = step(params, prompt, jnp.int32(0), cache,
                               lengths - 1 if ragged else None, (key, 0))
        out = jnp.full((batch, steps), 0 if eos_id is None else eos_id, jnp.int32)
        out = out.at[:, 0].set(token)
        done = jnp.zeros((batch,), bool) if eos_id is None else token == eos_id

        def more(carry: tuple[Any, ...]) -> jax.Array:
            return (carry[0] < steps) & ~jnp.all(carry[-1])

        def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            t, out, token, cache, done = carry
            start = lengths + t - 1 if ragged else lengths[0] + t - 1
            token, _, cache = step(params, token[:, None], start, cache, None, (key, t))
            if eos_id is not None:
                token = jnp.where(done, eos_id, token)
                done = done | (token == eos_id)
            out = jax.lax.dynamic_update_index_in_dim(out, token, t, 1)
            return t + 1, out, token, cache, done

        t, out, *_ = jax.lax.while_loop(more, body, (jnp.int32(1), out, token, cache, done))
        return out, t

    return jax.jit(run, compiler_options=fast())


def generate_with_logits(params: Params, prompt: Any, *, config: Config, steps: int,
                         strategy: Any = None, mesh: Mesh | None = None,
                         temperature: Any = 0.0, top_k: Any = None, top_p: Any = None,
                         key: Any = None, eos_id: Any = None, prompt_lengths: Any = None,
                         pad_id: Any = 0) -> tuple[jax.Array, jax.Array]:
    """:func:`generate` from a Python loop (one prefill, then a dispatch per decode step,
    each donating the cache), and the logits each new token was chosen from, ``[batch,
    steps_run, vocab]`` (``steps_run`` < ``steps`` when every row stopped at ``eos_id``)."""
    p = plan(params, prompt, config=config, steps=steps, strategy=strategy, mesh=mesh,
             temperature=temperature, top_k=top_k, top_p=top_p, key=key, eos_id=eos_id,
             prompt_lengths=prompt_lengths, pad_id=pad_id)
    srv, batch = p.srv, len(p.lengths)
    cache = init_cache(srv.config, batch=batch, max_len=p.max_len, strategy=srv.strategy,
                       mesh=srv.mesh)
    step = srv.stepper(p.sampler)
    LAUNCHES["python loop"] += 1
    token, logits, cache = step(p.params, srv.place_tokens(np.asarray(p.prompt, np.int32)),
                                np.int32(0), cache, p.last, (p.key, np.int32(0)))
    tokens, all_logits = [np.asarray(token)], [logits]
    done = tokens[0] == p.eos_id
    for t in range(1, p.steps):
        if p.eos_id is not None and done.all():
            break
        LAUNCHES["python loop"] += 1
        token, logits, cache = step(p.params, srv.place_tokens(tokens[-1][:, None]),
                                    p.starts(t), cache, None, (p.key, np.int32(t)))
        token = np.asarray(token)
        if p.eos_id is not None:
            token = np.where(done, p.eos_id, token)
            done |= token == p.eos_id
        tokens.append(token)
        all_logits.append(logits)
    new = np.full((batch, p.steps), 0 if p.eos_id is None else p.eos_id, np.int32)
    new[:, :len(tokens)] = np.stack(tokens, axis=1)
    return p.assemble(new), jnp.asarray(np.stack([np.asarray(x) for x in all_logits], axis=1))


#: Launches of the model's compiled programs from Python, by loop (see :func:`dispatches`).
LAUNCHES: Counter[str] = Counter()


def dispatches(params: Params, prompt: Any, *, config: Config, steps: int,
               **options: Any) -> dict[str, Any]:
    """Both loops on the same input (``options`` as :func:`generate` takes them): how many
    times each launches one of the model's compiled programs from Python for the whole
    generation (the cache's allocation and the tokens' transfers aside), and whether their
    tokens agree."""
    allowed = {"strategy", "mesh", "temperature", "top_k", "top_p", "key", "eos_id",
               "prompt_lengths", "pad_id"}
    if set(options) - allowed:
        raise checks.InputError(
            f"unknown options {sorted(set(options) - allowed)}; dispatches takes generate's "
            f"options: {', '.join(sorted(allowed))}.")
    LAUNCHES.clear()
    python = generate_with_logits(params, prompt, config=config, steps=steps, **options)[0]
    device = generate(params, prompt, config=config, steps=steps, **options)
    return {"python loop": LAUNCHES["python loop"], "device loop": LAUNCHES["device loop"],
            "same tokens": bool(np.array_equal(np.asarray(python), np.asarray(device)))}


@functools.cache
def _recompute_step() -> Callable[..., tuple[jax.Array, jax.Array]]:
    """One step of the reference: the buffer through the model, the logits of the position
    before ``position``, and the buffer with their argmax written at ``position``.
    ``position`` is traced, so every step runs the same compiled program."""
    def step(params: Params, tokens: jax.Array, position: jax.Array
             ) -> tuple[jax.Array, jax.Array]:
        logits = jax.lax.dynamic_index_in_dim(forward(params, tokens[:, :-1]), position - 1,
                                              axis=1, keepdims=False)
        new = jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]
        return logits, jax.lax.dynamic_update_slice_in_dim(tokens, new, position, axis=1)
    return jax.jit(step, compiler_options=fast())


def recompute_generate(params: Params, prompt: Any, *, config: Config, steps: int
                       ) -> tuple[jax.Array, jax.Array]:
    """The greedy reference without a cache, on one device: for each new token, run the
    model on the whole sequence so far and take the last position's argmax. (One compiled
    program on a ``[batch, prompt_len + steps - 1]`` buffer: by causality the logits at a
    position do not depend on the unfilled slots after it.) Returns tokens and logits as
    :func:`generate_with_logits` does. Makes the checks :func:`generate` makes."""
    prompt = check_prompt(prompt, config)
    check_config(config)
    check_params_for(params, config)
    steps = checks.count("steps", steps)
    batch, prompt_len = prompt.shape
    total = check_length(config, prompt_len, steps) + 1
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
    if srv.config != config:
        raise checks.InputError(
            f"srv serves another config ({srv.config}) than config ({config}); make it with "
            "server(config, strategy=..., mesh=...).")
    dtype = jnp.dtype(config.dtype)
    shapes = jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape, dtype), param_shapes(config),
                          is_leaf=lambda x: isinstance(x, tuple))
    shardings = (jax.tree.map(lambda _: srv.sharding("tokens"), shapes) if srv.mesh is None
                 else srv.strategy.shardings(shapes, srv.mesh))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)


def step_args(srv: Server, *, batch: int, length: int, max_len: int) -> tuple[Any, ...]:
    """Abstract arguments of ``srv``'s step: ``batch`` rows of ``length`` tokens, all at one
    position, into a cache of ``max_len`` positions."""
    if not isinstance(srv, Server):
        raise checks.InputTypeError(
            f"srv must be a Server from server(config, strategy=..., mesh=...), got "
            f"{checks.value_text(srv)}.")
    batch = srv.check_batch(batch)
    max_len = check_max_len(srv.config, max_len)
    length = checks.count("length", length, maximum=max_len)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    return (abstract_params(srv.config, srv),
            jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=srv.sharding("tokens")),
            scalar, srv.cache_shapes(batch, max_len), None, (jax.ShapeDtypeStruct((), jax.random.key(0).dtype), scalar))


def compiled_step(config: Config, *, batch: int, length: int, max_len: int,
                  strategy: Any = None, mesh: Mesh | None = None) -> jax.stages.Compiled:
    """The greedy serving step compiled for ``batch`` sequences feeding ``length`` tokens
    each (the prompt for prefill, 1 for decode) into a cache of ``max_len`` positions, laid
    out as ``strategy`` serves them on ``mesh``. Compiled for abstract arrays: nothing runs."""
    srv = server(config, strategy=strategy, mesh=mesh)
    batch = srv.check_batch(batch)
    max_len = check_max_len(config, max_len)
    length = checks.count("length", length, maximum=max_len)
    return hlo.compile(srv.step, *step_args(srv, batch=batch, length=length, max_len=max_len),
                       compiler_options=fast())


def decode_collectives(config: Config, *, strategy: str, n_devices: int, batch: int,
                       max_len: int | None = None) -> dict[str, int]:
    """The collectives of one decode step of ``strategy`` on the first ``n_devices`` devices
    (kind -> count, kinds that occur only), with a cache of ``max_len`` positions (default
    ``config.seq_len``)."""
    chosen = strategy_of(strategy)
    if chosen is None:
        raise checks.InputError("decode_collectives needs a strategy (one device has none).")
    n = checks.count("n_devices", n_devices, maximum=len(jax.devices()))
    config = check_config(config)
    max_len = config.seq_len if max_len is None else max_len
    compiled = compiled_step(config, batch=batch, length=1, max_len=max_len,
                             strategy=strategy, mesh=chosen.mesh(jax.devices()[:n]))
    return {k: n for k, n in hlo.count_kinds(hlo.collectives_in_text(compiled.as_text())).items()
            if n}


def donation_rows(config: Config, *, batch: int, max_len: int) -> list[dict[str, Any]]:
    """The memory of one decode step on one device, compiled twice: with the cache donated
    (as :func:`generate` runs it) and without. Bytes: arguments, outputs, outputs aliased to
    donated arguments (written in place), temporaries."""
    srv = server(config)
    batch = srv.check_batch(batch)
    args = step_args(srv, batch=batch, length=1, max_len=check_max_len(config, max_len))
    kept = jax.jit(functools.partial(_step, constrain=srv.constrain(), sampler=sampling.GREEDY))
    rows = []
    for label, fn in (("cache donated", srv.step), ("not donated", kept)):
        mem = hlo.memory_per_device(hlo.compile(fn, *args, compiler_options=fast()))
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
    if strategy_of(strategy) is None:
        raise checks.InputError("sharded_row needs a strategy (a name of SERVED) and a mesh.")
    if not isinstance(reference, (tuple, list)) or len(reference) != 2:
        raise checks.InputTypeError("reference must be one device's (tokens, logits) from "
                                    "generate_with_logits.")
    p = plan(params, prompt, config=config, steps=steps, strategy=strategy, mesh=mesh)
    batch = len(p.lengths)
    for name, theirs, shape in (("tokens", reference[0], (batch, p.out_width)),
                                ("logits", reference[1], (batch, p.steps, config.vocab))):
        checks.same_shape(f"reference's {name}", checks.array(f"reference's {name}", theirs),
                          shape, other="this generation")
    tokens, logits = generate_with_logits(params, prompt, config=config, steps=steps,
                                          strategy=strategy, mesh=mesh)
    srv = server(config, strategy=strategy, mesh=mesh)
    batch, total = tokens.shape
    cache = init_cache(config, batch=batch, max_len=total - 1, strategy=strategy, mesh=srv.mesh)
    placed = srv.place_params(params)
    held = max(sum(s.data.nbytes for leaf in jax.tree.leaves(placed)
                   for s in leaf.addressable_shards if s.device == d)
               for d in srv.mesh.devices.flat)
    # The decode step generate just ran (the same arguments, so JAX's cache has it).
    rows = np.zeros((batch,), np.int32)
    ops = hlo.collectives_in_text(srv.step.lower(
        placed, srv.place_tokens(rows[:, None]), np.int32(0), cache, None,
        (srv.place_key(jax.random.key(0)), np.int32(0))).compile())
    kinds = {k: n for k, n in hlo.count_kinds(ops).items() if n}
    return {"strategy": strategy,
            "mesh": " x ".join(f"{k}={v}" for k, v in srv.mesh.shape.items()),
            "same tokens": bool(np.array_equal(np.asarray(tokens), np.asarray(reference[0]))),
            "max |logit diff|": f"{np.max(np.abs(np.asarray(logits) - np.asarray(reference[1]))):.1e}",
            "cache / device": cache_bytes(cache)["per device"], "params / device": held,
            "collectives per decode step": ", ".join(f"{n} {k}" for k, n in kinds.items())
            or "none", "sent per decode step": sum(op.bytes_sent for op in ops)}
