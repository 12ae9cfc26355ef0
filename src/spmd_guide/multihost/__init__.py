"""Part VIII, beyond one host (book/multihost/).

- `multihost`: several JAX processes on one machine, launched, watched and stopped; a partial
  start (multihost/multihost).
- `worker`: what each of those processes runs: JAX set up, `initialize`, the target.
- `cluster`: what `jax.distributed.initialize()` detects, and hybrid ICI x DCN meshes.

What the launched processes run, one idea each (every page section of multihost/multihost):

- `describe`: what one process sees: its devices, every device, its shards of a global array.
- `global_arrays`: a global shape, or an abstract array, from a local shape; what a gather costs.
- `problem`: the Part IV task as files every process reads.
- `step`: one training step in every process against the one-device reference.
- `sharded_save`: a sharded checkpoint that every process saves and restores (Orbax).
- `failures`: a process that raises, hangs, freezes, exits, or never starts.
"""
