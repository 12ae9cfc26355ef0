"""Part VII, beyond one host (book/multihost/).

- `multihost`: several JAX processes on one machine (multihost/multihost).
- `multihost_examples`: the programs those processes run.
- `cluster`: what `jax.distributed.initialize()` detects, and hybrid ICI x DCN meshes.
"""
