"""Part IV, neural-network parallelism (book/nn/), and its face in one import: the MLP of
:mod:`spmd_guide.nn.mlp` and the strategies of :mod:`spmd_guide.nn.strategies` that train it
on many devices.

- `mlp`: the MLP, its losses, SGD with pinned layouts, a task to learn (nn/model).
- `strategies`: the parallelism strategies, registry `STRATEGIES` (nn/auto_parallelism,
  nn/manual_parallelism).
- `placement`: the checks and conversions the strategies share (devices, even splits).
- `step_costs`: a strategy against the reference; one step's collectives, memory and time
  (nn/auto_parallelism, nn/manual_parallelism).
- `remat`: what the compiler keeps of FSDP's rematerialization (nn/manual_parallelism).
- `cheat_sheet`: the PartitionSpec cheat sheet, read off compiled programs (nn/cheat_sheet).
- `which_strategy`: the decision guide (nn/which_strategy).
- `step_diff`: what a jit step and a shard_map step compute, before comparing their speed
  (nn/which_strategy).

    from spmd_guide.nn import STRATEGIES, init_mlp, mlp_loss

Each name is defined in one of those two modules and only re-exported here, so the
dependencies run one way: ``nn`` -> ``strategies`` -> ``mlp``.
"""

from spmd_guide.nn.mlp import (
    Batch,
    LossFn,
    Params,
    check_batch,
    check_params,
    cross_entropy_loss,
    init_mlp,
    layer_outputs,
    make_regression_batch,
    make_sgd_step,
    mlp_loss,
    param_bytes_per_device,
    predict,
    sgd_update,
    train,
)
from spmd_guide.nn.strategies import STRATEGIES, Strategy

__all__ = [
    "STRATEGIES", "Batch", "LossFn", "Params", "Strategy", "check_batch", "check_params",
    "cross_entropy_loss", "init_mlp", "layer_outputs", "make_regression_batch",
    "make_sgd_step", "mlp_loss", "param_bytes_per_device", "predict", "sgd_update", "train",
]
