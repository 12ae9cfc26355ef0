"""The NNX model against the Part IX model (lm, transformer.STRATEGIES): the same layouts,
the same loss, the same training step, on meshes over the first 1, 2, 4 and 8 devices with
Auto and Explicit axes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import DEVICES, mesh_of

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.flax_nnx import logical
from spmd_guide.flax_nnx.logical import (
    RULES,
    Model,
    create,
    loss,
    make_optimizer,
    to_lm_params,
    train_step,
)
from spmd_guide.transformer import lm
from spmd_guide.transformer.transformer import STRATEGIES

CONFIG = lm.Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=1, seq_len=8)
BATCH = 8


@functools.cache
def tokens():
    return np.asarray(lm.counting_task(jax.random.key(1), batch=BATCH, config=CONFIG))


def _mesh(name, n, axis_types):
    return STRATEGIES[name].mesh(DEVICES[:n], axis_types=axis_types)


def _host(tree):
    return jax.tree.map(np.asarray, tree)


_lm_loss = jax.jit(lm.lm_loss, static_argnames="config")


def check_layout_and_loss(name, n, axis_types, *, part_ix_loss=True):
    mesh = _mesh(name, n, axis_types)
    model = create(CONFIG, strategy=name, mesh=mesh, seed=3)
    params = to_lm_params(model)
    assert jax.tree.structure(params) == jax.tree.structure(
        lm.init_params(jax.random.key(0), CONFIG))
    # Every parameter laid out as Part IX's strategy lays out its counterpart.
    ref, ref_tokens = STRATEGIES[name].shard(_host(params), tokens(), mesh)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(params),
                                 jax.tree.leaves(ref), strict=True):
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim), \
            (jax.tree_util.keystr(path), got.sharding, want.sharding)
        assert got.dtype == jnp.float32
    value = loss(model, tokens())
    np.testing.assert_allclose(value, _lm_loss(_host(params), tokens(), config=CONFIG),
                               rtol=2e-6)
    if part_ix_loss:
        np.testing.assert_allclose(value, STRATEGIES[name].loss(mesh, CONFIG)(ref, ref_tokens),
                                   rtol=2e-6)


def check_step(name, n, axis_types, microbatches):
    """One step with k microbatches equals one full-batch step (and Part IX's AdamW step);
    parameters and AdamW's moments keep the parameters' layouts."""
    mesh = _mesh(name, n, axis_types)
    model = create(CONFIG, strategy=name, mesh=mesh)
    before = _host(to_lm_params(model))
    layouts = [x.sharding for x in jax.tree.leaves(nnx.state(model))]
    optimizer = make_optimizer(model, learning_rate=1e-2)
    value = train_step(model, optimizer, tokens(), microbatches=microbatches)
    ref_loss, want = _reference_step(before, tokens())
    np.testing.assert_allclose(value, ref_loss, rtol=1e-5)
    for got, w in zip(jax.tree.leaves(to_lm_params(model)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    for x, s in zip(jax.tree.leaves(nnx.state(model)), layouts, strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    mu = nnx.state(optimizer)["opt_state"][0]["mu"]
    for m, s in zip(jax.tree.leaves(mu), layouts, strict=True):
        assert m.sharding.is_equivalent_to(s, m.ndim)
    assert int(optimizer.step[...]) == 1


@jax.jit
def _reference_step(params, tokens):
    """Part IX's model, one AdamW step on the whole batch on one device."""
    ref_loss, grads = jax.value_and_grad(functools.partial(lm.lm_loss, config=CONFIG))(
        params, tokens)
    tx = optax.adamw(1e-2)
    updates, _ = tx.update(grads, tx.init(params), params)
    return ref_loss, optax.apply_updates(params, updates)


# Quick: layouts and loss on a 2-D Explicit mesh; the sweeps cover every strategy on 1, 2, 4
# and 8 devices with both axis types, and the training step with microbatches.
@pytest.mark.slow
def test_fsdp_tp_on_explicit_axes_layout_and_loss():
    check_layout_and_loss("fsdp_tp", 4, "explicit", part_ix_loss=False)


SWEEP = [(name, n, kind) for name in RULES for n in (1, 2, 4, 8) for kind in ("auto", "explicit")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "n", "axis_types"), SWEEP)
def test_layout_and_loss_sweep(name, n, axis_types):
    check_layout_and_loss(name, n, axis_types)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "n", "axis_types"), SWEEP)
def test_step_sweep(name, n, axis_types):
    check_step(name, n, axis_types, microbatches=1 if n == 1 else 4)


@pytest.mark.slow
def test_one_device_model_is_part_ix_model():
    model = Model(CONFIG, rngs=nnx.Rngs(0))
    params = to_lm_params(model)
    shapes = jax.tree.map(lambda x: x.shape, params)
    assert shapes == jax.tree.map(tuple, lm.param_shapes(CONFIG),
                                  is_leaf=lambda x: isinstance(x, tuple))
    np.testing.assert_allclose(loss(model, tokens()),
                               lm.lm_loss(params, tokens(), config=CONFIG), rtol=2e-6)
    # Every parameter is annotated with the logical names of its dimensions.
    for spec in jax.tree.leaves(nnx.get_partition_spec(nnx.state(model))):
        assert len(spec) >= 1 and all(isinstance(n, str) for n in spec)


