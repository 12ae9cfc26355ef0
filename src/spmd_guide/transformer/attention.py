"""Attention on one device and ring attention over a sequence-sharded mesh axis.

``reference_attention`` is the textbook formula. ``ring_attention`` computes the same thing
with the sequence split over the devices of one mesh axis (context parallelism): each device
keeps its block of queries and passes its block of keys and values round the ring with
``ppermute``; after ``n`` steps every query block has met every key block, and an *online
softmax* (running max and running sum) combines the partial results without ever holding the
whole ``seq x seq`` score matrix.

With a causal mask the work is uneven: in the contiguous layout device 0 needs only its own
block while the last device needs all of them. The *zig-zag* layout cuts the sequence into
``2n`` chunks and gives device ``i`` chunks ``i`` and ``2n - 1 - i``, so every device holds one
early and one late chunk and does the same useful work (``causal_work`` counts it).
``zigzag_steps`` reads off the mask which halves each step needs, and
``zigzag_skipping_local`` computes only those.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo

LAYOUTS = ("contiguous", "zigzag")
_NEG = -1e30  # a finite "minus infinity", so fully masked rows give 0, never NaN


def _check_qkv(q, k, v) -> tuple[jax.Array, jax.Array, jax.Array]:
    q, k, v = (jnp.asarray(checks.array(name, x, ndim=4, dtype_kind="f"))
               for name, x in (("q", q), ("k", k), ("v", v)))
    checks.same_shape("k", k, q.shape, other="q")
    checks.same_shape("v", v, q.shape, other="q")
    return q, k, v


def reference_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool) -> jax.Array:
    """softmax(q k^T / sqrt(head_dim)) v, masked to earlier-or-equal positions if ``causal``.

    q, k, v: ``[batch, seq, heads, head_dim]``; the result has the shape of q. Shapes and
    dtypes are checked; the values inside the arrays are not: a NaN in q, k or v gives NaN
    in the rows it reaches, as in JAX.
    """
    q, k, v = _check_qkv(q, k, v)
    causal = checks.flag("causal", causal)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[1]
        mask = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]
        scores = jnp.where(mask, scores, _NEG)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def layout_positions(seq: int, n: int, layout: str) -> np.ndarray:
    """``[n, seq // n]``: the global positions device ``i`` holds in ``layout``."""
    seq, n = checks.count("seq", seq), checks.count("n", n)
    check_ring(seq, n, layout)
    if layout == "contiguous":
        return np.arange(seq).reshape(n, seq // n)
    chunks = np.arange(seq).reshape(2 * n, seq // (2 * n))
    return np.stack([np.concatenate([chunks[i], chunks[2 * n - 1 - i]]) for i in range(n)])


def check_ring(seq: int, n: int, layout: str) -> None:
    """Refuse a sequence length the ring cannot split evenly (``ValueError``)."""
    seq, n = checks.count("seq", seq), checks.count("n", n)
    checks.one_of("layout", layout, LAYOUTS)
    parts = n if layout == "contiguous" else 2 * n
    checks.divisible("sequence length (dimension 1 of q)", seq, parts,
                     why=f"for the {layout} layout over a ring of {n} devices")


def _block(q, k, v, q_pos, k_pos, causal, carry):
    """One online-softmax update of (running max, running sum, running output)."""
    m, total, o = carry
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, _NEG)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    if causal:
        p = jnp.where(q_pos[:, None] >= k_pos[None, :], p, 0.0)
    scale = jnp.exp(m - m_new)
    total_new = total * scale + p.sum(-1)
    o_new = o * scale.transpose(0, 2, 1)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, v)
    return m_new, total_new, o_new


def _check_local(q, k, v, axis_name, positions, who: str):
    """The checks of a per-device program: blocks, axis name (bound here), positions table."""
    q, k, v = _check_qkv(q, k, v)
    if not isinstance(axis_name, str):
        raise checks.InputTypeError(f"axis_name must be a string, got {checks.value_text(axis_name)}.")
    positions = checks.array("positions", positions, ndim=2, dtype_kind="iu")
    try:
        n = jax.lax.axis_size(axis_name)
    except NameError:
        raise checks.InputError(
            f"{who} runs inside jax.shard_map over a mesh axis named {axis_name!r}; here no "
            f"such axis is bound (call ring_attention from outside shard_map).") from None
    if tuple(positions.shape) != (n, q.shape[1]):
        raise checks.InputError(
            f"positions must be the [ring size, block] = [{n}, {q.shape[1]}] table of "
            f"layout_positions, got shape {tuple(positions.shape)}.")
    return q, k, v, positions, n


def ring_attention_local(q, k, v, *, axis_name: str, positions: jax.Array, causal: bool):
    """The per-device program (call inside ``shard_map``): local q, k, v blocks.

    ``positions`` is the ``[n, block]`` table of :func:`layout_positions`; the K/V block a
    device holds after ``s`` steps came from device ``(i - s) mod n``.
    """
    causal = checks.flag("causal", causal)
    q, k, v, positions, n = _check_local(q, k, v, axis_name, positions, "ring_attention_local")
    i = jax.lax.axis_index(axis_name)
    b, t, h, _ = q.shape
    q_pos = positions[i]
    carry = (jnp.full((b, h, t), _NEG, q.dtype), jnp.zeros((b, h, t), q.dtype),
             jnp.zeros_like(q))
    perm = [(j, (j + 1) % n) for j in range(n)]
    for step in range(n):
        k_pos = positions[(i - step) % n]
        carry = _block(q, k, v, q_pos, k_pos, causal, carry)
        if step < n - 1:  # pass K/V on; the last block needs no send
            k, v = jax.lax.ppermute((k, v), axis_name, perm)
    _, total, o = carry
    return o / total.transpose(0, 2, 1)[..., None]


def zigzag_skipping_local(q, k, v, *, axis_name: str, positions: jax.Array):
    """The causal zig-zag ring's per-device program that computes only what the mask keeps
    (call inside ``shard_map``; :func:`zigzag_steps` says why): step 0 the own block with the
    mask; then, K/V from an earlier device, all of q against the early half of K/V, else
    the late half of q against all of K/V, both unmasked. Which one is the device's choice,
    a ``jax.lax.cond`` on its index: every device runs the same program, and both branches
    are half a block of work."""
    q, k, v, positions, n = _check_local(q, k, v, axis_name, positions, "zigzag_skipping_local")
    i = jax.lax.axis_index(axis_name)
    b, t, h, _ = q.shape
    half, q_pos = t // 2, positions[i]
    carry = (jnp.full((b, h, t), _NEG, q.dtype), jnp.zeros((b, h, t), q.dtype),
             jnp.zeros_like(q))
    carry = _block(q, k, v, q_pos, q_pos, True, carry)
    perm = [(j, (j + 1) % n) for j in range(n)]
    for step in range(1, n):
        k, v = jax.lax.ppermute((k, v), axis_name, perm)
        k_pos = positions[(i - step) % n]

        def earlier(carry, k=k, v=v, k_pos=k_pos):  # all of q, early half of K/V
            return _block(q, k[:, :half], v[:, :half], q_pos, k_pos[:half], False, carry)

        def later(carry, k=k, v=v, k_pos=k_pos):  # late half of q, all of K/V
            late = _block(q[:, half:], k, v, q_pos[half:], k_pos, False,
                          (carry[0][..., half:], carry[1][..., half:], carry[2][:, half:]))
            return (carry[0].at[..., half:].set(late[0]), carry[1].at[..., half:].set(late[1]),
                    carry[2].at[:, half:].set(late[2]))

        carry = jax.lax.cond(step <= i, earlier, later, carry)
    _, total, o = carry
    return o / total.transpose(0, 2, 1)[..., None]


def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh, axis_name: str, *,
                   causal: bool, layout: str = "contiguous",
                   skip_masked: bool = False) -> jax.Array:
    """Attention with the sequence split over ``mesh`` axis ``axis_name`` (context parallel).

    Equals :func:`reference_attention`. The inputs are placed as the algorithm needs
    (``P(None, axis_name, None, None)``); the output comes back in that layout. With
    ``layout="zigzag"`` the sequence is reordered so that each device holds chunks ``i`` and
    ``2n - 1 - i`` (balanced causal work) and put back in order afterwards; it needs the
    sequence length divisible by ``2n``, the contiguous layout by ``n``. Works under ``jit``;
    called on concrete arrays it runs one compiled program (cached per mesh and options),
    since shard_map run eagerly dispatches the unrolled ring one small operation at a time.
    Works on meshes of Auto or Explicit axes. ``skip_masked=True`` (causal zig-zag only)
    runs :func:`zigzag_skipping_local`, which computes only the quarters the mask keeps.
    """
    q, k, v = _check_qkv(q, k, v)
    causal = checks.flag("causal", causal)
    skip = _check_skip(skip_masked, causal, layout)
    checks.mesh("mesh", mesh)
    n = checks.axis(mesh, axis_name)
    check_ring(q.shape[1], n, layout)
    _check_axis_types(mesh)
    if not any(checks.is_traced(x) for x in (q, k, v)):
        return _ring_program(mesh, axis_name, causal, layout, skip)(q, k, v)
    return _ring(q, k, v, mesh, axis_name, causal=causal, layout=layout, skip_masked=skip)


