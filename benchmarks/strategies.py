"""Compare every Part IV parallelism strategy on one SGD step of an MLP larger than the book's.

For each strategy in ``spmd_guide.nn.STRATEGIES`` the script lays out the same model and
batch, compiles one training step (forward, backward, SGD update), and reports per device:
the collectives in the compiled program, the bytes one device sends (ring model,
``spmd_guide.core.hlo``), the parameter bytes it stores, the compiler's peak-memory bound, and the
step time (``spmd_guide.core.timing.time_fn``: first call excluded, median of ``--runs``).

With accelerators the mesh spans the first 8 of them; without, JAX is given 8 CPU mock
devices, which share the host's cores: their times show overheads, not speedups.

    python benchmarks/strategies.py                                  # default sizes
    python benchmarks/strategies.py --layers 512 4096 4096 4096 512 --batch 2048
"""

from __future__ import annotations

import argparse
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=None,
                        help="layer sizes [d_in, ..., d_out] (default: 256 2048 2048 2048 256 "
                             "on CPU, 1024 8192 8192 8192 1024 on accelerators)")
    parser.add_argument("--batch", type=int, default=None,
                        help="global batch size (default: 1024 on CPU, 4096 on accelerators)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--devices", type=int, default=8,
                        help="devices to use (CPU mock devices when there is no accelerator)")
    parser.add_argument("--strategies", nargs="+", default=None,
                        help="names from STRATEGIES (default: all)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also save the table and its provenance (spmd_guide.core.results)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from spmd_guide import ensure_devices

    devices = ensure_devices(args.devices)  # before anything else touches JAX
    import jax

    from spmd_guide import environment_summary, nn
    from spmd_guide.nn import step_costs

    on_cpu = devices[0].platform == "cpu"
    layers = args.layers or ([256, 2048, 2048, 2048, 256] if on_cpu else [1024, 8192, 8192, 8192, 1024])
    batch_size = args.batch or (1024 if on_cpu else 4096)
    names = args.strategies or list(nn.STRATEGIES)
    print(environment_summary())
    if on_cpu:
        print("CPU mock devices share the host's cores: read the times as overheads, not "
              "as what parallelism buys on accelerators.")
    params = nn.init_mlp(jax.random.key(0), layers)
    batch = nn.make_regression_batch(jax.random.key(1), batch_size, layers[0], layers[-1])
    n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
    print(f"MLP {layers} ({n_params:,} parameters), batch {batch_size}, {len(devices)} devices\n")

    start = time.perf_counter()
    profiles = step_costs.compare(names, params, batch, devices=devices, runs=args.runs)
    print(step_costs.comparison_table(profiles))
    single = next((p for p in profiles if p.strategy == "single"), None)
    if single is not None:
        ratios = ", ".join(f"{p.strategy} {single.step.median / p.step.median:.2f}"
                           for p in profiles if p is not single)
        print(f"\nspeedup over one device (median / median; below 1 is slower): {ratios}")
    if args.json:
        from spmd_guide.core import results

        results.save(args.json, benchmark="Part IV strategies, one SGD step", command=[
            "benchmarks/strategies.py", *argv], settings={
            "layers": layers, "batch": batch_size, "runs": args.runs,
            "parameters": n_params}, rows=[{**p.row(), "median vs one device": (
                f"{single.step.median / p.step.median:.2f}" if single else "")}
                for p in profiles])
    print(f"\n{len(devices)} x {devices[0].device_kind}; median of {args.runs} runs after one "
          f"compiling call; bytes sent under the ring model; peak memory is the compiler's bound "
          f"(arguments + outputs + temporaries). Total {time.perf_counter() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