@pytest.mark.slow
def test_bf16_compute_keeps_float32_parameters():
    mesh = _mesh("dp", 2, "auto")
    m32 = create(CONFIG, strategy="dp", mesh=mesh)
    m16 = create(CONFIG, strategy="dp", mesh=mesh, compute_dtype=jnp.bfloat16)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(m16)))
    l32, l16 = float(loss(m32, tokens())), float(loss(m16, tokens()))
    assert l32 != l16 and abs(l32 - l16) < 0.05
    text = jax.jit(lambda s, t: logical._pure_loss(nnx.graphdef(m16), s, t)).lower(
        nnx.state(m16), tokens()).as_text()
    assert "bf16" in text


def test_bad_input():
    mesh = _mesh("dp", 2, "auto")
    with pytest.raises(InputError, match="unknown strategy 'zero3'"):
        create(CONFIG, strategy="zero3", mesh=mesh)
    with pytest.raises(InputError, match="names mesh axis 'model'"):
        create(CONFIG, strategy="tp", mesh=mesh)
    with pytest.raises(InputError, match="n_heads"):
        create(lm.Config(n_heads=4), strategy="tp", mesh=_mesh("tp", 8, "auto"))
    for kwargs in ({"seed": -1}, {"seed": 1.5}, {"param_dtype": jnp.int32},
                   {"compute_dtype": "int8"}, {"mesh": "data"}, {"strategy": None}):
        with pytest.raises(InputError):
            create(CONFIG, **({"strategy": "dp", "mesh": mesh} | kwargs))
    with pytest.raises(InputTypeError):
        create({"vocab": 32}, strategy="dp", mesh=mesh)
    with pytest.raises(InputTypeError, match="rngs"):
        Model(CONFIG, rngs=0)
    # Every check runs before anything is compiled.
    model = Model(CONFIG, rngs=nnx.Rngs(0))
    optimizer = make_optimizer(model)
    with pytest.raises(InputError, match="microbatches=3"):
        train_step(model, optimizer, tokens(), microbatches=3)
    for k in (0, -2, 1.0, True):
        with pytest.raises(InputError):
            train_step(model, optimizer, tokens(), microbatches=k)
    with pytest.raises(InputError, match="seq_len"):
        loss(model, tokens()[:, :5])
    with pytest.raises(InputError, match="token id"):
        loss(model, tokens() + CONFIG.vocab)
    for bad in (to_lm_params(model), None):
        with pytest.raises(InputTypeError):
            loss(bad, tokens())
    with pytest.raises(InputTypeError):
        train_step(model, optax.adamw(1e-3), tokens())
    with pytest.raises(InputError):
        make_optimizer(model, learning_rate=0)
    small = logical.abstract_model(lm.Config(d_model=16, n_heads=4), strategy="dp",
                                   mesh=_mesh("dp", 1, "auto"))
    other = nnx.eval_shape(lambda m: nnx.Optimizer(m, optax.adamw(1e-3), wrt=nnx.Param), small)
    with pytest.raises(InputError, match="does not track"):
        train_step(model, other, tokens())
    # An abstract model (shapes only) compiles, it does not run or make an optimizer.
    for call in (lambda: make_optimizer(small), lambda: loss(small, tokens()),
                 lambda: train_step(small, other, tokens())):
        with pytest.raises(InputError, match="model is abstract"):
            call()
    auto = mesh_of(2, ("data",))
    manual_mixed = jax.make_mesh((2, 1), ("data", "model"), devices=DEVICES[:2],
                                 axis_types=(jax.sharding.AxisType.Auto,
                                             jax.sharding.AxisType.Explicit))
    assert logical.abstract_model(CONFIG, strategy="dp", mesh=auto).mesh is auto
    with pytest.raises(InputError, match="all axes Auto or all Explicit"):
        create(CONFIG, strategy="dp", mesh=manual_mixed)


@pytest.mark.slow
def test_model_without_mesh_trains_with_microbatches():
    values = []
    for k in (1, 4):
        model = Model(CONFIG, rngs=nnx.Rngs(0))
        before = _host(to_lm_params(model))
        value = train_step(model, make_optimizer(model, learning_rate=1e-2), tokens(),
                           microbatches=k)
        values.append((float(value), to_lm_params(model)))
    ref_loss, want = _reference_step(before, tokens())
    for value, params in values:
        np.testing.assert_allclose(value, ref_loss, rtol=1e-5)
        for got, w in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)


def test_an_optimizer_made_for_another_model_is_refused():
    """Flax 0.12's nnx.Optimizer does not hold its model: a same-shaped model would silently
    take the other's AdamW moments. make_optimizer remembers which model it was made for."""
    first, second = Model(CONFIG, rngs=nnx.Rngs(0)), Model(CONFIG, rngs=nnx.Rngs(1))
    optimizer = make_optimizer(first)
    before = _host(to_lm_params(second))
    with pytest.raises(InputError, match="made for another model"):
        train_step(second, optimizer, tokens())
    for got, want in zip(jax.tree.leaves(to_lm_params(second)), jax.tree.leaves(before),
                         strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)  # nothing was updated


