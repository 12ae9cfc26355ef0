"""Grouped-query attention (GQA) served with tensor parallelism, when there are fewer KV
heads than devices.

In GQA, ``n_heads`` query heads share ``n_kv_heads`` key/value heads: query head ``h`` reads
KV head ``h // (n_heads // n_kv_heads)``, and the KV cache holds only ``n_kv_heads`` heads.
Tensor parallelism splits the heads over a ``model`` axis; with more devices than KV heads,
a KV head cannot be split, and there are two ways out (the two ``LAYOUTS``):

- ``replicate_kv``: every device takes ``n_heads / n`` query heads and a *copy* of the one
  KV head they read (``replicate_kv_heads``: the same model with each KV head repeated), so
  each copy's cache is stored on ``n / n_kv_heads`` devices;
- ``split_batch``: the ``model`` axis is only ``n_kv_heads`` wide, and the remaining factor
  of the devices splits the batch (a ``batch`` axis), so no cache is stored twice.

Both run one program (:func:`decode_step`, a decode step with a KV cache) under
``jax.shard_map`` on a ``(batch, model)`` mesh; :func:`costs` reads each one's bytes per
device and collectives off the compiled program.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.transformer.attention import reference_attention

LAYOUTS = ("replicate_kv", "split_batch")
AXES = ("batch", "model")
_NEG = -1e30

#: Where each array lives on the ``(batch, model)`` mesh: heads over ``model``, the batch
#: (activations and the cache) over ``batch``.
SPECS = {"wq": P(None, "model"), "wk": P(None, "model"), "wv": P(None, "model"),
         "wo": P("model"), "x": P("batch"), "cache": P("batch", "model")}


def init_gqa(key: Any, *, d_model: int, n_heads: int, n_kv_heads: int) -> dict[str, jax.Array]:
    """Random attention weights: ``wq [d_model, n_heads, head_dim]``, ``wk`` and ``wv
    [d_model, n_kv_heads, head_dim]``, ``wo [n_heads, head_dim, d_model]``."""
    key = checks.key("key", key)
    d, h, kv = (checks.count(n, v) for n, v in
                (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)))
    checks.divisible("d_model", d, h, why="into n_heads heads")
    checks.divisible("n_heads", h, kv, why="into n_kv_heads groups of query heads")
    return (_init if checks.is_traced(key) else _init_fast)(key, d, h, kv)


def _init(key: jax.Array, d: int, h: int, kv: int) -> dict[str, jax.Array]:
    hd = d // h
    shapes = {"wq": (d, h, hd), "wk": (d, kv, hd), "wv": (d, kv, hd), "wo": (h, hd, d)}
    keys = jax.random.split(key, len(shapes))
    return {name: jax.random.normal(k, shape) / math.sqrt(d if name != "wo" else h * hd)
            for k, (name, shape) in zip(keys, shapes.items(), strict=True)}


#: Called with a concrete key, the draws run as one program compiled without LLVM's code
#: optimization (a jit with compiler options cannot be nested in another jit).
_init_fast = jax.jit(_init, static_argnums=(1, 2, 3), compiler_options=hlo.FAST_COMPILE)


def sizes(params: Any) -> tuple[int, int, int, int]:
    """``(d_model, n_heads, n_kv_heads, head_dim)`` read from ``params``, whose shapes are
    checked against each other (an error names the one that disagrees)."""
    if not isinstance(params, dict) or set(params) != {"wq", "wk", "wv", "wo"}:
        raise checks.InputTypeError(
            f"params must be the dict init_gqa returns (wq, wk, wv, wo), got "
            f"{checks.value_text(params)}.")
    wq = checks.array("params['wq']", params["wq"], ndim=3, dtype_kind="f")
    d, h, hd = wq.shape
    kv = checks.array("params['wk']", params["wk"], ndim=3, dtype_kind="f").shape[1]
    checks.divisible("n_heads (dimension 1 of wq)", h, kv,
                     why="into n_kv_heads (dimension 1 of wk) groups of query heads")
    for name, want in (("wk", (d, kv, hd)), ("wv", (d, kv, hd)), ("wo", (h, hd, d))):
        checks.same_shape(f"params['{name}']", checks.array(f"params['{name}']", params[name],
                                                            dtype_kind="f"), want, other="wq")
    return d, h, kv, hd


def reference(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """Causal GQA self-attention on one device, ``x [batch, seq, d_model]``: each KV head is
    repeated for the query heads of its group and the textbook attention
    (:func:`~spmd_guide.transformer.attention.reference_attention`) does the rest."""
    d, h, kv, _ = sizes(params)
    x = checks.array("x", x, ndim=3, dtype_kind="f")
    checks.same_shape("x", x, (x.shape[0], x.shape[1], d), other="params (d_model)")
    q, k, v = (jnp.einsum("btd,dhe->bthe", x, params[w]) for w in ("wq", "wk", "wv"))
    k, v = (jnp.repeat(a, h // kv, axis=2) for a in (k, v))
    return jnp.einsum("bthe,hed->btd", reference_attention(q, k, v, causal=True), params["wo"])


def init_cache(params: dict[str, jax.Array], *, batch: int, max_len: int) -> dict[str, Any]:
    """An empty KV cache, ``k`` and ``v`` each ``[batch, n_kv_heads, max_len, head_dim]``."""
    _, _, kv, hd = sizes(params)
    batch, max_len = checks.count("batch", batch), checks.count("max_len", max_len)
    zeros = jnp.zeros((batch, kv, max_len, hd), params["wq"].dtype)
    return {"k": zeros, "v": zeros}


def _step(wq, wk, wv, wo, x, k_cache, v_cache, pos, *, axis: str | None):
    """One token per row: write its key and value at ``pos``, attend over ``0..pos``. On a
    device's heads inside ``shard_map`` (``axis="model"``) the output is a partial sum."""
    b, kv, t, hd = k_cache.shape
    q = jnp.einsum("bd,dhe->bhe", x, wq).reshape(b, kv, -1, hd)  # [batch, kv, group, hd]
    k, v = (jnp.einsum("bd,dke->bke", x, w)[:, :, None] for w in (wk, wv))
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, 0, pos, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, 0, pos, 0))
    s = jnp.einsum("bkge,bkte->bkgt", q, k_cache) / math.sqrt(hd)
    s = jnp.where(jnp.arange(t) <= pos, s, _NEG)
    o = jnp.einsum("bkgt,bkte->bkge", jax.nn.softmax(s, axis=-1), v_cache).reshape(b, -1, hd)
    y = jnp.einsum("bhe,hed->bd", o, wo)
    return (jax.lax.psum(y, axis) if axis else y), k_cache, v_cache


