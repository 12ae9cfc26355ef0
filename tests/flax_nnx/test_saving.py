"""An NNX model saved under one rule table and restored under another (Orbax, Part XI)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES

from spmd_guide.checkpointing import checkpoint
from spmd_guide.core.checks import InputError
from spmd_guide.flax_nnx import logical, saving
from spmd_guide.flax_nnx.rules import RULES
from spmd_guide.transformer import lm
from spmd_guide.transformer.transformer import STRATEGIES

CONFIG = lm.Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=1, seq_len=8)


def _check(tmp_path, source, target):
    (name, n, kind), (name2, n2, kind2) = source, target
    model = logical.create(CONFIG, strategy=name, mesh=STRATEGIES[name].mesh(
        DEVICES[:n], axis_types=kind), seed=5)
    saving.save(tmp_path / "ck", model, step=7)
    # The checkpoint records the layout it was saved in (not the logical names).
    saved = checkpoint.saved_layout(tmp_path / "ck")["blocks"]["0"]["wq"]
    assert saved.sharding.is_equivalent_to(model.blocks[0].wq.get_value().sharding, 3)
    mesh = STRATEGIES[name2].mesh(DEVICES[:n2], axis_types=kind2)
    restored = saving.restore(tmp_path / "ck", CONFIG, strategy=name2, mesh=mesh)
    want = logical.create(CONFIG, strategy=name2, mesh=mesh, seed=5)
    for got, ref, fresh in zip(jax.tree.leaves(logical.to_lm_params(restored)),
                               jax.tree.leaves(logical.to_lm_params(model)),
                               jax.tree.leaves(logical.to_lm_params(want)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
        assert got.sharding.is_equivalent_to(fresh.sharding, got.ndim)
    tokens = lm.counting_task(jax.random.key(1), batch=8, config=CONFIG)
    np.testing.assert_allclose(logical.loss(restored, tokens), logical.loss(model, tokens),
                               rtol=1e-6)


@pytest.mark.slow
def test_fsdp_tp_to_tp_on_fewer_explicit_devices(tmp_path):
    _check(tmp_path, ("fsdp_tp", 8, "auto"), ("tp", 4, "explicit"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RULES))
def test_every_table_to_another_device_count(tmp_path, name):
    _check(tmp_path, ("dp", 2, "explicit"), (name, 8 if name != "dp" else 1, "auto"))


def test_bad_input(tmp_path):
    with pytest.raises(InputError):
        saving.save(tmp_path / "x", {"embed": np.ones(3)}, step=1)
    with pytest.raises(InputError):
        saving.restore(tmp_path / "missing", CONFIG, strategy="dp",
                       mesh=STRATEGIES["dp"].mesh(DEVICES[:2]))
    with pytest.raises(InputError, match="unknown strategy"):
        saving.restore(tmp_path, CONFIG, strategy="zero", mesh=STRATEGIES["dp"].mesh(DEVICES[:2]))


@pytest.mark.slow
def test_restore_refuses_another_config(tmp_path):
    model = logical.Model(CONFIG, rngs=logical.nnx.Rngs(0))
    saving.save(tmp_path / "ck", model, step=1)
    other = lm.Config(vocab=32, d_model=16, n_heads=8, d_ff=64, n_layers=1, seq_len=8)
    with pytest.raises(InputError, match="shape"):
        saving.restore(tmp_path / "ck", other, strategy="dp",
                       mesh=STRATEGIES["dp"].mesh(DEVICES[:2]))


def test_a_part_ix_checkpoint_restores_and_a_mismatch_names_the_argument(tmp_path):
    """Part IX's pytree (blocks a list) holds the same arrays as the NNX state (blocks a dict
    keyed 0, 1, ...): saving.restore reads either. A checkpoint of another config or dtype is
    refused by the argument to change (config, param_dtype), and nothing on disk changes."""
    params = lm.init_params(jax.random.key(2), CONFIG)
    checkpoint.save(tmp_path / "ix", params, step=4)
    mesh = STRATEGIES["fsdp"].mesh(DEVICES[:4])
    restored = saving.restore(tmp_path / "ix", CONFIG, strategy="fsdp", mesh=mesh)
    for got, want in zip(jax.tree.leaves(logical.to_lm_params(restored)),
                         jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert restored.blocks[0].wq.get_value().sharding.spec == jax.P("data", None, None)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    for kwargs, words in (
            ({"config": lm.Config(vocab=32, d_model=16, n_heads=8, d_ff=64, n_layers=1,
                                  seq_len=8)}, ("config gives", "(16,)", "(32,)")),
            ({"config": lm.Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=2,
                                  seq_len=8)}, ("config", "blocks.1")),
            ({"param_dtype": jnp.bfloat16}, ("param_dtype", "float32"))):
        with pytest.raises(InputError) as info:
            saving.restore(tmp_path / "ix", **({"config": CONFIG} | kwargs), strategy="fsdp",
                           mesh=mesh)
        assert all(w in str(info.value) for w in words), str(info.value)
        assert "like" not in str(info.value) and "damaged" not in str(info.value)
    assert sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_an_eval_shape_target_has_no_layout(tmp_path):
    """What the page shows: nnx.eval_shape's values carry no sharding; Orbax then restores in
    the saved layout (not the table wanted), checkpoint.restore refuses such a target, and
    abstract_model's values carry the table's shardings."""
    import orbax.checkpoint as ocp
    from flax import nnx

    model = logical.create(CONFIG, strategy="fsdp", mesh=STRATEGIES["fsdp"].mesh(DEVICES))
    saving.save(tmp_path, model, step=1)
    bare = nnx.eval_shape(lambda: logical.Model(CONFIG, rngs=nnx.Rngs(0)))
    assert all(x.sharding is None for x in jax.tree.leaves(nnx.state(bare)))
    like = nnx.to_pure_dict(nnx.state(bare))
    with ocp.StandardCheckpointer() as orbax:
        back = orbax.restore(tmp_path / "1" / "default", like)
    assert back["blocks"][0]["wq"].sharding.is_equivalent_to(
        model.blocks[0].wq.get_value().sharding, 3)
    with pytest.raises(InputError, match="with a sharding"):
        checkpoint.restore(tmp_path, like=like)
    mesh = STRATEGIES["tp"].mesh(DEVICES[:4])
    target = logical.abstract_model(CONFIG, strategy="tp", mesh=mesh)
    assert target.blocks[0].wq.get_value().sharding.spec == jax.P(None, "model", None)
