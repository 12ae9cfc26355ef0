"""What XLA does with FSDP's remat: re-gathers kept or merged, temporaries, bytes, and the
pass that lifts remat's optimization barriers (``spmd_guide.nn.remat``).

The book's manual-parallelism chapter computes this table live on the JAX it is built with.
This script keeps the same table for *other* JAX releases, so the chapter can say what an
older one did (with the provenance ``--json`` records). The kept run
``results/fsdp_remat_jax0.10.2.json`` was made in a virtual environment holding
``jax==0.10.2 jaxlib==0.10.2`` and this repository's ``src`` on ``PYTHONPATH``:

    python benchmarks/fsdp_remat.py                       # the book's MLP on 8 devices
    python benchmarks/fsdp_remat.py --json benchmarks/results/fsdp_remat_jaxX.Y.Z.json
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[16, 64, 64, 64, 16],
                        help="layer sizes [d_in, ..., d_out] (default: the chapter's)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--devices", type=int, default=8,
                        help="devices to use (CPU mock devices when there is no accelerator)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also save the table and its provenance (spmd_guide.core.results)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from spmd_guide import ensure_devices

    devices = ensure_devices(args.devices)  # before anything else touches JAX
    import jax

    from spmd_guide import environment_summary, nn
    from spmd_guide.nn import remat, strategies

    print(environment_summary())
    params = nn.init_mlp(jax.random.key(0), args.layers)
    batch = nn.make_regression_batch(jax.random.key(1), args.batch, args.layers[0],
                                     args.layers[-1])
    steps = remat.compare(params, batch, devices=devices)
    fsdp = strategies.FSDP(remat=True)
    mesh = fsdp.mesh(devices)
    placed, placed_batch = fsdp.shard(params, batch, mesh)
    trace = remat.pass_trace(fsdp.sgd_step(mesh, placed, learning_rate=0.01), placed,
                             placed_batch)
    lifted = next((p for p in trace if p.barriers == 0), None)
    merged = next((p for p in trace if lifted and p.index > lifted.index
                   and p.gathers < lifted.gathers), None)

    def where(step: remat.PassStep | None) -> str:
        return f"{step.name} ({step.pipeline})" if step else "-"

    rows = [{**s.row(), "barriers lifted after": where(lifted) if s.remat else "-",
             "gathers merged after": where(merged) if s.remat else "-"} for s in steps]
    for row in rows:
        print("\n".join(f"{key:>26}: {value}" for key, value in row.items()), end="\n\n")
    if args.json:
        from spmd_guide.core import results

        results.save(args.json, benchmark="FSDP remat, one SGD step", command=[
            "benchmarks/fsdp_remat.py", *argv], settings={
            "layers": args.layers, "batch": args.batch, "devices": len(devices)}, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
