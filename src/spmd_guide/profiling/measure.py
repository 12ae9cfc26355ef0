"""What the profiling pages measure with a trace: a straggler, compile time against run time,
and the memory each device holds after a step.

- :func:`straggler_program`: a ``shard_map`` step in which each device's data asks for a
  different amount of work (a loop of ``work[d]`` matmuls on device ``d``) before one
  ``psum``: the devices with less work wait at the collective for the one with the most.
- :func:`stage_times` and :func:`call_times`: tracing and lowering, compiling, and each call,
  timed apart: the first call of a jitted function is not the step.
- :func:`live_bytes`: bytes of live buffers per device, read from
  ``jax.profiler.device_memory_profile()`` (a gzipped pprof protobuf, read here with the
  standard library); :func:`memory_after_step` puts them next to the compiled program's
  memory analysis.

Times come from whatever devices run them; in this book, 8 CPU mock devices sharing the host's
cores, where they say where time goes, not how fast an accelerator would be.
"""

from __future__ import annotations

import functools
import gzip
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, compile_cache, hlo
from spmd_guide.profiling.tracing import MAX_REPEATS, Trace, capture, counts_text

__all__ = [
    "MAX_DELAY_MS", "MemoryAfterStep", "call_times", "counts_row", "live_bytes", "memory_after_step", "stage_times",
    "steady_ratio", "straggler_program", "thread_sharing", "waits_per_collective",
]

# --------------------------------------------------------------------------- checks


def counts_row(label: str, fn: Callable[..., Any], *args: Any, repeats: int = 2
               ) -> dict[str, str]:
    """One row of the page's check: the collectives the compiled program of ``fn`` holds,
    those one device executed per run in a trace of it, and whether they agree."""
    checks.text("label", label)
    repeats = checks.count("repeats", repeats, maximum=MAX_REPEATS)
    compiled = hlo.compile(fn, *args)  # once: the trace runs this very executable
    held = hlo.count_kinds(hlo.collectives_in_text(compiled.as_text()))
    traced = capture(compiled, *args, repeats=repeats).collective_counts()
    return {"program": label, "compiled program holds": counts_text(held),
            "each device ran, per step": counts_text(traced),
            "equal": "yes" if held == traced else "no"}


def thread_sharing(events: Sequence[Any]) -> dict[str, int]:
    """How op events spread over threads: ``{"devices", "threads", "threads with several
    devices"}`` (a thread runs whichever device's program the pool hands it)."""
    devices_of: dict[Any, set[str]] = {}
    for e in events:
        args = e.get("args") or {}
        if "hlo_op" in args and "device_ordinal" in args:
            devices_of.setdefault((e.get("pid"), e.get("tid")), set()).add(
                args["device_ordinal"])
    devices = set().union(*devices_of.values()) if devices_of else set()
    return {"devices": len(devices), "threads": len(devices_of),
            "threads with several devices": sum(len(d) > 1 for d in devices_of.values())}


# --------------------------------------------------------------------------- a straggler


def _local_step(x: jax.Array, w: jax.Array, work: jax.Array, *, axis_name: str) -> jax.Array:
    """One device's part: learn the total work (an all-reduce that also lines the devices up
    at the start), run ``work`` rounds of ``tanh(y @ w)`` on its rows, then sum every
    device's result (a second all-reduce, where the devices with less work wait)."""
    total = lax.psum(work[0], axis_name)
    y = x / jnp.maximum(total, 1).astype(x.dtype)
    y = lax.fori_loop(0, work[0], lambda _, y: jnp.tanh(y @ w), y)
    return lax.psum(jnp.sum(y), axis_name)


def _sleep(y: np.ndarray, delay_ms: np.ndarray) -> np.ndarray:
    """Host side of :func:`_delayed_step`: sleep, using no CPU, then hand ``y`` back."""
    time.sleep(float(np.asarray(delay_ms).reshape(-1)[0]) / 1e3)
    return np.asarray(y)


def _delayed_step(x: jax.Array, w: jax.Array, work: jax.Array, delay_ms: jax.Array, *,
                  axis_name: str) -> jax.Array:
    """:func:`_local_step` with a stall: after the first all-reduce, the device's thread
    sleeps ``delay_ms`` in a host callback (a device held up by its input, say), taking no
    CPU from the others."""
    total = lax.psum(work[0], axis_name)
    y = x / jnp.maximum(total, 1).astype(x.dtype)
    y = jax.pure_callback(_sleep, jax.ShapeDtypeStruct(y.shape, y.dtype), y, delay_ms)
    y = lax.fori_loop(0, work[0], lambda _, y: jnp.tanh(y @ w), y)
    return lax.psum(jnp.sum(y), axis_name)


#: The longest stall :func:`straggler_program` takes, in ms (a step, not a hang).
MAX_DELAY_MS = 10_000.0


