"""The cheat sheet against the shardings the strategies' programs really produce."""

from __future__ import annotations

import dataclasses
import re

import jax
import pytest
from helpers import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import nn
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.nn import cheat_sheet

SIZES = [8, 16, 8]
_LAYOUTS: dict = {}


def _model(batch_size: int = 16, sizes=tuple(SIZES)):
    params = nn.init_mlp(jax.random.key(0), sizes)
    batch = nn.make_regression_batch(jax.random.key(1), batch_size, sizes[0], sizes[-1])
    return params, batch


def _layout(name, k, sizes=tuple(SIZES)):
    """One layout per (strategy, devices, sizes), computed once for the module."""
    if (name, k, sizes) not in _LAYOUTS:
        _LAYOUTS[name, k, sizes] = cheat_sheet.layout(name, *_model(sizes=sizes), devices=DEVICES[:k])
    return _LAYOUTS[name, k, sizes]


def _specs(tree, leaves_like):
    return [cheat_sheet.spec_text(a.sharding, a.ndim) for a in jax.tree.leaves(tree)]


@pytest.mark.parametrize(("name", "k", "sizes"), [
    ("fsdp", 4, tuple(SIZES)),
    pytest.param("auto_dp_tp", 4, (8, 16, 16, 8), marks=pytest.mark.slow),
    pytest.param("dp", 2, (8, 8), marks=pytest.mark.slow)])
def test_sheet_matches_the_arrays_the_programs_return(name, k, sizes):
    params, batch = _model(sizes=sizes)
    lay = _layout(name, k, sizes)
    strategy = nn.STRATEGIES[name]
    mesh = strategy.mesh(DEVICES[:k])
    placed, placed_batch = strategy.shard(params, batch, mesh)
    loss = strategy.loss(mesh)
    flat = lambda pairs: [s for pair in pairs for s in pair]  # noqa: E731
    # run the programs and read the arrays they return
    assert flat(lay.params) == _specs(placed, placed)
    assert lay.batch == cheat_sheet.spec_text(placed_batch[0].sharding, 2)
    assert flat(lay.grads) == _specs(cheat_sheet.gradient_program(loss)(placed, placed_batch), placed)
    new_params, _ = nn.make_sgd_step(loss, learning_rate=0.01)(placed, placed_batch)
    assert flat(lay.updated) == _specs(new_params, placed)
    assert list(lay.activations) == _specs(jax.jit(nn.layer_outputs)(placed, placed_batch[0]),
                                          None)
    state = jax.jit(cheat_sheet.adamw().init)(placed)
    assert flat(lay.adam_mu) == _specs(state[0].mu, placed)
    assert lay.mesh_shape == dict(mesh.shape)
    assert lay.param_bytes_total == sum(4 * (a * b + b) for a, b in zip(sizes, sizes[1:], strict=False))
    assert lay.param_bytes_per_device == nn.param_bytes_per_device(placed)


def test_layouts_the_strategies_promise():
    params, batch = _model()
    dp = _layout("dp", 2, (8, 8))
    fsdp = _layout("fsdp", 4)
    assert dp.family == "DP" and fsdp.family == "FSDP"
    assert set(dp.params) == {("P()", "P()")} and dp.batch == "P('batch', None)"
    assert set(fsdp.params) == {("P('batch', None)", "P('batch')")}
    assert fsdp.param_bytes_per_device * 4 == fsdp.param_bytes_total
    assert dp.param_bytes_per_device == dp.param_bytes_total
    assert dp.grads_match_params and dp.step_keeps_layout
    for part, columns in cheat_sheet.COLUMNS.items():
        table = cheat_sheet.sheet_table([dp, fsdp], part=part)
        assert table.headers == list(columns) and table.rows[1]["strategy"].startswith("fsdp")
    assert "P('batch', None)" in str(cheat_sheet.sheet_table([fsdp]))
    assert dp.collective_counts["all-reduce"] >= 1 and fsdp.collective_counts["all-gather"] >= 1
    # AdamW's state initialised under a bare jit lands on one device, whatever the params
    assert set(fsdp.adam_mu) == {("device 0 only", "device 0 only")}
    assert not fsdp.adam_matches_params
    assert fsdp.adam_pinned == fsdp.params  # the sheet's last column: pinned_init's layout
    step = cheat_sheet.sheet_table([fsdp], part="step").rows[0]
    assert step[cheat_sheet.ADAM_BARE] == "device 0 only"
    assert step[cheat_sheet.ADAM_PINNED] == "P('batch', None)" and step["strategy"] == "fsdp"
    assert cheat_sheet.sheet_table([fsdp], part="layout").rows[0]["strategy"] == (
        "fsdp\nFSDP, shard_map\nbatch=4")
    placed, _ = nn.STRATEGIES["fsdp"].shard(params, batch, nn.STRATEGIES["fsdp"].mesh(DEVICES[:4]))
    for how in ("eager", "pinned"):
        mu, nu = cheat_sheet.adam_state_shardings(placed, how=how)
        assert cheat_sheet._pairs(mu, placed) == cheat_sheet._pairs(nu, placed) == fsdp.params
    pinned = cheat_sheet.pinned_init(cheat_sheet.adamw(), placed)(placed)
    assert [a.sharding for a in jax.tree.leaves(pinned[0].mu)] == [
        a.sharding for a in jax.tree.leaves(placed)]


