"""Tests for spmd_guide.rooflines.roofline: the chips file, the counts
the compiled program gives against closed forms, predict's bound, the worked answers, and
bad input."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from helpers import mesh_of
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import nn
from spmd_guide.core import hlo
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import roofline

REQUIRED = {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "h100-sxm", "h200", "b200"}


# --------------------------------------------------------------------------- chips


def test_every_required_chip_is_listed_with_a_source():
    assert REQUIRED <= set(roofline.CHIPS)
    for key, chip in roofline.CHIPS.items():
        assert chip.key == key
        assert chip.source.split()[0].startswith("https://"), key
        assert chip.read_via and chip.date_read.count("-") == 2
        assert chip.interconnect and chip.network


@pytest.mark.parametrize("key", sorted(REQUIRED))
def test_chip_numbers_are_plain_floats_in_si_units(key):
    chip = roofline.CHIPS[key]
    for name in roofline.UNITS:
        assert type(getattr(chip, name)) is float
    # SI, not tera- or giga-: plausible ranges for 2021-2025 accelerators.
    assert 1e14 <= chip.peak_flops_bf16 <= 1e16
    assert 8e9 <= chip.hbm_bytes <= 3e11
    assert 5e11 <= chip.hbm_bandwidth <= 2e13
    assert 1e10 <= chip.interconnect_bandwidth <= 2e12
    assert 1e9 <= chip.network_bandwidth < chip.interconnect_bandwidth
    assert 50 < chip.ridge < 1000


def test_published_figures_as_read():
    assert roofline.CHIPS["tpu-v5e"].peak_flops_bf16 == 1.97e14
    assert roofline.CHIPS["tpu-v5e"].hbm_bandwidth == 8.19e11
    assert roofline.CHIPS["h100-sxm"].peak_flops_bf16 == 9.89e14  # half the sparse 1,979 TFLOPS
    assert roofline.CHIPS["h100-sxm"].interconnect_bandwidth == 4.5e11  # 900 GB/s bidirectional
    assert roofline.CHIPS["tpu-v5p"].network_bandwidth == 50e9 / 8  # 50 Gbps per chip


def _write(tmp_path, text):
    path = tmp_path / "chips.toml"
    path.write_text(text)
    return path


GOOD = """[chip.x]
name = "X"
peak_flops_bf16 = 1e14
hbm_bytes = 1e10
hbm_bandwidth = 1e12
interconnect_bandwidth = 1e11
interconnect = "links"
network_bandwidth = 1e10
network = "dcn"
source = "https://example.org"
read_via = "a copy"
date_read = "2026-11-23"
"""


@pytest.mark.parametrize("edit, word", [
    (lambda t: t + 'colour = "red"\n', "unknown"),
    (lambda t: t.replace('source = "https://example.org"\n', ""), "missing"),
    (lambda t: t.replace('"https://example.org"', '"  "'), "source"),
    (lambda t: t.replace("hbm_bytes = 1e10", "hbm_bytes = -1.0"), "positive"),
    (lambda t: t.replace("hbm_bytes = 1e10", 'hbm_bytes = "16 GB"'), "positive"),
])
def test_loader_refuses_bad_entries(tmp_path, edit, word):
    assert roofline.load_chips(_write(tmp_path, GOOD))["x"].hbm_bytes == 1e10
    with pytest.raises(ValueError, match=word):
        roofline.load_chips(_write(tmp_path, edit(GOOD)))


# --------------------------------------------------------------------------- closed forms


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64), st.sampled_from([2, 4]))
def test_matmul_intensity_closed_form(m, k, n, size):
    expected = 2 * m * k * n / (size * (m * k + k * n + m * n))
    assert roofline.matmul_intensity(m, k, n, bytes_per_element=size) == pytest.approx(expected)


def test_cost_analysis_counts_a_matmul_as_2mkn_and_its_bytes_once():
    m, k, n = 48, 80, 24
    work = roofline.counts(lambda a, b: a @ b, jnp.ones((m, k)), jnp.ones((k, n)))
    assert work.flops == 2 * m * k * n
    assert work.bytes_accessed == 4 * (m * k + k * n + m * n)
    assert work.flops / work.bytes_accessed == pytest.approx(
        roofline.matmul_intensity(m, k, n, bytes_per_element=4))
    assert work.comm_bytes == 0


@pytest.mark.parametrize("sizes, batch", [([16, 32, 32, 8], 24), ([8, 24, 4], 10)])
def test_mlp_forward_and_backward_flops_match_the_closed_forms(sizes, batch):
    params = nn.init_mlp(jax.random.key(0), sizes)
    data = (jnp.ones((batch, sizes[0])), jnp.ones((batch, sizes[-1])))
    forward = roofline.counts(nn.mlp_loss, params, data).flops
    assert forward == (roofline.mlp_matmul_flops(sizes, batch)
                       + roofline.mlp_elementwise_flops(sizes, batch))
    both = roofline.counts(jax.value_and_grad(nn.mlp_loss), params, data).flops
    matmuls = roofline.mlp_matmul_flops(sizes, batch, with_gradient=True)
    # The matmuls are all but the element-wise work (bias, ReLU, loss and their gradients).
    assert matmuls < both <= matmuls + 4 * roofline.mlp_elementwise_flops(sizes, batch)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_dp_gradient_bytes_follow_the_ring_model(k):
    strategy = nn.STRATEGIES["dp"]
    mesh = strategy.mesh(jax.devices()[:k])
    sizes, batch = [8, 16, 8], 4 * k
    params = nn.init_mlp(jax.random.key(1), sizes)
    data = (jnp.ones((batch, 8)), jnp.ones((batch, 8)))
    params, data = strategy.shard(params, data, mesh)
    work = roofline.counts(jax.value_and_grad(strategy.loss(mesh)), params, data)
    param_bytes = sum(4 * (a * b + b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    # all-reduce of every gradient (2 (k-1)/k of its bytes) plus the scalar loss.
    assert work.comm_bytes == pytest.approx(2 * (k - 1) / k * (param_bytes + 4), abs=8)


def test_allgather_bytes_equal_ring_time_model():
    mesh = mesh_of(4)
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x", None)))
    gather = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))
    estimate = roofline.predict(gather, x, chip="h100-sxm")
    assert estimate.comm_bytes == hlo.ring_bytes("all-gather", 64 * 32 * 4, 4)
    assert estimate.comm_s == pytest.approx(roofline.ring_time(64 * 32 * 4, 4, "h100-sxm"))


# --------------------------------------------------------------------------- predict's bound


def test_predict_bound_is_the_largest_time():
    small = roofline.predict(lambda a, b: a + b, jnp.ones(1024), jnp.ones(1024), chip="tpu-v5e")
    assert small.bound == "memory" and small.memory_s > small.compute_s
    big = roofline.estimate(roofline.Counts(flops=1e15, bytes_accessed=1e9, comm_bytes=0), "tpu-v5e")
    assert big.bound == "compute" and big.step_s == big.compute_s
    talk = roofline.estimate(roofline.Counts(flops=1e9, bytes_accessed=1e6, comm_bytes=1e9), "h100-sxm")
    assert talk.bound == "communication"
    assert talk.comm_s == pytest.approx(1e9 / 4.5e11)
    over = roofline.estimate(roofline.Counts(1e9, 1e6, 1e9), "h100-sxm", link="network")
    assert over.comm_s == pytest.approx(1e9 / 5e10)
    assert roofline.estimate(roofline.Counts(0, 2e6, 0), "h100-sxm", byte_scale=0.5).bytes_accessed == 1e6


def test_critical_batch_is_where_the_matmul_meets_the_ridge():
    for key in REQUIRED:
        batch = roofline.critical_batch(key, d=8192, f=8192)
        assert roofline.matmul_intensity(round(batch) + 1, 8192, 8192) > roofline.CHIPS[key].ridge
        assert roofline.matmul_intensity(math.floor(batch) - 1, 8192, 8192) < roofline.CHIPS[key].ridge
        assert roofline.critical_batch(key) < batch
    assert roofline.critical_batch("h100-sxm", d=64, f=64) == math.inf


def test_parallelism_thresholds_balance_compute_and_communication():
    chip = roofline.CHIPS["h100-sxm"]
    b = roofline.dp_critical_batch(chip, n=8)
    params = 1e9
    assert 4 * b * params / chip.peak_flops_bf16 == pytest.approx(
        roofline.ring_time(2 * params, 8, chip, kind="all-reduce"))
    f = roofline.tp_min_width(chip, 4)
    assert roofline.tp_max_ways(chip, math.ceil(f)) == 4
    assert roofline.tp_max_ways(chip, math.floor(f)) == 3
    rows = 3 * 2 * chip.comm_ridge / 2  # where compute meets communication on a 4-ring
    compute, comm = roofline.collective_matmul_times(round(rows), 512, 1024, 4, chip)
    assert compute == pytest.approx(comm, rel=1e-3)
    assert roofline.overlap_speedup(1.0, 1.0) == 2 and roofline.overlap_speedup(3.0, 1.0) == pytest.approx(4 / 3)
    assert compute > 0 and comm > 0
    assert roofline.fsdp_critical_batch(chip, gathers=2) == pytest.approx(roofline.dp_critical_batch(chip))
    assert roofline.fsdp_critical_batch(chip, n=8) == pytest.approx(2 / 3 * roofline.dp_critical_batch(chip, n=8))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, error, word", [
    (lambda: roofline.matmul_intensity(0, 4, 4), InputError, "m"),
    (lambda: roofline.matmul_intensity(4, 4.5, 4), InputTypeError, "k"),
    (lambda: roofline.matmul_intensity(4, 4, 4, bytes_per_element=0), InputError, "bytes_per_element"),
    (lambda: roofline.get_chip("tpu-v9"), InputError, "tpu-v5e"),
    (lambda: roofline.get_chip(5), InputTypeError, "chip"),
    (lambda: roofline.predict(lambda a: a, jnp.ones(3), chip="nope"), InputError, "chip"),
    (lambda: roofline.predict("f", jnp.ones(3), chip="h200"), InputTypeError, "fn"),
    (lambda: roofline.estimate(roofline.Counts(1, 1, 1), "h200", link="pcie"), InputError, "link"),
    (lambda: roofline.estimate(roofline.Counts(1, 1, 1), "h200", byte_scale=-1), InputError, "byte_scale"),
    (lambda: roofline.critical_batch("h200", d=8), InputError, "both"),
    (lambda: roofline.ring_time(1e6, 8, "h200", kind="broadcast"), InputError, "kind"),
    (lambda: roofline.dp_critical_batch("h200", n=1), InputError, "n"),
    (lambda: roofline.tp_min_width("h200", 1), InputError, "n"),
    (lambda: roofline.overlap_speedup(0, 0), InputError, "nothing"),
    (lambda: roofline.mlp_matmul_flops([8], 4), InputError, "layer_sizes"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
