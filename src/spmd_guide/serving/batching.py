"""Continuous batching: a queue of requests through a fixed number of cache slots.

A server holds one KV cache of ``slots`` rows and runs one decode step for all of them at
a time. *Static* batching takes ``slots`` requests, generates until the last of them is done,
and only then takes the next ``slots``: a request that stops early leaves its row idle. *Continuous*
batching (Orca's iteration-level scheduling; vLLM, JetStream and MaxText's engines serve this
way) gives a finished request's slot to the next request in the queue at once: the next
step prefills it into that row while the other rows keep their caches.

Every program has a fixed shape, so the number of compiled programs does not grow with the
number of requests: one prefill of ``slots`` rows (the prompts right-padded to the longest
one; rows not being refilled keep their cache) and one decode step (each row at its own
position). Their shapes follow the longest request and ``max_new_tokens`` (the cache holds
``longest + max_new_tokens - 1`` positions), so another of either compiles them again.

Each prefill here runs every slot's row, a whole step: it costs about a decode step, so
continuous batching's extra prefills can outweigh the idle rows it saves
(:func:`throughput_rows` prices both). Chunked prefill (Sarathi-Serve) makes refills cheap.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from spmd_guide.core import checks
from spmd_guide.serving import sampling
from spmd_guide.serving.step import (
    Cache,
    Server,
    _step,
    check_length,
    check_prompt,
    fast,
    init_cache,
    server,
)
from spmd_guide.transformer.lm import Config, Params

__all__ = ["COMPILE_EVENT", "Run", "check_requests", "compiled_programs", "run", "serve",
           "throughput_rows"]

#: The event JAX records once per program it compiles (jax/_src/dispatch.py).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclass
class Run:
    """What a serve did: each request's new tokens, the prefill and decode steps it took,
    and per decode step the rows that made a token a request kept."""

    outputs: list[list[int]]
    prefills: int = 0
    decode_steps: int = 0
    busy: list[int] = field(default_factory=list)

    @property
    def tokens_per_decode_step(self) -> float:
        return sum(self.busy) / max(self.decode_steps, 1)

    @property
    def tokens(self) -> int:
        """Every new token, the ones prefills made included."""
        return sum(len(o) for o in self.outputs)

    def priced_tokens_per_s(self, *, decode_s: float, prefill_s: float) -> float:
        """All the tokens over the time of every step: ``prefills * prefill_s +
        decode_steps * decode_s`` seconds."""
        return self.tokens / (self.prefills * prefill_s + self.decode_steps * decode_s)


def check_requests(requests: Any, config: Config) -> list[list[int]]:
    """A non-empty sequence of prompts, each a non-empty sequence of ids in ``[0, vocab)``."""
    if isinstance(requests, (str, bytes, dict)) or not hasattr(requests, "__len__"):
        raise checks.InputTypeError(
            f"requests must be a list of prompts (lists of token ids), got "
            f"{checks.value_text(requests)}.")
    if len(requests) == 0:
        raise checks.InputError("requests is empty: pass at least one prompt.")
    out = []
    for i, request in enumerate(requests):
        if isinstance(request, (str, bytes)) or not hasattr(request, "__len__"):
            raise checks.InputTypeError(
                f"requests[{i}] must be a list of token ids, got {checks.value_text(request)}.")
        if len(request) == 0:
            raise checks.InputError(f"requests[{i}] is empty: a prompt needs at least one token.")
        row = checks.array(f"requests[{i}]", request, ndim=1, dtype_kind="iu")
        ids = check_prompt(np.asarray(row)[None], config, name=f"requests[{i}]")
        out.append([int(x) for x in ids[0]])
    return out


@functools.cache
def _prefill(srv: Server) -> Callable[..., tuple[jax.Array, Cache]]:
    """The prefill of a whole batch of slots, of which only the ``fresh`` rows are written:
    the others keep their cache (a select, done in place in the donated cache)."""
    step = functools.partial(_step, constrain=srv.constrain(), sampler=sampling.GREEDY)

    def prefill(params: Params, tokens: jax.Array, lengths: jax.Array, cache: Cache,
                fresh: jax.Array) -> tuple[jax.Array, Cache]:
        token, _, new = step(params, tokens, jnp.int32(0), cache, lengths - 1,
                             (jax.random.key(0), 0))
        keep = fresh[:, None, None, None]
        return token, jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, cache)

    return jax.jit(prefill, donate_argnums=3, compiler_options=fast())


def run(params: Params, requests: Any, *, config: Config, max_new_tokens: int, slots: int,
        strategy: Any = None, mesh: Mesh | None = None, eos_id: Any = None,
        policy: str = "continuous") -> Run:
    """Greedy generation of every request through ``slots`` cache slots. ``policy``
    ``"continuous"`` refills a slot as soon as its request is done; ``"static"`` refills only
    when every slot is done (static batching). A request is done after ``eos_id`` (kept) or
    ``max_new_tokens`` new tokens."""
    srv = server(config, strategy=strategy, mesh=mesh)
    reqs = check_requests(requests, config)
    limit = checks.count("max_new_tokens", max_new_tokens)
    slots = srv.check_batch(slots, name="slots")
    eos = None if eos_id is None else checks.count("eos_id", eos_id, minimum=0,
                                                   maximum=config.vocab - 1)
    policy = checks.one_of("policy", policy, ("continuous", "static"))
    width = max(len(r) for r in reqs)
    max_len = check_length(config, width, limit, steps_name="max_new_tokens",
                           prompt_name="longest request")
    params = srv.place_params(params)
    cache = init_cache(config, batch=slots, max_len=max_len, strategy=srv.strategy,
                       mesh=srv.mesh)
    out = Run([[] for _ in reqs])
    queue, owner = deque(range(len(reqs))), [None] * slots
    position, last = np.zeros(slots, np.int32), np.zeros(slots, np.int32)
    draw = (srv.place_key(jax.random.key(0)), np.int32(0))

    def take(slot: int, token: int) -> None:
        mine = out.outputs[owner[slot]]
        mine.append(token)
        if token == eos or len(mine) == limit:
            owner[slot] = None
            position[slot] = 0

    while queue or any(o is not None for o in owner):
        free = [s for s in range(slots) if owner[s] is None]
        if queue and free and (policy == "continuous" or len(free) == slots):
            tokens = np.zeros((slots, width), np.int32)
            lengths, fresh = np.ones(slots, np.int32), np.zeros(slots, bool)
            for s in free[:len(queue)]:
                owner[s] = queue.popleft()
                prompt = reqs[owner[s]]
                tokens[s, :len(prompt)], lengths[s], fresh[s] = prompt, len(prompt), True
            token, cache = _prefill(srv)(params, srv.place_tokens(tokens), lengths, cache,
                                         fresh)
            out.prefills += 1
            token = np.asarray(token)
            for s in np.flatnonzero(fresh):
                position[s], last[s] = lengths[s], token[s]
                take(s, int(token[s]))
            continue
        busy = [s for s in range(slots) if owner[s] is not None]
        token, _, cache = srv.step(params, srv.place_tokens(last[:, None]), position, cache,
                                   None, draw)
        out.decode_steps += 1
        out.busy.append(len(busy))
        token = np.asarray(token)
        for s in busy:
            position[s] += 1
            last[s] = token[s]
            take(s, int(token[s]))
    return out


def serve(params: Params, requests: Any, *, config: Config, max_new_tokens: int, slots: int,
          strategy: Any = None, mesh: Mesh | None = None, eos_id: Any = None
          ) -> list[list[int]]:
    """Continuous batching of ``requests`` (prompts as lists of token ids) through ``slots``
    cache slots, greedy: each request's new tokens, up to and including ``eos_id`` or
    ``max_new_tokens`` of them, equal to generating that request alone. Compiles one prefill
    and one decode program however many requests there are (the cache's length, and so the
    programs, follow the longest request and ``max_new_tokens``)."""
    return run(params, requests, config=config, max_new_tokens=max_new_tokens, slots=slots,
               strategy=strategy, mesh=mesh, eos_id=eos_id).outputs


def compiled_programs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``fn(*args, **kwargs)`` and the number of programs XLA compiled while it ran (JAX's
    compile event, counted by a listener)."""
    count = 0

    def listen(event: str, duration: float, **_: Any) -> None:
        nonlocal count
        count += event == COMPILE_EVENT

    checks.function("fn", fn)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        result = fn(*args, **kwargs)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return result, count


