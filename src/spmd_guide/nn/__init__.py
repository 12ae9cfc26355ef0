"""Part IV in one import: the MLP of :mod:`spmd_guide.mlp` and the strategies of
:mod:`spmd_guide.strategies` that train it on many devices.

    from spmd_guide.nn import STRATEGIES, init_mlp, mlp_loss

Each name is defined in one of those two modules and only re-exported here, so the
dependencies run one way: ``nn`` -> ``strategies`` -> ``mlp``.
"""

from spmd_guide.mlp import (
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
from spmd_guide.strategies import STRATEGIES, Strategy

__all__ = [
    "STRATEGIES", "Batch", "LossFn", "Params", "Strategy", "check_batch", "check_params",
    "cross_entropy_loss", "init_mlp", "layer_outputs", "make_regression_batch",
    "make_sgd_step", "mlp_loss", "param_bytes_per_device", "predict", "sgd_update", "train",
]