def straggler_program(mesh: Mesh, axis_name: str, work: Sequence[int], *, rows: int = 32,
                      width: int = 256, seed: int = 0,
                      delay_ms: Sequence[float] | None = None
                      ) -> tuple[Callable[..., jax.Array], tuple[jax.Array, ...]]:
    """``(step, args)``: a jitted ``shard_map`` step and its inputs, in which device ``d``
    of ``axis_name`` runs ``work[d]`` matmuls of ``[rows, width] @ [width, width]`` between
    two ``psum``s. The first lines the devices up (on CPU mock devices their programs start
    at different times); at the second, the devices with less work wait. Equal ``work``
    gives a balanced step; one larger entry, a straggler. With ``delay_ms`` (one entry per
    device), device ``d`` also sleeps ``delay_ms[d]`` ms after the first ``psum``
    (:func:`_delayed_step`): a straggler that takes no CPU from the others. ``mesh`` may
    have Auto or Explicit axes; other axes replicate."""
    checks.mesh("mesh", mesh)
    n = checks.axis(mesh, axis_name)
    work = checks.counts("work", work, minimum=0)
    if len(work) != n:
        raise checks.InputError(
            f"work needs one entry per device of axis {axis_name!r} ({n}), got {len(work)}.")
    if delay_ms is not None:
        if isinstance(delay_ms, (str, bytes)) or not isinstance(delay_ms,
                                                                 (Sequence, np.ndarray)):
            raise checks.InputTypeError(f"delay_ms must be a sequence of milliseconds, one "
                                        f"per device, got {checks.value_text(delay_ms)}.")
        delay_ms = [checks.real(f"delay_ms[{i}]", v, minimum=0.0, maximum=MAX_DELAY_MS)
                    for i, v in enumerate(delay_ms)]
        if len(delay_ms) != n:
            raise checks.InputError(f"delay_ms needs one entry per device of axis "
                                    f"{axis_name!r} ({n}), got {len(delay_ms)}.")
    rows = checks.count("rows", rows, maximum=1 << 16)
    width = checks.count("width", width, maximum=1 << 14)
    rng = np.random.default_rng(checks.count("seed", seed, minimum=0))
    x = rng.standard_normal((n * rows, width), dtype=np.float32)
    w = rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)
    split, whole = NamedSharding(mesh, P(axis_name)), NamedSharding(mesh, P())
    args = (jax.device_put(x, split), jax.device_put(w, whole),
            jax.device_put(np.asarray(work, np.int32), split))
    specs = (P(axis_name), P(), P(axis_name))
    body = functools.partial(_local_step, axis_name=axis_name)
    if delay_ms is not None:
        args += (jax.device_put(np.asarray(delay_ms, np.float32), split),)
        specs += (P(axis_name),)
        body = functools.partial(_delayed_step, axis_name=axis_name)
    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()))
    return step, args


def waits_per_collective(trace: Trace) -> dict[str, dict[int, float]]:
    """``{collective's HLO name: {device: µs waited in it per run}}`` of a
    :class:`~spmd_guide.profiling.tracing.Trace`, collectives in the order they first start
    (0 for a device that did not wait)."""
    checks.instance("trace", trace, Trace, example="a tracing.Trace (tracing.capture(...))")
    firsts: dict[str, float] = {}
    for op in trace.ops:
        if op.kind == "collective":
            firsts[op.name] = min(firsts.get(op.name, float("inf")), op.start_us)
    table = {name: dict.fromkeys(trace.devices, 0.0) for name in sorted(firsts, key=firsts.get)}
    for op in trace.ops:
        if op.kind == "wait":
            table[op.name][op.device] += op.dur_us / trace.runs
    return table


# --------------------------------------------------------------------------- warm-up


def _fresh_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A new ``jax.jit`` around ``fn``: JAX keeps lowered and compiled programs per jitted
    function, so timing the compile of ``fn`` itself a second time would time a cache hit.
    A jitted ``fn`` is called inside (its shardings and pins kept, its donation not)."""
    checks.function("fn", fn)
    if isinstance(fn, (jax.stages.Compiled, jax.stages.Lowered)):
        raise checks.InputTypeError("give the function, not a compiled or lowered program: "
                                    "the point is to time its compilation.")
    return jax.jit(lambda *a: fn(*a))


def stage_times(fn: Callable[..., Any], *args: Any) -> dict[str, float]:
    """Seconds to trace and lower ``fn`` on ``args``, to compile it, and to run the compiled
    program once and again (waited for): ``{"trace and lower", "compile", "first run",
    "second run"}``. ``fn`` is jitted afresh (:func:`_fresh_jit`) and the persistent compile
    cache is off (:func:`spmd_guide.core.compile_cache.disabled`), so the compile is never a
    cache hit; tracing may reuse a jitted ``fn``'s own cached trace."""
    fresh = _fresh_jit(fn)
    with compile_cache.disabled():   # a real compile, as in a reader's first run
        t0 = time.perf_counter()
        lowered = fresh.lower(*args)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        t3 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        t4 = time.perf_counter()
        return {"trace and lower": t1 - t0, "compile": t2 - t1, "first run": t3 - t2,
                "second run": t4 - t3}


