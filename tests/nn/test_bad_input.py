"""Every guarded argument of the Part IV functions through its class battery (battery.py):
keys, layer sizes, batch and device counts, rates and fractions, meshes and axis names,
strategy names. Each answer is the package's InputError naming the argument, or (for a valid
form) the plain value's answer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from battery import (
    Axis,
    Choice,
    Count,
    Devices,
    Flag,
    Key,
    MeshArg,
    Real,
    anything,
    battery_tests,
    call,
)
from helpers import DEVICES, mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import nn
from spmd_guide.nn import cheat_sheet, mlp, step_costs, step_diff, strategies, which_strategy


def _params():
    return mlp.init_mlp(jax.random.key(0), [4, 8, 2])


def _batch():
    return mlp.make_regression_batch(jax.random.key(1), 8, 4, 2)


CALLS = [
    call(mlp.init_mlp, dict(key=jax.random.key(0), layer_sizes=[4, 8, 2]), key=Key()),
    call(mlp.make_regression_batch, dict(key=jax.random.key(0), batch_size=8, d_in=4, d_out=2),
         key=Key(), batch_size=Count(), d_in=Count(), d_out=Count()),
    call(mlp.sgd_update, lambda: dict(params=_params(), grads=_params(), learning_rate=0.1),
         learning_rate=Real()),
    call(mlp.make_sgd_step, dict(loss_fn=mlp.mlp_loss, learning_rate=0.1, donate=False),
         learning_rate=Real(), donate=Flag(), same=anything),
    call(mlp.train, lambda: dict(step=mlp.make_sgd_step(mlp.mlp_loss, learning_rate=0.1),
                                 params=_params(), batch=_batch(), steps=2), steps=Count()),
    call(which_strategy.training_state_bytes, dict(param_bytes=1000, optimizer_slots=2),
         param_bytes=Count(), optimizer_slots=Count(0)),
    call(which_strategy.data_axis_size, dict(batch=32, n_devices=8, min_batch_per_device=2),
         batch=Count(), n_devices=Count(), min_batch_per_device=Count()),
    call(which_strategy.round_batch, dict(batch=30, data=8), batch=Count(), data=Count()),
    call(which_strategy.recommend, dict(param_bytes=10**9, device_bytes=16 * 10**9, batch=64,
                                        n_devices=8, optimizer_slots=2, memory_fraction=0.5,
                                        min_batch_per_device=1),
         param_bytes=Count(), device_bytes=Count(), batch=Count(), n_devices=Count(),
         optimizer_slots=Count(0), memory_fraction=Real(maximum=1.0),
         min_batch_per_device=Count()),
    call(strategies.TwoAxisMesh, dict(model_size=2), model_size=Count(), same=anything),
    call(step_diff.distinct_blocks, dict(out=jnp.ones((8, 4)), n_blocks=4), n_blocks=Count()),
    call(step_diff.dropout, dict(x=jnp.ones((8, 4)), key=jax.random.key(0), rate=0.5),
         key=Key(), rate=Real(positive=False, minimum=0.0, maximum=1.0)),
    call(step_diff.dropout_steps, lambda: dict(mesh=mesh_of(4), axis_name="x", rate=0.5),
         mesh=MeshArg(), axis_name=Axis(), rate=Real(positive=False, minimum=0.0, maximum=1.0),
         same=anything),
    call(cheat_sheet.spec_of, lambda: dict(sharding=NamedSharding(mesh_of(4), P("x")), ndim=2),
         ndim=Count()),
    call(cheat_sheet.spec_text, lambda: dict(sharding=NamedSharding(mesh_of(4), P("x")),
                                             ndim=2), ndim=Count()),
    call(cheat_sheet.layout, lambda: dict(name="dp", params=_params(), batch=_batch(),
                                          learning_rate=0.1),
         name=Choice(), learning_rate=Real(), same=anything),
    call(lambda name: nn.STRATEGIES[name], dict(name="dp"), label="nn.STRATEGIES[name]"),
]
CALLS = [c for c in CALLS if c.args]


CALLS += [
    call(cheat_sheet.cheat_sheet, lambda: dict(names=["dp"], layer_sizes=[4, 8, 2],
                                               batch_size=8, devices=DEVICES[:4]),
         batch_size=Count(), devices=Devices(), same=anything),
    call(cheat_sheet.adam_state_shardings, lambda: dict(params=_params(), how="jit"),
         how=Choice(), same=anything),
    call(step_costs.profile_step, lambda: dict(strategy="dp", params=_params(), batch=_batch(),
                                               devices=DEVICES[:4], learning_rate=0.1, runs=2),
         strategy=Choice(), learning_rate=Real(), runs=Count(), devices=Devices(),
         same=anything),
    call(step_costs.train_run, lambda: dict(strategy="dp", params=_params(), batch=_batch(),
                                            steps=2, learning_rate=0.1, devices=DEVICES[:4],
                                            runs=2),
         steps=Count(), runs=Count(), same=anything),
]

QUICK = [c for c in CALLS if c.label in ("which_strategy.recommend",)]
test_every_guarded_argument, test_numbers_quick = battery_tests(CALLS, QUICK)
