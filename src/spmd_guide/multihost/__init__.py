"""Part VIII, beyond one host (book/multihost/).

- `multihost`: several JAX processes on one machine, launched, watched and stopped
  (multihost/multihost).
- `worker`: what each of those processes runs: JAX set up, `initialize`, the target
  (multihost/multihost).
- `multihost_examples`: the programs those processes run.
- `cluster`: what `jax.distributed.initialize()` detects, and hybrid ICI x DCN meshes.
"""