def _check_skip(skip_masked: Any, causal: bool, layout: str) -> bool:
    skip = checks.flag("skip_masked", skip_masked)
    checks.one_of("layout", layout, LAYOUTS)
    if skip and (not causal or layout != "zigzag"):
        raise checks.InputError(
            f"skip_masked=True skips the blocks a causal mask empties in the zig-zag layout; "
            f"it needs causal=True and layout='zigzag', got causal={causal}, "
            f"layout={layout!r}.")
    return skip


@functools.lru_cache(maxsize=64)
def _ring_program(mesh: Mesh, axis_name: str, causal: bool, layout: str, skip: bool = False):
    return jax.jit(functools.partial(_ring, mesh=mesh, axis_name=axis_name, causal=causal,
                                     layout=layout, skip_masked=skip),
                   compiler_options=hlo.FAST_COMPILE)


def _ring(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh, axis_name: str, *,
          causal: bool, layout: str, skip_masked: bool = False) -> jax.Array:
    n, seq = int(mesh.shape[axis_name]), q.shape[1]
    order = layout_positions(seq, n, layout).reshape(-1)
    if layout == "zigzag":  # reorder once (a real loader would store the tokens this way)
        q, k, v = (_take_seq(x, order, mesh) for x in (q, k, v))
    out = ring_attention_in_layout(q, k, v, mesh, axis_name, causal=causal, layout=layout,
                                   skip_masked=skip_masked)
    if layout == "zigzag":
        out = _take_seq(out, np.argsort(order), mesh)
    return _place(out, NamedSharding(mesh, P(None, axis_name, None, None)))


