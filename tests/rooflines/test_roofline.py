"""Tests for spmd_guide.rooflines.roofline: the chips file (every rate cited), the counts
the compiled program gives against closed forms (on Auto and Explicit mesh axes), predict's
bound, the parallelism thresholds, and bad input."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
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
        assert set(chip.cite) == set(roofline.UNITS), key  # every rate cites its figure
        assert all(len(text) > 20 for text in chip.cite.values()), key
        assert [row["rate"] for row in chip.citations()] == list(roofline.UNITS)


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
    # Google prints the TPU v4 and (current revision) v5p capacities in GiB.
    assert roofline.CHIPS["tpu-v4"].hbm_bytes == 32 * 2**30
    assert roofline.CHIPS["tpu-v5p"].hbm_bytes == 95 * 2**30
    assert "32 GiB" in roofline.CHIPS["tpu-v4"].cite["hbm_bytes"]


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

[chip.x.cite]
peak_flops_bf16 = "p"
hbm_bytes = "c"
hbm_bandwidth = "b"
interconnect_bandwidth = "i"
network_bandwidth = "n"
"""


@pytest.mark.parametrize("edit, word", [
    (lambda t: t.replace('date_read = "2026-11-23"\n', 'date_read = "2026-11-23"\ncolour = "red"\n'),
     "unknown"),
    (lambda t: t.replace('source = "https://example.org"\n', ""), "missing"),
    (lambda t: t.replace('"https://example.org"', '"  "'), "source"),
    (lambda t: t.replace("hbm_bytes = 1e10", "hbm_bytes = -1.0"), "positive"),
    (lambda t: t.replace("hbm_bytes = 1e10", "hbm_bytes = nan"), "finite"),
    (lambda t: t.replace("hbm_bytes = 1e10", 'hbm_bytes = "16 GB"'), "real number"),
    (lambda t: t.replace('network_bandwidth = "n"\n', ""), "cite"),
    (lambda t: t.replace('network_bandwidth = "n"', 'network_bandwidth = " "'), "cite"),
    (lambda t: t.split("[chip.x.cite]")[0], "missing"),
    (lambda t: "", "no"),
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


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_allgather_bytes_equal_ring_time_model(explicit):
    mesh = mesh_of(4, explicit=explicit)
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x", None)))
    gather = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))
    estimate = roofline.predict(gather, x, chip="h100-sxm")
    assert estimate.comm_bytes == hlo.ring_bytes("all-gather", 64 * 32 * 4, 4)
    assert estimate.comm_s == pytest.approx(roofline.ring_time(64 * 32 * 4, 4, "h100-sxm"))
    work = roofline.counts(gather, x)
    assert dict(work.sent_by_kind) == {"all-gather": work.comm_bytes}


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_counts_of_a_sharded_matmul_split_the_work_on_either_axis_type(explicit):
    mesh = mesh_of(8, ("x",), explicit=explicit)
    a = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x", None)))
    b = jax.device_put(jnp.ones((32, 16)), NamedSharding(mesh, P()))
    work = roofline.counts(lambda u, v: u @ v, a, b)
    assert work.flops == 2 * 64 * 32 * 16 / 8  # per device
    assert work.comm_bytes == 0


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


def test_dp_over_the_network_reduces_inside_the_node_first():
    """Review W1: each GPU's NIC carries 1/8 of the gradient after an NVLink reduce-scatter;
    the scaling book's 2475 tokens per H100 (990e12 / 400e9) is the same model."""
    flat = roofline.dp_critical_batch("h100-sxm", link="network", group=1)
    node = roofline.dp_critical_batch("h100-sxm", link="network", group=8)
    assert node == pytest.approx(flat / 8)
    assert node == pytest.approx(2475, rel=0.002)
    # Per TPU slice the network threshold is a batch per slice: group x per-chip is constant.
    v5p = [g * roofline.dp_critical_batch("tpu-v5p", link="network", group=g) for g in (4, 64)]
    assert v5p[0] == pytest.approx(v5p[1]) == pytest.approx(4.59e14 / 6.25e9)
    with pytest.raises(InputError, match="group"):
        roofline.dp_critical_batch("h100-sxm", link="network")
    with pytest.raises(InputError, match="network"):
        roofline.dp_critical_batch("h100-sxm", group=8)