def _check_step(params, x, cache, pos) -> tuple[Any, ...]:
    d, _, kv, hd = sizes(params)
    x = checks.array("x", x, ndim=2, dtype_kind="f")
    checks.same_shape("x", x, (x.shape[0], d), other="params (d_model)")
    if not isinstance(cache, dict) or set(cache) != {"k", "v"}:
        raise checks.InputTypeError(
            f"cache must be the dict init_cache returns (k, v), got {checks.value_text(cache)}.")
    k = checks.array("cache['k']", cache["k"], ndim=4, dtype_kind="f")
    want = (x.shape[0], kv, k.shape[2], hd)
    for name in ("k", "v"):
        checks.same_shape(f"cache['{name}']", cache[name], want,
                          other="x's batch and params' n_kv_heads and head_dim")
    if not checks.is_traced(pos):
        pos = checks.count("pos", pos, minimum=0, maximum=k.shape[2] - 1)
    return params, x, cache, pos


def decode_step(params: dict[str, jax.Array], x: jax.Array, cache: dict[str, Any],
                pos: Any) -> tuple[jax.Array, dict[str, Any]]:
    """One decode step on one device: ``x [batch, d_model]`` is the new token's input at
    position ``pos``; returns the attention output ``[batch, d_model]`` and the new cache.
    A concrete ``pos`` past the cache is refused; a traced one cannot be checked (the write
    would be clamped to the last slot), so the caller keeps it below ``max_len``."""
    params, x, cache, pos = _check_step(params, x, cache, pos)
    step = _one_device if checks.is_traced(pos) or any(
        checks.is_traced(a) for a in jax.tree.leaves((params, x, cache))) else _one_device_jit
    return step(params, x, cache, jnp.asarray(pos, jnp.int32))


def _one_device(params, x, cache, pos):
    y, k, v = _step(*(params[w] for w in ("wq", "wk", "wv", "wo")), x, cache["k"],
                    cache["v"], pos, axis=None)
    return y, {"k": k, "v": v}


