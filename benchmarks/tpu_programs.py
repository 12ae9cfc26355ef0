"""Part XIV's tables, compiled by XLA:TPU and kept with their provenance, for the machines
where libtpu is not available (macOS, Linux on ARM): the pages show these instead.

    python benchmarks/tpu_programs.py --json benchmarks/results

writes one file per table (``spmd_guide.tpu.kept.FILES``). Needs libtpu (Linux x86_64).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from spmd_guide import ensure_devices


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path, required=True,
                        help="the folder to write the tables to (benchmarks/results)")
    args = parser.parse_args(argv)
    ensure_devices(8)
    from jax.sharding import AxisType

    from spmd_guide.core import results
    from spmd_guide.tpu import compare, kept, programs, topology

    why = topology.unavailable()
    if why:
        sys.exit(f"cannot compile for TPUs: {why}")
    fit_names = ["auto_dp", "dp", "auto_fsdp", "fsdp", "tp", "auto_dp_tp", "auto_2d"]
    plan = [("dp", "v4:2x2x2"), ("fsdp", "v5p:2x2x2"), ("tp", "v6e:2x4"),
            ("tp_sp", "v4:2x2x2"), ("cp", "v5p:2x2x2"), ("fsdp_tp", "v6e:2x4")]
    steps = [programs.compile_strategy("transformer", s, t) for s, t in plan]
    mesh = topology.tpu_mesh("v5e:2x4", (8,), ("data",), axis_types=(AxisType.Auto,))
    tables = {
        "fit": [programs.fit_row("mlp", n, "v5e:2x4") for n in fit_names],
        "strategies": [p.row() for p in steps],
        "costs": [p.cost_row() for p in steps],
        "overlap": compare.overlap_rows(compare.probe_program("async", mesh)),
        "compare": compare.compare("v5e:2x4"),
    }
    import importlib.metadata

    libtpu = importlib.metadata.version("libtpu")
    for name, rows in tables.items():
        path = results.save(args.json / kept.FILES[name], benchmark=f"tpu {name}",
                            command=sys.argv, settings={"table": name, "libtpu": libtpu}, rows=rows)
        print(path)


if __name__ == "__main__":
    main()