def throughput_rows(runs: dict[str, Run], *, decode_s: float, prefill_s: float,
                    chip: str) -> list[dict[str, Any]]:
    """One table row per run: its prefill and decode steps, the tokens a decode step made
    for requests (measured), and two predictions of the tokens per second per chip on
    ``chip``, from a roofline's ``decode_s`` seconds per decode step and ``prefill_s`` per
    prefill step: decode steps alone (the tokens decode steps made over their time), and
    every step priced (all the tokens, the prefills' first ones included, over the time of
    the prefills and the decode steps)."""
    decode_s = checks.real("decode_s", decode_s, positive=True)
    prefill_s = checks.real("prefill_s", prefill_s, positive=True)
    checks.text("chip", chip)
    if not isinstance(runs, dict) or not runs:
        raise checks.InputTypeError("runs must map labels to Runs from run(...).")
    rows = []
    for label, r in runs.items():
        if not isinstance(r, Run):
            raise checks.InputTypeError(f"runs[{label!r}] must be a Run from run(...).")
        rows.append({"batching": label, "prefill steps": r.prefills,
                     "decode steps": r.decode_steps,
                     "tokens per decode step (measured)": f"{r.tokens_per_decode_step:.2f}",
                     f"tokens/s, decode only ({chip}, predicted)":
                         f"{r.tokens_per_decode_step / decode_s:,.0f}",
                     f"tokens/s, all steps ({chip}, predicted)":
                         f"{r.priced_tokens_per_s(decode_s=decode_s, prefill_s=prefill_s):,.0f}"})
    return rows