def _check_axis_types(mesh: Mesh) -> None:
    if any(t == AxisType.Manual for t in mesh.axis_types):
        raise checks.InputError(
            f"mesh has Manual axes {tuple(mesh.axis_types)}: call ring attention outside "
            f"shard_map (it runs its own), on a mesh of Auto or Explicit axes; inside "
            f"shard_map, call ring_attention_local on the local blocks.")


def _place(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    """Lay ``x`` out as ``sharding``: ``reshard`` on Explicit axes, a constraint on Auto."""
    if any(t == AxisType.Explicit for t in sharding.mesh.axis_types):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def _take_seq(x: jax.Array, order: np.ndarray, mesh: Mesh) -> jax.Array:
    """Reorder dimension 1 of ``x`` (replicated first, so the gather needs no guessing)."""
    return jnp.take(_place(x, NamedSharding(mesh, P())), order, axis=1)


def ring_attention_in_layout(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh,
                             axis_name: str, *, causal: bool, layout: str,
                             skip_masked: bool = False) -> jax.Array:
    """Ring attention on q, k, v whose sequence is *already* in ``layout`` order.

    The model of context parallelism calls this: it puts its tokens in zig-zag order once, so
    no activation is ever reordered. The output is in the same order, ``P(None, axis_name)``.
    """
    q, k, v = _check_qkv(q, k, v)
    causal = checks.flag("causal", causal)
    skip = _check_skip(skip_masked, causal, layout)
    n = checks.axis(mesh, axis_name)
    check_ring(q.shape[1], n, layout)
    _check_axis_types(mesh)
    positions = layout_positions(q.shape[1], n, layout)
    spec = P(None, axis_name, None, None)
    sharding = NamedSharding(mesh, spec)
    q, k, v = (_place(x, sharding) for x in (q, k, v))

    def local(q, k, v):
        if skip:
            return zigzag_skipping_local(q, k, v, axis_name=axis_name,
                                         positions=jnp.asarray(positions))
        return ring_attention_local(q, k, v, axis_name=axis_name,
                                    positions=jnp.asarray(positions), causal=causal)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)


