"""pricing: the transformer strategies' compiled counts against the closed form."""

from __future__ import annotations

import pytest

from spmd_guide.core.checks import InputError
from spmd_guide.transformer import pricing


def test_bad_input():
    with pytest.raises(InputError, match="strategy"):
        pricing.transformer_counts("pp")
    with pytest.raises(InputError, match="n_devices"):
        pricing.transformer_big_arrays(n_devices=0)


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
