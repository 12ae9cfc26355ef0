"""Every guarded argument of the Part IX functions through its class battery (battery.py):
config sizes, keys, token arrays, meshes, axis names, strategy and layout names. Each answer
is the package's InputError naming the argument, or (for a valid form: NumPy/JAX integer
scalars, raw keys, Explicit axes) the plain value's answer."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from battery import (
    Array,
    Axis,
    Choice,
    Count,
    Flag,
    Key,
    MeshArg,
    Real,
    Tree,
    battery_tests,
    call,
)
from helpers import DEVICES, mesh_of

from spmd_guide.transformer import (
    attention,
    breakdown,
    lm,
    memory,
    pricing,
    step_memory,
    transformer,
    verify,
)

CONFIG = dict(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)


@functools.cache
def _config():
    return lm.Config(**CONFIG)


@functools.cache
def _params():
    return lm.init_params(jax.random.key(0), _config())


def _tokens():
    return jax.random.randint(jax.random.key(1), (8, 9), 0, 16)


def _qkv():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 8, 2, 4)) for i in range(3))
    return dict(q=q, k=k, v=v)


NUMERIC = [
    call(lm.Config, CONFIG, **{k: Count() for k in CONFIG}),
    call(attention.layout_positions, dict(seq=16, n=4, layout="zigzag"), seq=Count(),
         n=Count(), layout=Choice()),
    call(attention.check_ring, dict(seq=16, n=4, layout="zigzag"), seq=Count(), n=Count(),
         layout=Choice()),
    call(attention.causal_work, dict(seq=16, n=4, layout="zigzag"), seq=Count(), n=Count(),
         layout=Choice()),
    call(attention.ring_schedule, dict(n=4), n=Count()),
    call(lm.optimizer, dict(learning_rate=1e-3, weight_decay=0.01),
         learning_rate=Real(), weight_decay=Real(positive=False, minimum=0.0),
         same=lambda a, b: True),
    call(lm.against_uniform, dict(loss=1.5, vocab=16), loss=Real(positive=False, minimum=0.0),
         vocab=Count()),
    call(pricing.transformer_big_arrays, dict(batch=16, n_devices=8, d_model=64),
         batch=Count(), n_devices=Count(), d_model=Count()),
    call(pricing.transformer_counts, dict(name="dp", batch=8, vocab=16, d_model=16, n_heads=4,
                                          d_ff=32, n_layers=1, seq_len=8),
         name=Choice(), batch=Count(), d_model=Count(), n_layers=Count()),
]

ARRAYS = [
    call(lm.init_params, lambda: dict(key=jax.random.key(0), config=_config()), key=Key()),
    call(lm.counting_task, lambda: dict(key=jax.random.key(0), batch=4, config=_config()),
         key=Key(), batch=Count()),
    call(lm.lm_loss, lambda: dict(params=_params(), tokens=_tokens(), config=_config()),
         tokens=Array(ndim=2, kind="iu")),
    call(lm.forward, lambda: dict(params=_params(), inputs=_tokens()[:, :8]),
         inputs=Array(ndim=2, kind="iu")),
    call(lm.train_one_device, lambda: dict(key=jax.random.key(0), config=_config(), steps=2,
                                           batch=4, learning_rate=1e-3),
         key=Key(), steps=Count(), batch=Count(), learning_rate=Real()),
    call(attention.reference_attention, lambda: _qkv() | dict(causal=True),
         q=Array(ndim=4), causal=Flag()),
    call(attention.ring_attention, lambda: _qkv() | dict(mesh=mesh_of(4), axis_name="x",
                                                         causal=True, layout="zigzag"),
         q=Array(ndim=4), mesh=MeshArg(), axis_name=Axis(), causal=Flag(), layout=Choice()),
    call(transformer.train_step, lambda: dict(
        strategy=transformer.STRATEGIES["dp"], mesh=transformer.STRATEGIES["dp"].mesh(
            DEVICES[:4]), config=_config(), params=_params(), optimizer=lm.optimizer(),
        donate=False), mesh=MeshArg(axes=("data",), explicit=False), donate=Flag(),
        same=lambda a, b: True),
    call(memory.kept_per_token, lambda: dict(config=_config()), config=Choice()),
    call(verify.predicted_comm_bytes, lambda: dict(
        strategy=transformer.STRATEGIES["dp"], mesh=transformer.STRATEGIES["dp"].mesh(
            DEVICES[:4]), config=_config(), params=_params(), batch=8),
        batch=Count(), mesh=MeshArg(axes=("data",))),
    call(memory.predicted_bytes, lambda: dict(
        strategy=transformer.STRATEGIES["dp"], mesh=transformer.STRATEGIES["dp"].mesh(
            DEVICES[:4]), config=_config(), params=_params(), batch=8),
        batch=Count(), mesh=MeshArg(axes=("data",))),
]

MORE = [
    call(attention.draw_ring, dict(n=4, seq=16, layout="zigzag"), n=Count(), seq=Count(),
         layout=Choice(), same=lambda a, b: True),
    call(attention.saved_for_backward, lambda: _qkv() | dict(mesh=mesh_of(2), axis_name="x",
                                                             causal=True),
         mesh=MeshArg(), axis_name=Axis(), causal=Flag()),
    call(breakdown.scatter_forms, lambda: dict(mesh=mesh_of(4), axis_name="x"),
         mesh=MeshArg(), axis_name=Axis()),
    call(lm.cross_entropy, lambda: dict(logits=jnp.zeros((2, 8, 16)),
                                        targets=jnp.zeros((2, 8), jnp.int32)),
         logits=Array(ndim=3), targets=Array(ndim=2, kind="iu")),
    call(lm.check_params, lambda: dict(params=_params(), config=_config()), params=Tree()),
    call(lm.config_of, lambda: dict(params=_params()), params=Tree()),
    call(step_memory.init_stack, dict(key=jax.random.key(0), layers=2, width=8), key=Key(),
         layers=Count(), width=Count()),
    call(step_memory.remat_grad, lambda: dict(mesh=mesh_of(4), variant="no remat", axis="x",
                                              unrolled=False),
         variant=Choice(), unrolled=Flag(), same=lambda a, b: True),
    call(step_memory.hybrid_step, lambda: dict(
        mesh=mesh_of(8, ("data", "fsdp"), (2, 4)), k=2, learning_rate=0.1, momentum=0.9,
        loop=True), k=Count(), learning_rate=Real(), momentum=Real(positive=False, minimum=0.0,
                                                                  maximum=1.0),
         loop=Flag(), same=lambda a, b: True),
]

CALLS = NUMERIC + ARRAYS + MORE


QUICK = [c for c in NUMERIC if c.label in ("lm.Config", "attention.causal_work")]
test_every_guarded_argument, test_numbers_quick = battery_tests(CALLS, QUICK)
