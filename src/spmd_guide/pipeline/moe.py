"""A mixture-of-experts MLP layer, with its experts spread over a mesh axis (expert parallelism).

A **router** scores each token against ``n_experts`` small MLPs (the **experts**); each token
goes to its ``top_k`` best experts, and its output is their outputs weighted by the router's
softmax probabilities. An expert takes at most ``capacity`` token-expert **assignments** per
batch; the rest are **dropped** (the token gets nothing from that expert).

The drop rule here does not depend on the device count, so every mesh gives the same answer:

* one capacity per expert for the whole batch, ``ceil(capacity_factor * tokens * top_k /
  n_experts)``;
* filled in priority order: all first choices before any second choice, and within a choice
  earlier tokens first.

:func:`reference_moe` applies that rule on one device; :func:`moe_layer` runs the same layer
in ``jax.shard_map`` with tokens and experts split over one mesh axis: an ``all_gather`` of
small routing counts gives each assignment its place in the global order, an ``all_to_all``
sends tokens to their experts' devices, and a second ``all_to_all`` brings the outputs back.

Every public function checks its arguments first (:mod:`spmd_guide.core.checks`): counts
must be integers (NumPy's included), the capacity factor a positive finite number (NaN is
refused). The values inside arrays are not inspected: a NaN in ``x`` flows through the layer
as through any JAX program.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.hlo import ring_bytes

Params = dict[str, jax.Array]
Stats = dict[str, jax.Array]


def init_moe(key: Any, *, d_model: int, d_ff: int, n_experts: int) -> Params:
    """Router ``[d_model, n_experts]`` and experts ``w_in [n_experts, d_model, d_ff]``,
    ``w_out [n_experts, d_ff, d_model]`` (float32, scaled by 1/sqrt(fan-in))."""
    key = checks.key("key", key)
    d_model = checks.count("d_model", d_model)
    d_ff = checks.count("d_ff", d_ff)
    n_experts = checks.count("n_experts", n_experts)
    return _init_moe(key, d_model, d_ff, n_experts)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_moe(key: jax.Array, d_model: int, d_ff: int, n_experts: int) -> Params:
    """One compiled program (drawn op by op, the draws compile one small program each)."""
    k_router, k_in, k_out = jax.random.split(key, 3)
    normal = functools.partial(jax.random.normal, dtype=jnp.float32)
    return {
        "router": normal(k_router, (d_model, n_experts)) / math.sqrt(d_model),
        "w_in": normal(k_in, (n_experts, d_model, d_ff)) / math.sqrt(d_model),
        "w_out": normal(k_out, (n_experts, d_ff, d_model)) / math.sqrt(d_ff),
    }


def capacity(tokens: int, *, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Assignments one expert takes per batch: ``ceil(capacity_factor * tokens * top_k /
    n_experts)`` (``capacity_factor`` 1 is an even share).

    Computed in exact fractions, with the factor read as the decimal it prints as: 1.1 x 100
    / 10 is 11, where float arithmetic gives 11.000000000000002 and a ceiling of 12.
    """
    tokens = checks.count("tokens", tokens)
    n_experts = checks.count("n_experts", n_experts)
    top_k = checks.count("top_k", top_k, maximum=n_experts)
    factor = Fraction(repr(_capacity_factor(capacity_factor)))
    return math.ceil(factor * tokens * top_k / n_experts)


# --------------------------------------------------------------------------- input checks


def _capacity_factor(value: Any) -> float:
    """A positive, finite, concrete capacity factor (NaN refused) as a Python float."""
    factor = checks.real("capacity_factor", value, positive=True)
    if not isinstance(factor, float):
        raise checks.InputTypeError(
            "capacity_factor must be a concrete number (it fixes buffer shapes), got a "
            "traced value; pass it as a Python float.")
    return factor


def _routing(value: Any) -> Routing:
    if not isinstance(value, Routing):
        raise checks.InputTypeError(
            f"routing must be the Routing that moe.route returns, got {type(value).__name__}.")
    return value


