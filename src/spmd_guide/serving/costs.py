"""Prefill and decode priced: counts from the compiled serving step, times per chip.

The step of :mod:`spmd_guide.serving.serving` is compiled at a size worth pricing (Part V's
transformer size, :data:`spmd_guide.transformer.pricing.LM_CONFIG`) on
``jax.ShapeDtypeStruct``s laid out as the strategy serves them; nothing runs. From the
compiled program come:

* **FLOPs** per device (XLA's cost analysis);
* **bytes read** per device: the step's arguments (XLA's memory analysis: the parameters and
  the cache this device holds, and the tokens) less the two lookup tables, token embeddings
  and position embeddings, of which a step reads only the rows of its tokens. Every
  weight and every cached key and value is read at least once per step, so this is the
  floor on the step's memory traffic. (XLA:CPU's own "bytes accessed" is shown beside it:
  it charges a gather of several rows with its whole table, and at batch 1 it adds copies of
  the cache that its layout choices make; neither is what an accelerator must read.);
* **bytes sent** and the collectives (:mod:`spmd_guide.core.hlo`).

Priced as Part V prices everything (:func:`spmd_guide.rooflines.roofline.estimate`, bytes
as bfloat16): a step takes at least the longest of its compute, memory and communication
times. These are predictions, not measurements.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from spmd_guide.core import checks, hlo
from spmd_guide.core.display import listed
from spmd_guide.rooflines import hardware, roofline
from spmd_guide.serving import serving
from spmd_guide.transformer.lm import Config
from spmd_guide.transformer.pricing import LM_CONFIG

#: The prompt the page prefills; the cache holds ``LM_CONFIG["seq_len"]`` positions.
PROMPT_LEN = 1024
#: Bytes are counted in float32 and priced as bfloat16 (Part V's convention).
BYTE_SCALE = 0.5
_LOOKUP = ("embed", "pos")  # tables a step gathers rows from


@dataclass(frozen=True)
class StepCounts:
    """What one device does in one compiled serving step (float32 bytes)."""

    kind: str             # "prefill" or "decode"
    strategy: str         # a name of serving.SERVED, or "one device"
    devices: int
    batch: int
    local_batch: int      # sequences each device holds the cache of
    new_tokens: int       # tokens the step feeds (batch x prompt, or batch)
    flops: float          # cost analysis, per device
    bytes_read: int       # weights + cache (+ tokens) this device must read
    bytes_accessed: float  # XLA:CPU's cost analysis, for comparison
    weight_bytes: int     # parameters held per device, lookup tables excluded
    table_bytes: int      # the lookup tables held per device
    cache_bytes: int      # cache held per device
    comm_bytes: int       # bytes one device sends (ring model)
    collectives: dict[str, int]

    @property
    def intensity(self) -> float:
        """FLOPs per byte read."""
        return self.flops / self.bytes_read

    @property
    def work(self) -> roofline.Counts:
        return roofline.Counts(flops=self.flops, bytes_accessed=self.bytes_read,
                               comm_bytes=self.comm_bytes)

    def estimate(self, chip: str | hardware.Chip) -> roofline.Estimate:
        """The roofline prediction on ``chip`` (bytes as bfloat16)."""
        return roofline.estimate(self.work, chip, byte_scale=BYTE_SCALE)

    def collectives_text(self) -> str:
        return ", ".join(f"{n} {kind}" for kind, n in self.collectives.items() if n) or "none"


def _config(overrides: dict[str, int]) -> Config:
    return Config(**(LM_CONFIG | overrides))


def step_counts(kind: str, *, batch: int, strategy: str | None = None, n_devices: int = 1,
                prompt_len: int = PROMPT_LEN, **config: int) -> StepCounts:
    """Counts of one serving step of ``kind`` (``"prefill"``: a ``prompt_len``-token prompt
    into an empty cache; ``"decode"``: one token) for ``batch`` sequences, served by
    ``strategy`` on the first ``n_devices`` devices, with a cache of ``seq_len`` positions.
    ``config`` overrides fields of :data:`LM_CONFIG`. Compiled, not run."""
    kind = checks.one_of("kind", kind, ("prefill", "decode"))
    batch = checks.count("batch", batch)
    n = checks.count("n_devices", n_devices, maximum=len(jax.devices()))
    cfg = _config(config)
    if kind == "prefill":
        prompt_len = checks.count("prompt_len", prompt_len, maximum=cfg.seq_len)
    if strategy is None and n != 1:
        raise checks.InputError(f"n_devices={n} needs a strategy; one device serves alone.")
    return _step_counts(kind, batch, strategy, n, prompt_len if kind == "prefill" else 1, cfg)


@functools.cache
def _step_counts(kind: str, batch: int, strategy: str | None, n: int, length: int,
                 config: Config) -> StepCounts:
    mesh = None if strategy is None else \
        serving.STRATEGIES[strategy].mesh(jax.devices()[:n])
    srv = serving.server(config, strategy=strategy, mesh=mesh)
    compiled = serving.compiled_step(config, batch=batch, length=length,
                                     max_len=config.seq_len, strategy=strategy, mesh=mesh)
    cost = compiled.cost_analysis()
    ops = hlo.collectives_in_text(compiled.as_text())
    params = serving.abstract_params(config, srv)
    tables = sum(_shard_bytes(params[name]) for name in _LOOKUP)
    arguments = hlo.memory_per_device(compiled).argument_bytes
    return StepCounts(
        kind=kind, strategy=strategy or "one device", devices=n, batch=batch,
        local_batch=batch // (1 if mesh is None else dict(srv.mesh.shape).get("data", 1)),
        new_tokens=batch * length, flops=float(cost.get("flops", 0.0)),
        bytes_read=arguments - tables, bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        weight_bytes=_shard_bytes(params) - tables, table_bytes=tables,
        cache_bytes=_shard_bytes(srv.cache_shapes(batch, config.seq_len)),
        comm_bytes=sum(op.bytes_sent for op in ops), collectives=hlo.count_kinds(ops))


def _shard_bytes(tree: Any) -> int:
    """Bytes one device holds of ``tree``'s ``ShapeDtypeStruct``s (by their shardings)."""
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