def causal_work(seq: int, n: int, layout: str) -> np.ndarray:
    """``[n devices, n steps]``: unmasked (query, key) pairs each device scores at each step
    of causal ring attention, per batch row and head. The row sums show the load balance."""
    seq, n = checks.count("seq", seq), checks.count("n", n)
    check_ring(seq, n, layout)
    pos = layout_positions(seq, n, layout)
    work = np.zeros((n, n), dtype=int)
    for i in range(n):
        for s in range(n):
            work[i, s] = int((pos[i][:, None] >= pos[(i - s) % n][None, :]).sum())
    return work


HALVES = ("early", "late")


def zigzag_steps(seq: int, n: int) -> list[dict[str, Any]]:
    """What each device computes at each step of the causal zig-zag ring, read off the mask.

    Device ``i`` holds query chunks ``i`` (its *early* half) and ``2n - 1 - i`` (its *late*
    half); at step ``s`` it holds the K/V block of device ``j = (i - s) mod n``, also an early
    and a late half. Each (query half, K/V half) pair is a quarter of the step's score block,
    and the causal mask makes it ``full`` (every score kept), ``diagonal`` (some kept: a
    kernel must mask it) or ``skipped`` (no score kept: a kernel need not compute it). One row
    per device and step, with the quarters of each kind, the query and K/V halves that any
    kept score needs, and the scores kept (per batch row and head; they sum to
    :func:`causal_work`).
    """
    seq, n = checks.count("seq", seq), checks.count("n", n)
    check_ring(seq, n, "zigzag")
    half = seq // (2 * n)
    pos = layout_positions(seq, n, "zigzag").reshape(n, 2, half)  # [device, half, position]
    rows = []
    for i in range(n):
        for s in range(n):
            j = (i - s) % n
            kinds: dict[str, list[tuple[str, str]]] = {"full": [], "diagonal": [], "skipped": []}
            kept = 0
            for a, qh in enumerate(HALVES):
                for b, kh in enumerate(HALVES):
                    mask = pos[i, a][:, None] >= pos[j, b][None, :]
                    kept += int(mask.sum())
                    kind = "full" if mask.all() else "skipped" if not mask.any() else "diagonal"
                    kinds[kind].append((qh, kh))
            used = kinds["full"] + kinds["diagonal"]
            rows.append({
                "device": i, "step": s, "K/V from": j,
                "q halves": _halves({qh for qh, _ in used}),
                "K/V halves": _halves({kh for _, kh in used}),
                "full": len(kinds["full"]), "diagonal": len(kinds["diagonal"]),
                "skipped": len(kinds["skipped"]), "scores kept": kept})
    return rows


