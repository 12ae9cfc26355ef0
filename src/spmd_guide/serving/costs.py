"""Prefill and decode priced: counts from the compiled serving step, times per chip.

The step of :mod:`spmd_guide.serving.serving` is compiled at a size worth pricing (Part V's
transformer size, :data:`spmd_guide.transformer.pricing.LM_CONFIG`) on
``jax.ShapeDtypeStruct``s laid out as the strategy serves them; nothing runs. From the
compiled program come:

* **FLOPs** per device (XLA's cost analysis);
* **bytes read** per device: the step's arguments (XLA's memory analysis: the parameters and
  the cache this device holds, and the tokens) less the two lookup tables, of which a step
  reads only its tokens' rows. The step takes the whole cache as an input and reads every
  weight and every cached key and value at least once, so this is the floor on its memory
  traffic (a prefill into an empty cache need only write its prompt's keys and values,
  :attr:`StepCounts.written_bytes`). XLA:CPU's own "bytes accessed" is kept beside it: it
  charges a gather of several rows with its whole table, and at batch 1 it adds copies of
  the cache that its layout choices make; neither is what an accelerator must read;
* **bytes sent** and the collectives (:mod:`spmd_guide.core.hlo`).

Priced as Part V prices everything (:func:`spmd_guide.rooflines.roofline.estimate`, bytes
as bfloat16): a step takes at least the longest of its compute, memory and communication
times. These are predictions, not measurements. They price communication by bandwidth
alone; :func:`collective_latency` adds the fixed cost each collective has whatever its size.

Every public function checks its arguments (:mod:`spmd_guide.core.checks`): sizes, strategy
names (:data:`serving.SERVED`), chips (:data:`spmd_guide.rooflines.hardware.CHIPS`), and the
step counts, lines and served rows it is given, which must be this module's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from spmd_guide.core import checks, hlo
from spmd_guide.core.display import listed
from spmd_guide.rooflines import hardware, roofline
from spmd_guide.serving import serving
from spmd_guide.transformer.lm import Config, param_shapes
from spmd_guide.transformer.pricing import LM_CONFIG

#: The prompt the page prefills; the cache holds ``LM_CONFIG["seq_len"]`` positions.
PROMPT_LEN = 1024
#: Bytes are counted in float32 and priced as bfloat16 (Part V's convention).
BYTE_SCALE = 0.5
#: The fixed cost of one hop between neighbouring chips, whatever the bytes: "typically
#: around 1us" over TPU ICI (the scaling book, sharding.md, "A note on ICI latency"; it also
#: measured a 3-hop all-gather at about 8 us, so this is a floor).
HOP_S = 1e-6
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
    config: Config        # the model's sizes; the cache holds config.seq_len positions
    matmul_params: int    # the whole model's weight matrices: blocks and head (no tables)
    hops: int             # ring hops of the step's collectives, one after another

    @property
    def intensity(self) -> float:
        """FLOPs per byte read."""
        return self.flops / self.bytes_read

    @property
    def written_bytes(self) -> int:
        """The keys and values this step writes into the cache, per device: its fed positions'
        share of the cache (float32)."""
        return self.cache_bytes * (self.new_tokens // self.batch) // self.config.seq_len

    @property
    def work(self) -> roofline.Counts:
        return roofline.Counts(flops=self.flops, bytes_accessed=self.bytes_read,
                               comm_bytes=self.comm_bytes)

    def estimate(self, chip: str | hardware.Chip) -> roofline.Estimate:
        """The roofline prediction on ``chip`` (bytes as bfloat16)."""
        return roofline.estimate(self.work, chip, byte_scale=BYTE_SCALE)

    def collectives_text(self) -> str:
        return ", ".join(f"{n} {kind}" for kind, n in self.collectives.items() if n) or "none"


_MADE_BY = {"StepCounts": "costs.step_counts(...)", "Line": "costs.Line.through(a, b)",
            "Served": "costs.serve_table(...)"}


def _one[T](name: str, value: Any, kind: type[T]) -> T:
    if not isinstance(value, kind):
        raise checks.InputTypeError(f"{name} must be a {kind.__name__} from "
                                    f"{_MADE_BY[kind.__name__]}, got {checks.value_text(value)}.")
    return value


def _step(name: str, value: Any) -> StepCounts:
    return _one(name, value, StepCounts)


def _items[T](name: str, values: Any, kind: type[T]) -> list[T]:
    """A non-empty sequence (not a string) of ``kind``."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise checks.InputTypeError(f"{name} must be a list of {kind.__name__} (from "
                                    f"{_MADE_BY[kind.__name__]}), got {checks.value_text(values)}.")
    if not values:
        raise checks.InputError(f"{name} is empty; pass at least one {kind.__name__}.")
    return [_one(f"{name}[{i}]", value, kind) for i, value in enumerate(values)]


