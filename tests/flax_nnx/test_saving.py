"""An NNX model saved under one rule table and restored under another (Orbax, Part XI)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import DEVICES

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