def _halves(found: set[str]) -> str:
    return "both" if len(found) == 2 else next(iter(found), "none")


def zigzag_plan(seq: int, n: int) -> np.ndarray:
    """``[n devices, n steps]`` of text: what a kernel that skips fully masked quarters
    computes at each step of the causal zig-zag ring, from :func:`zigzag_steps`: ``causal``
    (the diagonal step, with a mask), else the halves of q and of K/V it computes, no mask
    (``"q late\nK/V both"``: two lines, so that a table of them fits a phone)."""
    rows = zigzag_steps(seq, n)
    plan = np.empty((int(n), int(n)), dtype=object)
    for row in rows:
        plan[row["device"], row["step"]] = (
            "causal" if row["diagonal"] else f"q {row['q halves']}\nK/V {row['K/V halves']}")
    return plan


def zigzag_flops(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh,
                 axis_name: str) -> list[dict[str, Any]]:
    """FLOPs per device of the causal zig-zag ring, masked (every block scored) and
    skipping (:func:`zigzag_skipping_local`), from each compiled program's cost analysis
    (XLA's ``HloCostAnalysis``, which counts a conditional as its costliest branch)."""
    q, k, v = _check_qkv(q, k, v)
    checks.mesh("mesh", mesh)
    check_ring(q.shape[1], checks.axis(mesh, axis_name), "zigzag")
    _check_axis_types(mesh)
    rows = []
    for skip in (False, True):
        compiled = _ring_program(mesh, axis_name, True, "zigzag", skip).lower(q, k, v).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        rows.append({"ring": "skipping" if skip else "masked",
                     "FLOPs per device": int(cost["flops"])})
    return rows


def ring_schedule(n: int) -> np.ndarray:
    """``[n devices, n steps]``: which K/V block each device holds at each step."""
    n = checks.count("n", n)
    return np.array([[(i - s) % n for s in range(n)] for i in range(n)])


def draw_ring(n: int, seq: int, *, layout: str = "contiguous"):
    """A figure: rows are devices, columns ring steps; each cell names the K/V block the
    device holds and is shaded by the share of that block's scores the causal mask keeps
    (palest: none, darkest: all), with a colour bar for the shades."""
    import matplotlib.pyplot as plt

    n, seq = checks.count("n", n), checks.count("seq", seq)
    work = causal_work(seq, n, layout)
    full = (seq // n) ** 2
    held = ring_schedule(n)
    fig, ax = plt.subplots(figsize=(0.75 * n + 2.4, 0.5 * n + 1.0), dpi=110)
    image = ax.imshow(work / full, cmap="Blues", vmin=-0.15, vmax=1.3, aspect="auto")
    for i in range(n):
        for s in range(n):
            dark = work[i, s] / full > 0.6
            ax.text(s, i, f"KV{held[i, s]}", ha="center", va="center", fontsize=11,
                    color="white" if dark else "black")
    ax.set_xticks(range(n), [str(s) for s in range(n)], fontsize=11)
    ax.set_yticks(range(n), [f"dev {i}" for i in range(n)], fontsize=11)
    ax.set_xlabel("ring step", fontsize=11)
    ax.set_title(f"{layout}: K/V block held", fontsize=11)
    bar = fig.colorbar(image, ax=ax, ticks=[0, 0.5, 1], fraction=0.08, pad=0.04)
    bar.ax.set_ylim(0, 1)
    bar.set_label("share of scores kept", fontsize=11)
    bar.ax.tick_params(labelsize=11)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- memory

_ITEMSIZE = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1,
             "bool": 1, "pred": 1, "s64": 8, "u64": 8}