#: Called on concrete arrays, the step runs as one program compiled without LLVM's code
#: optimization (run op by op, each operation would compile a program of its own).
_one_device_jit = jax.jit(_one_device, compiler_options=hlo.FAST_COMPILE)


def replicate_kv_heads(params: dict[str, jax.Array], copies: int) -> dict[str, jax.Array]:
    """The same model with every KV head stored ``copies`` times (``wk``, ``wv`` repeated):
    query head ``h`` still reads a copy of its own KV head, so the output is unchanged."""
    sizes(params)
    copies = checks.count("copies", copies)
    return params | {w: jnp.repeat(params[w], copies, axis=1) for w in ("wk", "wv")}


def plan(n_devices: int, *, n_heads: int, n_kv_heads: int, layout: str) -> dict[str, Any]:
    """How ``layout`` spreads ``n_heads`` query and ``n_kv_heads`` KV heads over
    ``n_devices``: the ``(batch, model)`` mesh shape and the copies of each KV head."""
    n, h, kv = (checks.count(k, v) for k, v in (("n_devices", n_devices), ("n_heads", n_heads),
                                                  ("n_kv_heads", n_kv_heads)))
    checks.one_of("layout", layout, LAYOUTS)
    checks.divisible("n_heads", h, kv, why="into n_kv_heads groups of query heads")
    if layout == "replicate_kv":
        checks.divisible("n_heads", h, n, why=f"over the {n} devices of the model axis")
        if n > kv:
            checks.divisible("the device count", n, kv,
                             why="into copies of the n_kv_heads KV heads")
        else:
            checks.divisible("n_kv_heads", kv, n, why=f"over the {n} devices of the model axis")
        return {"mesh_shape": (1, n), "kv_copies": max(1, n // kv)}
    model = math.gcd(n, kv)
    if model < min(n, kv):
        raise checks.InputError(
            f"split_batch puts n_kv_heads={kv} on a model axis that must divide the "
            f"{n} devices (or be divided by them); use a device count that is a multiple or a "
            f"divisor of {kv}.")
    return {"mesh_shape": (n // model, model), "kv_copies": 1}


def make_mesh(devices: Any, *, n_heads: int, n_kv_heads: int, layout: str,
              explicit: bool = False) -> tuple[Mesh, int]:
    """The ``(batch, model)`` mesh of :func:`plan` over ``devices`` (Auto axes, or Explicit
    ones if ``explicit``), and the copies of each KV head it needs."""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise checks.InputTypeError(
            f"devices must be a list of jax.Device such as jax.devices(), got "
            f"{checks.value_text(devices)}.")
    devices = list(devices)
    if not all(isinstance(d, jax.Device) for d in devices):
        raise checks.InputTypeError("devices must be a list of jax.Device such as "
                                    "jax.devices().")
    p = plan(len(devices), n_heads=n_heads, n_kv_heads=n_kv_heads, layout=layout)
    kind = AxisType.Explicit if checks.flag("explicit", explicit) else AxisType.Auto
    mesh = jax.make_mesh(p["mesh_shape"], AXES, axis_types=(kind, kind), devices=devices)
    return mesh, p["kv_copies"]


def _check_mesh(mesh: Mesh, params, batch: int) -> None:
    checks.mesh_axes("mesh", mesh, AXES, why="(make one with gqa.make_mesh)")
    if any(t == AxisType.Manual for t in mesh.axis_types):
        raise checks.InputError("mesh has Manual axes: call sharded_decode_step outside "
                                "shard_map, on a mesh of Auto or Explicit axes.")
    _, h, kv, _ = sizes(params)
    m, b = int(mesh.shape["model"]), int(mesh.shape["batch"])
    checks.divisible("n_heads (dimension 1 of wq)", h, m, why=f"over mesh axis 'model' of size {m}")
    if kv % m:
        raise checks.InputError(
            f"params hold {kv} KV head(s), which do not split over mesh axis 'model' of size "
            f"{m}: store {m // math.gcd(kv, m)} copies of each first "
            f"(replicate_kv_heads(params, {m // math.gcd(kv, m)})), or split the batch instead "
            f"(layout='split_batch').")
    checks.divisible("the batch (dimension 0 of x)", batch, b,
                     why=f"over mesh axis 'batch' of size {b}")


def place(params: dict[str, jax.Array], x: Any, cache: dict[str, Any], mesh: Mesh):
    """``params``, ``x`` and ``cache`` laid out on ``mesh`` as :data:`SPECS` says."""
    params, x, cache, _ = _check_step(params, x, cache, 0)
    _check_mesh(mesh, params, x.shape[0])

    def put(a, kind):
        sharding = NamedSharding(mesh, SPECS[kind])
        if checks.is_traced(a):
            if any(t == AxisType.Explicit for t in mesh.axis_types):
                return jax.sharding.reshard(a, sharding)
            return jax.lax.with_sharding_constraint(a, sharding)
        return jax.device_put(a, sharding)

    return ({w: put(a, w) for w, a in params.items()}, put(x, "x"),
            {n: put(a, "cache") for n, a in cache.items()})


def sharded_decode_step(params: dict[str, jax.Array], x: jax.Array, cache: dict[str, Any],
                        pos: Any, mesh: Mesh) -> tuple[jax.Array, dict[str, Any]]:
    """:func:`decode_step` with the heads split over mesh axis ``model`` and the batch over
    ``batch`` (``jax.shard_map``; one all-reduce over ``model`` sums the heads' partial
    outputs). ``params`` must hold a number of KV heads the ``model`` axis divides (see
    :func:`replicate_kv_heads`). Works on Auto and Explicit axes, under ``jit`` or not."""
    params, x, cache, pos = _check_step(params, x, cache, pos)
    _check_mesh(mesh, params, x.shape[0])
    if not checks.is_traced(pos) and not any(checks.is_traced(a) for a in
                                             jax.tree.leaves((params, x, cache))):
        return _program(mesh)(params, x, cache, jnp.int32(pos))
    return _sharded(params, x, cache, pos, mesh)


@functools.lru_cache(maxsize=32)
def _program(mesh: Mesh):
    return jax.jit(functools.partial(_sharded, mesh=mesh), compiler_options=hlo.FAST_COMPILE)


def _sharded(params, x, cache, pos, mesh):
    params, x, cache = place(params, x, cache, mesh)
    specs = tuple(SPECS[k] for k in ("wq", "wk", "wv", "wo", "x", "cache", "cache")) + (P(),)
    step = jax.shard_map(functools.partial(_step, axis="model"), mesh=mesh, in_specs=specs,
                         out_specs=(P("batch"), SPECS["cache"], SPECS["cache"]))
    y, k, v = step(*(params[w] for w in ("wq", "wk", "wv", "wo")), x, cache["k"], cache["v"],
                   jnp.asarray(pos, jnp.int32))
    return y, {"k": k, "v": v}


def costs(params: dict[str, jax.Array], *, batch: int, max_len: int, mesh: Mesh) -> dict[str, Any]:
    """One sharded decode step compiled for ``mesh`` (not run): the bytes of the KV cache
    and of the weights each device holds, from the compiled program's input shardings, and
    its collectives with the bytes one device sends (ring model)."""
    _, _, kv, hd = sizes(params)
    batch, max_len = checks.count("batch", batch), checks.count("max_len", max_len)
    x = jax.ShapeDtypeStruct((batch, params["wq"].shape[0]), params["wq"].dtype)
    cache = {n: jax.ShapeDtypeStruct((batch, kv, max_len, hd), params["wq"].dtype)
             for n in ("k", "v")}
    _check_mesh(mesh, params, batch)
    args = (params, x, cache, jax.ShapeDtypeStruct((), jnp.int32))
    compiled = hlo.compile(functools.partial(_sharded, mesh=mesh), *args,
                           compiler_options=hlo.FAST_COMPILE)
    shardings = jax.tree.leaves(compiled.input_shardings[0])
    flat = jax.tree.leaves(args)

    def held(which) -> int:
        return sum(int(np.prod(s.shard_shape(a.shape))) * a.dtype.itemsize
                   for s, a, w in zip(shardings, flat, which, strict=True) if w)

    kinds = jax.tree.leaves((jax.tree.map(lambda _: "w", params), "x",
                             jax.tree.map(lambda _: "c", cache), "p"))
    ops = hlo.collectives_in_text(compiled)
    counts = {k: c for k, c in hlo.count_kinds(ops).items() if c}
    return {"cache bytes/device": held([k == "c" for k in kinds]),
            "weight bytes/device": held([k == "w" for k in kinds]),
            "collectives": ", ".join(f"{c} {k}" for k, c in counts.items()) or "none",
            "bytes sent/device": sum(op.bytes_sent for op in ops)}
