"""Tests for spmd_guide.rooflines.formulas: the closed forms against the counts of compiled
programs (matmul intensity, the MLP's FLOPs, the ring schedule of the overlapped collective
matmul), the thresholds of the parallelism page against each other and the scaling book's
figures, and bad input."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_guide import nn
from spmd_guide.core import hlo
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import formulas, hardware, roofline


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64), st.sampled_from([2, 4]))
def test_matmul_intensity_closed_form(m, k, n, size):
    expected = 2 * m * k * n / (size * (m * k + k * n + m * n))
    assert formulas.matmul_intensity(m, k, n, bytes_per_element=size) == pytest.approx(expected)


@pytest.mark.parametrize("sizes, batch", [([16, 32, 32, 8], 24), ([8, 24, 4], 10)])
def test_mlp_forward_and_backward_flops_match_the_closed_forms(sizes, batch):
    params = nn.init_mlp(jax.random.key(0), sizes)
    data = (jnp.ones((batch, sizes[0])), jnp.ones((batch, sizes[-1])))
    forward = roofline.counts(nn.mlp_loss, params, data).flops
    assert forward == (formulas.mlp_matmul_flops(sizes, batch)
                       + formulas.mlp_elementwise_flops(sizes, batch))
    both = roofline.counts(jax.value_and_grad(nn.mlp_loss), params, data).flops
    matmuls = formulas.mlp_matmul_flops(sizes, batch, with_gradient=True)
    # The matmuls are all but the element-wise work (bias, ReLU, loss and their gradients).
    assert matmuls < both <= matmuls + 4 * formulas.mlp_elementwise_flops(sizes, batch)


def test_critical_batch_is_where_the_matmul_meets_the_ridge():
    for key in hardware.CHIPS:
        batch = formulas.critical_batch(key, d=8192, f=8192)
        assert formulas.matmul_intensity(round(batch) + 1, 8192, 8192) > hardware.CHIPS[key].ridge
        assert formulas.matmul_intensity(math.floor(batch) - 1, 8192, 8192) < hardware.CHIPS[key].ridge
        assert formulas.critical_batch(key) < batch
    assert formulas.critical_batch("h100-sxm", d=64, f=64) == math.inf


def test_dp_over_the_network_reduces_inside_the_node_first():
    """Review W1: each GPU's NIC carries 1/8 of the gradient after an NVLink reduce-scatter;
    the scaling book's 2475 tokens per H100 (990e12 / 400e9) is the same model."""
    flat = formulas.dp_critical_batch("h100-sxm", link="network", group=1)
    node = formulas.dp_critical_batch("h100-sxm", link="network", group=8)
    assert node == pytest.approx(flat / 8)
    assert node == pytest.approx(2475, rel=0.002)
    # Per TPU slice the network threshold is a batch per slice: group x per-chip is constant.
    v5p = [g * formulas.dp_critical_batch("tpu-v5p", link="network", group=g) for g in (4, 64)]
    assert v5p[0] == pytest.approx(v5p[1]) == pytest.approx(4.59e14 / 6.25e9)
    with pytest.raises(InputError, match="group"):
        formulas.dp_critical_batch("h100-sxm", link="network")
    with pytest.raises(InputError, match="network"):
        formulas.dp_critical_batch("h100-sxm", group=8)


def _ring_schedule(compute, comm, ways):
    """The step of allgather_overlapped, step by step: matmul s beside transfer s + 1."""
    block, transfer = compute / ways, comm / (ways - 1)
    return sum(max(block, transfer) for _ in range(ways - 1)) + block


