"""Tests for spmd_guide.rooflines.roofline: the counts the compiled program gives (on Auto and
Explicit mesh axes), predict's bound and its link, the names the public contract keeps here,
and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide import nn
from spmd_guide.core import hlo
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import formulas, hardware, roofline


def test_the_contract_names_stay_on_roofline():
    """DESIGN.md's contract: roofline.CHIPS, roofline.matmul_intensity and roofline.predict."""
    assert roofline.CHIPS is hardware.CHIPS
    assert roofline.matmul_intensity is formulas.matmul_intensity
    assert callable(roofline.predict)


# --------------------------------------------------------------------------- counts


def test_cost_analysis_counts_a_matmul_as_2mkn_and_its_bytes_once():
    m, k, n = 48, 80, 24
    work = roofline.counts(lambda a, b: a @ b, jnp.ones((m, k)), jnp.ones((k, n)))
    assert work.flops == 2 * m * k * n
    assert work.bytes_accessed == 4 * (m * k + k * n + m * n)
    assert work.flops / work.bytes_accessed == pytest.approx(
        formulas.matmul_intensity(m, k, n, bytes_per_element=4))
    assert work.comm_bytes == 0


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
    assert estimate.comm_s == pytest.approx(formulas.ring_time(64 * 32 * 4, 4, "h100-sxm"))
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


def test_numpy_numbers_work_wherever_python_ones_do():
    work = roofline.Counts(np.float32(1e9), np.int64(10**6), np.float64(0))
    assert type(work.flops) is float
    assert roofline.estimate(work, "h200", byte_scale=np.float16(0.5)).bytes_accessed == 5e5


# --------------------------------------------------------------------------- bad input


NAN = float("nan")
WORK = roofline.Counts(1e9, 1e6, 1e6)


@pytest.mark.parametrize("call, error, word", [
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
    (lambda: roofline.as_devices("cpu"), InputTypeError, "devices"),
    (lambda: roofline.as_devices([]), InputError, "empty"),
    (lambda: roofline.as_devices([0, 1]), InputTypeError, "jax.Device"),
    (lambda: roofline.as_devices(jax.devices()[:1] * 2), InputError, "more than once"),
    (lambda: roofline.predict(lambda a: a, jnp.ones(3), chip="nope"), InputError, "chip"),
    (lambda: roofline.predict("f", jnp.ones(3), chip="h200"), InputTypeError, "fn"),
    (lambda: roofline.estimate(roofline.Counts(1, 1, 1), "h200", link="pcie"), InputError, "link"),
    (lambda: roofline.estimate(roofline.Counts(1, 1, 1), "h200", byte_scale=-1), InputError, "byte_scale"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
