"""A rule table applied to an NNX model's state: a PartitionSpec per variable (param_specs),
abstract states that carry the shardings (set_abstract), and the meshes the model runs on."""

from __future__ import annotations

import jax
import pytest
from flax import nnx
from helpers import DEVICES
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from spmd_guide.core.checks import InputError
from spmd_guide.flax_nnx import layouts, logical
from spmd_guide.flax_nnx.rules import RULES
from spmd_guide.transformer import lm
from spmd_guide.transformer.transformer import STRATEGIES

CONFIG = lm.Config(vocab=32, d_model=32, n_heads=4, d_ff=64, n_layers=1, seq_len=8)


def _abstract_model():
    return nnx.eval_shape(lambda: logical.Model(CONFIG, rngs=nnx.Rngs(0)))


def test_param_specs_resolve_each_variable_and_set_abstract_carries_them():
    mesh = STRATEGIES["fsdp"].mesh(DEVICES)
    model = _abstract_model()
    specs = layouts.param_specs(model, RULES["fsdp"], mesh)
    # heads (4) does not split 8 ways: head_dim (8) takes data, as Part IX's ZeRO-3 does.
    assert specs["blocks"][0]["wo"] == P(None, "data", None)
    assert specs["blocks"][0]["wq"] == P("data", None, None)
    state = nnx.state(model)
    layouts.set_abstract(state, RULES["fsdp"], mesh)
    wq = state["blocks"][0]["wq"].get_value()
    assert isinstance(wq, jax.ShapeDtypeStruct) and wq.sharding.spec == P("data", None, None)


def test_param_specs_refuses_typos_nameless_trees_and_mixed_meshes():
    model, mesh = _abstract_model(), STRATEGIES["fsdp"].mesh(DEVICES)
    with pytest.raises(InputError, match="'embd'") as info:
        layouts.param_specs(model, (("embd", "data"),), mesh)
    assert "'embed'" in str(info.value)  # the known names, to pick the right one
    for plain in (nnx.to_pure_dict(nnx.state(model)), {}, None):
        with pytest.raises(InputError, match="model_or_state"):
            layouts.param_specs(plain, RULES["fsdp"], mesh)
    mixed = jax.make_mesh((2, 1), ("data", "model"), devices=DEVICES[:2],
                          axis_types=(AxisType.Auto, AxisType.Explicit))
    with pytest.raises(InputError, match="all axes Auto or all Explicit"):
        layouts.param_specs(model, RULES["fsdp"], mixed)
