"""spmd_guide.nn: the face of Part IV re-exports the model and the strategies, one way."""

from spmd_guide import nn
from spmd_guide.nn import mlp, strategies


def test_names_are_the_defining_modules_own():
    assert nn.STRATEGIES is strategies.STRATEGIES and nn.Strategy is strategies.Strategy
    assert nn.init_mlp is mlp.init_mlp and nn.mlp_loss is mlp.mlp_loss
    assert {"dp", "fsdp", "tp", "auto_dp", "auto_dp_tp"} <= set(nn.STRATEGIES)
    assert set(nn.__all__) <= set(dir(nn))
