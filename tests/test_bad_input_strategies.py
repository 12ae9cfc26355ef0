"""The contract's strategy objects (Part IV ``nn.STRATEGIES``, Part IX
``transformer.STRATEGIES``, Part X ``pipeline.STRATEGIES``) through the class battery
(battery.py): device lists (a string, a count, ints, empty, a device twice; a tuple or a NumPy
array of devices is valid), meshes missing the strategy's axes, microbatch counts. Each answer
is the package's InputError naming the argument, or the plain value's answer."""

from __future__ import annotations

import pytest
from battery import Count, Devices, MeshArg, Real, anything, call, check, params
from helpers import DEVICES

from spmd_guide import nn
from spmd_guide.core.checks import InputError
from spmd_guide.pipeline import pipeline
from spmd_guide.transformer import lm, transformer

CONFIG = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)


def _mesh_equal(a, b):
    return a.axis_names == b.axis_names and a.devices.tolist() == b.devices.tolist()


def _strategy_calls(label, strategies, names, loss_args):
    out = []
    for name in names:
        s = strategies[name]
        out.append(call(s.mesh, dict(devices=DEVICES[:4]), label=f"{label}[{name!r}].mesh",
                        devices=Devices(), same=_mesh_equal))
        out.append(call(lambda mesh, s=s, **kw: s.loss(mesh, **kw), lambda s=s: dict(
            mesh=s.mesh(DEVICES[:4]), **loss_args), label=f"{label}[{name!r}].loss",
            mesh=MeshArg(axes=s.mesh(DEVICES[:4]).axis_names, explicit=False),
            same=anything, **({"n_microbatches": Count()} if "n_microbatches" in loss_args
                              else {})))
    return out


CALLS = (
    _strategy_calls("nn.STRATEGIES", nn.STRATEGIES, ("dp", "fsdp", "tp", "auto_dp_tp"), {})
    + _strategy_calls("transformer.STRATEGIES", transformer.STRATEGIES,
                      ("dp", "fsdp_tp", "cp"), {"config": CONFIG})
    + _strategy_calls("pipeline.STRATEGIES", pipeline.STRATEGIES, ("gpipe", "1f1b"),
                      {"n_microbatches": 4})
    + [call(pipeline.make_train_step, lambda: dict(
        strategy=pipeline.STRATEGIES["1f1b"], mesh=pipeline.STRATEGIES["1f1b"].mesh(
            DEVICES[:4]), n_microbatches=4, learning_rate=0.1),
        n_microbatches=Count(), learning_rate=Real(), same=anything)]
)
# nn's strategies take no mesh-less loss arguments: their .loss(mesh) is called bare.
CALLS = [c for c in CALLS if c.args]


@pytest.mark.slow
@pytest.mark.parametrize("c, arg", params(CALLS))
def test_every_guarded_argument(c, arg):
    check(c, arg)


QUICK = [c for c in CALLS if c.label.endswith(".mesh") and "'dp'" in c.label]


@pytest.mark.parametrize("c, arg", params(QUICK))
def test_device_lists_quick(c, arg):
    check(c, arg)


def test_a_device_count_the_strategy_cannot_split_is_refused():
    """auto_dp_tp puts 2 devices on its model axis: 3 devices do not make that mesh."""
    with pytest.raises(InputError, match="3 devices"):
        nn.STRATEGIES["auto_dp_tp"].mesh(DEVICES[:3])
