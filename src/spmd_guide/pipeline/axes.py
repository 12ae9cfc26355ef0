"""Composing the five parallelism axes: the bytes each one moves per training step.

A large model's mesh has up to five axes: ``data``, ``fsdp``, ``pipeline``, ``tensor`` and
``expert``. Each moves a different kind of data, at a different rate:

==========  ====================================================  ==========================
axis        what it moves, per device and step                    collectives
==========  ====================================================  ==========================
data        its share of the gradients, once                      all-reduce
fsdp        its slice of the parameters, gathered (twice with      all-gather, reduce-scatter
            remat) and the gradients scattered, once per layer
pipeline    activations forward and their gradients backward,     collective-permute
            at each stage boundary, per microbatch
tensor      activations of every layer (2 all-reduces forward,    all-reduce
            2 backward, Megatron-style)
expert      tokens to their experts and back (2 all-to-alls      all-to-all (+ all-reduce)
            forward, 2 backward) per MoE layer; the dense
            gradients, once
==========  ====================================================  ==========================

:func:`traffic` turns those rules into numbers with the ring model of
:func:`spmd_guide.core.hlo.ring_bytes`; :func:`place_axes` puts the axes that move the most
bytes on the fast links inside a node. The small programs at the end (``*_program``) do one
axis's collective on a real mesh (Auto or Explicit axes), so the formulas can be checked
against the compiled HLO. :func:`mixtral_params` counts a published Mixtral configuration,
to compare with the simpler :class:`Model`.

Arguments are checked first (:mod:`spmd_guide.core.checks`): counts are integers (NumPy's
included), bandwidths and the capacity factor positive finite numbers (NaN refused).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.hlo import ring_bytes
from spmd_guide.pipeline import moe

AXES = ("data", "fsdp", "pipeline", "tensor", "expert")


# --------------------------------------------------------------------------- one axis each


def _bytes_and_n(name: str, buffer_bytes: Any, n: Any) -> tuple[int, int]:
    """A byte count (0 allowed) and a device count, checked under the caller's names."""
    return (checks.count(name, buffer_bytes, minimum=0),
            checks.count("n", n, maximum=checks.MAX_DEVICES))


def data_bytes(grad_bytes: int, n: int) -> int:
    """Data parallelism: one all-reduce of the gradients a device holds."""
    grad_bytes, n = _bytes_and_n("grad_bytes", grad_bytes, n)
    return ring_bytes("all-reduce", grad_bytes, n)


def fsdp_bytes(param_bytes: int, n: int, *, gathers: int = 2) -> int:
    """FSDP: ``gathers`` all-gathers of the parameters (forward, and again in the backward
    pass with remat) and one reduce-scatter of the gradients; ``param_bytes`` is the full
    (gathered) size."""
    gathers = checks.count("gathers", gathers, minimum=0)
    param_bytes, n = _bytes_and_n("param_bytes", param_bytes, n)
    return (gathers * ring_bytes("all-gather", param_bytes, n)
            + ring_bytes("reduce-scatter", param_bytes, n))


def tensor_bytes(activation_bytes: int, n: int, *, all_reduces: int) -> int:
    """Tensor parallelism: ``all_reduces`` all-reduces of an activation ``[tokens, d_model]``."""
    all_reduces = checks.count("all_reduces", all_reduces, minimum=0)
    activation_bytes, n = _bytes_and_n("activation_bytes", activation_bytes, n)
    return all_reduces * ring_bytes("all-reduce", activation_bytes, n)


def pipeline_bytes(activation_bytes: int, n: int, *, sends: int) -> int:
    """Pipeline parallelism: ``sends`` collective-permutes of an activation to the next (or
    previous) stage; nothing when there is one stage."""
    sends = checks.count("sends", sends, minimum=0)
    activation_bytes, n = _bytes_and_n("activation_bytes", activation_bytes, n)
    sent = ring_bytes("collective-permute", activation_bytes, n)
    return sends * sent if n > 1 else 0


