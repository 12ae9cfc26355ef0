"""Bytes per axis: the formulas, checked by hand and against compiled programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide.core import checks, hlo
from spmd_guide.pipeline import axes, moe

TOKENS, D = 32, 16


def _bytes(fn, *args) -> dict[str, int]:
    sent: dict[str, int] = {}
    for op in hlo.collectives(fn, *args):
        sent[op.kind] = sent.get(op.kind, 0) + op.bytes_sent
    return sent


@pytest.mark.parametrize(("n", "explicit"), [(2, False), (8, True)])
def test_formulas_equal_compiled_programs(n, explicit):
    """On Auto axes and on Explicit ones (jax.make_mesh's default): the programs lay out
    their arguments themselves, and the bytes are the same."""
    x = jnp.ones((TOKENS, D))
    w = jnp.ones((D, D))
    mesh = mesh_of(n, ("a",), explicit=explicit)
    assert _bytes(axes.data_program(mesh, "a"), w, x) == {
        "all-reduce": axes.data_bytes(D * D * 4, n)}
    fsdp = _bytes(axes.fsdp_program(mesh, "a"), w, x)
    assert sum(fsdp.values()) == axes.fsdp_bytes(D * D * 4, n, gathers=1)
    assert set(fsdp) == {"all-gather", "reduce-scatter"}
    w1, w2 = jnp.ones((D, 2 * D)), jnp.ones((2 * D, D))
    assert _bytes(axes.tensor_program(mesh, "a"), x, w1, w2) == {
        "all-reduce": axes.tensor_bytes(TOKENS * D * 4, n, all_reduces=1)}
    assert _bytes(axes.pipeline_program(mesh, "a"), x) == {
        "collective-permute": axes.pipeline_bytes(TOKENS // n * D * 4, n, sends=1)}


def test_traffic_by_hand():
    model = axes.Model(n_layers=4, d_model=8, d_ff=32, batch=16, seq_len=4, bytes_per_value=4)
    params = 4 * (4 * 64 + 2 * 8 * 32)
    assert model.dense_params == params and model.expert_params == 0
    rows = {r.axis: r for r in axes.traffic(model, {"data": 4})}
    assert rows["data"].bytes_sent == 2 * 3 * params * 4 // 4
    assert all(r.bytes_sent == 0 and r.ops == 0 for a, r in rows.items() if a != "data")
    rows = {r.axis: r for r in axes.traffic(model, {"tensor": 2, "pipeline": 2},
                                            n_microbatches=4)}
    activation = 16 * 4 * 8 * 4
    assert rows["tensor"].bytes_sent == 4 * 2 * activation  # 4 all-reduces x 2 layers x 1/1
    assert rows["pipeline"].bytes_sent == 2 * activation
    assert rows["pipeline"].ops == 8
    remat = {r.axis: r.bytes_sent for r in axes.traffic(model, {"fsdp": 4})}["fsdp"]
    plain = {r.axis: r.bytes_sent for r in axes.traffic(model, {"fsdp": 4}, remat=False)}
    assert remat == 3 * 3 * params * 4 // 4 and plain["fsdp"] == 2 * 3 * params * 4 // 4


def test_expert_row_uses_the_moe_buffer():
    model = axes.Model(n_layers=2, d_model=8, d_ff=16, batch=8, seq_len=4, n_experts=4,
                       top_k=2, capacity_factor=1.0, bytes_per_value=4)
    row = {r.axis: r for r in axes.traffic(model, {"expert": 4})}["expert"]
    per_layer = moe.all_to_all_bytes(32, 4, top_k=2, n_experts=4, capacity_factor=1.0,
                                     d_model=8, rule="per_device")
    dense_grads = axes.data_bytes(model.dense_params * 4, 4)
    assert row.bytes_sent == 4 * 2 * per_layer + dense_grads
    assert row.ops == 4 * 2 + 1


def test_placement_puts_the_heaviest_axes_inside_a_node():
    model = axes.Model(n_layers=8, d_model=256, d_ff=1024, batch=64, seq_len=128,
                       n_experts=8, top_k=2)
    rows = axes.traffic(model, {"data": 2, "fsdp": 2, "tensor": 4, "expert": 2,
                                "pipeline": 2}, n_microbatches=4)
    placement = axes.place_axes(rows, devices_per_node=8)
    heaviest = max(rows, key=lambda r: r.bytes_sent)
    assert placement[heaviest.axis] == "fast"
    fast = [r.size for r in rows if placement[r.axis] == "fast"]
    assert 8 % jnp.prod(jnp.array(fast)) == 0
    assert set(axes.place_axes(rows, devices_per_node=1).values()) == {"slow"}
    seconds = axes.link_seconds(rows, placement, fast_bandwidth=4e11, slow_bandwidth=5e10)
    slow = axes.link_seconds(rows, dict.fromkeys(placement, "slow"),
                             fast_bandwidth=4e11, slow_bandwidth=5e10)
    assert sum(seconds.values()) < sum(slow.values())


def test_programs_run_on_inputs_laid_out_otherwise():
    """Explicit axes refuse a shard_map input whose layout differs from in_specs; the
    programs move it first, and compute the same numbers as on Auto axes."""
    x = jnp.arange(TOKENS * D, dtype=jnp.float32).reshape(TOKENS, D) / 100
    w = jnp.eye(D)
    results = {}
    for explicit in (False, True):
        mesh = mesh_of(4, ("a",), explicit=explicit)
        x_cols = jax.device_put(x, jax.NamedSharding(mesh, jax.P(None, "a")))
        results[explicit] = (axes.data_program(mesh, "a")(w, x_cols),
                             axes.pipeline_program(mesh, "a")(x_cols))
    for got, want in zip(results[True], results[False], strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(results[True][0]), 2 * np.asarray(x.T @ x),
                               rtol=1e-5)


def test_traffic_takes_a_jax_mesh_of_either_axis_type():
    model = axes.Model(n_layers=4, d_model=8, d_ff=32, batch=16, seq_len=4)
    want = axes.traffic(model, {"data": 2, "tensor": 4})
    for explicit in (False, True):
        mesh = mesh_of(8, ("data", "tensor"), (2, 4), explicit=explicit)
        assert axes.traffic(model, mesh) == want


def test_mixtral_from_its_published_config():
    """composing.md: Mixtral 8x7B has 46.7 B parameters, 12.9 B used per token (Mistral
    AI's figures: 47 B and 13 B); the page's model has its widths but 2-matrix experts,
    full multi-head attention and no embeddings."""
    counts = axes.mixtral_params()
    assert counts["total"] == 46_702_792_704
    assert counts["active"] == 12_879_925_248
    assert counts["experts"] == 32 * 8 * 3 * 4096 * 14336
    assert counts["attention"] == 32 * (2 * 4096 ** 2 + 2 * 4096 * 1024)
    model = axes.Model(n_layers=32, d_model=4096, d_ff=14336, batch=256, seq_len=4096,
                       n_experts=8, top_k=2)
    assert model.dense_params + model.expert_params == 32_212_254_720
    assert model.expert_params * 3 == counts["experts"] * 2
    tied = axes.mixtral_params({**axes.MIXTRAL_8X7B, "tie_word_embeddings": True})
    assert counts["total"] - tied["total"] == 32000 * 4096


def test_numpy_scalars_work_like_python_ints():
    model = axes.Model(n_layers=np.int64(4), d_model=np.int32(8), d_ff=32, batch=16,
                       seq_len=4, capacity_factor=np.float32(1.5))
    assert isinstance(model.n_layers, int) and isinstance(model.capacity_factor, float)
    assert model == axes.Model(n_layers=4, d_model=8, d_ff=32, batch=16, seq_len=4,
                               capacity_factor=1.5)
    assert axes.traffic(model, {"data": np.int64(4)}) == axes.traffic(model, {"data": 4})
    assert axes.pipeline_bytes(np.int64(100), np.int64(8), sends=np.int64(2)) == 200
    assert axes.fsdp_bytes(80, 8, gathers=np.int8(1)) == 140


def test_bad_inputs():
    model = axes.Model(n_layers=4, d_model=8, d_ff=32, batch=16, seq_len=4)
    rows = axes.traffic(model, {"data": 4})
    placement = axes.place_axes(rows, devices_per_node=8)
    links = {"fast_bandwidth": 1e11, "slow_bandwidth": 1e10}
    cases = [
        (lambda: axes.pipeline_bytes(100, 8, sends="2"), checks.InputTypeError, "sends"),
        (lambda: axes.pipeline_bytes(100, 8, sends=-1), checks.InputError, "sends"),
        (lambda: axes.pipeline_bytes(100, "8", sends=2), checks.InputTypeError, "n must"),
        (lambda: axes.pipeline_bytes(-100, 1, sends=2), checks.InputError, "activation_bytes"),
        (lambda: axes.fsdp_bytes(100, 8, gathers=1.5), checks.InputTypeError, "gathers"),
        (lambda: axes.tensor_bytes(100, 8, all_reduces=None), checks.InputTypeError,
         "all_reduces"),
        (lambda: axes.expert_bytes(100, 8, all_to_alls=True), checks.InputTypeError,
         "all_to_alls"),
        (lambda: axes.data_bytes(100, 0), checks.InputError, "n must"),
        (lambda: axes.data_bytes(float("nan"), 8), checks.InputTypeError, "grad_bytes"),
        (lambda: axes.Model(n_layers=4, d_model=8, d_ff=32, batch=16, seq_len=4,
                            capacity_factor=float("nan")), checks.InputError, "finite"),
        (lambda: axes.Model(n_layers=4.0, d_model=8, d_ff=32, batch=16, seq_len=4),
         checks.InputTypeError, "n_layers"),
        (lambda: axes.traffic(model, {"data": 4}, remat=1), checks.InputTypeError, "remat"),
        (lambda: axes.traffic(model, {"data": 4}, n_microbatches=0), checks.InputError,
         "n_microbatches"),
        (lambda: axes.place_axes("rows", devices_per_node=8), checks.InputTypeError, "rows"),
        (lambda: axes.place_axes(rows, devices_per_node=3), checks.InputError,
         "devices_per_node=3"),
        (lambda: axes.place_axes([rows[0].row()], devices_per_node=8), checks.InputTypeError,
         "AxisTraffic"),
        (lambda: axes.link_seconds(rows, {"data": "fast"}, **links), checks.InputError,
         "no link for axis 'fsdp'"),
        (lambda: axes.link_seconds(rows, {**placement, "data": "medium"}, **links),
         checks.InputError, "medium"),
        (lambda: axes.link_seconds(rows, list(placement), **links), checks.InputTypeError,
         "placement"),
        (lambda: axes.link_seconds(rows, placement, fast_bandwidth=float("nan"),
                                   slow_bandwidth=1e10), checks.InputError, "finite"),
        (lambda: axes.mixtral_params({"hidden_size": 4096}), checks.InputError, "lacks"),
        (lambda: axes.mixtral_params({**axes.MIXTRAL_8X7B, "hidden_act": "gelu"}),
         checks.InputError, "hidden_act"),
        (lambda: axes.mixtral_params({**axes.MIXTRAL_8X7B, "num_experts_per_tok": 9}),
         checks.InputError, "at most 8"),
        (lambda: axes.mixtral_params([]), checks.InputTypeError, "mapping"),
        (lambda: axes.pipeline_program("mesh", "a"), checks.InputTypeError, "Mesh"),
        (lambda: axes.tensor_program(mesh_of(2, ("a",), explicit=True), "b"),
         checks.InputError, "not an axis"),
        (lambda: axes.traffic(model, {"batch": 2}), checks.InputError, "mesh axis"),
        (lambda: axes.traffic(model, {"data": 3}), checks.InputError, "divisible"),
        (lambda: axes.traffic(model, {"pipeline": 3}), checks.InputError, "n_layers"),
        (lambda: axes.traffic(model, {"data": 0}), checks.InputError, "at least 1"),
        (lambda: axes.traffic(model, [("data", 2)]), checks.InputTypeError, "sizes"),
        (lambda: axes.traffic("model", {"data": 2}), checks.InputTypeError, "Model"),
        (lambda: axes.Model(n_layers=4, d_model=8, d_ff=32, batch=16, seq_len=4, top_k=2),
         checks.InputError, "top_k"),
        (lambda: axes.place_axes([], devices_per_node=0), checks.InputError, "devices_per"),
        (lambda: axes.data_program(mesh_of(2, ("a",)), "b"), checks.InputError, "axis"),
    ]
    for call, error, word in cases:
        with pytest.raises(error, match=word):
            call()


def _example():
    """The model and mesh of book/pipeline/composing.md."""
    model = dict(n_layers=32, d_model=4096, d_ff=14336, seq_len=4096, n_experts=8, top_k=2,
                 capacity_factor=1.25)
    mesh = {"data": 2, "fsdp": 4, "pipeline": 4, "expert": 2, "tensor": 4}
    return model, mesh


def test_chapter_placement_and_exercises():
    model, mesh = _example()
    rows = axes.traffic(axes.Model(batch=256, **model), mesh, n_microbatches=8)
    placement = axes.place_axes(rows, devices_per_node=8)
    assert {a for a, link in placement.items() if link == "fast"} == {"tensor", "expert"}
    # Exercise 1: double the batch.
    big = {r.axis: r.bytes_sent
           for r in axes.traffic(axes.Model(batch=512, **model), mesh, n_microbatches=8)}
    small = {r.axis: r.bytes_sent for r in rows}
    assert big["pipeline"] == 2 * small["pipeline"] and big["tensor"] == 2 * small["tensor"]
    assert big["data"] == small["data"] and big["fsdp"] == small["fsdp"]
    assert 1.9 * small["expert"] < big["expert"] < 2 * small["expert"]
    # Exercise 2: nodes of 4 devices keep only the tensor axis inside.
    four = axes.place_axes(rows, devices_per_node=4)
    assert [a for a, link in four.items() if link == "fast"] == ["tensor"]


# --------------------------------------------------------------------------- bad input, by class
@pytest.mark.parametrize(("call", "word"), [
    (lambda: axes.data_bytes(-100, 8), "grad_bytes"),
    (lambda: axes.data_bytes(100, 0), "n must"),
    (lambda: axes.fsdp_bytes(-1, 8), "param_bytes"),
    (lambda: axes.tensor_bytes(-1, 8, all_reduces=2), "activation_bytes"),
    (lambda: axes.pipeline_bytes("1", 8, sends=2), "activation_bytes"),
    (lambda: axes.expert_bytes(2.5, 8, all_to_alls=1), "buffer_bytes"),
    (lambda: axes.place_axes([], devices_per_node=4), "rows"),
])
def test_each_formula_names_its_own_argument(call, word):
    with pytest.raises(checks.InputError, match=word):
        call()


def test_programs_check_their_arrays_before_jax_does():
    """30 rows over 8 devices: the package says which array and which axis, where JAX would
    raise its own IndivisibleError."""
    mesh = mesh_of(8, ("a",))
    w, x = jnp.ones((4, 4)), jnp.ones((30, 4))
    with pytest.raises(checks.InputError, match="dimension 0 of x is 30"):
        axes.data_program(mesh, "a")(w, x)
    with pytest.raises(checks.InputTypeError, match="2 arrays"):
        axes.data_program(mesh, "a")(w)
    with pytest.raises(checks.InputError, match="w1"):
        axes.tensor_program(mesh, "a")(jnp.ones((8, 4)), jnp.ones((4, 12)), jnp.ones((12, 4)))
    assert axes.data_program(mesh, "a")(w, jnp.ones((32, 4))).shape == (4, 4)
    assert axes.data_bytes(0, 8) == 0  # nothing to send is a valid edge case


def test_traffic_refuses_widths_the_tensor_axis_does_not_split():
    model = axes.Model(n_layers=2, d_model=9, d_ff=16, batch=8, seq_len=8)
    with pytest.raises(checks.InputError, match="d_model is 9"):
        axes.traffic(model, {"tensor": 2})
