"""Part IX, a transformer at scale (book/transformer/).

- `lm`: the decoder-only transformer and its counting task (every page of the Part).
- `attention`: ring attention, contiguous and zig-zag (transformer/ring_attention).
- `transformer`: the strategies (dp, fsdp, tp, tp_sp, cp, cp_zigzag, fsdp_tp) behind one
  interface, and a pinned training step (every page of the Part).
- `verify`: each strategy checked against the one-device model, with the gradients' layouts
  unpinned, its collectives, and the formula for its bytes (the Part's tables).
- `memory`: memory per device, by formula and from the compiled step (transformer/memory).
- `step_memory`: remat of the partitioner's all-gathers, hybrid sharding against the
  accumulation factor, refused donations (transformer/step_memory).
- `breakdown`: each collective of a compiled program by pass, source line and mesh axis.
- `pricing`: the strategies compiled at GPT-2-medium widths for Part V's
  rooflines/transformer page.

The face re-exports the names of the book's public contract, so that
``from spmd_guide.transformer import Config, init_params, lm_loss, STRATEGIES`` works; the
chapters import the modules themselves.
"""

from spmd_guide.transformer.lm import Config, init_params, lm_loss
from spmd_guide.transformer.transformer import STRATEGIES

__all__ = ["STRATEGIES", "Config", "init_params", "lm_loss"]
