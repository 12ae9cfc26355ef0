"""Compare the Part IX transformer strategies on one AdamW training step at a larger size.

For each strategy in ``spmd_guide.transformer.transformer.STRATEGIES``: the collectives of the compiled
step, the bytes one device sends (ring model, ``spmd_guide.core.hlo``) beside the formula
(``predicted_comm_bytes``), parameter + optimizer-state bytes per device, the compiled
program's peak-memory bound, and the step time (``spmd_guide.core.timing.time_fn``, first call
excluded, median of ``--runs``).

With accelerators the mesh spans the first 8 of them; without, JAX is given 8 CPU mock
devices that share the host's cores: their times show overheads, never speedups.

    python benchmarks/transformer_strategies.py
    python benchmarks/transformer_strategies.py --d-model 512 --seq-len 256 --runs 5
"""

from __future__ import annotations

import argparse
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--strategies", nargs="+", default=None)
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also save the table and its provenance (spmd_guide.core.results)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from spmd_guide import ensure_devices

    devices = ensure_devices(args.devices)
    import jax
    from tabulate import tabulate

    from spmd_guide.core import hlo
    from spmd_guide.core.timing import time_fn
    from spmd_guide.transformer import lm, transformer, verify

    config = lm.Config(vocab=args.vocab, d_model=args.d_model, n_heads=args.heads,
                       d_ff=args.d_ff, n_layers=args.layers, seq_len=args.seq_len)
    params = lm.init_params(jax.random.key(0), config)
    tokens = lm.counting_task(jax.random.key(1), batch=args.batch, config=config)
    names = args.strategies or list(transformer.STRATEGIES)
    rows = []
    start = time.perf_counter()
    for name in names:
        strategy = transformer.STRATEGIES[name]
        mesh = strategy.mesh(devices)
        sp, st = strategy.shard(params, tokens, mesh)
        trainer = transformer.train_step(strategy, mesh, config, sp,
                                         optimizer=lm.optimizer(1e-3), donate=False)
        state = trainer.init(sp)
        compiled = hlo.compile(trainer.step, sp, state, st)
        ops = hlo.collectives_in_text(compiled.as_text())
        memory = compiled.memory_analysis()
        timing = time_fn(compiled, sp, state, st, runs=args.runs, label=name)
        pred = verify.predicted_comm_bytes(strategy, mesh, config, params, args.batch)
        held = transformer._bytes_per_device((sp, state))
        counts: dict[str, int] = {}
        for op in ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        rows.append({
            "strategy": name,
            "mesh": "x".join(str(v) for v in mesh.shape.values()),
            "collectives": ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
            "sent/device": hlo.format_bytes(sum(op.bytes_sent for op in ops)),
            "formula": hlo.format_bytes(pred["total"]),
            "params+opt/device": hlo.format_bytes(held),
            "temps/device": hlo.format_bytes(memory.temp_size_in_bytes),
            "step (median)": f"{timing.median * 1e3:.1f} ms",
        })
    device = devices[0]
    print(f"transformer {config}, batch {args.batch}, {len(devices)} x {device.device_kind} "
          f"({device.platform}); total {time.perf_counter() - start:.0f} s")
    if device.platform == "cpu":
        print("CPU mock devices share the host's cores: times show overheads, not speedups.")
    print(tabulate(rows, headers="keys"))
    if args.json:
        from spmd_guide.core import results

        results.save(args.json, benchmark="Part IX transformer strategies, one AdamW step",
                     command=["benchmarks/transformer_strategies.py", *argv],
                     settings={"config": str(config), "batch": args.batch, "runs": args.runs},
                     rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