def call_times(fn: Callable[..., Any], *args: Any, calls: int = 5) -> list[float]:
    """Seconds of each of ``calls`` calls of a fresh ``jax.jit`` of ``fn`` on ``args``, each
    waited for: the first includes tracing and compiling (never a load from the persistent
    compile cache)."""
    calls = checks.count("calls", calls, maximum=1000)
    fresh = _fresh_jit(fn)
    times = []
    with compile_cache.disabled():   # the first call compiles, as in a reader's first run
        for _ in range(calls):
            start = time.perf_counter()
            jax.block_until_ready(fresh(*args))
            times.append(time.perf_counter() - start)
    return times


def steady_ratio(times: Sequence[float]) -> float:
    """The first call's time over the median of the others (how many steady calls the
    first one costs). Each time must be a finite positive number of seconds."""
    if isinstance(times, (str, bytes)) or not isinstance(times, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"times must be a sequence of seconds (call_times(...)), got "
            f"{checks.value_text(times)}.")
    seconds = [checks.real(f"times[{i}]", t, positive=True) for i, t in enumerate(times)]
    if len(seconds) < 2:
        raise checks.InputError("times needs at least two call times: the first and a later "
                                f"one, got {len(seconds)}.")
    return seconds[0] / statistics.median(seconds[1:])


# --------------------------------------------------------------------------- memory


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes):
    """(field number, wire type, value) of a protobuf message, read with the wire format."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not in a pprof profile")
        yield number, wire, value


def _packed(wire: int, value: Any) -> list[int]:
    if wire == 0:
        return [value]
    out, i = [], 0
    while i < len(value):
        item, i = _varint(value, i)
        out.append(item)
    return out


def live_bytes(profile: bytes | None = None) -> dict[int, int]:
    """Bytes of live buffers on each device, ``{device id: bytes}``, from a pprof memory
    profile (default: ``jax.profiler.device_memory_profile()`` taken now).

    pprof's ``Profile`` message: samples (field 2) with values (field 2: count, bytes) and
    labels (field 3: key and string, indices into the string table, field 6); JAX labels
    each buffer ``kind=buffer`` and ``device=<platform>:<id>``.
    """
    if profile is None:
        profile = jax.profiler.device_memory_profile()
    if not isinstance(profile, (bytes, bytearray)):
        raise checks.InputTypeError(
            f"profile must be the bytes of jax.profiler.device_memory_profile(), got "
            f"{checks.value_text(profile)}.")
    data = gzip.decompress(profile) if profile[:2] == b"\x1f\x8b" else bytes(profile)
    strings: list[str] = []
    samples: list[tuple[list[int], list[tuple[int, int]]]] = []
    for number, _wire, value in _fields(data):
        if number == 6:
            strings.append(value.decode())
        elif number == 2:
            values: list[int] = []
            labels: list[tuple[int, int]] = []
            for n, w, v in _fields(value):
                if n == 2:
                    values += _packed(w, v)
                elif n == 3:
                    label = {ln: lv for ln, _, lv in _fields(v)}
                    labels.append((label.get(1, 0), label.get(2, 0)))
            samples.append((values, labels))
    found: dict[int, int] = {}
    for values, labels in samples:
        named = {strings[k]: strings[v] for k, v in labels}
        if named.get("kind") != "buffer" or "device" not in named or len(values) < 2:
            continue
        device = int(named["device"].rsplit(":", 1)[-1])
        found[device] = found.get(device, 0) + values[1]
    return found


@dataclass(frozen=True)
class MemoryAfterStep:
    """Live bytes per device before and after one step (its outputs kept), next to the
    compiled program's memory analysis (:class:`spmd_guide.core.hlo.MemoryStats`)."""

    before: dict[int, int]
    after: dict[int, int]
    compiled: hlo.MemoryStats

    def rows(self) -> list[dict[str, str]]:
        """A row per device: live before, after, the growth, and the program's outputs."""
        fmt = hlo.format_bytes
        return [{"device": str(d), "live before": fmt(self.before.get(d, 0)),
                 "live after": fmt(self.after.get(d, 0)),
                 "grew by": fmt(self.after.get(d, 0) - self.before.get(d, 0)),
                 "compiled: outputs": fmt(self.compiled.output_bytes),
                 "compiled: temporaries": fmt(self.compiled.temp_bytes)}
                for d in sorted(set(self.before) | set(self.after))]


def memory_after_step(fn: Callable[..., Any], *args: Any) -> MemoryAfterStep:
    """Run ``fn`` (compiled on ``args``) once and read live buffers per device just before
    and just after, its outputs still held; with the compiled program's memory analysis.

    Temporaries live only inside the step, so the growth is the outputs; the peak inside
    the step is what the memory analysis reports, not what a snapshot after it sees.
    """
    compiled = hlo.compile(fn, *args)
    jax.block_until_ready(compiled(*args))  # a first run, so nothing is allocated once
    before = live_bytes()
    outputs = jax.block_until_ready(compiled(*args))
    after = live_bytes()
    del outputs
    return MemoryAfterStep(before, after, hlo._memory(compiled))