def _ring_schedule(compute, comm, ways):
    """The step of allgather_overlapped, step by step: matmul s beside transfer s + 1."""
    block, transfer = compute / ways, comm / (ways - 1)
    return sum(max(block, transfer) for _ in range(ways - 1)) + block


def test_ring_overlap_reaches_at_most_2n_minus_1_over_n():
    """Review W2: n block matmuls and n - 1 transfers (pinned on the compiled program below);
    the last matmul overlaps nothing, so the gain is (2n-1)/n at best, not 2."""
    for ways in (2, 4, 8):
        rows = roofline.ring_matmul_balance_rows(ways, "tpu-v5e")
        gains = []
        for m in np.geomspace(rows / 20, rows * 20, 81):
            compute, comm = roofline.collective_matmul_times(round(m), 4096, 4096, ways, "tpu-v5e")
            assert roofline.overlapped_time(compute, comm, ways=ways) == pytest.approx(
                _ring_schedule(compute, comm, ways))
            gains.append(roofline.overlap_speedup(compute, comm, ways=ways))
        assert max(gains) == pytest.approx((2 * ways - 1) / ways, rel=1e-3)
        compute, comm = roofline.collective_matmul_times(round(rows), 4096, 4096, ways, "tpu-v5e")
        assert roofline.overlap_speedup(compute, comm, ways=ways) == pytest.approx(
            (2 * ways - 1) / ways, rel=1e-3)
        assert roofline.overlap_speedup(compute, comm) >= (2 * ways - 1) / ways * 0.999  # 2 streams


def test_the_ring_schedule_counts_the_compiled_program():
    from spmd_guide.core.devices import build_mesh
    from spmd_guide.shard_map import collective_matmul

    ring = build_mesh((4,), ("ring",), devices=jax.devices()[:4])
    fn = lambda a, b: collective_matmul.VARIANTS["allgather_overlapped"](a, b, ring, "ring")  # noqa: E731
    args = (jnp.ones((64, 32)), jnp.ones((32, 16)))
    text = hlo.compiled_text(fn, *args)
    assert len(re.findall(r"\bdot\(", text)) == 4  # n block matmuls
    assert hlo.collective_counts(fn, *args)["collective-permute"] == 3  # n - 1 transfers


def test_fsdp_hides_from_data_parallelism_s_batch():
    """Review W3: the forward's gathers hide only behind the forward's 2BP FLOPs."""
    for gathers in (1, 2):
        for n in (8, None):
            assert roofline.fsdp_critical_batch("h100-sxm", n=n, gathers=gathers) == \
                pytest.approx(roofline.dp_critical_batch("h100-sxm", n=n))
    forward = roofline.fsdp_critical_batch("tpu-v5p", phase="forward")
    assert roofline.fsdp_critical_batch("tpu-v5p", phase="backward", gathers=1) == forward / 2
    assert roofline.fsdp_critical_batch("tpu-v5p", phase="backward", gathers=2) == forward
    assert forward == pytest.approx(2550, rel=1e-3)  # the scaling book's v5p figure


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


def test_numpy_numbers_work_wherever_python_ones_do():
    assert roofline.matmul_intensity(np.int64(48), np.int32(80), np.uint16(24),
                                     bytes_per_element=np.float32(4)) == \
        roofline.matmul_intensity(48, 80, 24, bytes_per_element=4)
    assert roofline.critical_batch(np.str_("h200"), d=np.int64(4096), f=np.array(4096)) == \
        roofline.critical_batch("h200", d=4096, f=4096)
    assert roofline.ring_time(np.float64(1e6), np.int8(8), "h200", kind=np.str_("all-reduce")) \
        == roofline.ring_time(1e6, 8, "h200", kind="all-reduce")
    assert roofline.overlap_speedup(np.float32(4.0), np.float64(3.0), ways=np.int64(4)) == 1.75
    assert roofline.mlp_matmul_flops(np.array([8, 16, 4]), np.int64(3)) == \
        roofline.mlp_matmul_flops([8, 16, 4], 3)
    work = roofline.Counts(np.float32(1e9), np.int64(10**6), np.float64(0))
    assert type(work.flops) is float
    assert roofline.estimate(work, "h200", byte_scale=np.float16(0.5)).bytes_accessed == 5e5
    assert [c.key for c in roofline.get_chips(np.array(["h200", "b200", "h200"]))] == ["h200", "b200"]
    assert [c.key for c in roofline.get_chips("h100-sxm")] == ["h100-sxm"]  # a name, not letters


