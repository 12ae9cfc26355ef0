"""Every guarded argument of the core helpers a reader calls through its class battery
(battery.py): device counts, mesh shapes and axis types, byte counts, collective kinds,
timing runs, ratios, result paths. Each answer is the package's InputError naming the
argument (nothing on disk changed), or (for a valid form) the plain value's answer."""

from __future__ import annotations

import jax.numpy as jnp
from battery import (
    Choice,
    Count,
    Devices,
    PathArg,
    Real,
    Text,
    anything,
    battery_tests,
    call,
    fresh_root,
)
from helpers import DEVICES

from spmd_guide.core import devices, display, hlo, results, timing


def _results_path():
    return fresh_root() / "out" / "r.json"


CALLS = [
    # More than the running 8 devices is a RuntimeError (JAX has started), not bad input.
    call(devices.ensure_devices, dict(n=8), n=Count(), same=anything),
    call(devices.build_mesh, dict(shape=(2, 2), names=("a", "b"), axis_types="auto",
                                  devices=DEVICES[:4]),
         axis_types=Choice(), devices=Devices(), same=lambda a, b: a == b),
    call(display.wrap, dict(text="a b c", width=40), width=Count(), text=Text()),
    call(hlo.ring_bytes, dict(kind="all-gather", buffer_bytes=1024, group_size=4),
         kind=Choice(), buffer_bytes=Count(0), group_size=Count()),
    call(hlo.format_bytes, dict(n=1536), n=Real(positive=False, minimum=0.0)),
    call(lambda fn, runs, warmup: timing.time_fn(fn, jnp.ones(4), runs=runs, warmup=warmup),
         dict(fn=jnp.sin, runs=2, warmup=1), label="timing.time_fn", runs=Count(),
         warmup=Count(0), same=anything),
    call(timing.ratio_words, dict(ratio=1.5, tolerance=1.1), ratio=Real(),
         tolerance=Real(minimum=1.0)),
    call(timing.reading, dict(ratio=1.5), ratio=Real()),
    call(timing.beyond_cores, dict(ratios=[1.0, 3.0], cores=2), cores=Count(optional=True)),
    call(results.save, lambda: dict(path=_results_path(), benchmark="b",
                                    command=["run.py", "--n", "4"], settings={"n": 4},
                                    rows=[{"a": 1}]),
         path=PathArg(reads=False, file=True), command=Text(), same=anything),
]


def _saved_results():
    path = fresh_root() / "runs" / "r.json"
    results.save(path, benchmark="b", command=["run.py"], settings={}, rows=[{"a": 1}])
    return path


CALLS += [
    call(results.load, lambda: dict(path=_saved_results()), path=PathArg(file=True)),
    call(results.load_all, lambda: dict(folder=_saved_results().parent, script=None),
         folder=PathArg()),
]

QUICK = [c for c in CALLS if c.label in ("hlo.ring_bytes", "timing.ratio_words")]
test_every_guarded_argument, test_numbers_quick = battery_tests(CALLS, QUICK)
