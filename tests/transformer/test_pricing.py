"""pricing: the transformer strategies' compiled counts against the closed form, the
collectives the pricing page reads, devices from meshes of either axis type, and bad input."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import mesh_of

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.transformer import pricing

SMALL = dict(vocab=512, d_model=256, n_heads=8, d_ff=1024, n_layers=1, seq_len=64)


#: A transformer small enough to lay out in a moment (2 heads: tp's 8-way split refuses it).
TINY = dict(vocab=64, d_model=16, n_heads=2, d_ff=32, seq_len=8)


@pytest.mark.parametrize("call, error, word", [
    (lambda: pricing.transformer_counts("pp"), InputError, "unknown strategy name 'pp'"),
    (lambda: pricing.transformer_counts(["dp"]), InputTypeError, "strategy"),
    (lambda: pricing.transformer_counts("dp", batch=0), InputError, "batch"),
    (lambda: pricing.transformer_counts("dp", batch=float("nan")), InputTypeError, "batch"),
    (lambda: pricing.transformer_counts("dp", heads=4), InputError, "unknown transformer size"),
    (lambda: pricing.transformer_counts("dp", d_model=100, n_heads=16), InputError, "n_heads"),
    (lambda: pricing.transformer_counts("dp", seq_len=64.5), InputTypeError, "seq_len"),
    (lambda: pricing.transformer_counts("dp", devices="cpu"), InputTypeError, "devices"),
    (lambda: pricing.transformer_counts("dp", devices=[]), InputError, "devices"),
    (lambda: pricing.transformer_big_arrays(n_devices=0), InputError, "n_devices"),
    (lambda: pricing.transformer_big_arrays(n_devices=3), InputError, "n_devices"),
    (lambda: pricing.transformer_big_arrays(vocab=-1), InputError, "vocab"),
    (lambda: pricing.transformer_big_arrays(layers=2), InputError, "unknown transformer size"),
    (lambda: pricing.transformer_big_arrays(batch=True), InputTypeError, "batch"),
    # A batch the data axis does not divide: InputError before JAX's IndivisibleError.
    (lambda: pricing.transformer_counts("dp", batch=12, **TINY), InputError,
     r"tokens \[batch=12.* 8 equal parts over mesh axis 'data'"),
    (lambda: pricing.transformer_counts("fsdp_tp", batch=2, **TINY), InputError,
     r"batch=2.* 4 equal parts over mesh axis 'data'"),
    (lambda: pricing.transformer_counts("tp", batch=8, **TINY), InputError, "n_heads"),
    (lambda: pricing.transformer_counts("cp", batch=8, **(TINY | {"seq_len": 12})),
     InputError, "seq_len"),
    (lambda: pricing.transformer_counts("dp", dtype="bfloat16"), InputError,
     "unknown transformer size"),
    (lambda: pricing.transformer_counts("dp", n_layers=True), InputTypeError, "n_layers"),
    (lambda: pricing.transformer_counts("dp", devices=jax.devices()[:1] * 2), InputError,
     "more than once"),
    (lambda: pricing.abstract_params({"vocab": 4}), InputTypeError, "config"),
    (lambda: pricing.abstract_params("cfg"), InputTypeError, "config"),
    (lambda: pricing.transformer_big_arrays(n_devices=True), InputTypeError, "n_devices"),
    (lambda: pricing.transformer_big_arrays(n_devices="8"), InputTypeError, "n_devices"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


@pytest.mark.slow
def test_numpy_sizes_work_as_python_ones():
    config = {k: np.int64(v) for k, v in SMALL.items()}
    assert pricing.transformer_big_arrays(batch=np.int32(16), n_devices=np.int64(8), **config) \
        == pricing.transformer_big_arrays(batch=16, n_devices=8, **SMALL)
    assert pricing.transformer_counts("dp", batch=np.int64(16), **config) == \
        pricing.transformer_counts("dp", batch=16, **SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_devices_may_come_from_a_mesh_of_either_axis_type(explicit):
    mesh = mesh_of(8, ("a", "b"), (2, 4), explicit=explicit)
    listed = pricing.transformer_counts("fsdp_tp", batch=16, **SMALL)
    assert pricing.transformer_counts("fsdp_tp", batch=16, devices=mesh, **SMALL) == listed
    config = pricing.transformer.Config(**SMALL)
    with jax.set_mesh(mesh):  # an ambient mesh does not get in the way (compiled afresh)
        fresh = pricing._transformer_counts.__wrapped__("fsdp_tp", config, 16,
                                                        tuple(mesh.devices.flat))
    assert fresh == listed


@pytest.mark.slow
def test_collectives_the_pricing_page_reads():
    """On XLA:CPU, fsdp all-reduces its gradients (no reduce-scatter) and tp_sp sends more
    than tp: the page says so, and says a GPU/TPU compiler is expected to differ."""
    dp, fsdp, tp, tp_sp = (pricing.transformer_counts(n, batch=16, **SMALL)
                           for n in ("dp", "fsdp", "tp", "tp_sp"))
    assert "reduce-scatter" not in fsdp.sent_by_kind
    assert fsdp.sent_by_kind["all-reduce"] == pytest.approx(dp.sent_by_kind["all-reduce"])
    assert set(tp.sent_by_kind) == {"all-reduce"}
    assert "reduce-scatter" not in tp_sp.sent_by_kind
    assert tp_sp.comm_bytes > tp.comm_bytes


@pytest.mark.slow
def test_transformer_counts_match_the_closed_form_and_split_the_work_evenly():
    """6 x matmul parameters x tokens, plus attention's two s x s matmuls (forward and
    backward), divided over 8 devices; dp and tp do the same arithmetic."""
    config = dict(vocab=512, d_model=256, n_heads=8, d_ff=1024, n_layers=1, seq_len=64)
    batch = 16
    dp, tp = (pricing.transformer_counts(n, batch=batch, **config) for n in ("dp", "tp"))
    d, f, v, s = config["d_model"], config["d_ff"], config["vocab"], config["seq_len"]
    matmul_params = 4 * d * d + 2 * d * f + d * v
    attention = 2 * 2 * batch * s * s * d * 3
    expected = (6 * matmul_params * batch * s + attention) / 8
    assert dp.flops == pytest.approx(expected, rel=0.1)
    assert tp.flops == pytest.approx(dp.flops, rel=0.05)
    assert dp.comm_bytes > 0 and tp.comm_bytes > dp.comm_bytes
    big = pricing.transformer_big_arrays(batch=batch, **config)
    assert big == {"attention scores, one layer": 4 * batch * 8 * s * s // 8,
                   "logits": 4 * batch * s * v // 8}


def test_abstract_params_match_init_params():
    import jax.numpy as jnp

    config = pricing.transformer.Config(**SMALL)
    real = pricing.transformer.init_params(jax.random.key(0), config)
    abstract = pricing.abstract_params(config)
    assert jax.tree.structure(abstract) == jax.tree.structure(real)
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(abstract)] == \
        [(r.shape, r.dtype) for r in jax.tree.leaves(real)]
    bf16 = pricing.abstract_params(pricing.transformer.Config(**SMALL, dtype="bfloat16"))
    assert {a.dtype for a in jax.tree.leaves(bf16)} == {jnp.dtype("bfloat16")}
    with pytest.raises(InputTypeError, match="config"):
        pricing.abstract_params(SMALL)


BAD_INTS = {"str": "4", "float": 2.5, "None": None, "zero": 0, "negative": -3,
            "nan": float("nan"), "bool": True}
SIZES = ["batch", *pricing.LM_CONFIG]


@pytest.mark.parametrize("fn", [pricing.transformer_counts, pricing.transformer_big_arrays],
                         ids=["counts", "big_arrays"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tag", list(BAD_INTS))
def test_every_bad_size_is_named_before_anything_compiles(fn, size, tag):
    args = ("dp",) if fn is pricing.transformer_counts else ()
    with pytest.raises(InputError, match=rf"\b{size}\b"):
        fn(*args, **{size: BAD_INTS[tag]})


@pytest.mark.parametrize("value", list(BAD_INTS.values()) + [3], ids=[*BAD_INTS, "three"])
def test_a_bad_device_count_is_named(value):
    with pytest.raises(InputError, match="n_devices"):
        pricing.transformer_big_arrays(n_devices=value)