# --------------------------------------------------------------------------- bad input


NAN = float("nan")
WORK = roofline.Counts(1e9, 1e6, 1e6)


@pytest.mark.parametrize("call, error, word", [
    (lambda: roofline.matmul_intensity(0, 4, 4), InputError, "m"),
    (lambda: roofline.matmul_intensity(4, 4, 4, bytes_per_element=NAN), InputError, "bytes_per_element"),
    (lambda: roofline.matmul_intensity("4", 4, 4), InputTypeError, "m"),
    (lambda: roofline.get_chip(["h200"]), InputTypeError, "chip"),
    (lambda: roofline.get_chip("h"), InputError, "unknown chip 'h'"),
    (lambda: roofline.get_chips([]), InputError, "empty"),
    (lambda: roofline.get_chips({"h200": 1}), InputTypeError, "chips"),
    (lambda: roofline.get_chips(["h200", "nope"]), InputError, "nope"),
    (lambda: roofline.Counts(NAN, 1, 1), InputError, "flops"),
    (lambda: roofline.Counts(1, -1, 1), InputError, "bytes_accessed"),
    (lambda: roofline.Counts(1, 1, "1"), InputTypeError, "comm_bytes"),
    (lambda: roofline.Counts(1, 1, 1, {"broadcast": 1}), InputError, "collective kind"),
    (lambda: roofline.estimate({"flops": 1}, "h200"), InputTypeError, "Counts"),
    (lambda: roofline.estimate(WORK, "h200", byte_scale=NAN), InputError, "byte_scale"),
    (lambda: roofline.estimate(WORK, "h200", link=["network"]), InputTypeError, "link"),
    (lambda: roofline.estimate(WORK, "h200", link="net"), InputError, "link"),
    (lambda: roofline.predict(lambda a: a, jnp.ones(3), chip="h200", link="pcie"), InputError, "link"),
    (lambda: roofline.predict(lambda a: a, jnp.ones(3), chip="h200", byte_scale=0), InputError, "byte_scale"),
    (lambda: roofline.critical_batch("h200", d=8.0, f=8), InputTypeError, "d"),
    (lambda: roofline.ring_time(NAN, 8, "h200"), InputError, "buffer_bytes"),
    (lambda: roofline.ring_time(1e6, 0, "h200"), InputError, "n"),
    (lambda: roofline.ring_time(1e6, 8, "h200", kind=("all-reduce",)), InputTypeError, "kind"),
    (lambda: roofline.dp_critical_batch("h200", link="network", group=0), InputError, "group"),
    (lambda: roofline.fsdp_critical_batch("h200", gathers=3), InputError, "gathers"),
    (lambda: roofline.fsdp_critical_batch("h200", phase="middle"), InputError, "phase"),
    (lambda: roofline.tp_max_ways("h200", 0), InputError, "width"),
    (lambda: roofline.overlap_speedup(NAN, 1.0), InputError, "compute_s"),
    (lambda: roofline.overlap_speedup(1.0, -1.0), InputError, "comm_s"),
    (lambda: roofline.overlap_speedup(1.0, 1.0, ways=1), InputError, "ways"),
    (lambda: roofline.ring_matmul_balance_rows(1, "h200"), InputError, "ways"),
    (lambda: roofline.collective_matmul_times(8, 8, 8, 0, "h200"), InputError, "ways"),
    (lambda: roofline.mlp_matmul_flops([8, 4], 4, with_gradient=1), InputTypeError, "with_gradient"),
    (lambda: roofline.mlp_elementwise_flops([8, 4], -1), InputError, "batch"),
    (lambda: roofline.load_chips(5), InputTypeError, "path"),
    (lambda: roofline.as_devices("cpu"), InputTypeError, "devices"),
    (lambda: roofline.as_devices([]), InputError, "empty"),
    (lambda: roofline.as_devices([0, 1]), InputTypeError, "jax.Device"),
    (lambda: roofline.as_devices(jax.devices()[:1] * 2), InputError, "more than once"),
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
    (lambda: roofline.load_chips("no/such/chips.toml"), InputError, "chips.toml"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
