"""Pipelined losses against the one-device reference: loss, parameter and batch gradients,
on 2, 4 and 8 stages, a (data, stage) mesh, layouts that never drift, and bad input."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import hlo
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.pipeline import pipeline

LAYERS, WIDTH, BATCH = 8, 8, 24  # the chapter uses 8 x 128 and a batch of 256


@pytest.fixture(scope="module")
def model():
    params = pipeline.init_stack(jax.random.key(3), LAYERS, WIDTH)
    batch = pipeline.make_batch(jax.random.key(4), BATCH, WIDTH)
    value, grads = jax.jit(jax.value_and_grad(pipeline.stack_loss, argnums=(0, 1)))(params, batch)
    return params, batch, (value, grads)


def _assert_close(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(("n_stages", "n_micro"), [(4, 6), (8, 2)])
def test_loss_and_gradients_equal_the_reference(model, n_stages, n_micro):
    """Both schedules in one compiled program (one compilation instead of two); 2 stages
    are in test_profile_counts_buffers_and_memory_gap, M < S is (8, 2)."""
    params, batch, want = model
    mesh = pipeline.STRATEGIES["gpipe"].mesh(DEVICES[:n_stages])
    params, batch = pipeline.STRATEGIES["gpipe"].shard(params, batch, mesh)
    loss_fns = [s.loss(mesh, n_microbatches=n_micro) for s in pipeline.STRATEGIES.values()]
    both = jax.jit(lambda p, b: [jax.value_and_grad(f, argnums=(0, 1))(p, b) for f in loss_fns])
    for got in both(params, batch):
        _assert_close(got, want)
        for leaf, grad in zip(jax.tree.leaves(params), jax.tree.leaves(got[1][0]), strict=True):
            assert grad.sharding.is_equivalent_to(leaf.sharding, leaf.ndim)  # no drift


def _explicit(mesh):
    """The same devices and axis names with Explicit axes (jax.make_mesh's default)."""
    return jax.make_mesh(mesh.axis_sizes, mesh.axis_names, devices=mesh.devices.ravel(),
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))


def test_explicit_axes_give_the_reference_from_any_layout(model):
    """jax.make_mesh's default axes are Explicit: the loss lays out params and batch itself
    (here arrays not placed on the mesh at all)."""
    params, batch, want = model
    strategy = pipeline.STRATEGIES["1f1b"]
    mesh = _explicit(strategy.mesh(DEVICES[:4]))
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
    loss = strategy.loss(mesh, n_microbatches=3)
    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, batch)
    _assert_close(got, want)
    assert got[1][0]["w"].sharding.is_equivalent_to(NamedSharding(mesh, P("stage")), 3)


@pytest.mark.slow
def test_explicit_eager_grad_training_and_profile(model):
    params, batch, want = model
    strategy = pipeline.STRATEGIES["gpipe"]
    mesh4 = _explicit(strategy.mesh(DEVICES[:4]))
    placed = strategy.shard(params, batch, mesh4)
    assert placed[0]["w"].sharding == strategy.param_shardings(mesh4)["w"]
    loss = strategy.loss(mesh4, n_microbatches=3)
    with jax.set_mesh(mesh4):  # JAX's rule for eager grad of any loss on Explicit axes
        _assert_close(jax.value_and_grad(loss, argnums=(0, 1))(*placed), want)
    want_loss = want[0]
    mesh = _explicit(strategy.mesh(DEVICES[:8], data=2))
    step = pipeline.make_train_step(strategy, mesh, n_microbatches=3, learning_rate=0.1)
    new, loss = step(*strategy.shard(params, batch, mesh))
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=2e-5)
    assert new["w"].sharding.is_equivalent_to(NamedSharding(mesh, P("stage")), 3)
    rows = pipeline.profile(params, batch, _explicit(strategy.mesh(DEVICES[:2])),
                            n_microbatches=2)
    assert all(r["_error"] < 1e-4 and r["ppermutes"] == 2 for r in rows)