def expert_bytes(buffer_bytes: int, n: int, *, all_to_alls: int) -> int:
    """Expert parallelism: ``all_to_alls`` all-to-alls of a dispatch buffer."""
    all_to_alls = checks.count("all_to_alls", all_to_alls, minimum=0)
    buffer_bytes, n = _bytes_and_n("buffer_bytes", buffer_bytes, n)
    return all_to_alls * ring_bytes("all-to-all", buffer_bytes, n)


# --------------------------------------------------------------------------- a model, a mesh


@dataclass(frozen=True, kw_only=True)
class Model:
    """A decoder-only transformer, for counting: per layer attention (``4 d_model^2``
    parameters) and an MLP (``2 d_model d_ff``), or ``n_experts`` such MLPs (a MoE layer with
    ``top_k`` routing). ``batch`` sequences of ``seq_len`` tokens per step; every value
    (parameters, gradients, activations) takes ``bytes_per_value`` bytes."""

    n_layers: int
    d_model: int
    d_ff: int
    batch: int
    seq_len: int
    n_experts: int = 1
    top_k: int = 1
    capacity_factor: float = 1.25
    bytes_per_value: int = 2

    def __post_init__(self) -> None:
        # NumPy scalars are accepted and stored as Python numbers (NaN is refused).
        for name in ("n_layers", "d_model", "d_ff", "batch", "seq_len", "n_experts",
                     "bytes_per_value"):
            object.__setattr__(self, name, checks.count(name, getattr(self, name)))
        object.__setattr__(self, "top_k",
                           checks.count("top_k", self.top_k, maximum=self.n_experts))
        object.__setattr__(self, "capacity_factor", checks.real(
            "capacity_factor", self.capacity_factor, positive=True))

    @property
    def dense_params(self) -> int:
        """Parameters every token uses: attention, plus the MLP of a dense model."""
        mlp = 2 * self.d_model * self.d_ff if self.n_experts == 1 else 0
        return self.n_layers * (4 * self.d_model ** 2 + mlp)

    @property
    def expert_params(self) -> int:
        """Parameters of the experts (0 for a dense model)."""
        return self.n_layers * self.n_experts * 2 * self.d_model * self.d_ff \
            if self.n_experts > 1 else 0

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


