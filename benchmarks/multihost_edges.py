"""The multi-process edge cases too slow for the multi-host page, run as the page runs its
processes (``spmd_guide.multihost.multihost.launch``: local processes of CPU devices, gloo
on loopback), each case kept with how every process ended, when, and why.

- **partial start**: two processes, one never started; ``initialize`` waits
  ``--init-timeout`` seconds for it (JAX's default is 300 s), then gives up.
- **a save by process 0 alone**: Orbax's save called in process 0 only (the mistake), against
  the save called in both; the launcher's ``--limit`` ends the first.
- **process 0 exits at JAX's default heartbeat timeout** (100 s): the other is terminated at
  once all the same, because process 0 hosts the coordination service.

    python benchmarks/multihost_edges.py --json benchmarks/results/multihost_edges.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init-timeout", type=int, default=1,
                        help="initialize's initialization_timeout, seconds (default 1)")
    parser.add_argument("--limit", type=float, default=60.0,
                        help="the launcher's time limit for the save by process 0 alone (s)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also save the table and its provenance (spmd_guide.core.results)")
    return parser.parse_args(argv)


def rows_of(case: str, results, failures) -> list[dict]:
    """One row per process: how and when it ended, and why, in the runtime's words."""
    return [{"case": case, "process": r.process_id, "ended": r.ended,
             "after (s)": round(r.seconds, 1), "why": failures.short_verdict(r.stderr)}
            for r in results]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from spmd_guide.core import results
    from spmd_guide.multihost import failures, multihost

    rows = []
    for missing in (1, 0):
        failed = failures.partial_start(missing=missing,
                                        initialization_timeout=args.init_timeout)
        rows += rows_of(f"partial start: process {missing} never starts", failed.results,
                        failures)
    with tempfile.TemporaryDirectory() as work:
        for savers, label in (([0], "process 0 alone"), (None, "every process")):
            directory = Path(work, label.replace(" ", "_"))
            case = f"Orbax save by {label}"
            try:
                done = multihost.launch("spmd_guide.multihost.sharded_save:save_from",
                                        num_processes=2, devices_per_process=2,
                                        timeout=args.limit,
                                        kwargs={"directory": str(directory), "savers": savers})
            except multihost.ProcessFailed as stopped:  # a ProcessTimeout too
                done = stopped.results
                if isinstance(stopped, multihost.ProcessTimeout):
                    case += f" (stopped at the {args.limit:g} s limit)"
            on_disk = "step on disk" if directory.exists() else "nothing on disk"
            for row in rows_of(case, done, failures):
                row["why"] = "; ".join(filter(None, [row["why"], on_disk]))
                rows.append(row)
    ended = failures.failure_modes((("exit", 0),), heartbeat_timeout=100, timeout=150)
    rows += rows_of("process 0 exits, heartbeat timeout 100 s", ended[("exit", 0)].results,
                    failures)
    for row in rows:
        print(row)
    if args.json:
        path = results.save(args.json, benchmark="multihost edge cases", command=sys.argv,
                            settings={"processes": 2, "devices per process": 2,
                                      "initialization timeout (s)": args.init_timeout,
                                      "launcher limit (s)": args.limit},
                            rows=rows)
        print("saved", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