def test_data_by_stage_training_keeps_layouts(model):
    params, batch, (want_loss, (want_grads, _)) = model
    strategy = pipeline.STRATEGIES["1f1b"]
    mesh = strategy.mesh(DEVICES[:8], data=2)
    assert dict(mesh.shape) == {"data": 2, "stage": 4}
    params, batch = strategy.shard(params, batch, mesh)
    assert batch[0].sharding.spec == P("data")
    step = pipeline.make_train_step(strategy, mesh, n_microbatches=3, learning_rate=0.1)
    new, loss = step(params, batch)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=2e-5)
    _assert_close(new, jax.tree.map(lambda p, g: p - 0.1 * g, params, want_grads))
    losses = [float(loss)]
    for _ in range(3):
        for leaf in jax.tree.leaves(new):
            assert leaf.sharding == NamedSharding(mesh, P("stage"))
        new, loss = step(new, batch)
        losses.append(float(loss))
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_profile_counts_buffers_and_memory_gap(model):
    params, batch, _ = model
    strategy = pipeline.STRATEGIES["gpipe"]
    mesh = strategy.mesh(DEVICES[:2])
    params, batch = strategy.shard(params, batch, mesh)
    rows = pipeline.profile(params, batch, mesh, n_microbatches=6)
    assert "_temp" not in str(pipeline.profile_table(rows))
    rows = {r["schedule"]: r for r in rows}
    assert rows["gpipe"]["in flight"] == 6 and rows["1f1b"]["in flight"] == 2
    assert all(r["_error"] < 1e-4 and r["ppermutes"] == 2 for r in rows.values())
    saved = rows["gpipe"]["_buffers"] - rows["1f1b"]["_buffers"]
    assert saved == 2 * (6 - 2) * (BATCH // 6) * WIDTH * 4
    assert rows["gpipe"]["_temp"] - rows["1f1b"]["_temp"] == saved


def _stack(n_layers, width, batch_size, features=None):
    """Arrays of the right shapes (NumPy: the checks look at shapes only)."""
    params = {"w": np.zeros((n_layers, width, width), np.float32),
              "b": np.zeros((n_layers, width), np.float32)}
    x = np.zeros((batch_size, features or width), np.float32)
    return params, (x, x)


def _bad_cases():
    mesh4 = pipeline.STRATEGIES["gpipe"].mesh(DEVICES[:4])
    loss = pipeline.STRATEGIES["gpipe"].loss(mesh4, n_microbatches=4)
    params6, batch = _stack(6, 4, 8)
    params8, _ = _stack(8, 4, 8)
    return [
        (lambda: loss(params6, batch), InputError, "n_layers is 6, .* 4"),
        (lambda: loss(*_stack(8, 4, 6)), InputError, "batch size is 6, .* 4"),
        (lambda: loss(params8, _stack(8, 4, 8, features=5)[1]), InputError, "width 4"),
        (lambda: loss({"w": params8["w"]}, batch), InputTypeError, "dict"),
        (lambda: loss(params8, batch[0]), InputTypeError, "pair"),
        (lambda: pipeline.STRATEGIES["1f1b"].loss(mesh4, n_microbatches=0), InputError, "at least 1"),
        (lambda: pipeline.STRATEGIES["1f1b"].loss(jax.make_mesh((2,), ("x",), devices=DEVICES[:2]),
                                            n_microbatches=2), InputError, "'stage'"),
        (lambda: pipeline.STRATEGIES["gpipe"].mesh(DEVICES[:8], data=3), InputError, "divisible by 3"),
        (lambda: pipeline.STRATEGIES["gpipe"].shard(params6, batch, mesh4), InputError, "n_layers"),
        (lambda: pipeline.init_stack(0, 0, 4), InputError, "n_layers"),
        (lambda: pipeline.init_stack(0.5, 2, 4), InputTypeError, "key"),
        (lambda: pipeline.make_train_step(pipeline.STRATEGIES["gpipe"], mesh4, n_microbatches=2,
                                    learning_rate=-1.0), InputError, "positive"),
        (lambda: pipeline.make_train_step(pipeline.STRATEGIES["gpipe"], mesh4, n_microbatches=2,
                                    learning_rate=float("nan")), InputError, "finite"),
        (lambda: pipeline.make_train_step("gpipe", mesh4, n_microbatches=2, learning_rate=0.1),
         InputTypeError, "PipelineStrategy"),
        (lambda: pipeline.init_stack(0, 2, 4, dtype=np.int32), InputTypeError, "float dtype"),
        (lambda: pipeline.init_stack(0, 2, 4, dtype="text"), InputTypeError, "float dtype"),
        (lambda: pipeline.init_stack(0, 2, "4"), InputTypeError, "width"),
        (lambda: pipeline.make_batch(0, -8, 4), InputError, "batch_size"),
        (lambda: pipeline.stack_loss(params8, batch[0]), InputTypeError, "pair"),
        (lambda: pipeline.stack_loss({"w": params8["w"], "b": params8["w"]}, batch), InputError,
         "params\\['b'\\]"),
        (lambda: pipeline.apply_layers(params8, np.zeros((8, 5), np.float32)), InputError,
         "width 4"),
        (lambda: pipeline.apply_layers(params8, np.zeros((8, 4), np.int32)), InputTypeError,
         "floating"),
        (lambda: pipeline.STRATEGIES["gpipe"].mesh("cpu"), InputTypeError, "devices"),
        (lambda: pipeline.STRATEGIES["gpipe"].mesh([0, 1]), InputTypeError, "devices"),
        (lambda: pipeline.STRATEGIES["gpipe"].param_shardings(
            jax.make_mesh((2,), ("x",), devices=DEVICES[:2])), InputError, "'stage'"),
        (lambda: pipeline.STRATEGIES["gpipe"].batch_sharding("mesh"), InputTypeError, "Mesh"),
        (lambda: pipeline.pipelined_loss(mesh4, schedule="interleaved", n_microbatches=2),
         InputError, "schedule"),
        (lambda: pipeline.activation_buffer_bytes("gpipe", 4, 8, batch_size=12, width=4),
         InputError, "batch_size is 12"),
        (lambda: pipeline.activation_buffer_bytes("gpipe", 4, 8, batch_size=16, width=0),
         InputError, "width"),
        (lambda: pipeline.profile(params8, batch, mesh4, n_microbatches=0), InputError,
         "n_microbatches"),
        (lambda: pipeline.profile(params8, batch, "mesh", n_microbatches=2), InputTypeError,
         "Mesh"),
        (lambda: pipeline.profile_table("rows"), InputTypeError, "profile"),
    ]


def test_bad_input_is_refused_before_any_computation():
    for call, error, word in _bad_cases():
        with pytest.raises(error, match=word):
            call()


def test_numpy_scalars_work_like_python_ints():
    strategy = pipeline.STRATEGIES["gpipe"]
    mesh = strategy.mesh(DEVICES[:np.int64(4)], data=np.int64(1))
    assert dict(mesh.shape) == {"stage": 4}
    params = pipeline.init_stack(np.int64(0), np.int64(4), np.int32(4))
    assert params["w"].shape == (4, 4, 4)
    assert pipeline.activation_buffer_bytes("1f1b", np.int64(4), np.int64(8),
                                            batch_size=np.int64(16), width=np.int64(4)) == 256
    strategy.loss(mesh, n_microbatches=np.int64(2))  # accepted


def test_reference_is_the_squared_error_of_the_stack(model):
    params, (x, y), (value, _) = model
    h = np.asarray(x, np.float64)
    for w, b in zip(np.asarray(params["w"]), np.asarray(params["b"]), strict=True):
        h = np.tanh(h @ w + b)
    want = np.mean(np.sum((h - np.asarray(y)) ** 2, axis=-1))
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    assert float(np.std(params["w"])) == pytest.approx(WIDTH ** -0.5, rel=0.3)


@pytest.mark.slow
def test_each_ppermute_sends_s_minus_one_messages(model):
    """pipeline.md, exercise 3: the two collective-permutes pair stage s with s + 1 (and
    back), S - 1 pairs each, none from the last stage forwards or the first backwards."""
    params, batch, _ = model
    strategy = pipeline.STRATEGIES["gpipe"]
    mesh = strategy.mesh(DEVICES[:4])
    params, batch = strategy.shard(params, batch, mesh)
    loss = strategy.loss(mesh, n_microbatches=8)
    permutes = [op for op in hlo.collectives(jax.grad(loss), params, batch)
                if op.kind == "collective-permute"]
    pairs = sorted(tuple(sorted(op.groups)) for op in permutes)
    assert pairs == [((0, 1), (1, 2), (2, 3)), ((1, 0), (2, 1), (3, 2))]


@pytest.mark.parametrize(("rows", "word"), [
    ([{"schedule": "gpipe"}], "rows\\[0\\] lacks"),
    ([], "non-empty"),
    ("rows", "non-empty"),
    ([["schedule"]], "rows\\[0\\] must be a dict"),
])
def test_profile_table_refuses_rows_profile_did_not_make(rows, word):
    with pytest.raises(InputError, match=word):
        pipeline.profile_table(rows)


def test_profile_table_shows_a_complete_row():
    row = dict.fromkeys(pipeline.PROFILE_COLUMNS, "1") | {"_error": 0.0}
    assert "_error" not in str(pipeline.profile_table([row]))


def test_integer_biases_and_targets_are_refused():
    params = pipeline.init_stack(jax.random.key(0), 4, 4)
    x, y = pipeline.make_batch(jax.random.key(1), 8, 4)
    with pytest.raises(InputTypeError, match="params\\['b'\\]"):
        pipeline.stack_loss({"w": params["w"], "b": params["b"].astype(int)}, (x, y))
    with pytest.raises(InputTypeError, match="y must"):
        pipeline.stack_loss(params, (x, y.astype(int)))