#: Mixtral 8x7B as published: the fields of its Hugging Face ``config.json``
#: (``mistralai/Mixtral-8x7B-Instruct-v0.1``, commit eba92302a2861cdc0098cc54bc9f17cb2c47eb61;
#: the base model ``Mixtral-8x7B-v0.1`` has the same) that fix its parameter count.
MIXTRAL_8X7B: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def mixtral_params(config: Mapping[str, Any] = MIXTRAL_8X7B) -> dict[str, int]:
    """Parameters of a Mixtral-style decoder, counted from its Hugging Face ``config``.

    Per layer: grouped-query attention (query and output ``d x d``; key and value ``d x
    kv_heads * head_dim``), a router ``d x n_experts``, ``n_experts`` SwiGLU experts of three
    ``d x d_ff`` matrices, two RMSNorm scales; then a final norm and an untied embedding and
    output head, ``vocab x d`` each. No biases. Returns the parts, ``total``, and ``active``:
    what one token uses (``top_k`` experts instead of all).
    """
    if not isinstance(config, Mapping):
        raise checks.InputTypeError(
            f"config must be a mapping of Hugging Face config fields such as "
            f"axes.MIXTRAL_8X7B, got {type(config).__name__}.")
    missing = sorted(set(MIXTRAL_8X7B) - set(config))
    if missing:
        raise checks.InputError(f"config lacks the fields {missing}.")
    checks.one_of("hidden_act", config["hidden_act"], ("silu",))  # SwiGLU: 3 matrices
    d, d_ff, layers, vocab, heads, kv_heads, experts = (checks.count(k, config[k]) for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size",
        "num_attention_heads", "num_key_value_heads", "num_local_experts"))
    top_k = checks.count("num_experts_per_tok", config["num_experts_per_tok"], maximum=experts)
    checks.divisible("hidden_size", d, heads, why="into attention heads")
    kv = kv_heads * (d // heads)
    expert = 3 * d * d_ff
    parts = {
        "attention": layers * (2 * d * d + 2 * d * kv),
        "experts": layers * experts * expert,
        "router": layers * d * experts,
        "norms": (2 * layers + 1) * d,
        "embeddings": (1 if checks.flag("tie_word_embeddings", config["tie_word_embeddings"])
                       else 2) * vocab * d,
    }
    total = sum(parts.values())
    return {**parts, "total": total, "active": total - layers * (experts - top_k) * expert}


@dataclass(frozen=True)
class AxisTraffic:
    """What one mesh axis moves per training step, per device."""

    axis: str
    size: int
    collectives: str
    ops: int
    bytes_sent: int
    what: str

    def row(self) -> dict[str, Any]:
        from spmd_guide.core.hlo import format_bytes

        return {"axis": self.axis, "size": self.size, "collectives": self.collectives,
                "ops per step": self.ops, "sent per device": format_bytes(self.bytes_sent),
                "what": self.what}


def _sizes(mesh: Mapping[str, int] | Mesh) -> dict[str, int]:
    if isinstance(mesh, Mesh):  # only its axis sizes matter (Auto or Explicit alike)
        mesh = dict(mesh.shape)
    if not isinstance(mesh, Mapping):
        raise checks.InputTypeError(
            f"mesh must map axis names to sizes, such as {{'data': 2, 'tensor': 4}}, got "
            f"{mesh!r}.")
    for name in mesh:
        checks.one_of("mesh axis", name, AXES)
    return {a: checks.count(f"mesh[{a!r}]", mesh.get(a, 1)) for a in AXES}


def traffic(model: Model, mesh: Mapping[str, int], *, n_microbatches: int = 1,
            remat: bool = True) -> list[AxisTraffic]:
    """Bytes each axis of ``mesh`` (axis name -> size; missing axes: size 1)
    sends per device in one training step of ``model`` (ring model).

    Layout: the batch splits over ``data x fsdp x expert``; layers over
    ``pipeline``; every weight matrix over ``tensor``; experts over
    ``expert``; each device's share of the parameters over ``fsdp``.
    Gradients are reduced one axis at a time (``expert`` for the dense
    weights, then ``data``). ``remat`` re-gathers the FSDP weights in the
    backward pass. Axes of size 1 send nothing.
    """
    s, m = _check_traffic(model, mesh, n_microbatches), n_microbatches
    b, remat = model.bytes_per_value, checks.flag("remat", remat)
    layers = model.n_layers // s["pipeline"]
    moe_layers = layers if model.n_experts > 1 else 0
    tokens = model.tokens // (s["data"] * s["fsdp"] * s["expert"])
    activation = tokens * model.d_model * b       # [tokens, d_model] here
    model_parallel = s["pipeline"] * s["tensor"]
    dense = model.dense_params * b // model_parallel
    experts = model.expert_params * b // (model_parallel * s["expert"])
    buffer = moe.dispatch_buffer_bytes(
        tokens * s["expert"], s["expert"], top_k=model.top_k,
        n_experts=model.n_experts, capacity_factor=model.capacity_factor,
        d_model=model.d_model, bytes_per_element=b, rule="per_device")
    gathers = 2 if remat else 1
    rows = [
        AxisTraffic(
            "data", s["data"], "all-reduce", 1,
            data_bytes((dense + experts) // s["fsdp"], s["data"]),
            "gradients (this device's FSDP shard)"),
        AxisTraffic(
            "fsdp", s["fsdp"], "all-gather, reduce-scatter",
            (gathers + 1) * layers,
            fsdp_bytes(dense + experts, s["fsdp"], gathers=gathers),
            "weights gathered, gradients scattered"),
        AxisTraffic(
            "pipeline", s["pipeline"], "collective-permute", 2 * m,
            pipeline_bytes(activation // m, s["pipeline"], sends=2 * m),
            "activations forward, their gradients backward"),
        AxisTraffic(
            "tensor", s["tensor"], "all-reduce", 4 * layers,
            tensor_bytes(activation, s["tensor"], all_reduces=4 * layers),
            "activations, 2 all-reduces forward + 2 backward per layer"),
        AxisTraffic(
            "expert", s["expert"], "all-to-all, all-reduce",
            4 * moe_layers + 1,
            expert_bytes(buffer, s["expert"], all_to_alls=4 * moe_layers)
            + data_bytes(dense // s["fsdp"], s["expert"]),
            "tokens to experts and back; dense gradients"),
    ]
    return [r if r.size > 1 else AxisTraffic(r.axis, 1, "none", 0, 0, r.what)
            for r in rows]


def _check_traffic(model: Any, mesh: Any, n_microbatches: Any) -> dict[str, int]:
    if not isinstance(model, Model):
        raise checks.InputTypeError(f"model must be an axes.Model, got {model!r}.")
    s = _sizes(mesh)
    n_microbatches = checks.count("n_microbatches", n_microbatches)
    replicas = s["data"] * s["fsdp"] * s["expert"]
    checks.divisible("batch (sequences)", model.batch, replicas * n_microbatches,
                     why="over data x fsdp x expert, then into microbatches")
    checks.divisible("n_layers", model.n_layers, s["pipeline"], why="over 'pipeline'")
    checks.divisible("n_experts", model.n_experts, s["expert"], why="over 'expert'")
    checks.divisible("d_model", model.d_model, s["tensor"], why="over 'tensor'")
    checks.divisible("d_ff", model.d_ff, s["tensor"], why="over 'tensor'")
    return s


def _rows(rows: Any) -> list[AxisTraffic]:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, (list, tuple)) or not rows or not all(
            isinstance(r, AxisTraffic) for r in rows):
        raise checks.InputTypeError(
            f"rows must be the non-empty list of AxisTraffic that axes.traffic returns, got "
            f"{checks.value_text(rows)}.")
    return list(rows)


def place_axes(rows: list[AxisTraffic], *, devices_per_node: int
               ) -> dict[str, str]:
    """Which link each axis should use: ``"fast"`` (inside a node or slice:
    NVLink, ICI) or ``"slow"`` (across nodes: InfiniBand, DCN).

    Greedy: axes in order of bytes sent, heaviest first, go inside the node
    while the product of their sizes still divides ``devices_per_node``; the
    rest go across.
    """
    devices_per_node = checks.count("devices_per_node", devices_per_node)
    rows = _rows(rows)
    total = math.prod(r.size for r in rows)
    if total % devices_per_node and devices_per_node % total:
        raise checks.InputError(
            f"devices_per_node={devices_per_node} neither divides the mesh's {total} devices "
            f"nor holds them whole: nodes of {devices_per_node} cannot tile a mesh of {total}.")
    inside = 1
    placement: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: -r.bytes_sent):
        if row.size == 1:
            placement[row.axis] = "none"
        elif devices_per_node % (inside * row.size) == 0:
            inside *= row.size
            placement[row.axis] = "fast"
        else:
            placement[row.axis] = "slow"
    return {r.axis: placement[r.axis] for r in rows}


def link_seconds(rows: list[AxisTraffic], placement: Mapping[str, str], *,
                 fast_bandwidth: float, slow_bandwidth: float) -> dict[str, float]:
    """Seconds each axis spends sending its bytes at its link's bandwidth (bytes/s per
    device, one direction), with no overlap and no latency: a lower bound, for ranking."""
    rows = _rows(rows)
    fast = checks.real("fast_bandwidth", fast_bandwidth, positive=True)
    slow = checks.real("slow_bandwidth", slow_bandwidth, positive=True)
    speed = {"fast": fast, "slow": slow, "none": math.inf}
    if not isinstance(placement, Mapping):
        raise checks.InputTypeError(
            f"placement must map each axis to 'fast', 'slow' or 'none' (as place_axes "
            f"returns), got {type(placement).__name__}.")
    for r in rows:
        if r.axis not in placement:
            raise checks.InputError(
                f"placement has no link for axis {r.axis!r}; it names {sorted(placement)}.")
        checks.one_of(f"link of axis {r.axis!r}", placement[r.axis], speed)
    return {r.axis: r.bytes_sent / speed[placement[r.axis]] for r in rows}


# --------------------------------------------------------------------------- compiled checks


def _program(body: Callable[..., Any], mesh: Mesh, in_specs: tuple[P, ...],
             out_specs: P, names: tuple[str, ...]) -> Callable[..., Any]:
    """``body`` under ``jax.shard_map``, jitted, its arguments first laid out as ``in_specs``
    say: on Explicit axes ``shard_map`` refuses an argument laid out otherwise, and
    ``jax.device_put`` (a no-op where the layout already holds) works on both axis types."""
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    def program(*args: Any) -> Any:
        if len(args) != len(names):
            raise checks.InputTypeError(
                f"the program takes {len(names)} arrays ({', '.join(names)}), got {len(args)}.")
        for name, a, spec in zip(names, args, in_specs, strict=True):
            a = checks.array(name, a, min_ndim=len(spec), dtype_kind="f")
            checks.spec_fits(name, a.shape, spec, mesh)
        return mapped(*(jax.device_put(a, NamedSharding(mesh, spec))
                        for a, spec in zip(args, in_specs, strict=True)))

    return jax.jit(program)


def data_program(mesh: Mesh, axis_name: str) -> Callable[..., Any]:
    """Gradient of a data-parallel linear layer: ``w`` replicated, ``x`` split by rows."""
    checks.axis(mesh, axis_name)

    def loss(w, x):
        local = jnp.sum((x @ w) ** 2)
        return jax.lax.psum(local, axis_name)

    return _program(jax.grad(loss), mesh, (P(), P(axis_name)), P(), ("w", "x"))


def fsdp_program(mesh: Mesh, axis_name: str) -> Callable[..., Any]:
    """Gradient of an FSDP linear layer: ``w`` split by rows, gathered before use."""
    checks.axis(mesh, axis_name)

    def loss(w_shard, x):
        w = jax.lax.all_gather(w_shard, axis_name, tiled=True)
        return jax.lax.psum(jnp.sum((x @ w) ** 2), axis_name)

    return _program(jax.grad(loss), mesh, (P(axis_name), P(axis_name)), P(axis_name),
                    ("w_shard", "x"))


def tensor_program(mesh: Mesh, axis_name: str) -> Callable[..., Any]:
    """Forward pass of a Megatron MLP block: ``w1`` split by columns, ``w2`` by rows, one
    all-reduce of the output activation."""
    checks.axis(mesh, axis_name)

    def block(x, w1, w2):
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, axis_name)

    return _program(block, mesh, (P(), P(None, axis_name), P(axis_name)), P(),
                    ("x", "w1", "w2"))


def pipeline_program(mesh: Mesh, axis_name: str) -> Callable[..., Any]:
    """One pipeline tick: each stage sends its activation ``[tokens, d_model]`` to the next."""
    n = checks.axis(mesh, axis_name)

    def tick(h):
        return jax.lax.ppermute(h, axis_name, [(i, (i + 1) % n) for i in range(n)])

    return _program(tick, mesh, (P(axis_name),), P(axis_name), ("h",))
