"""Honest micro-benchmarks: warm up (compile), wait for the result, repeat, report the spread.

JAX dispatches asynchronously: a call returns before the device has finished. A timing that
does not wait with ``block_until_ready`` measures only the dispatch. The first call also
compiles, so it is timed separately and left out of the statistics.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from spmd_guide.core import checks, compile_cache


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of repeated calls, in seconds, and what they ran on."""

    label: str
    times: tuple[float, ...]
    first_call: float
    device_kind: str
    device_count: int

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> tuple[float, float]:
        """(fastest, slowest) of the timed runs."""
        return min(self.times), max(self.times)

    def row(self) -> dict[str, Any]:
        """A table row with times in milliseconds."""
        low, high = self.spread
        return {
            "what": self.label,
            "devices": f"{self.device_count} x {self.device_kind}",
            "median ms": round(self.median * 1e3, 3),
            "min ms": round(low * 1e3, 3),
            "max ms": round(high * 1e3, 3),
            "runs": len(self.times),
            "first call ms": round(self.first_call * 1e3, 1),
        }

    def __str__(self) -> str:
        low, high = self.spread
        return (
            f"{self.label}: median {self.median * 1e3:.3f} ms "
            f"(min {low * 1e3:.3f}, max {high * 1e3:.3f}, {len(self.times)} runs) "
            f"on {self.device_count} x {self.device_kind}"
        )


def _devices_of(result: Any) -> list[jax.Device]:
    for leaf in jax.tree.leaves(result):
        if isinstance(leaf, jax.Array):
            return sorted(leaf.sharding.device_set, key=lambda d: d.id)
    return [jax.devices()[0]]


def time_fn(
    fn: Callable[..., Any],
    *args: Any,
    runs: int = 10,
    warmup: int = 1,
    label: str | None = None,
) -> Timing:
    """Time ``fn(*args)``: ``warmup`` untimed calls (the first one compiles), then ``runs`` timed.

    Every call waits for its result with ``jax.block_until_ready``. The devices reported are
    those holding the first array in the result. The first call never loads its program from
    the persistent compile cache (:func:`spmd_guide.core.compile_cache.disabled`): its time is
    that of a reader's first run.
    """
    checks.function("fn", fn)
    runs = checks.count("runs", runs)
    if isinstance(warmup, int) and not isinstance(warmup, bool) and warmup < 1:
        raise checks.InputError(
            f"warmup must be at least 1 (the first call compiles and must not be timed), got {warmup}."
        )
    warmup = checks.count("warmup", warmup)
    if label is not None and not isinstance(label, str):
        raise checks.InputTypeError(f"label must be a string, got {label!r}.")
    with compile_cache.disabled():   # the first call compiles, as in a reader's first run
        start = time.perf_counter()
        result = jax.block_until_ready(fn(*args))
        first_call = time.perf_counter() - start
    for _ in range(warmup - 1):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    devices = _devices_of(result)
    return Timing(
        label=label or getattr(fn, "__name__", "fn"),
        times=tuple(times),
        first_call=first_call,
        device_kind=devices[0].device_kind,
        device_count=len(devices),
    )


def timing_table(timings: list[Timing]) -> str:
    """An HTML table (for a notebook page) of several timings, with the hardware on each row."""
    from tabulate import tabulate

    if isinstance(timings, Timing) or not all(isinstance(t, Timing) for t in timings) \
            or not timings:
        raise checks.InputTypeError(
            f"timings must be a non-empty list of Timing (from time_fn), got {timings!r:.60}.")
    rows = [t.row() for t in timings]
    return tabulate(rows, headers="keys", tablefmt="html")


def speedup(single: Timing, sharded: Timing) -> float:
    """How many times faster the sharded run was (median over median); below 1 is slower."""
    for name, value in (("single", single), ("sharded", sharded)):
        if not isinstance(value, Timing):
            raise checks.InputTypeError(
                f"{name} must be a Timing from time_fn, got {value!r:.60}.")
    return single.median / sharded.median


def reading(ratio: float) -> str:
    """Words for a measured speedup ratio that claim no more than the ratio shows."""
    ratio = checks.real("ratio", ratio, positive=True)
    if ratio >= 1.2:
        return f"ran {ratio:.1f} times faster sharded"
    if ratio > 1 / 1.2:
        return "ran at about the same speed sharded as on one device"
    return f"ran {1 / ratio:.1f} times slower sharded"


def ratio_words(ratio: float, *, tolerance: float = 1.1) -> str:
    """Words for ``ratio`` = one time over another ("... the other"), claiming no
    difference within ``tolerance``: ``"1.52 times as long as"``, ``"only 0.61 of the
    time of"`` or ``"about as long as (1.04 times)"``."""
    ratio = checks.real("ratio", ratio, positive=True)
    tolerance = checks.real("tolerance", tolerance, positive=True)
    if tolerance < 1:
        raise checks.InputError(f"tolerance must be at least 1 (a ratio), got {tolerance}.")
    if ratio > tolerance:
        return f"{ratio:.2f} times as long as"
    if ratio < 1 / tolerance:
        return f"only {ratio:.2f} of the time of"
    return f"about as long as ({ratio:.2f} times)"


def beyond_cores(ratios: Sequence[float], *, cores: int | None) -> str:
    """A warning sentence if any ratio exceeds what ``cores`` shared cores can explain.

    ``cores`` is the host's core count when the devices are CPU mock devices (they share
    those cores), ``None`` on real accelerators; the answer is ``""`` when nothing to say.
    """
    if isinstance(ratios, (str, bytes)) or not isinstance(ratios, Iterable):
        raise checks.InputTypeError(
            f"ratios must be a list of speedup ratios, got {ratios!r:.60}.")
    ratios = [checks.real(f"ratios[{i}]", r, positive=True) for i, r in enumerate(ratios)]
    if not ratios:
        raise checks.InputError("ratios is empty: give at least one speedup ratio.")
    if cores is not None:
        cores = checks.count("cores", cores)
    if cores is None or max(ratios) <= cores:
        return ""
    return (f"A ratio above {cores}, the number of cores the mock devices share, cannot "
            "come from computing in parallel alone: how the pieces fit in the caches and "
            "what else the host ran while timing are part of it.")