def _check(params: Any, x: Any, top_k: Any, capacity_factor: Any) -> tuple[int, float]:
    if not isinstance(params, dict) or set(params) != {"router", "w_in", "w_out"}:
        raise checks.InputTypeError(
            "params must be the dict init_moe returns, with keys 'router', 'w_in', 'w_out'; "
            f"got {type(params).__name__}"
            + (f" with keys {sorted(params)}" if isinstance(params, dict) else "") + ".")
    router = checks.array("params['router']", params["router"], ndim=2, dtype_kind="f")
    w_in = checks.array("params['w_in']", params["w_in"], ndim=3, dtype_kind="f")
    w_out = checks.array("params['w_out']", params["w_out"], ndim=3, dtype_kind="f")
    x = checks.array("x", x, ndim=2, dtype_kind="f")
    d_model, n_experts = router.shape
    checks.same_shape("params['w_in']", w_in, (n_experts, d_model, w_in.shape[2]),
                      other="[n_experts, d_model, d_ff] from params['router']")
    checks.same_shape("params['w_out']", w_out, (n_experts, w_in.shape[2], d_model),
                      other="[n_experts, d_ff, d_model] from params['w_in']")
    if x.shape[1] != d_model:
        raise checks.InputError(
            f"x has {x.shape[1]} features (shape {tuple(x.shape)}), but the router expects "
            f"d_model = {d_model}; x must be [tokens, {d_model}].")
    top_k = checks.count("top_k", top_k, maximum=n_experts)
    return top_k, _capacity_factor(capacity_factor)


# --------------------------------------------------------------------------- routing


class Routing(NamedTuple):
    """Where each token goes: for token ``t`` and choice ``j`` (0 = first choice),
    ``expert[t, j]``, its weight ``gate[t, j]``, its place ``position[t, j]`` in that expert's
    queue (in priority order) and whether it is ``kept`` (``position < capacity``).
    A named tuple, so a jitted function can return it."""

    probs: jax.Array     # [tokens, n_experts] router softmax
    expert: jax.Array    # [tokens, top_k] int32
    gate: jax.Array      # [tokens, top_k]
    position: jax.Array  # [tokens, top_k] int32
    kept: jax.Array      # [tokens, top_k] bool