def _config(overrides: dict[str, Any]) -> Config:
    """:data:`LM_CONFIG` with ``overrides``, each a positive int; unknown names refused."""
    unknown = sorted(set(overrides) - set(LM_CONFIG))
    if unknown:
        raise checks.InputError(
            f"unknown transformer size(s) {unknown}; the sizes are {sorted(LM_CONFIG)}.")
    return Config(**{key: checks.count(key, value)
                     for key, value in (LM_CONFIG | overrides).items()})


def _strategy(strategy: Any) -> str | None:
    """``None`` (one device) or a name of :data:`serving.SERVED`."""
    return None if strategy is None else checks.one_of("strategy", strategy, serving.SERVED)


def _devices(strategy: str | None, n_devices: Any) -> int:
    n = checks.count("n_devices", n_devices, maximum=len(jax.devices()))
    if strategy is None and n != 1:
        raise checks.InputError(f"n_devices={n} needs a strategy; one device serves alone.")
    return n


def step_counts(kind: str, *, batch: int, strategy: str | None = None, n_devices: int = 1,
                prompt_len: int | None = None, **config: int) -> StepCounts:
    """Counts of one serving step of ``kind`` (``"prefill"``: a ``prompt_len``-token prompt,
    default :data:`PROMPT_LEN`, into an empty cache; ``"decode"``: one token, and no
    ``prompt_len``) for ``batch`` sequences, served by ``strategy`` (a name of
    :data:`serving.SERVED`, or ``None`` for one device) on the first ``n_devices`` devices,
    with a cache of ``seq_len`` positions. ``config`` overrides sizes of :data:`LM_CONFIG`
    (unknown names refused). Compiled, not run."""
    kind = checks.one_of("kind", kind, ("prefill", "decode"))
    batch = checks.count("batch", batch)
    strategy = _strategy(strategy)
    n = _devices(strategy, n_devices)
    cfg = _config(config)
    if kind == "prefill":
        length = checks.count("prompt_len", PROMPT_LEN if prompt_len is None else prompt_len,
                              maximum=cfg.seq_len)
    elif prompt_len is not None:
        raise checks.InputError(
            f"prompt_len={checks.value_text(prompt_len)} is for a prefill; a decode step feeds "
            f"one token: leave prompt_len out.")
    else:
        length = 1
    return _step_counts(kind, batch, strategy, n, length, cfg)


def _mesh(strategy: str | None, n: int) -> Any:
    return None if strategy is None else serving.STRATEGIES[strategy].mesh(jax.devices()[:n])


@functools.cache
def _batch_ways(strategy: str | None, n: int, config: Config) -> int:
    """Into how many parts the strategy's cache layout splits the batch on ``n`` devices
    (refuses a strategy the mesh cannot serve the model on)."""
    if strategy is None:
        return 1
    srv = serving.server(config, strategy=strategy, mesh=_mesh(strategy, n))
    return math.prod(srv.mesh.shape[a] for a in checks.spec_axes(srv.spec("cache")[0]))


@functools.cache
def _step_counts(kind: str, batch: int, strategy: str | None, n: int, length: int,
                 config: Config) -> StepCounts:
    mesh = _mesh(strategy, n)
    srv = serving.server(config, strategy=strategy, mesh=mesh)
    compiled = serving.compiled_step(config, batch=batch, length=length,
                                     max_len=config.seq_len, strategy=strategy, mesh=mesh)
    cost = compiled.cost_analysis()
    ops = hlo.collectives_in_text(compiled.as_text())
    params = serving.abstract_params(config, srv)
    tables = sum(_shard_bytes(params[name]) for name in _LOOKUP)
    arguments = hlo.memory_per_device(compiled).argument_bytes
    shapes = param_shapes(config)
    matrices = [shape for name, tree in shapes.items() if name not in _LOOKUP
                for shape in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, tuple))
                if len(shape) >= 2]  # the norms' scales are vectors
    return StepCounts(
        kind=kind, strategy=strategy or "one device", devices=n, batch=batch,
        local_batch=batch // _batch_ways(strategy, n, config),
        new_tokens=batch * length, flops=float(cost.get("flops", 0.0)),
        bytes_read=arguments - tables, bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        weight_bytes=_shard_bytes(params) - tables, table_bytes=tables,
        cache_bytes=_shard_bytes(srv.cache_shapes(batch, config.seq_len)),
        comm_bytes=sum(op.bytes_sent for op in ops), collectives=hlo.count_kinds(ops),
        config=config, matmul_params=sum(math.prod(s) for s in matrices),
        hops=sum(_hops(op) for op in ops))


