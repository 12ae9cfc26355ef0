"""verify: facts the check_strategy table states that the other tests do not already pin
(the rest of check_strategy, spec_table and predicted_comm_bytes is in test_transformer)."""

from __future__ import annotations

import functools

import jax
import pytest
from helpers import DEVICES

from spmd_guide.core import checks
from spmd_guide.transformer import lm, verify
from spmd_guide.transformer.transformer import STRATEGIES, Config, init_params

# model.md's config and batch.
CONFIG = Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=2, seq_len=16)


@functools.cache
def _row(name: str, axis_types: str) -> verify.StrategyCheck:
    params = init_params(jax.random.key(0), CONFIG)
    tokens = lm.counting_task(jax.random.key(3), batch=8, config=CONFIG)
    mesh = STRATEGIES[name].mesh(DEVICES, axis_types=axis_types)
    return verify.check_strategy(STRATEGIES[name], mesh, CONFIG, params, tokens)


@pytest.mark.slow
def test_zero_gradients_leave_the_param_layout_on_auto_axes():
    """model.md: without out_shardings, Auto axes let the compiler return ZeRO's gradients in
    another layout: none of fsdp's 20 leaves keeps its parameter's."""
    assert _row("fsdp", "auto")["unpinned grads in param layout"] == "0/20"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp", "fsdp_tp"])
def test_zero_gradients_keep_the_param_layout_on_explicit_axes_only(name):
    """model.md: ... on Explicit axes all 20 keep it; the row's program is the pinned one."""
    auto, explicit = _row(name, "auto"), _row(name, "explicit")
    assert auto["unpinned grads in param layout"] == "0/20"
    assert explicit["unpinned grads in param layout"] == "20/20"
    # The row's program is the pinned one either way: the same collectives, the same loss.
    assert auto["collectives"] == explicit["collectives"]
    assert auto.loss == pytest.approx(explicit.loss, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp", "tp", "tp_sp"])
def test_unsplit_or_megatron_gradients_keep_the_param_layout_unpinned(name):
    assert _row(name, "auto")["unpinned grads in param layout"] == "20/20"
    assert _row(name, "explicit")["unpinned grads in param layout"] == "20/20"


# --------------------------------------------------------------------------- bad input, by class
def test_spec_table_refuses_a_mesh_without_the_strategys_axes():
    params = init_params(jax.random.key(0), CONFIG)
    data_only = STRATEGIES["dp"].mesh(DEVICES)
    with pytest.raises(checks.InputError, match=r"meshes\['tp'\] has axes \('data',\)"):
        verify.spec_table(params, {"tp": data_only})
    tp = STRATEGIES["tp"].mesh(DEVICES)
    assert "P(None, 'model', None)" in {row["tp"] for row in verify.spec_table(params, {"tp": tp})}


@pytest.mark.parametrize("rows", [None, 3, "rows", []])
def test_rounding_words_refuses_what_is_not_rows(rows):
    with pytest.raises(checks.InputError, match="rows"):
        verify.rounding_words(rows)