def _residuals(fn, *args) -> list[tuple[str, tuple[int, ...], str]]:
    """(dtype, shape, source) of each array ``jax.vjp(fn, *args)`` keeps for the backward
    pass, as ``jax.ad_checkpoint.print_saved_residuals`` lists them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    found = []
    for line in out.getvalue().splitlines():
        match = re.match(r"(\w+)\[([\d,]*)\]\S*\s+(.*)", line)
        if match:
            shape = tuple(int(d) for d in match.group(2).split(",") if d)
            found.append((match.group(1), shape, match.group(3)))
    return found


def _kind_of_residual(shape: tuple[int, ...], source: str, block: tuple[int, ...]) -> str:
    if source.startswith("from the argument"):
        return f"own {source.rsplit(' ', 1)[-1]} block"
    if "ppermute" in source.split(" from ")[0]:
        return "K or V block received round the ring"
    if len(shape) == 4 and shape[-1] == shape[-2] == block[1]:
        return "score-sized block (scores, weights, masks)"
    if shape == block:
        return "block-sized (running outputs)"
    return "smaller (running maxima and sums)"


def saved_for_backward(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Mesh, axis_name: str,
                       *, causal: bool) -> list[dict[str, Any]]:
    """What one device keeps between the forward and the backward pass of
    :func:`ring_attention` when JAX differentiates it (the unrolled ring, no custom rule).

    Two readings of the same thing. Per kind of saved array (rows): JAX's own list of the
    backward pass's residuals for one device's program (``print_saved_residuals`` of
    :func:`ring_attention_local`, traced inside ``shard_map`` so that it sees the ring's
    ``ppermute``), with the count and bytes per device. And the last row, ``compiled``: the
    bytes per device the compiled forward program (``jax.jit`` of ``jax.vjp``) outputs for
    the backward pass, from ``memory_analysis()`` (the same arrays, plus the output tuple's
    8-byte pointer to each). Works on meshes of Auto or Explicit axes.
    """
    q, k, v = _check_qkv(q, k, v)
    causal = checks.flag("causal", causal)
    n = checks.axis(mesh, axis_name)
    check_ring(q.shape[1], n, "contiguous")
    _check_axis_types(mesh)
    spec = P(None, axis_name, None, None)
    positions = jnp.asarray(layout_positions(q.shape[1], n, "contiguous"))
    block = (q.shape[0], q.shape[1] // n, q.shape[2], q.shape[3])
    found: list[tuple[str, tuple[int, ...], str]] = []

    def local(q, k, v):
        def ring(q, k, v):
            return ring_attention_local(q, k, v, axis_name=axis_name, positions=positions,
                                        causal=causal)
        found.extend(_residuals(ring, q, k, v))
        return ring(q, k, v)

    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))
              for x in (q, k, v)]
    jax.eval_shape(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec),
                   *shapes)
    rows: dict[str, dict[str, Any]] = {}
    for dtype, shape, source in found:
        kind = _kind_of_residual(shape, source, block)
        row = rows.setdefault(kind, {"saved for the backward": kind, "arrays": 0, "bytes": 0})
        row["arrays"] += 1
        row["bytes"] += int(np.prod(shape)) * _ITEMSIZE.get(dtype, 4)

    def forward(q, k, v):
        return jax.vjp(lambda q, k, v: ring_attention(q, k, v, mesh, axis_name, causal=causal),
                       q, k, v)[1]

    compiled = jax.jit(forward).lower(*shapes).compile(compiler_options=hlo.FAST_COMPILE)
    total = int(compiled.memory_analysis().output_size_in_bytes)
    order = ["own q block", "own k block", "own v block", "K or V block received round the ring"]
    listed = sorted(rows.values(), key=lambda r: (order.index(r["saved for the backward"])
                                                  if r["saved for the backward"] in order
                                                  else len(order), -r["bytes"]))
    return listed + [{"saved for the backward": "compiled forward program's outputs",
                      "arrays": "", "bytes": total}]