def _choose(router: jax.Array, x: jax.Array, top_k: int
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Router probabilities, and each token's ``top_k`` experts with their probabilities."""
    probs = jax.nn.softmax(x @ router, axis=-1)
    gate, expert = jax.lax.top_k(probs, top_k)
    return probs, expert.astype(jnp.int32), gate


def _exclusive_cumsum(a: jax.Array, axis: int) -> jax.Array:
    return jnp.cumsum(a, axis=axis) - a


def route(params: Params, x: jax.Array, *, top_k: int, capacity_factor: float,
          groups: int = 1) -> Routing:
    """The routing decisions on one device.

    ``groups=1`` is this module's rule (one capacity for the whole batch). ``groups=n`` is
    the per-device rule of GShard-style layers, for comparison: the tokens split into ``n``
    equal groups (one per device), each with its own capacity
    ``ceil(capacity_factor * tokens / n * top_k / n_experts)`` per expert.
    """
    top_k, capacity_factor = _check(params, x, top_k, capacity_factor)
    groups = checks.count("groups", groups)
    tokens, n_experts = x.shape[0], params["router"].shape[1]
    checks.divisible("the number of tokens (dimension 0 of x)", tokens, groups,
                     why="into routing groups")
    cap = capacity(tokens // groups, top_k=top_k, n_experts=n_experts,
                   capacity_factor=capacity_factor)
    return _route(params["router"], x, top_k=top_k, cap=cap, groups=groups)


@functools.partial(jax.jit, static_argnames=("top_k", "cap", "groups"))
def _route(router: jax.Array, x: jax.Array, *, top_k: int, cap: int,
           groups: int) -> Routing:
    """Each assignment's place in its expert's queue: a cumulative count in
    priority order (choice-major, then token), per group of tokens; kept if
    the place is below ``cap``."""
    tokens, n_experts = x.shape[0], router.shape[1]
    size = tokens // groups
    probs, expert, gate = _choose(router, x, top_k)
    hot = jax.nn.one_hot(expert, n_experts, dtype=jnp.int32)   # [t, k, E]
    hot = hot.reshape(groups, size, top_k, n_experts).transpose(0, 2, 1, 3)
    flat = hot.reshape(groups, top_k * size, n_experts)        # in priority
    before = _exclusive_cumsum(flat, axis=1).reshape(hot.shape)
    position = jnp.sum(before * hot, axis=-1)                  # [g, k, t/g]
    position = position.transpose(0, 2, 1).reshape(tokens, top_k)
    return Routing(probs, expert, gate, position, position < cap)


def dropped_at(routing: Routing, capacity_factor: float) -> int:
    """Assignments ``routing`` would drop at another capacity factor: a position in an
    expert's queue does not depend on the capacity, only the cut-off does."""
    tokens, top_k = _routing(routing).expert.shape
    cap = capacity(tokens, top_k=top_k, n_experts=routing.probs.shape[1],
                   capacity_factor=capacity_factor)
    return int(jnp.sum(routing.position >= cap))


def load_balancing_loss(probs: jax.Array, expert: jax.Array) -> jax.Array:
    """Switch-Transformer auxiliary loss ``n_experts * sum_e f_e * p_e``.

    ``f_e``: the share of assignments (before drops) routed to expert ``e``;
    ``p_e``: its mean router probability. 1 when the load is even; larger
    when the router favours a few experts.
    """
    probs = checks.array("probs", probs, ndim=2, dtype_kind="f")
    expert = checks.array("expert", expert, ndim=2, dtype_kind="iu")
    if expert.shape[0] != probs.shape[0]:
        raise checks.InputError(
            f"expert has {expert.shape[0]} tokens (shape {tuple(expert.shape)}) but probs has "
            f"{probs.shape[0]} (shape {tuple(probs.shape)}); both are [tokens, ...].")
    n_experts = probs.shape[-1]
    if not checks.is_traced(expert) and expert.size:
        low, high = int(np.min(expert)), int(np.max(expert))
        if low < 0 or high >= n_experts:
            raise checks.InputError(
                f"expert ids must be in [0, {n_experts}) (probs has {n_experts} experts), got "
                f"ids from {low} to {high}.")
    hot = jax.nn.one_hot(expert, n_experts, dtype=probs.dtype)
    share = jnp.mean(hot, axis=(0, 1))
    return n_experts * jnp.sum(share * jnp.mean(probs, axis=0))


def router_aux_loss(router: jax.Array, x: jax.Array, *, top_k: int) -> jax.Array:
    """:func:`load_balancing_loss` of a router on tokens ``x``, as a function of the router
    weights alone (to differentiate: the top-k choice gives ``f_e`` no gradient, so the
    gradient flows through the mean probabilities ``p_e``)."""
    router = checks.array("router", router, ndim=2, dtype_kind="f")
    x = checks.array("x", x, ndim=2, dtype_kind="f")
    if x.shape[1] != router.shape[0]:
        raise checks.InputError(
            f"x has {x.shape[1]} features (shape {tuple(x.shape)}), but the router expects "
            f"d_model = {router.shape[0]}.")
    top_k = checks.count("top_k", top_k, maximum=router.shape[1])
    probs, expert, _ = _choose(router, x, top_k)
    return load_balancing_loss(probs, expert)


def _stats(kept: jax.Array, expert: jax.Array, n_experts: int, aux: jax.Array) -> Stats:
    per_expert = jnp.sum(jax.nn.one_hot(expert, n_experts, dtype=jnp.int32)
                         * kept[..., None], axis=(0, 1))
    return {"tokens_per_expert": per_expert,
            "dropped": jnp.sum(~kept).astype(jnp.int32),
            "aux_loss": aux,
            "kept": kept}


def _expert_mlp(w_in: jax.Array, w_out: jax.Array, x: jax.Array) -> jax.Array:
    """Expert ``e`` applied to ``x[..., e, :, :]``: ``gelu(x @ w_in[e]) @ w_out[e]``."""
    return jnp.einsum("...esf,efd->...esd",
                      jax.nn.gelu(jnp.einsum("...esd,edf->...esf", x, w_in)), w_out)


def reference_moe(params: Params, x: jax.Array, *, top_k: int,
                  capacity_factor: float) -> tuple[jax.Array, Stats]:
    """The layer on one device. Returns ``(y, stats)``: ``stats`` holds
    ``tokens_per_expert`` (kept assignments per expert), ``dropped`` (assignments dropped),
    ``aux_loss`` (:func:`load_balancing_loss`) and ``kept`` ``[tokens, top_k]``."""
    top_k, capacity_factor = _check(params, x, top_k, capacity_factor)
    cap = capacity(x.shape[0], top_k=top_k, n_experts=params["router"].shape[1],
                   capacity_factor=capacity_factor)
    return _reference(params, x, top_k=top_k, cap=cap)


@functools.partial(jax.jit, static_argnames=("top_k", "cap"))
def _reference(params: Params, x: jax.Array, *, top_k: int, cap: int
               ) -> tuple[jax.Array, Stats]:
    """Written for clarity: every expert on every token, then each token keeps
    its kept assignments, weighted by their gates."""
    r = _route(params["router"], x, top_k=top_k, cap=cap, groups=1)
    n_experts = params["router"].shape[1]
    every = _expert_mlp(params["w_in"], params["w_out"], x[None])  # [E, t, d]
    hot = jax.nn.one_hot(r.expert, n_experts, dtype=x.dtype)       # [t, k, E]
    weight = jnp.sum(hot * (r.gate * r.kept)[..., None], axis=1)   # [t, E]
    y = jnp.einsum("te,etd->td", weight, every)
    aux = load_balancing_loss(r.probs, r.expert)
    return y, _stats(r.kept, r.expert, n_experts, aux)


# --------------------------------------------------------------------------- sharded layer


def dispatch_slots(tokens: int, n_devices: int, *, top_k: int, n_experts: int,
                   capacity_factor: float) -> int:
    """Slots each device reserves per expert in its send buffer ``[n_experts, slots,
    d_model]``: ``min(capacity, tokens / n_devices)``. Under the global rule one device
    may fill an expert's whole capacity, so the buffer must hold that many; a token picks
    an expert at most once, so never more than the device's tokens."""
    cap = capacity(tokens, top_k=top_k, n_experts=n_experts,
                   capacity_factor=capacity_factor)
    n_devices = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    checks.divisible("tokens", tokens, n_devices, why="over the devices")
    checks.divisible("n_experts", n_experts, n_devices,
                     why="over the devices (each device holds n_experts / n_devices experts)")
    return min(cap, tokens // n_devices)


def _global_positions(hot: jax.Array, axis_name: str) -> jax.Array:
    """Each local assignment's place in its expert's queue over the whole batch.

    ``hot`` is this device's assignments, one-hot ``[top_k, tokens/n, E]``.
    Before an assignment come: earlier choices on every device, the same
    choice on earlier devices, and earlier tokens of this device.
    """
    n = jax.lax.axis_size(axis_name)
    counts = jnp.sum(hot, axis=1)                          # [k, E] here
    every = jax.lax.all_gather(counts, axis_name)          # [n, k, E]
    earlier_choices = _exclusive_cumsum(jnp.sum(every, axis=0), axis=0)
    is_earlier = (jnp.arange(n) < jax.lax.axis_index(axis_name)).astype(jnp.int32)
    earlier_devices = jnp.einsum("d,dke->ke", is_earlier, every)
    here = _exclusive_cumsum(hot, axis=1)                  # [k, t, E]
    offset = (earlier_choices + earlier_devices)[:, None, :]
    return jnp.sum((offset + here) * hot, axis=-1).T       # [t, k]


def _local_layer(router: jax.Array, w_in: jax.Array, w_out: jax.Array,
                 x: jax.Array, *, axis_name: str, top_k: int, cap: int,
                 slots: int, tokens: int, token_axes: Any = None) -> tuple[jax.Array, Stats]:
    """One device's part: route its tokens, send them to their experts' devices, run its
    own experts, send the results back, combine. Tokens are split over ``token_axes``
    (default ``axis_name``; a tuple composes axes, :mod:`spmd_guide.pipeline.composed`)."""
    n, d = jax.lax.axis_size(axis_name), x.shape[1]
    token_axes = token_axes or axis_name
    n_experts = router.shape[1]
    probs, expert, gate = _choose(router, x, top_k)
    hot = jax.nn.one_hot(expert, n_experts, dtype=jnp.int32)
    hot = hot.transpose(1, 0, 2)                           # [k, t, E]
    kept = _global_positions(hot, token_axes) < cap        # [t, k]
    # Slot in the send buffer: rank among this device's assignments to the
    # expert. Kept ones come first in priority order: slots 0, 1, ...
    rank = _exclusive_cumsum(hot.reshape(-1, n_experts), axis=0)
    rank = jnp.sum(rank.reshape(hot.shape) * hot, axis=-1).T
    slot = jnp.where(kept, rank, slots)                    # dropped: past end
    send = jnp.zeros((n_experts, slots, d), x.dtype)
    tokens_in = jnp.broadcast_to(x[:, None], (*expert.shape, d))
    send = send.at[expert, slot].set(tokens_in, mode="drop")
    # Dispatch: block i of the experts goes to device i.
    send = send.reshape(n, n_experts // n, slots, d)
    received = jax.lax.all_to_all(send, axis_name, 0, 0)   # [source, E/n, ...]
    out = _expert_mlp(w_in, w_out, received)
    # Combine: results go back to the devices their tokens came from.
    back = jax.lax.all_to_all(out, axis_name, 0, 0).reshape(n_experts, slots, d)
    picked = back.at[expert, slot].get(mode="fill", fill_value=0)  # [t, k, d]
    y = jnp.einsum("tk,tkd->td", gate * kept, picked)
    # Statistics over the whole batch.
    psum = functools.partial(jax.lax.psum, axis_name=token_axes)
    share = psum(jnp.sum(hot, axis=(0, 1))) / (tokens * top_k)
    mean_prob = psum(jnp.sum(probs, axis=0)) / tokens
    stats = {
        "tokens_per_expert": psum(jnp.sum(hot * kept.T[..., None], axis=(0, 1))),
        "dropped": psum(jnp.sum(~kept).astype(jnp.int32)),
        "aux_loss": n_experts * jnp.sum(share * mean_prob),
        "kept": kept,
    }
    return y, stats


def moe_layer(params: Params, x: jax.Array, mesh: Mesh, axis_name: str, *, top_k: int,
              capacity_factor: float) -> tuple[jax.Array, Stats]:
    """The layer with tokens and experts split over mesh axis ``axis_name``.

    ``x: [tokens, d_model]`` is split by rows, the experts' weights by expert; the router is
    replicated. Returns ``(y, stats)`` equal to :func:`reference_moe` (same assignments kept
    and dropped, ``y`` up to float rounding) on any number of devices. ``y`` comes back
    sharded ``P(axis_name)``, ``stats`` replicated. The mesh's axes may be Auto or Explicit
    (``jax.make_mesh``'s default): the inputs are laid out as the layer needs, wherever they
    are.
    """
    top_k, capacity_factor = _check(params, x, top_k, capacity_factor)
    n = checks.axis(mesh, axis_name)
    tokens, n_experts = x.shape[0], params["router"].shape[1]
    checks.divisible("the number of tokens (dimension 0 of x)", tokens, n,
                     why=f"over mesh axis {axis_name!r}")
    checks.divisible("n_experts", n_experts, n, why=f"over mesh axis {axis_name!r}")
    cap = capacity(tokens, top_k=top_k, n_experts=n_experts, capacity_factor=capacity_factor)
    slots = dispatch_slots(tokens, n, top_k=top_k, n_experts=n_experts,
                           capacity_factor=capacity_factor)
    layer = _sharded_layer(mesh, axis_name, top_k=top_k, cap=cap, slots=slots, tokens=tokens)
    return layer(params["router"], params["w_in"], params["w_out"], x)


@functools.cache
def _sharded_layer(mesh: Mesh, axis_name: str, *, top_k: int, cap: int, slots: int,
                   tokens: int) -> Any:
    """The jitted ``shard_map`` of :func:`_local_layer`, built once per configuration."""
    body = functools.partial(_local_layer, axis_name=axis_name, top_k=top_k, cap=cap,
                             slots=slots, tokens=tokens)
    stat_specs = {"tokens_per_expert": P(), "dropped": P(), "aux_loss": P(),
                  "kept": P(axis_name)}
    in_specs = (P(), P(axis_name), P(axis_name), P(axis_name))
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                           out_specs=(P(axis_name), stat_specs))

    def layer(*args: jax.Array) -> tuple[jax.Array, Stats]:
        # On Explicit axes shard_map refuses an input laid out otherwise than its in_spec;
        # device_put lays each out (a no-op where it already is), on either axis type.
        return mapped(*(jax.device_put(a, NamedSharding(mesh, spec))
                        for a, spec in zip(args, in_specs, strict=True)))

    return jax.jit(layer)


# --------------------------------------------------------------------------- costs and pictures


def dispatch_buffer_bytes(tokens: int, n_devices: int, *, top_k: int, n_experts: int,
                          capacity_factor: float, d_model: int, bytes_per_element: int = 4,
                          rule: str = "global") -> int:
    """Bytes of one device's dispatch buffer ``[n_experts, slots, d_model]``.

    ``rule="global"`` is :func:`moe_layer` (``slots`` from :func:`dispatch_slots`);
    ``rule="per_device"`` is a GShard-style layer whose capacity is computed per device,
    ``slots = ceil(capacity_factor * tokens / n_devices * top_k / n_experts)``.
    """
    checks.one_of("rule", rule, ("global", "per_device"))
    n = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    d_model = checks.count("d_model", d_model)
    bytes_per_element = checks.count("bytes_per_element", bytes_per_element)
    checks.divisible("tokens", checks.count("tokens", tokens), n, why="over the devices")
    if rule == "global":
        slots = dispatch_slots(tokens, n, top_k=top_k, n_experts=n_experts,
                               capacity_factor=capacity_factor)
    else:
        slots = capacity(tokens // n, top_k=top_k, n_experts=n_experts,
                         capacity_factor=capacity_factor)
        checks.divisible("n_experts", n_experts, n,
                         why="over the devices (each device holds n_experts / n_devices experts)")
    return n_experts * slots * d_model * bytes_per_element


def all_to_all_bytes(tokens: int, n_devices: int, *, top_k: int, n_experts: int,
                     capacity_factor: float, d_model: int, bytes_per_element: int = 4,
                     rule: str = "global") -> int:
    """Bytes one device sends in one of the layer's all-to-alls: (n-1)/n of its
    :func:`dispatch_buffer_bytes` (one block of the buffer stays on the device)."""
    buffer = dispatch_buffer_bytes(tokens, n_devices, top_k=top_k, n_experts=n_experts,
                                   capacity_factor=capacity_factor, d_model=d_model,
                                   bytes_per_element=bytes_per_element, rule=rule)
    return ring_bytes("all-to-all", buffer, n_devices)


def lowered_all_to_alls(fn: Callable[..., Any], *args: Any) -> list[int]:
    """The ``split_count`` of each all-to-all JAX emits for ``fn`` on ``args``: read from the
    lowered StableHLO (``jax.jit(fn).lower(*args).as_text()``), before XLA compiles it.

    JAX emits one array all-to-all per ``jax.lax.all_to_all``; what the compiled program
    holds is the compiler's choice (XLA:CPU's all-to-all decomposer splits each into a tuple
    of one buffer per destination), so compare this with the compiled ops' ``buffers``.
    """
    checks.function("fn", fn)
    checks.array_tree("args", args)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    text = jitted.lower(*args).as_text()
    return [int(n) for n in
            re.findall(r'"stablehlo\.all_to_all".*?split_count = (\d+)', text)]


def traffic(routing: Routing, n_devices: int) -> np.ndarray:
    """Kept assignments sent from each device (rows: the devices holding the tokens) to each
    device (columns: the devices holding the experts), ``[n_devices, n_devices]``, with
    tokens and experts split evenly over the devices in order, as :func:`moe_layer` does."""
    tokens, n_experts = _routing(routing).probs.shape
    n = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    checks.divisible("the number of tokens", tokens, n, why="over the devices")
    checks.divisible("n_experts", n_experts, n, why="over the devices")
    source = np.arange(tokens)[:, None] // (tokens // n)
    target = np.asarray(routing.expert) // (n_experts // n)
    matrix = np.zeros((n, n), np.int64)
    np.add.at(matrix, (np.broadcast_to(source, target.shape), target),
              np.asarray(routing.kept).astype(np.int64))
    return matrix


def draw_traffic(matrix: Any, *, title: str = "") -> Any:
    """A heat map of :func:`traffic`: a cell per (token device, expert device), its count
    written in it. Returns the matplotlib ``Figure``."""
    import matplotlib.pyplot as plt

    title = checks.text("title", title, empty=True)
    m = np.asarray(checks.array("matrix", matrix, ndim=2, dtype_kind="iu"))
    n = m.shape[0]
    if m.shape != (n, n):
        raise checks.InputError(f"matrix must be square (as traffic returns), got {m.shape}.")
    if m.size and m.min() < 0:
        raise checks.InputError(f"matrix holds counts, which are never negative; got {m.min()}.")
    fig, ax = plt.subplots(figsize=(4.2, 3.8))
    image = ax.imshow(m, cmap="Blues", vmin=0)
    for (i, j), value in np.ndenumerate(m):
        dark = value > 0.6 * max(int(m.max()), 1)
        ax.text(j, i, str(value), ha="center", va="center", fontsize=11,
                color="white" if dark else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("device holding the expert", fontsize=11)
    ax.set_ylabel("device holding the token", fontsize=11)
    ax.tick_params(labelsize=11)
    ax.set_title(title or "assignments sent, token device -> expert device", fontsize=11)
    fig.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=10)
    fig.tight_layout()
    return fig