def test_spec_text_and_family():
    mesh = jax.make_mesh((2, 2), ("a", "b"), devices=DEVICES[:4])
    assert cheat_sheet.spec_text(NamedSharding(mesh, P("a")), 2) == "P('a', None)"
    assert cheat_sheet.spec_text(NamedSharding(mesh, P()), 3) == "P()"
    assert cheat_sheet.spec_text(NamedSharding(mesh, P(("a", "b"), None)), 2) == "P(('a', 'b'), None)"
    assert cheat_sheet.spec_text(jax.sharding.SingleDeviceSharding(DEVICES[3]), 1) == "device 3 only"
    assert cheat_sheet.spec_of(NamedSharding(mesh, P("a")), 2) == P("a", None)
    assert cheat_sheet.family({"batch": 8}, "P('batch', None)", ["P()"]) == "DP"
    assert cheat_sheet.family({"batch": 8}, "P('batch', None)", ["P('batch', None)"]) == "FSDP"
    assert cheat_sheet.family({"model": 8}, "P(None, 'model')", ["P('model', None)"]) == "TP"
    assert cheat_sheet.family({"d": 4, "m": 2}, "P('d', None)", ["P()"]) == "2-D"
    assert cheat_sheet.per_layer(["P()"] * 3) == "P()"
    assert cheat_sheet.per_layer(["P()", "X", "X", "P()"]) == "L0: P()\nL1-2: X\nL3: P()"


_MESH = jax.make_mesh((2, 2), ("a", "b"), devices=DEVICES[:4])


@pytest.mark.parametrize(("call", "error", "word"), [
    # issue #27: a lone string is not a list of layers, names or layouts
    (lambda: cheat_sheet.per_layer("P('a')"), InputTypeError, "wrap it: [\"P('a')\"]"),
    (lambda: cheat_sheet.per_layer([]), InputError, "non-empty"),
    (lambda: cheat_sheet.per_layer(["P()", 3]), InputTypeError, "spec strings"),
    (lambda: cheat_sheet.per_layer(None), InputError, "specs"),
    (lambda: cheat_sheet.cheat_sheet("dp"), InputTypeError, "wrap it: ['dp']"),
    (lambda: cheat_sheet.cheat_sheet([]), InputError, "at least one strategy"),
    (lambda: cheat_sheet.cheat_sheet(["dp", "zero"]), InputError, "unknown strategy 'zero'"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], devices="cpu"), InputTypeError, "jax.Device"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], devices=[0, 1]), InputTypeError, "jax.Device"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], devices=_MESH), InputTypeError, "got a Mesh"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], batch_size=16.0), InputTypeError, "batch_size"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], layer_sizes="16 64"), InputTypeError, "layer_sizes"),
    (lambda: cheat_sheet.layout("dp", *_model(), learning_rate=0), InputError, "learning_rate"),
    (lambda: cheat_sheet.layout("dp", "params", _model()[1]), InputTypeError, "params"),
    (lambda: cheat_sheet.spec_text("P('a')", 2), InputTypeError, "Sharding"),
    (lambda: cheat_sheet.spec_text(jax.sharding.NamedSharding(_MESH, P("a")), -1), InputError,
     "ndim"),
    (lambda: cheat_sheet.spec_of(jax.sharding.NamedSharding(_MESH, P("a", "b")), 1), InputError,
     "ndim"),
    (lambda: cheat_sheet.family("batch=8", "P('batch', None)", ["P()"]), InputTypeError,
     "mesh_shape"),
    (lambda: cheat_sheet.family({"batch": 0}, "P('batch', None)", ["P()"]), InputError,
     "mesh_shape['batch']"),
    (lambda: cheat_sheet.family({"batch": 8}, P("batch"), ["P()"]), InputTypeError, "batch_spec"),
    (lambda: cheat_sheet.family({"batch": 8}, "P('batch', None)", "P()"), InputTypeError,
     "weight_specs"),
    (lambda: cheat_sheet.sheet_table(_layout("dp", 2, (8, 8))), InputTypeError, "one Layout"),
    (lambda: cheat_sheet.sheet_table(["dp"]), InputTypeError, "Layout objects"),
    (lambda: cheat_sheet.notes("dp"), InputError, "at least one layout"),
    (lambda: _layout("dp", 2, (8, 8)).row(full_name="no"), InputTypeError, "full_name"),
    (lambda: cheat_sheet.gradient_program("loss"), InputTypeError, "loss"),
    (lambda: cheat_sheet.adam_state_shardings("params"), InputTypeError, "params"),
    (lambda: cheat_sheet.pinned_init("adamw", _model()[0]), InputTypeError, "GradientTransformation"),
    (lambda: cheat_sheet.layout("zero", *_model()), InputError, "strategy"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], layer_sizes=[8]), InputError, "layer_sizes"),
    (lambda: cheat_sheet.cheat_sheet(["dp"], batch_size=0), InputError, "batch_size"),
    (lambda: cheat_sheet.sheet_table([]), InputError, "layout"),
    (lambda: cheat_sheet.sheet_table([_layout("dp", 2, (8, 8))], part="all"), InputError, "part"),
    (lambda: cheat_sheet.adam_state_shardings(_model()[0], how="lazy"), InputError, "how"),
    (lambda: cheat_sheet.spec_of("P()", 1), TypeError, "NamedSharding"),
    (lambda: cheat_sheet.pinned_init(cheat_sheet.adamw(), _model()[0]), InputTypeError, "NamedSharding"),
    (lambda: cheat_sheet.layout("fsdp", *_model(batch_size=6), devices=DEVICES[:4]), ValueError, "6"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=re.escape(word)):
        call()


