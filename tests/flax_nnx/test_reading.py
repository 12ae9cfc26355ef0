"""The compiler facts Part XIII's pages state: the NNX model's collectives equal Part IX's,
where accumulation's collectives run, the unreduced deferral, memory per device."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from helpers import DEVICES

from spmd_guide.core import hlo
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.flax_nnx import logical, reading
from spmd_guide.flax_nnx.rules import RULES, mesh_spec
from spmd_guide.transformer import lm
from spmd_guide.transformer.transformer import STRATEGIES

CONFIG = lm.Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=1, seq_len=8)


@functools.cache
def tokens(batch=32):
    return lm.counting_task(jax.random.key(1), batch=batch, config=CONFIG)


def _mesh(name, n, kind="auto"):
    return STRATEGIES[name].mesh(DEVICES[:n], axis_types=kind)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RULES))
def test_same_layout_and_collectives_as_part_ix(name):
    [row] = reading.compare_with_part_ix(CONFIG, tokens(), {name: _mesh(name, 8)})
    assert row["same layout"] and row["same collectives"], row


@pytest.mark.slow
def test_accumulation_reduces_per_microbatch_and_fsdp_gathers_once():
    dp = logical.create(CONFIG, strategy="dp", mesh=_mesh("dp", 4))
    where = reading.loop_counts(reading.grad_program(dp, tokens(), microbatches=4))
    assert where["per microbatch"]["all-reduce"] >= 1
    assert sum(where["once"].values()) == 0
    fsdp = logical.create(CONFIG, strategy="fsdp", mesh=_mesh("fsdp", 4))
    where = reading.loop_counts(reading.grad_program(fsdp, tokens(), microbatches=4))
    assert where["per microbatch"]["all-reduce"] >= 1
    assert where["per microbatch"]["all-gather"] == 0 and where["once"]["all-gather"] > 0


@pytest.mark.slow
def test_unreduced_moves_the_reduction_out_of_the_loop():
    mesh = jax.make_mesh((4,), ("data",), devices=DEVICES[:4])
    each = reading.deferred_reduction(mesh, microbatches=3, deferred=False)
    once = reading.deferred_reduction(mesh, microbatches=3, deferred=True)
    assert each["counts"]["per microbatch"]["all-reduce"] == 1
    assert sum(each["counts"]["once"].values()) == 0
    assert sum(once["counts"]["per microbatch"].values()) == 0
    assert once["counts"]["once"]["all-reduce"] == 1
    assert once["grad_sum"] == pytest.approx(each["grad_sum"], rel=1e-5)
    with pytest.raises(InputError, match="one Explicit axis"):
        reading.deferred_reduction(_mesh("dp", 2), deferred=True)


@pytest.mark.slow
def test_memory_and_bf16_step():
    mesh = _mesh("fsdp", 8)
    model = logical.create(CONFIG, strategy="fsdp", mesh=mesh)
    whole = reading.bytes_per_device(logical.Model(CONFIG, rngs=logical.nnx.Rngs(0)))
    held = reading.bytes_per_device(model)
    assert held < whole / 4
    mem = reading.init_memory(CONFIG, strategy="fsdp", mesh=mesh)
    assert mem.output_bytes + mem.temp_bytes < whole
    m16 = logical.abstract_model(CONFIG, strategy="fsdp", mesh=mesh, compute_dtype=jnp.bfloat16)
    progs = [reading.step_program(m, tokens()) for m in (model, m16)]
    mems = [p.memory_analysis() for p in progs]
    assert mems[0].argument_size_in_bytes == mems[1].argument_size_in_bytes
    assert mems[1].temp_size_in_bytes < mems[0].temp_size_in_bytes
    assert "bf16" in progs[1].as_text()


def test_exercise_answers():
    mesh = jax.make_mesh((2,), ("model",), devices=DEVICES[:2])
    mlp_only = (("mlp", "model"),)
    assert mesh_spec(("embed", "mlp"), (32, 64), mlp_only, mesh) == jax.P(None, "model")
    assert mesh_spec(("embed", "heads", "head_dim"), (32, 8, 4), mlp_only, mesh) == \
        jax.P(None, None, None)
    d8 = jax.make_mesh((8,), ("data",), devices=DEVICES)
    assert mesh_spec(("heads", "head_dim", "embed"), (4, 8, 32), RULES["fsdp"], d8) == \
        jax.P(None, "data", None)
    model = logical.nnx.eval_shape(lambda: logical.Model(CONFIG, rngs=logical.nnx.Rngs(0)))
    for k in (1, 2, 4, 8, 16, 32):
        logical._check_tokens(model, tokens(), k)
    with pytest.raises(InputError, match="microbatches=3"):
        logical._check_tokens(model, tokens(), 3)
    # Microbatches of 8 rows or more split over 8 devices; smaller ones are computed whole.
    for rows, spec in ((32, jax.P("data", None)), (8, jax.P("data", None)), (4, jax.P(None, None))):
        assert mesh_spec(("batch", "length"), (rows, 9), RULES["dp"], d8,
                         skip_indivisible=False) == spec


def test_bad_input():
    with pytest.raises(InputTypeError):
        reading.compare_with_part_ix(CONFIG, tokens(), [])
    with pytest.raises(InputTypeError):
        reading.grad_program("model", tokens())
    with pytest.raises(InputError):
        reading.init_memory(CONFIG, strategy="tp", mesh=_mesh("dp", 2))
    with pytest.raises(InputError):
        reading.bytes_per_device([])


@pytest.mark.slow
def test_xla_cpu_widens_the_bf16_collectives_the_partitioner_made(tmp_path):
    """With bf16 compute the SPMD partitioner gathers the cast (bf16) weights and all-reduces
    bf16 weight gradients; XLA:CPU's AllReducePromotion and FloatNormalization turn them into
    f32 collectives. A float32 model has f32 collectives at both stages."""
    tok = lm.counting_task(jax.random.key(1), batch=32, config=CONFIG)
    found = {}
    for name, dtype in (("f32", None), ("bf16", jnp.bfloat16)):
        model = logical.abstract_model(CONFIG, strategy="fsdp", mesh=_mesh("fsdp", 8),
                                       compute_dtype=dtype)
        program = reading.step_program(model, tok, dump_to=tmp_path / name)
        found[name] = (reading.collective_dtypes(reading.partitioned_text(tmp_path / name)),
                       reading.collective_dtypes(program))
    (f32_part, f32_final), (b16_part, b16_final) = found["f32"], found["bf16"]
    assert set(f32_part) == set(f32_final) == {"all-gather f32", "all-reduce f32"}
    assert b16_part["all-gather bf16"] * 2 == f32_part["all-gather f32"]  # half the bytes
    assert b16_part["all-reduce bf16"] > 100 * b16_part.get("all-reduce f32", 0)  # loss only
    assert b16_final == f32_final  # widened back to f32 on XLA:CPU
    with pytest.raises(InputError, match="no dump"):
        reading.partitioned_text(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [32, 256])
def test_bf16_temporaries_stay_well_above_half(batch):
    """On XLA:CPU the bf16 step's temporaries are 0.65-0.9 of the f32 step's, at the page's
    batch and at 8 times it: the float32 part grows with the activations, not the weights."""
    tok = lm.counting_task(jax.random.key(1), batch=batch, config=CONFIG)
    temps = []
    for dtype in (None, jnp.bfloat16):
        model = logical.abstract_model(CONFIG, strategy="fsdp", mesh=_mesh("fsdp", 8),
                                       compute_dtype=dtype)
        temps.append(hlo.memory_per_device(reading.step_program(model, tok)).temp_bytes)
    assert 0.65 < temps[1] / temps[0] < 0.9, temps


@pytest.mark.slow
def test_accumulated_gradient_equals_the_whole_batch_gradient():
    """The page's point: k microbatches give the whole batch's gradient (float32 rounding);
    the weights after one AdamW step differ more only where AdamW divides by a tiny |g|."""
    model = logical.create(CONFIG, strategy="fsdp", mesh=_mesh("fsdp", 8))
    l1, g1 = reading.gradient(model, tokens(), microbatches=1)
    l4, g4 = reading.gradient(model, tokens(), microbatches=4)
    assert float(l1) == pytest.approx(float(l4), rel=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4), strict=True):
        scale = float(jnp.max(jnp.abs(a)))
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * scale
    with pytest.raises(InputError, match="abstract"):
        reading.gradient(logical.abstract_model(CONFIG, strategy="dp", mesh=_mesh("dp", 2)),
                         tokens())


@pytest.mark.slow
@pytest.mark.parametrize(("n", "kind"), [(2, "auto"), (4, "explicit"), (8, "auto")])
def test_zero1_splits_the_state_and_adds_the_parameter_gathers(n, kind):
    """What the page measures on XLA:CPU: ZeRO-1 holds 1/n of AdamW's moments per device and
    the same parameters; its step keeps the gradient all-reduce and adds all-gathers of the
    updated parameters, (n - 1)/n of their bytes."""
    model = logical.abstract_model(CONFIG, strategy="dp", mesh=_mesh("dp", n, kind))
    plain = reading.optimizer_costs(model, tokens())
    zero1 = reading.optimizer_costs(model, tokens(), state_strategy="fsdp")
    assert zero1["parameters"] == plain["parameters"]
    count = 8  # nnx.Optimizer's step and optax's count, two replicated 4-byte scalars
    assert (zero1["optimizer state"] - count) * n == plain["optimizer state"] - count
    assert plain["collectives"]["all-gather"] == 0
    assert zero1["collectives"]["all-reduce"] == plain["collectives"]["all-reduce"]
    assert zero1["sent"] - plain["sent"] == plain["parameters"] * (n - 1) // n


@pytest.mark.slow
@pytest.mark.parametrize(("n", "kind"), [(2, "explicit"), (8, "auto")])
def test_zero2_on_xla_cpu_compiles_to_zero1s_collectives_and_memory(n, kind):
    """What the page states for XLA:CPU: pinning the gradient to the moments' layout (ZeRO-2)
    changes neither the collectives (the one all-reduce stays; no reduce-scatter) nor the
    temporaries of ZeRO-1's step; it moves the slice of the gradient before the update."""
    model = logical.abstract_model(CONFIG, strategy="dp", mesh=_mesh("dp", n, kind))
    zero1 = reading.optimizer_costs(model, tokens(), state_strategy="fsdp")
    zero2 = reading.optimizer_costs(model, tokens(), state_strategy="fsdp",
                                    gradient_layout="state")
    assert zero2["collectives"]["reduce-scatter"] == 0
    assert zero2["collectives"]["all-reduce"] == 1
    assert zero2 == zero1
    with pytest.raises(InputError, match="gradient_layout"):
        reading.optimizer_costs(model, tokens(), state_strategy="fsdp", gradient_layout="zero2")