def _hops(op: hlo.Collective) -> int:
    """Hops of a bidirectional ring of ``group_size`` devices (the scaling book's count): a
    gather or scatter reaches the farthest device in ``n // 2``, an all-reduce is both."""
    if op.kind == "collective-permute":
        return 1
    return op.group_size // 2 * (2 if op.kind == "all-reduce" else 1)


def _shard_bytes(tree: Any) -> int:
    """Bytes one device holds of ``tree``'s ``ShapeDtypeStruct``s (by their shardings)."""
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


def collective_latency(step: StepCounts, *, hop_s: float = HOP_S) -> float:
    """Seconds ``step``'s collectives take whatever their size, one after another: its ring
    hops (:attr:`StepCounts.hops`) at ``hop_s`` each. The roofline leaves this out; a decode
    step's collectives wait on the matmul before them, so it adds to the step."""
    return _step("step", step).hops * checks.real("hop_s", hop_s, minimum=0)


def head_positions(step: StepCounts) -> int:
    """At how many positions of each sequence the compiled ``step`` applies the output head:
    1 if it computes the last position's logits only, its fed length if it computes every
    position's (and keeps the last). Read off the FLOPs: what is left of them after the
    blocks' matmuls and the attention over the whole cache, in units of the head's FLOPs at
    one position, is near one of the two."""
    step = _step("step", step)
    c = step.config
    fed = step.new_tokens // step.batch
    per_seq = step.flops * step.devices / step.batch
    blocks = 2 * (step.matmul_params - c.d_model * c.vocab) * fed
    attention = 4 * c.n_layers * fed * c.seq_len * c.d_model
    left = (per_seq - blocks - attention) / (2 * c.d_model * c.vocab)
    return 1 if abs(left - 1) <= abs(left - fed) else fed


def phase_rows(steps: Sequence[StepCounts], chip: str | hardware.Chip = "h100-sxm"
               ) -> list[dict[str, Any]]:
    """Table rows, one per step: what it feeds, its counts per device, its intensity and its
    predicted time on ``chip``, whole and per new token."""
    steps = _items("steps", steps, StepCounts)
    spec = hardware.get_chip(chip)
    rows = []
    for step in steps:
        e = step.estimate(spec)
        rows.append({
            "step": f"{step.kind} ({step.strategy}" + (f" x{step.devices})" if step.devices > 1
                                                       else ")"),
            "new tokens": f"{step.new_tokens:,}", "GFLOP": f"{step.flops / 1e9:.3g}",
            "MB read": f"{BYTE_SCALE * step.bytes_read / 1e6:.4g}",
            "FLOP/B": _number(step.intensity / BYTE_SCALE),
            "sent": hlo.format_bytes(BYTE_SCALE * step.comm_bytes),
            f"predicted ms, {spec.key}": f"{e.step_s * 1e3:.3g}", "bound": e.bound,
            "µs per new token": f"{e.step_s * 1e6 / step.new_tokens:.3g}"})
    return rows


