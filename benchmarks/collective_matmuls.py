"""Time the six collective matmuls of Part III on whatever devices are present.

With accelerators (GPU or TPU), the ring spans all of them; without, JAX is
given 8 CPU mock devices, which share the host's cores: their timings show the
overhead of each variant, not what overlap or a bidirectional ring buys on a
real interconnect (see the chapter "Collective matmuls").

Each variant is compiled once per size with its inputs already laid out as it
needs, then timed with ``spmd_guide.core.timing.time_fn`` (first call excluded,
median of ``--runs``). Bytes are what one device sends in the compiled program
under the ring model (``spmd_guide.core.hlo``).

    python benchmarks/collective_matmuls.py                  # default sizes
    python benchmarks/collective_matmuls.py --sizes 4096 8192 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="square sizes M = K = N (default: 256 512 1024 "
                             "on CPU, 2048 4096 8192 on accelerators)")
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "bfloat16"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also save the table and its provenance (spmd_guide.core.results)")
    parser.add_argument("--cpu-devices", type=int, default=8,
                        help="CPU mock devices when there is no accelerator")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import jax

    # Only affects the CPU platform; must happen before JAX starts.
    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    import numpy as np
    from tabulate import tabulate

    from spmd_guide import environment_summary
    from spmd_guide.core import hlo
    from spmd_guide.core.timing import time_fn
    from spmd_guide.shard_map import collective_matmul, ring_costs

    devices = jax.devices()
    ring = len(devices)
    on_cpu = devices[0].platform == "cpu"
    sizes = args.sizes or ([256, 512, 1024] if on_cpu else [2048, 4096, 8192])
    for size in sizes:
        if size % (2 * ring):
            raise SystemExit(f"size {size} must be a multiple of 2 x {ring} "
                             f"devices = {2 * ring} (the bidirectional rings "
                             "halve each block).")
    mesh = jax.make_mesh((ring,), ("x",), devices=devices)
    dtype = jax.numpy.dtype(args.dtype)
    print(environment_summary())
    if on_cpu:
        print("CPU mock devices share the host's cores: read these numbers as "
              "overheads, not as what overlap buys on an interconnect.")
    print()

    rows = []
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    for size in sizes:
        lhs = rng.standard_normal((size, size), dtype=np.float32).astype(dtype)
        rhs = rng.standard_normal((size, size), dtype=np.float32).astype(dtype)
        medians = {}
        for name in collective_matmul.VARIANTS:
            program = ring_costs.compile_variant(name, lhs, rhs, mesh, "x")
            timing = time_fn(program.program, program.lhs, program.rhs,
                             runs=args.runs, label=name)
            ops = hlo.collectives(program.program)
            counts = {k: n for k, n in hlo.collective_counts(program.program)
                      .items() if n}
            medians[name] = timing.median
            family = ("allgather" if name.startswith("allgather")
                      else "reduce_scatter")
            low, high = timing.spread
            flops = 2 * size**3 / ring / timing.median
            rows.append({
                "M=K=N": str(size),
                "variant": name,
                "median ms": f"{timing.median * 1e3:.3f}",
                "min-max ms": f"{low * 1e3:.3f}-{high * 1e3:.3f}",
                "vs plain": f"{timing.median / medians[family]:.2f}",
                "GFLOP/s/device": f"{flops / 1e9:.1f}",
                "sent/device": hlo.format_bytes(sum(o.bytes_sent for o in ops)),
                "collectives": ", ".join(f"{n} {k}" for k, n in counts.items()),
            })
    print(tabulate(rows, headers="keys", tablefmt="github",
                   disable_numparse=True,
                   colalign=("right", "left", "right", "right", "right",
                             "right", "right", "left")))
    if args.json:
        from spmd_guide.core import results

        results.save(args.json, benchmark="Part III collective matmuls",
                     command=["benchmarks/collective_matmuls.py", *argv],
                     settings={"sizes": sizes, "dtype": args.dtype, "runs": args.runs},
                     rows=rows)
    print(f"\n{ring} x {devices[0].device_kind}, {args.dtype}, median of "
          f"{args.runs} runs after one warm-up call; 'vs plain' is the median "
          f"over that of the family's one-collective variant. Total "
          f"{time.perf_counter() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