def test_numpy_scalars_and_arrays_work_where_python_ones_do():
    import numpy as np

    assert cheat_sheet.family({"batch": np.int64(8)}, "P('batch', None)",
                              np.array(["P()"])) == "DP"
    assert cheat_sheet.per_layer(np.array(["P()", "X"])) == "L0: P()\nL1: X"
    sharding = jax.sharding.NamedSharding(_MESH, P("a"))
    assert cheat_sheet.spec_text(sharding, np.int32(2)) == "P('a', None)"
    assert cheat_sheet.spec_of(sharding, np.int64(2)) == P("a", None)
    lay = cheat_sheet.layout("dp", *_model(sizes=(8, 8)), devices=np.array(DEVICES[:2]),
                             learning_rate=np.float32(0.01))
    assert lay.mesh_shape == {"batch": 2} and lay == _layout("dp", 2, (8, 8))


def test_notes_follow_the_layouts():
    dp, fsdp = _layout("dp", 2, (8, 8)), _layout("fsdp", 4)
    text = cheat_sheet.notes([dp, fsdp])
    assert "Every strategy gets its gradients back" in text
    assert "for any strategy: it lands as device 0 only" in text
    drifting = dataclasses.replace(fsdp, grads=dp.grads)  # pretend fsdp's gradients drift
    assert "`dp` gets its gradients back in the parameters' own layout; `fsdp` does not" in (
        cheat_sheet.notes([dp, drifting]))
    assert "`dp`, `dp` get their gradients back in the parameters' own layout; `fsdp`, `fsdp` do"\
        " not" in cheat_sheet.notes([dp, dp, drifting, drifting])
    assert "No strategy gets its gradients back" in cheat_sheet.notes([drifting])
    with pytest.raises(InputError, match="layout"):
        cheat_sheet.notes([])


@pytest.mark.parametrize(("args", "word"), [
    (({"data": 8}, "garbage", ["P()"]), "batch_spec 'garbage' is not a spec"),
    (({"data": 8}, "P('data', None)", ["P('model', None)"]), "weight_specs\\[0\\].*'model'"),
    (({"data": 8}, "P('batch')", ["P()"]), "batch_spec.*'batch'"),
    (({"data": 8}, "P('data'", ["P()"]), "batch_spec"),
])
def test_family_refuses_specs_it_cannot_read(args, word):
    """Review: an unreadable spec fell through to 'replicated'."""
    with pytest.raises(InputError, match=word):
        cheat_sheet.family(*args)


def test_family_reads_every_form_spec_text_writes():
    assert cheat_sheet.family({"a": 8, "b": 1}, "P(('a', 'b'), None)", ["P(None, None)"]) == "DP"
    assert cheat_sheet.family({"data": 8}, "P()", ["P(None, 'data')"]) == "TP"


def test_spec_text_refuses_fewer_dimensions_than_the_spec_names():
    mesh = jax.make_mesh((2,), ("data",), devices=DEVICES[:2])
    with pytest.raises(InputError, match="ndim must be at least 2"):
        cheat_sheet.spec_text(NamedSharding(mesh, P("data", None)), 1)
