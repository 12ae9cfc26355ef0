"""Part XIII, your model in Flax NNX (book/flax_nnx/).

- `rules`: strategies as tables of logical-axis rules (``RULES``: dp, fsdp, tp, fsdp_tp) and
  how a table lays out one array, dimension by dimension (flax_nnx/logical_axes).
- `layouts`: a rule table applied to a model's state (a PartitionSpec per variable; abstract
  states that carry the shardings); the meshes the model runs on.
- `logical`: the Part IX transformer as an ``nnx.Module`` whose parameters carry logical
  axis names; the model built sharded under ``jax.jit``; AdamW through ``nnx.Optimizer``; a
  training step with gradient accumulation and mixed precision (both pages).
- `reading`: what the pages read from compiled programs: collectives against Part IX's,
  collectives inside an accumulation loop, ``unreduced`` gradients, memory per device.
- `saving`: the model's parameters saved with Part XI's Orbax checkpoint and restored under
  another rule table (flax_nnx/training).

The chapters import the modules themselves.
"""
