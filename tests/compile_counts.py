"""Opt-in pytest plugin: how many XLA compiles each test (and each module's import) costs.

``SPMD_COMPILE_COUNTS=<file>`` appends one JSON line per test phase to ``<file>``.<worker>:
the test's id, its phase (``collect`` for a module's import, ``setup``/``call``/``teardown``),
the number of backend compiles and the compiled functions' names (JAX's ``/jax/core/compile/backend_compile_duration`` event,
which also fires on a persistent-cache hit, so counts do not depend on the cache), how many of
them the persistent cache answered (on a cold cache: a program the other worker compiled
first), the seconds they took, and the phase's wall time. Compile counts do not depend on the machine's load, wall
times do: compare counts. ``python tests/compile_counts.py <file>*`` sums them per module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

EVENTS = {"/jax/core/compile/backend_compile_duration": "compile_s",
          "/jax/core/compile/jaxpr_trace_duration": "trace_s",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s"}


class Counter:
    """Sums JAX's compile events between two calls of :meth:`take`."""

    def __init__(self) -> None:
        self.n = 0
        self.secs: dict[str, float] = defaultdict(float)
        self.t0 = time.perf_counter()
        import jax.monitoring

        self.hits = 0
        self.names: list[str] = []
        jax.monitoring.register_event_duration_secs_listener(self._on)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_event(self, event: str, **_kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":  # a program loaded, not compiled
            self.hits += 1

    def _on(self, event: str, duration: float, **kwargs) -> None:
        name = EVENTS.get(event)
        if name is None:
            return
        self.secs[name] += duration
        if name == "compile_s":
            self.n += 1
            self.names.append(str(kwargs.get("fun_name", "?")))

    def take(self) -> dict:
        now = time.perf_counter()
        row = {"compiles": self.n, "cache_hits": self.hits, "wall_s": round(now - self.t0, 4),
               **{k: round(v, 4) for k, v in self.secs.items()}, "names": self.names}
        self.names = []
        self.n, self.hits, self.secs, self.t0 = 0, 0, defaultdict(float), now
        return row


class Plugin:
    def __init__(self, path: str) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.out = open(f"{path}.{worker}", "a")  # noqa: SIM115 (open for the session)
        self.counter = Counter()

    def _write(self, nodeid: str, phase: str) -> None:
        self.out.write(json.dumps({"id": nodeid, "phase": phase, **self.counter.take()}) + "\n")
        self.out.flush()

    def pytest_make_collect_report(self, collector):  # noqa: D102
        self.counter.take()

    def pytest_collectreport(self, report):  # noqa: D102
        if report.nodeid.endswith(".py"):
            self._write(report.nodeid, "collect")

    def pytest_runtest_logstart(self, nodeid, location):  # noqa: D102
        self.counter.take()

    def pytest_runtest_logreport(self, report):  # noqa: D102
        self._write(report.nodeid, report.when)


def summarise(paths: list[str]) -> None:
    """Print compiles and seconds per module, most compiles first."""
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    if len(paths) > 1:   # under xdist the controller (.main) sees the workers' reports again
        paths = [p for p in paths if not p.endswith(".main")]
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                module = row["id"].split("::")[0]
                for key in ("compiles", "cache_hits", "wall_s", "compile_s", "trace_s", "lower_s"):
                    per[module][key] += row.get(key, 0)
                per[module]["collect_s" if row["phase"] == "collect" else "run_s"] += row["wall_s"]
    total: dict[str, float] = defaultdict(float)
    print(f"{'module':55s} {'compiles':>8s} {'hits':>5s} {'compile_s':>9s} {'wall_s':>7s}"
          f" {'collect_s':>9s}")
    for module, row in sorted(per.items(), key=lambda kv: -kv[1]["compiles"]):
        for key, value in row.items():
            total[key] += value
        print(f"{module:55s} {row['compiles']:8.0f} {row['cache_hits']:5.0f} {row['compile_s']:9.1f} {row['wall_s']:7.1f}"
              f" {row['collect_s']:9.1f}")
    print(f"{'TOTAL':55s} {total['compiles']:8.0f} {total['cache_hits']:5.0f} {total['compile_s']:9.1f} {total['wall_s']:7.1f}"
          f" {total['collect_s']:9.1f}")


if __name__ == "__main__":
    summarise(sys.argv[1:])