def _number(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


# --------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class Line:
    """A count as ``fixed + per_sequence x batch`` (FLOPs, bytes read, bytes sent), from two
    compiled decode steps: the weights are read once whatever the batch, each sequence adds
    its own cache and arithmetic. ``weight_flops`` is the part of each sequence's FLOPs that
    the weight matmuls do (2 per matmul parameter, split over the devices), attention over the
    cache left out. ``strategy`` and ``devices`` say which layout the steps were."""

    flops: tuple[float, float]
    bytes_read: tuple[float, float]
    comm: tuple[float, float]
    weight_flops: float
    strategy: str = "one device"
    devices: int = 1

    def __post_init__(self) -> None:
        for name in ("flops", "bytes_read", "comm"):
            pair = getattr(self, name)
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise checks.InputTypeError(f"Line.{name} must be a pair (fixed, per sequence),"
                                            f" got {checks.value_text(pair)}.")
            for i, x in enumerate(pair):
                checks.real(f"Line.{name}[{i}]", x)
        checks.real("Line.weight_flops", self.weight_flops, minimum=0)

    @classmethod
    def through(cls, a: StepCounts, b: StepCounts) -> Line:
        """The line through two decode steps of one model and layout at two batch sizes."""
        a, b = _step("a", a), _step("b", b)
        for name, step in (("a", a), ("b", b)):
            if step.kind != "decode":
                raise checks.InputError(f"{name} is a {step.kind} step; a Line fits decode steps.")
        same = ("strategy", "devices", "config")
        differ = [f for f in same if getattr(a, f) != getattr(b, f)]
        if differ:
            raise checks.InputError(
                f"a and b differ in {', '.join(differ)}: a Line goes through two decode steps of "
                f"one model and layout, at two batch sizes.")
        if a.batch == b.batch:
            raise checks.InputError("need decode counts at two different batch sizes.")

        def fit(x: float, y: float) -> tuple[float, float]:
            slope = (y - x) / (b.batch - a.batch)
            return x - slope * a.batch, slope

        return cls(fit(a.flops, b.flops), fit(a.bytes_read, b.bytes_read),
                   fit(a.comm_bytes, b.comm_bytes), weight_flops=2 * a.matmul_params / a.devices,
                   strategy=a.strategy, devices=a.devices)

    def at(self, batch: float) -> roofline.Counts:
        batch = checks.real("batch", batch, minimum=0)
        return roofline.Counts(*(c0 + c1 * batch for c0, c1 in
                                 (self.flops, self.bytes_read, self.comm)))


def estimate_at(line: Line, batch: float, chip: str | hardware.Chip) -> roofline.Estimate:
    """The roofline prediction of a decode step of ``batch`` sequences, on the line (bytes as
    bfloat16)."""
    return roofline.estimate(_one("line", line, Line).at(checks.real("batch", batch, positive=True)), chip,
                             byte_scale=BYTE_SCALE)


def critical_batch(line: Line, chip: str | hardware.Chip, *, with_cache: bool = True
                   ) -> float:
    """The batch (sequences, as the line counts them) from which a decode step's compute time
    passes its memory time on ``chip``, by the line through the compiled counts: ``fixed bytes
    / (FLOPs per sequence / ridge - bytes per sequence)``; ``inf`` when every sequence adds
    more memory time than compute time. ``with_cache=False`` leaves each sequence's cache out,
    and with it the attention over the cache: only the weight matmuls' FLOPs (2 per weight
    per sequence) against the weights' bytes. That is the batch at which the weights alone are
    worth reading, Part V's critical batch: in bfloat16 (2 bytes per weight), the ridge."""
    line = _one("line", line, Line)
    spec = hardware.get_chip(chip)
    ridge = spec.ridge * BYTE_SCALE  # FLOPs per byte as counted (float32, priced bfloat16)
    if checks.flag("with_cache", with_cache):
        room = line.flops[1] / ridge - line.bytes_read[1]
    else:
        room = line.weight_flops / ridge
    return line.bytes_read[0] / room if room > 0 else math.inf


def max_batch(step: StepCounts, chip: str | hardware.Chip) -> int:
    """The most sequences one device of ``chip`` can hold the cache of, at ``step``'s cache
    length and layout: its HBM less the parameters it holds, over one sequence's share of
    the cache (all bfloat16)."""
    step = _step("step", step)
    spec = hardware.get_chip(chip)
    free = spec.hbm_bytes - BYTE_SCALE * (step.weight_bytes + step.table_bytes)
    per_seq = BYTE_SCALE * step.cache_bytes / step.local_batch
    return max(0, math.floor(free / per_seq))


def chip_rows(line: Line, step: StepCounts,
              chips: str | hardware.Chip | Sequence[str | hardware.Chip] = tuple(hardware.CHIPS)
              ) -> list[dict[str, Any]]:
    """Per chip (a name, a ``Chip``, or a sequence of them): ms per token at ``step``'s batch,
    the critical batches with and without the cache, and the batch whose cache fits beside
    the weights. ``line`` and ``step`` must be of one layout."""
    line, step = _one("line", line, Line), _step("step", step)
    if (line.strategy, line.devices) != (step.strategy, step.devices):
        raise checks.InputError(
            f"line is of {line.strategy} on {line.devices} device(s) and step of "
            f"{step.strategy} on {step.devices}; pass a line and a step of one layout.")
    rows = []
    for spec in hardware.get_chips(chips, name="chips"):
        e = step.estimate(spec)
        with_cache = critical_batch(line, spec)
        rows.append({"chip": spec.key, "ridge FLOP/B": f"{spec.ridge:.0f}",
                     f"predicted ms/token, batch {step.batch}": f"{e.step_s * 1e3:.3g}",
                     "bound": e.bound,
                     "critical batch, weights only":
                         f"{critical_batch(line, spec, with_cache=False):.0f}",
                     "critical batch, with cache":
                         "never" if math.isinf(with_cache) else f"{with_cache:.0f}",
                     "batch that fits": f"{max_batch(step, spec):,}"})
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


def _cases(cases: Any) -> list[tuple[str | None, int]]:
    """A non-empty sequence of distinct ``(strategy, n_devices)`` pairs."""
    if isinstance(cases, (str, bytes, Mapping)) or not isinstance(cases, Sequence):
        raise checks.InputTypeError(
            f"cases must be a list of (strategy, n_devices) pairs such as [(None, 1), ('tp', 8)],"
            f" got {checks.value_text(cases)}.")
    if not cases:
        raise checks.InputError("cases is empty; pass at least one (strategy, n_devices) pair.")
    out = []
    for i, case in enumerate(cases):
        if isinstance(case, (str, bytes)) or not isinstance(case, Sequence) or len(case) != 2:
            raise checks.InputTypeError(
                f"cases[{i}] must be a (strategy, n_devices) pair such as ('tp', 8), got "
                f"{checks.value_text(case)}.")
        try:
            strategy = _strategy(case[0])
            pair = (strategy, _devices(strategy, case[1]))
        except checks.InputError as error:
            raise type(error)(f"cases[{i}]: {error}") from None
        if pair in out:
            raise checks.InputError(f"cases[{i}] {pair} is repeated; list each layout once.")
        out.append(pair)
    return out


def serve_table(cases: Sequence[tuple[str | None, int]], batches: Sequence[int],
                chip: str | hardware.Chip = "h100-sxm") -> list[Served]:
    """Each ``(strategy, n_devices)`` at each batch its layout can split (a batch whose
    sequences do not share out evenly is left out; a layout that splits none of ``batches``
    is refused), decode priced on ``chip``; ``fits`` says whether weights and cache fit a
    device's HBM (bfloat16)."""
    cases = _cases(cases)
    batches = checks.counts("batches", batches)
    spec = hardware.get_chip(chip)
    config = _config({})
    out = []
    for strategy, n in cases:
        ways = _batch_ways(strategy, n, config)
        split = [b for b in batches if b % ways == 0]
        if not split:
            raise checks.InputError(
                f"{strategy} on {n} devices splits the batch {ways} ways, and none of batches "
                f"{batches} is a multiple of {ways}; add one that is.")
        for batch in split:
            step = step_counts("decode", batch=batch, strategy=strategy, n_devices=n)
            held = step.weight_bytes + step.table_bytes + step.cache_bytes
            fits = BYTE_SCALE * held <= spec.hbm_bytes
            out.append(Served(strategy or "one device", n, batch, step.estimate(spec), fits))
    return out


def serve_rows(served: Sequence[Served]) -> list[dict[str, Any]]:
    """Table rows: batch, then per strategy its ms per token and tokens/s per chip."""
    served = _items("served", served, Served)
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
    those whose weights and cache fit (batches where none fits are left out)."""
    served = _items("served", served, Served)
    tie = checks.real("tie", tie, minimum=0, maximum=1, inclusive_max=False)
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


def winners_text(best: Mapping[int, Mapping[str, str]], key: str) -> str:
    """Words for one column of :func:`winners`: ``"tp x8 at batches 1, 16 and 128; tp x8 =
    fsdp x8 at batch 1024"`` (``key`` is ``"latency"`` or ``"throughput"``)."""
    key = checks.one_of("key", key, ("latency", "throughput"))
    if not isinstance(best, Mapping):
        raise checks.InputTypeError(
            f"best must be the dict costs.winners(...) returns, got {checks.value_text(best)}.")
    if not best:
        raise checks.InputError(
            "best is empty: no batch had a layout whose weights and cache fit, so there is no "
            "winner to name.")
    groups: dict[str, list[int]] = {}
    for batch, won in best.items():
        checks.count("a batch of best", batch)
        if not isinstance(won, Mapping) or not isinstance(won.get(key), str):
            raise checks.InputError(
                f"best[{batch!r}] must map {key!r} to the winners' names, as costs.winners(...) "
                f"returns, got {checks.value_text(won)}.")
        groups.setdefault(won[key], []).append(batch)
    return "; ".join(
        f"{who} at batch{'es' if len(batches) > 1 else ''} "
        f"{listed([str(b) for b in batches])}" for who, batches in groups.items())