def phase_rows(steps: Sequence[StepCounts], chip: str = "h100-sxm") -> list[dict[str, Any]]:
    """Table rows, one per step: what it feeds, its counts per device, its intensity and its
    predicted time on ``chip``, whole and per new token."""
    rows = []
    for step in steps:
        e = step.estimate(chip)
        rows.append({
            "step": f"{step.kind} ({step.strategy}" + (f" x{step.devices})" if step.devices > 1
                                                       else ")"),
            "new tokens": f"{step.new_tokens:,}", "GFLOP": f"{step.flops / 1e9:.3g}",
            "MB read": f"{BYTE_SCALE * step.bytes_read / 1e6:.4g}",
            "FLOP/B": _number(step.intensity / BYTE_SCALE),
            "sent": hlo.format_bytes(BYTE_SCALE * step.comm_bytes),
            f"predicted ms, {chip}": f"{e.step_s * 1e3:.3g}", "bound": e.bound,
            "µs per new token": f"{e.step_s * 1e6 / step.new_tokens:.3g}"})
    return rows


def _number(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


# --------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class Line:
    """A count as ``fixed + per_sequence x batch`` (FLOPs, bytes read, bytes sent), from two
    compiled decode steps: the weights are read once whatever the batch, each sequence adds
    its own cache and arithmetic."""

    flops: tuple[float, float]
    bytes_read: tuple[float, float]
    comm: tuple[float, float]

    @classmethod
    def through(cls, a: StepCounts, b: StepCounts) -> Line:
        if a.batch == b.batch:
            raise checks.InputError("need decode counts at two different batch sizes.")

        def fit(x: float, y: float) -> tuple[float, float]:
            slope = (y - x) / (b.batch - a.batch)
            return x - slope * a.batch, slope

        return cls(fit(a.flops, b.flops), fit(a.bytes_read, b.bytes_read),
                   fit(a.comm_bytes, b.comm_bytes))

    def at(self, batch: float) -> roofline.Counts:
        return roofline.Counts(*(c0 + c1 * batch for c0, c1 in
                                 (self.flops, self.bytes_read, self.comm)))


def estimate_at(line: Line, batch: float, chip: str | hardware.Chip) -> roofline.Estimate:
    """The roofline prediction of a decode step of ``batch`` sequences per device, on the
    line (bytes as bfloat16)."""
    return roofline.estimate(line.at(checks.real("batch", batch, positive=True)), chip,
                             byte_scale=BYTE_SCALE)


def critical_batch(line: Line, chip: str | hardware.Chip, *, with_cache: bool = True
                   ) -> float:
    """The batch (sequences per device) from which a decode step's compute time passes its
    memory time on ``chip``, by the line through the compiled counts: ``fixed bytes / (FLOPs
    per sequence / ridge - bytes per sequence)``; ``inf`` when every sequence adds more memory
    time than compute time. ``with_cache=False`` leaves each sequence's cache out (the batch at
    which the weights alone are worth reading: Part V's critical batch)."""
    spec = hardware.get_chip(chip)
    ridge = spec.ridge * BYTE_SCALE  # FLOPs per byte as counted (float32, priced bfloat16)
    per_seq = line.bytes_read[1] if checks.flag("with_cache", with_cache) else 0.0
    room = line.flops[1] / ridge - per_seq
    return line.bytes_read[0] / room if room > 0 else math.inf


def max_batch(step: StepCounts, chip: str | hardware.Chip) -> int:
    """The most sequences one device of ``chip`` can hold the cache of, at ``step``'s cache
    length and layout: its HBM less the parameters it holds, over one sequence's share of
    the cache (all bfloat16)."""
    spec = hardware.get_chip(chip)
    free = spec.hbm_bytes - BYTE_SCALE * (step.weight_bytes + step.table_bytes)
    per_seq = BYTE_SCALE * step.cache_bytes / step.local_batch
    return max(0, math.floor(free / per_seq))


def chip_rows(line: Line, step: StepCounts, chips: Sequence[str] = tuple(hardware.CHIPS)
              ) -> list[dict[str, Any]]:
    """Per chip: ms per token at ``step``'s batch, the critical batches with and without the
    cache, and the batch whose cache fits beside the weights."""
    rows = []
    for key in chips:
        e = step.estimate(key)
        with_cache = critical_batch(line, key)
        rows.append({"chip": key, "ridge FLOP/B": f"{hardware.get_chip(key).ridge:.0f}",
                     f"predicted ms/token, batch {step.batch}": f"{e.step_s * 1e3:.3g}",
                     "bound": e.bound,
                     "critical batch, weights only":
                         f"{critical_batch(line, key, with_cache=False):.0f}",
                     "critical batch, with cache":
                         "never" if math.isinf(with_cache) else f"{with_cache:.0f}",
                     "batch that fits": f"{max_batch(step, key):,}"})
    return rows


# --------------------------------------------------------------------------- latency/throughput


@dataclass(frozen=True)
class Served:
    """One decode step priced on one chip: latency (ms per token) and throughput."""

    strategy: str
    devices: int
    batch: int
    estimate: roofline.Estimate
    fits: bool

    @property
    def ms_per_token(self) -> float:
        return self.estimate.step_s * 1e3

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.batch / self.estimate.step_s / self.devices


def serve_table(cases: Sequence[tuple[str | None, int]], batches: Sequence[int],
                chip: str = "h100-sxm") -> list[Served]:
    """Each ``(strategy, n_devices)`` at each batch it can split, decode priced on ``chip``;
    ``fits`` says whether weights and cache fit a device's HBM (bfloat16)."""
    spec = hardware.get_chip(chip)
    out = []
    for strategy, n in cases:
        for batch in checks.counts("batches", batches):
            try:
                step = step_counts("decode", batch=batch, strategy=strategy, n_devices=n)
            except checks.InputError:
                continue  # the mesh cannot split this batch
            held = step.weight_bytes + step.table_bytes + step.cache_bytes
            fits = BYTE_SCALE * held <= spec.hbm_bytes
            out.append(Served(strategy or "one device", n, batch, step.estimate(spec), fits))
    return out


def serve_rows(served: Sequence[Served]) -> list[dict[str, Any]]:
    """Table rows: batch, then per strategy its ms per token and tokens/s per chip."""
    labels = list(dict.fromkeys(_label(s) for s in served))
    rows = []
    for batch in sorted({s.batch for s in served}):
        row: dict[str, Any] = {"batch": batch}
        for label in labels:
            hit = [s for s in served if s.batch == batch and _label(s) == label]
            row[label] = (f"{hit[0].ms_per_token:.3g} ms\n{hit[0].tokens_per_s_per_chip:,.0f}/s"
                          + ("" if hit[0].fits else "\n(no fit)")) if hit else "-"
        rows.append(row)
    return rows


def _label(s: Served) -> str:
    return s.strategy if s.devices == 1 and s.strategy == "one device" else \
        f"{s.strategy} x{s.devices}"


def winners(served: Sequence[Served], *, tie: float = 0.01) -> dict[int, dict[str, str]]:
    """Per batch: the strategies with the lowest latency and those with the most tokens per
    second per chip (all within ``tie``, relative, of the best, joined by " = "), among
    those whose weights and cache fit."""
    out = {}
    for batch in sorted({s.batch for s in served}):
        fit = [s for s in served if s.batch == batch and s.fits]
        if not fit:
            continue
        fast = min(s.ms_per_token for s in fit)
        most = max(s.tokens_per_s_per_chip for s in fit)
        out[batch] = {
            "latency": " = ".join(_label(s) for s in fit if s.ms_per_token <= fast * (1 + tie)),
            "throughput": " = ".join(_label(s) for s in fit
                                     if s.tokens_per_s_per_chip >= most * (1 - tie))}
    return out


def winners_text(best: dict[int, dict[str, str]], key: str) -> str:
    """Words for one column of :func:`winners`: ``"tp x8 at batches 1, 16 and 128; tp x8 =
    fsdp x8 at batch 1024"`` (``key`` is ``"latency"`` or ``"throughput"``)."""
    key = checks.one_of("key", key, ("latency", "throughput"))
    groups: dict[str, list[int]] = {}
    for batch, won in best.items():
        groups.setdefault(won[key], []).append(batch)
    return "; ".join(
        f"{who} at batch{'es' if len(batches) > 1 else ''} "
        f"{listed([str(b) for b in batches])}" for who, batches in groups.items())