def test_a_step_frees_no_array_another_object_holds():
    """train_step does not donate: arrays shared with a clone, or taken before the step with
    to_lm_params, stay readable and unchanged; the stepped model has new ones."""
    model = Model(CONFIG, rngs=nnx.Rngs(0))
    before = to_lm_params(model)
    # Copies: a NumPy view of a CPU array would hold its buffer and keep JAX from donating it.
    saved = jax.tree.map(lambda x: np.array(x, copy=True), before)
    twin = nnx.clone(model)
    assert twin.blocks[0].wq.get_value() is model.blocks[0].wq.get_value()  # clone shares
    train_step(twin, make_optimizer(twin), tokens())
    train_step(model, make_optimizer(model), tokens())
    for tree in (before, to_lm_params(nnx.clone(twin))):
        assert all(not x.is_deleted() for x in jax.tree.leaves(tree))
    for got, want in zip(jax.tree.leaves(before), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)  # the old values, still there
    changed = [not np.array_equal(np.asarray(a), b) for a, b in zip(
        jax.tree.leaves(to_lm_params(model)), jax.tree.leaves(saved), strict=True)]
    assert all(changed)
    for a, b in zip(jax.tree.leaves(to_lm_params(model)), jax.tree.leaves(to_lm_params(twin)),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same start, same step


def check_zero1_step(n, axis_types, *, gradient_layout="params"):
    """ZeRO-1: a 'dp' model whose AdamW moments are laid out by the 'fsdp' table (ZeRO-2
    with ``gradient_layout='state'``: the gradient kept in the moments' layout too). One step
    equals Part IX's one-device AdamW step; the parameters stay whole on every device, the
    moments stay split over data, as the fsdp table lays them out."""
    mesh = _mesh("dp", n, axis_types)
    model = create(CONFIG, strategy="dp", mesh=mesh)
    before = _host(to_lm_params(model))
    optimizer = make_optimizer(model, learning_rate=1e-2, state_strategy="fsdp",
                               gradient_layout=gradient_layout)
    value = train_step(model, optimizer, tokens(), microbatches=2)
    ref_loss, want = _reference_step(before, tokens())
    np.testing.assert_allclose(value, ref_loss, rtol=1e-5)
    for got, w in zip(jax.tree.leaves(to_lm_params(model)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
        assert got.sharding.is_fully_replicated
    split = logical.abstract_model(CONFIG, strategy="fsdp", mesh=mesh)
    mu = nnx.state(optimizer)["opt_state"][0]["mu"]
    for m, s in zip(jax.tree.leaves(mu), jax.tree.leaves(nnx.state(split)), strict=True):
        assert m.sharding.is_equivalent_to(s.sharding, m.ndim)
    assert n == 1 or not all(m.sharding.is_fully_replicated for m in jax.tree.leaves(mu))


@pytest.mark.slow
@pytest.mark.parametrize(("n", "axis_types"), [(n, k) for n in (1, 2, 4, 8)
                                               for k in ("auto", "explicit")])
def test_zero1_step_sweep(n, axis_types):
    check_zero1_step(n, axis_types)


def test_zero2_step_equals_the_one_device_step():
    """ZeRO-2, the gradient in the moments' layout: the same step as one device's AdamW."""
    check_zero1_step(4, "explicit", gradient_layout="state")


@pytest.mark.slow
@pytest.mark.parametrize(("n", "axis_types"), [(n, k) for n in (2, 4, 8)
                                               for k in ("auto", "explicit")])
def test_zero2_step_sweep(n, axis_types):
    check_zero1_step(n, axis_types, gradient_layout="state")


def test_gradient_layout_is_one_of_two_names():
    model = create(CONFIG, strategy="dp", mesh=_mesh("dp", 2, "auto"))
    for bad in ("zero2", "", "State", None, True, 2, 2.0, np.int64(1), ("state",)):
        with pytest.raises(InputError, match="gradient_layout"):
            make_optimizer(model, state_strategy="fsdp", gradient_layout=bad)
    with pytest.raises(InputError, match="gradient_layout"):
        make_optimizer(Model(CONFIG, rngs=nnx.Rngs(0)), gradient_layout="zero2")
    with pytest.raises(TypeError):
        make_optimizer(model, 1e-2, "fsdp", "state")  # keyword-only


def test_zero1_needs_a_mesh_and_a_table_for_it():
    with pytest.raises(InputError, match="state_strategy"):
        make_optimizer(Model(CONFIG, rngs=nnx.Rngs(0)), state_strategy="fsdp")
    model = create(CONFIG, strategy="dp", mesh=_mesh("dp", 2, "auto"))
    for bad, word in (("zero1", "unknown strategy"), ("tp", "'model'"), (3, "strategy")):
        with pytest.raises(InputError, match=word):
            make_optimizer(model, state_strategy=bad)