def test_ring_overlap_reaches_at_most_2n_minus_1_over_n():
    """Review W2: n block matmuls and n - 1 transfers (pinned on the compiled program below);
    the last matmul overlaps nothing, so the gain is (2n-1)/n at best, not 2."""
    for ways in (2, 4, 8):
        rows = formulas.ring_matmul_balance_rows(ways, "tpu-v5e")
        gains = []
        for m in np.geomspace(rows / 20, rows * 20, 81):
            compute, comm = formulas.collective_matmul_times(
                ways * round(m / ways), 4096, 4096, ways, "tpu-v5e")
            assert formulas.overlapped_time(compute, comm, ways=ways) == pytest.approx(
                _ring_schedule(compute, comm, ways))
            gains.append(formulas.overlap_speedup(compute, comm, ways=ways))
        assert max(gains) == pytest.approx((2 * ways - 1) / ways, rel=1e-3)
        compute, comm = formulas.collective_matmul_times(ways * round(rows / ways), 4096, 4096, ways,
                                                      "tpu-v5e")
        assert formulas.overlap_speedup(compute, comm, ways=ways) == pytest.approx(
            (2 * ways - 1) / ways, rel=1e-3)
        assert formulas.overlap_speedup(compute, comm) >= (2 * ways - 1) / ways * 0.999  # 2 streams


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
            assert formulas.fsdp_critical_batch("h100-sxm", n=n, gathers=gathers) == \
                pytest.approx(formulas.dp_critical_batch("h100-sxm", n=n))
    forward = formulas.fsdp_critical_batch("tpu-v5p", phase="forward")
    assert formulas.fsdp_critical_batch("tpu-v5p", phase="backward", gathers=1) == forward / 2
    assert formulas.fsdp_critical_batch("tpu-v5p", phase="backward", gathers=2) == forward
    assert forward == pytest.approx(2550, rel=1e-3)  # the scaling book's v5p figure


def test_parallelism_thresholds_balance_compute_and_communication():
    chip = hardware.CHIPS["h100-sxm"]
    b = formulas.dp_critical_batch(chip, n=8)
    params = 1e9
    assert 4 * b * params / chip.peak_flops_bf16 == pytest.approx(
        formulas.ring_time(2 * params, 8, chip, kind="all-reduce"))
    f = formulas.tp_min_width(chip, 4)
    assert formulas.tp_max_ways(chip, math.ceil(f)) == 4
    assert formulas.tp_max_ways(chip, math.floor(f)) == 3
    rows = 3 * 2 * chip.comm_ridge / 2  # where compute meets communication on a 4-ring
    compute, comm = formulas.collective_matmul_times(4 * round(rows / 4), 512, 1024, 4, chip)
    assert compute == pytest.approx(comm, rel=1e-3)
    assert formulas.overlap_speedup(1.0, 1.0) == 2 and formulas.overlap_speedup(3.0, 1.0) == pytest.approx(4 / 3)
    assert compute > 0 and comm > 0


def test_numpy_numbers_work_wherever_python_ones_do():
    assert formulas.matmul_intensity(np.int64(48), np.int32(80), np.uint16(24),
                                     bytes_per_element=np.float32(4)) == \
        formulas.matmul_intensity(48, 80, 24, bytes_per_element=4)
    assert formulas.critical_batch(np.str_("h200"), d=np.int64(4096), f=np.array(4096)) == \
        formulas.critical_batch("h200", d=4096, f=4096)
    assert formulas.ring_time(np.float64(1e6), np.int8(8), "h200", kind=np.str_("all-reduce")) \
        == formulas.ring_time(1e6, 8, "h200", kind="all-reduce")
    assert formulas.overlap_speedup(np.float32(4.0), np.float64(3.0), ways=np.int64(4)) == 1.75
    assert formulas.mlp_matmul_flops(np.array([8, 16, 4]), np.int64(3)) == \
        formulas.mlp_matmul_flops([8, 16, 4], 3)


# --------------------------------------------------------------------------- bad input


NAN = float("nan")


