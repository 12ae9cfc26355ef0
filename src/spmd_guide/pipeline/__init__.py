"""Part X, pipeline and expert parallelism (book/pipeline/).

- `schedules`: pipeline schedules as data (GPipe, 1F1B), bubbles, microbatches in flight
  (pipeline/pipeline).
- `pipeline`: the stacked model and its pipelined losses in `shard_map` (pipeline/pipeline).
- `moe`: a mixture-of-experts layer over an `expert` axis (pipeline/experts,
  pipeline/composing).
- `axes`: the bytes each parallelism axis moves, and where to put it (pipeline/composing).
- `composed`: the MoE layer on a ``(data, expert)`` mesh, both axes at once
  (pipeline/composing).

The face re-exports the names of the book's public contract (``init_stack``, ``stack_loss``,
``STRATEGIES``, ``bubble_fraction``); the chapters import the modules themselves.
"""

from spmd_guide.pipeline.pipeline import STRATEGIES, init_stack, stack_loss
from spmd_guide.pipeline.schedules import bubble_fraction

__all__ = ["STRATEGIES", "bubble_fraction", "init_stack", "stack_loss"]
