"""Part XII, your model in Flax NNX (book/flax_nnx/).

- `logical`: the Part VIII transformer as an ``nnx.Module`` whose parameters carry logical
  axis names; the strategies dp, fsdp, tp and fsdp_tp as rule tables (``RULES``); the model
  built sharded under ``jax.jit``; AdamW through ``nnx.Optimizer``; a training step with
  gradient accumulation and mixed precision (flax_nnx/logical_axes).

The chapters import the modules themselves.
"""