@pytest.mark.parametrize("call, error, word", [
    (lambda: formulas.matmul_intensity(0, 4, 4), InputError, "m"),
    (lambda: formulas.matmul_intensity(4, 4, 4, bytes_per_element=NAN), InputError, "bytes_per_element"),
    (lambda: formulas.matmul_intensity("4", 4, 4), InputTypeError, "m"),
    (lambda: formulas.critical_batch("h200", d=8.0, f=8), InputTypeError, "d"),
    (lambda: formulas.ring_time(NAN, 8, "h200"), InputError, "buffer_bytes"),
    (lambda: formulas.ring_time(1e6, 0, "h200"), InputError, "n"),
    (lambda: formulas.ring_time(1e6, 8, "h200", kind=("all-reduce",)), InputTypeError, "kind"),
    (lambda: formulas.dp_critical_batch("h200", link="network", group=0), InputError, "group"),
    (lambda: formulas.fsdp_critical_batch("h200", gathers=3), InputError, "gathers"),
    (lambda: formulas.fsdp_critical_batch("h200", phase="middle"), InputError, "phase"),
    (lambda: formulas.tp_max_ways("h200", 0), InputError, "width"),
    (lambda: formulas.overlap_speedup(NAN, 1.0), InputError, "compute_s"),
    (lambda: formulas.overlap_speedup(1.0, -1.0), InputError, "comm_s"),
    (lambda: formulas.overlap_speedup(1.0, 1.0, ways=1), InputError, "ways"),
    (lambda: formulas.ring_matmul_balance_rows(1, "h200"), InputError, "ways"),
    (lambda: formulas.collective_matmul_times(8, 8, 8, 0, "h200"), InputError, "ways"),
    (lambda: formulas.mlp_matmul_flops([8, 4], 4, with_gradient=1), InputTypeError, "with_gradient"),
    (lambda: formulas.mlp_elementwise_flops([8, 4], -1), InputError, "batch"),
    (lambda: formulas.matmul_intensity(4, 4.5, 4), InputTypeError, "k"),
    (lambda: formulas.matmul_intensity(4, 4, 4, bytes_per_element=0), InputError, "bytes_per_element"),
    (lambda: formulas.critical_batch("h200", d=8), InputError, "both"),
    (lambda: formulas.ring_time(1e6, 8, "h200", kind="broadcast"), InputError, "kind"),
    (lambda: formulas.dp_critical_batch("h200", n=1), InputError, "n"),
    (lambda: formulas.tp_min_width("h200", 1), InputError, "n"),
    (lambda: formulas.overlap_speedup(0, 0), InputError, "nothing"),
    (lambda: formulas.mlp_matmul_flops([8], 4), InputError, "layer_sizes"),
    # Sizes the formula splits must split evenly (review: 100 rows over 8 chips was priced).
    (lambda: formulas.collective_matmul_times(100, 64, 64, 8, "h100-sxm"), InputError,
     r"m \(rows of the left-hand side\) is 100, .* 8 equal parts"),
    (lambda: formulas.collective_matmul_times(64, 60, 64, 8, "h100-sxm"), InputError,
     r"k \(rows of the right-hand side\) is 60, .* 8 equal parts"),
    (lambda: formulas.collective_matmul_times(8, 8, 8, True, "h200"), InputTypeError, "ways"),
    (lambda: formulas.collective_matmul_times(8, 8, 8, 4, "h200", slice_chips=2), InputError,
     "slice_chips"),
    (lambda: formulas.ring_time(True, 8, "h200"), InputTypeError, "buffer_bytes"),
    (lambda: formulas.ring_time(1e6, 10**9, "h200"), InputError, "n must be at most"),
    (lambda: formulas.ring_time(1e6, 8, "tpu-v5e", slice_chips=4), InputError, "slice_chips=4"),
    (lambda: formulas.ring_time(1e6, 4, "tpu-v5e", slice_chips="8"), InputTypeError, "slice_chips"),
    (lambda: formulas.ring_time(1e6, 4, "tpu-v5e", slice_chips=8, link="network"), InputError,
     "slice_chips=8 applies to link='interconnect'"),
    (lambda: formulas.ring_time(1e6, 4, ["tpu-v5e"]), InputTypeError, "chip"),
    (lambda: formulas.dp_critical_batch("h200", group=8), InputError, "group=8"),
    (lambda: formulas.dp_critical_batch("h200", n=True), InputTypeError, "n"),
    (lambda: formulas.dp_critical_batch("h200", link=["network"]), InputTypeError, "link"),
    (lambda: formulas.dp_critical_batch("h200", slice_chips=8), InputError, "needs n="),
    (lambda: formulas.fsdp_critical_batch("h200", phase=["forward"]), InputTypeError, "phase"),
    (lambda: formulas.fsdp_critical_batch("tpu-v4", n=4, slice_chips=0), InputError, "slice_chips"),
    (lambda: formulas.tp_min_width("tpu-v4", 16, slice_chips=8), InputError, "slice_chips=8"),
    (lambda: formulas.tp_max_ways("tpu-v4", 8192, slice_chips=False), InputTypeError, "slice_chips"),
    (lambda: formulas.ring_matmul_balance_rows(4, "tpu-v4", slice_chips=2), InputError, "slice_chips"),
    (lambda: formulas.mlp_matmul_flops("512", 8), InputTypeError, "layer_sizes"),
    (lambda: formulas.mlp_matmul_flops({4: 4, 5: 5}, 8), InputTypeError, "layer_sizes"),
    (lambda: formulas.critical_batch("h200", d=True, f=8), InputTypeError, "d"),
    (lambda: formulas.overlapped_time(True, 1.0), InputTypeError, "compute_s"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


# --------------------------------------------------------------------------- topology


def test_a_tpu_axis_without_wraparound_takes_twice_the_ring():
    """Review B2: on an 8-chip slice (2x4, 2x2x2) a 2- or 4-chip axis is a line; the scaling
    book: no wraparounds "typically doubles the time of most communication"."""
    for chip in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"):
        ring = formulas.ring_time(1e6, 4, chip)  # the 4 chips of a 2x2 slice: a cycle
        assert formulas.ring_time(1e6, 4, chip, slice_chips=8) == pytest.approx(2 * ring)
        assert formulas.ring_time(1e6, 8, chip, slice_chips=8) == \
            formulas.ring_time(1e6, 8, chip)  # all 8: a Hamiltonian cycle, the ring's price
        assert formulas.ring_time(1e6, 4, chip, link="network") == pytest.approx(
            3 / 4 * 1e6 / hardware.CHIPS[chip].network_bandwidth)
        assert formulas.tp_min_width(chip, 4, slice_chips=8) == pytest.approx(
            2 * formulas.tp_min_width(chip, 4))
        assert formulas.dp_critical_batch(chip, n=4, slice_chips=8) == pytest.approx(
            2 * formulas.dp_critical_batch(chip, n=4))
        assert formulas.fsdp_critical_batch(chip, n=4, slice_chips=8) == pytest.approx(
            2 * formulas.fsdp_critical_batch(chip, n=4))
        assert formulas.ring_matmul_balance_rows(4, chip, slice_chips=8) == pytest.approx(
            2 * formulas.ring_matmul_balance_rows(4, chip))
        c, m = formulas.collective_matmul_times(64, 64, 64, 4, chip)
        c8, m8 = formulas.collective_matmul_times(64, 64, 64, 4, chip, slice_chips=8)
        assert (c8, m8) == (c, pytest.approx(2 * m))
    for chip in ("h100-sxm", "h200", "b200"):  # NVSwitch: any group of a node is priced alike
        assert formulas.ring_time(1e6, 4, chip, slice_chips=8) == formulas.ring_time(1e6, 4, chip)


def test_tp_max_ways_in_a_slice_picks_a_length_that_divides_it():
    width = math.ceil(formulas.tp_min_width("tpu-v5p", 8))
    assert formulas.tp_max_ways("tpu-v5p", width, slice_chips=8) == 8  # a ring
    # 4 of 8 is a line: it needs twice the width 4 needs on a ring.
    four = formulas.tp_min_width("tpu-v5p", 4, slice_chips=8)
    assert four == pytest.approx(2 * formulas.tp_min_width("tpu-v5p", 4))
    assert formulas.tp_max_ways("tpu-v5p", math.ceil(four), slice_chips=8) == 4
    assert formulas.tp_max_ways("tpu-v5p", 10, slice_chips=8) == 1
    assert formulas.tp_max_ways("h100-sxm", width, slice_chips=8) == \
        min(8, formulas.tp_max_ways("h100-sxm", width))


# --------------------------------------------------------------------------- the audit
# Every integer and real argument of every formula, given each mistake a user makes (a
# string, a float, None, zero, a negative, NaN, infinity, a bool): InputError naming it.

BAD_INTS = {"str": "4", "float": 2.5, "None": None, "zero": 0, "negative": -3, "nan": NAN,
            "bool": True}
BAD_REALS = {"str": "1.0", "None": None, "negative": -1.0, "nan": NAN, "inf": float("inf"),
             "bool": True}
#: (function, valid keyword arguments, integer arguments, real arguments, optional ones:
#: None is valid there).
FORMULAS = [
    (formulas.matmul_intensity, dict(m=8, k=8, n=8), "m k n", "bytes_per_element", ""),
    (formulas.critical_batch, dict(chip="h200", d=8, f=8), "d f", "bytes_per_element", "d f"),
    (formulas.ring_time, dict(buffer_bytes=1e6, n=4, chip="tpu-v5e", slice_chips=8),
     "n slice_chips", "buffer_bytes", "slice_chips"),
    (formulas.dp_critical_batch, dict(chip="h200", n=8, link="network", group=8), "n group",
     "bytes_per_element", "n"),
    (formulas.fsdp_critical_batch, dict(chip="tpu-v5e", n=4, gathers=1, slice_chips=8),
     "n gathers slice_chips", "bytes_per_element", "n slice_chips"),
    (formulas.tp_min_width, dict(chip="h200", n=4, slice_chips=8), "n slice_chips",
     "bytes_per_element", "slice_chips"),
    (formulas.tp_max_ways, dict(chip="h200", width=8192, slice_chips=8), "width slice_chips",
     "bytes_per_element", "slice_chips"),
    (formulas.overlapped_time, dict(compute_s=1.0, comm_s=1.0, ways=4), "ways",
     "compute_s comm_s", "ways"),
    (formulas.overlap_speedup, dict(compute_s=1.0, comm_s=1.0, ways=4), "ways",
     "compute_s comm_s", "ways"),
    (formulas.ring_matmul_balance_rows, dict(ways=4, chip="h200", slice_chips=8),
     "ways slice_chips", "bytes_per_element", "slice_chips"),
    (formulas.collective_matmul_times, dict(m=64, k=64, n=64, ways=4, chip="h200",
                                            slice_chips=8),
     "m k n ways slice_chips", "bytes_per_element", "slice_chips"),
    (formulas.mlp_matmul_flops, dict(layer_sizes=[8, 8], batch=4), "batch", "", ""),
    (formulas.mlp_elementwise_flops, dict(layer_sizes=[8, 8], batch=4), "batch", "", ""),
    (hardware.axis_wraps, dict(chip="tpu-v5e", axis_length=4, slice_chips=8),
     "axis_length slice_chips", "", "slice_chips"),
    (hardware.topology_factor, dict(chip="tpu-v5e", axis_length=4, slice_chips=8),
     "axis_length slice_chips", "", "slice_chips"),
]
AUDIT = [
    pytest.param(fn, valid, arg, value, id=f"{fn.__name__}-{arg}-{tag}")
    for fn, valid, ints, reals, optional in FORMULAS
    for args, bad in ((ints, BAD_INTS), (reals, BAD_REALS))
    for arg in args.split()
    for tag, value in bad.items()
    if not (value is None and arg in optional.split())
] + [
    pytest.param(fn, valid, "chip", value, id=f"{fn.__name__}-chip-{tag}")
    for fn, valid, *_ in FORMULAS if "chip" in valid
    for tag, value in {"unknown": "tpu-v9", "list": ["h200"], "bytes": b"h200",
                       "None": None}.items()
]


@pytest.mark.parametrize("fn, valid, arg, value", AUDIT)
def test_every_bad_number_or_chip_names_its_argument(fn, valid, arg, value):
    fn(**valid)  # the valid call answers
    with pytest.raises(InputError, match=rf"\b{arg}\b"):
        fn(**valid | {arg: value})
