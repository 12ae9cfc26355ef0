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
    (lambda: roofline.estimate(WORK, "h200", topology=1), InputTypeError, "topology"),
    (lambda: roofline.comm_seconds(WORK, "h200", topology="no"), InputTypeError, "topology"),
    (lambda: roofline.comm_seconds(3.0, "h200"), InputTypeError, "Counts"),
    (lambda: roofline.predict(lambda a: a, jnp.ones(3), chip="h200", topology=None),
     InputTypeError, "topology"),
    (lambda: roofline.predict(lambda a: a, jnp.ones(3), chip=["h200"]), InputTypeError, "chip"),
    (lambda: roofline.predict(None, chip="h200"), InputTypeError, "fn"),
    (lambda: roofline.Counts(1, 1, 1, sent_by_group={"4": 1}, devices=8), InputTypeError,
     "group size"),
    (lambda: roofline.Counts(1, 1, 1, sent_by_group={4: 1}), InputError, "devices="),
    (lambda: roofline.Counts(1, 1, 1, sent_by_group={16: 1}, devices=8), InputError,
     "at most 8"),
    (lambda: roofline.Counts(1, 1, 1, sent_by_group={4: 5}, devices=8), InputError,
     "more than comm_bytes"),
    (lambda: roofline.Counts(1, 1, 1, sent_by_group=[4], devices=8), InputTypeError,
     "sent_by_group"),
    (lambda: roofline.Counts(1, 1, 1, devices=True), InputTypeError, "devices"),
    (lambda: roofline.Counts(1, 1, 1, converts=-1), InputError, "converts"),
    (lambda: roofline.Estimate("h200", 1, 1, 1, 1, 1, 1, converts=0.5), InputTypeError,
     "converts"),
    (lambda: roofline.counts(lambda a: a, "x"), InputTypeError, "arrays"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


# --------------------------------------------------------------------------- topology


def test_a_two_axis_program_prices_each_group_by_its_chips():
    """Review B2 and T5-M1: counts read each collective's device groups and the mesh from
    the compiled program; on an 8-chip TPU slice each group is priced by the chips
    jax.make_mesh puts it on: the 4-chip groups of a (4, 2) mesh are a 2x2 face (a ring) on
    a v4 and scattered (priced as a line, twice the ring) on a v5e, v5p or v6e. On a GPU
    node every group gets the ring's price."""
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("a", "b")))
    gather_a = jax.jit(lambda v: v * 2, out_shardings=NamedSharding(mesh, P(None, "b")))
    work = roofline.counts(gather_a, x)
    assert work.devices == 8 and set(work.sent_by_group) == {4}
    assert work.sent_by_group[4] == work.comm_bytes > 0
    assert work.mesh_shape == (4, 2)
    assert dict(work.sent_by_groups) == {((0, 2, 4, 6), (1, 3, 5, 7)): work.comm_bytes}
    for chip, factor in (("tpu-v4", 1), ("tpu-v5e", 2), ("tpu-v5p", 2), ("tpu-v6e", 2)):
        priced = roofline.estimate(work, chip)
        ring = roofline.estimate(work, chip, topology=False)
        assert priced.comm_s == pytest.approx(factor * ring.comm_s), chip
        assert ring.comm_s == pytest.approx(work.comm_bytes / hardware.CHIPS[chip].interconnect_bandwidth)
        assert roofline.estimate(work, chip, link="network").comm_s == pytest.approx(
            work.comm_bytes / hardware.CHIPS[chip].network_bandwidth)  # not a torus axis
    # Without the mesh (hand-made counts), the length rule prices the 4 of 8 as a line.
    bare = roofline.Counts(work.flops, work.bytes_accessed, work.comm_bytes,
                           sent_by_kind=work.sent_by_kind, sent_by_group=work.sent_by_group,
                           devices=8)
    assert roofline.estimate(bare, "tpu-v4").comm_s == pytest.approx(
        2 * roofline.estimate(bare, "tpu-v4", topology=False).comm_s)
    assert roofline.estimate(work, "h100-sxm").comm_s == \
        roofline.estimate(work, "h100-sxm", topology=False).comm_s
    line8 = mesh_of(8)
    x8 = jax.device_put(jnp.ones((64, 32)), NamedSharding(line8, P("x")))
    whole = roofline.counts(jax.jit(lambda v: v * 2, out_shardings=NamedSharding(line8, P())), x8)
    assert set(whole.sent_by_group) == {8}  # all 8 chips: a cycle through the slice, a ring
    assert roofline.estimate(whole, "tpu-v5e").comm_s == \
        roofline.estimate(whole, "tpu-v5e", topology=False).comm_s


def test_hand_made_counts_keep_the_ring_price():
    """Counts built by hand (serving.costs does) carry no groups: every byte at the ring."""
    work = roofline.Counts(1e9, 1e6, 1e6)
    assert roofline.estimate(work, "tpu-v5e").comm_s == 1e6 / 9e10
    grouped = roofline.Counts(1e9, 1e6, 1e6, sent_by_group={2: 4e5}, devices=8)
    assert roofline.estimate(grouped, "tpu-v5e").comm_s == pytest.approx((6e5 + 2 * 4e5) / 9e10)


# --------------------------------------------------------------------------- bfloat16


def _bf16(tree):
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16), tree)


def test_a_bf16_matmul_is_native_and_a_bf16_training_step_gains_conversions():
    """Review B1 (JAX 0.12, XLA:CPU): a bf16 matmul compiles with no convert and its ideal
    bytes; the bf16 MLP step gains float converts, and the cost analysis counts their bytes
    (more than the float32 step's, where bf16 should move half). The estimate says so."""
    m, k, n = 64, 128, 256
    mm = roofline.counts(lambda a, b: a @ b, *_bf16((jnp.ones((m, k)), jnp.ones((k, n)))))
    assert mm.converts == 0 and mm.bytes_accessed == 2 * (m * k + k * n + m * n)
    params = nn.init_mlp(jax.random.key(0), [64, 128, 64])
    batch = (jnp.ones((32, 64)), jnp.ones((32, 64)))
    step = jax.value_and_grad(nn.mlp_loss)
    f32, bf16 = roofline.counts(step, params, batch), roofline.counts(step, *_bf16((params, batch)))
    assert f32.converts == 0 and bf16.converts > 0
    assert bf16.bytes_accessed > f32.bytes_accessed
    assert roofline.estimate(f32, "h200").note == ""
    note = roofline.predict(step, *_bf16((params, batch)), chip="h200").note
    assert f"{bf16.converts} time(s)" in note and "byte_scale=0.5" in note
    # int -> float converts are not counted: only float <-> float.
    assert roofline.counts(lambda i: i.astype(jnp.float32) * 2, jnp.arange(8)).converts == 0


# --------------------------------------------------------------------------- the audit

BAD_INTS = {"str": "4", "float": 2.5, "None": None, "negative": -3, "nan": NAN, "bool": True}
BAD_REALS = {"str": "1.0", "None": None, "negative": -1.0, "nan": NAN, "inf": float("inf"),
             "bool": True}
BAD_CHIPS = {"unknown": "tpu-v9", "list": ["h200"], "bytes": b"h200", "None": None}
COUNTS = dict(flops=1.0, bytes_accessed=1.0, comm_bytes=1.0)
#: (function, valid keyword arguments, integer arguments, real arguments, chip argument).
CALLS = [
    (roofline.Counts, COUNTS | dict(devices=8, converts=0), "devices converts",
     "flops bytes_accessed comm_bytes", ""),
    (roofline.Estimate, dict(chip="h200", flops=1, bytes_accessed=1, comm_bytes=1, compute_s=1,
                             memory_s=1, comm_s=1, converts=0), "converts",
     "flops bytes_accessed comm_bytes compute_s memory_s comm_s", ""),
    (roofline.estimate, dict(work=WORK, chip="h200", byte_scale=0.5), "", "byte_scale", "chip"),
    (roofline.comm_seconds, dict(work=WORK, chip="h200", byte_scale=0.5), "", "byte_scale",
     "chip"),
]
AUDIT = [
    pytest.param(fn, valid, arg, value, id=f"{fn.__name__}-{arg}-{tag}")
    for fn, valid, ints, reals, chip in CALLS
    for args, bad in ((ints, BAD_INTS), (reals, BAD_REALS), (chip, BAD_CHIPS))
    for arg in args.split() for tag, value in bad.items()
]


@pytest.mark.parametrize("fn, valid, arg, value", AUDIT)
def test_every_bad_number_or_chip_names_its_argument(fn, valid, arg, value):
    fn(**valid)
    with pytest.raises(InputError, match=rf"\b{arg}\b"):
        fn(**valid | {arg: value})


@pytest.mark.parametrize("value", list(BAD_REALS.values()) + [0], ids=[*BAD_REALS, "zero"])
def test_predict_refuses_a_bad_byte_scale_before_compiling(value):
    with pytest.raises(InputError, match="byte_scale"):
        roofline.predict(lambda a: a, jnp.ones(3), chip="h200", byte_scale=value)


@pytest.mark.parametrize("value", list(BAD_CHIPS.values()), ids=list(BAD_CHIPS))
def test_predict_refuses_a_bad_chip_before_compiling(value):
    with pytest.raises(InputError, match="chip"):
        roofline.predict(lambda a: a, jnp.ones(3), chip=value)


# --------------------------------------------------------------------------- audit D


@pytest.mark.parametrize("call, word", [
    (lambda: roofline.Counts(1, 1, comm_bytes=1, sent_by_kind={"all-reduce": 99}), "add up"),
    (lambda: roofline.Counts(1, 1, comm_bytes=10, sent_by_kind={"all-reduce": 4}), "add up"),
    (lambda: roofline.Estimate(chip="not-a-chip", flops=1, bytes_accessed=1, comm_bytes=1,
                               compute_s=1, memory_s=1, comm_s=1), "not-a-chip"),
    (lambda: roofline.Counts(1, 1, 1, devices=8, mesh_shape=(4, 4)), "mesh_shape"),
    (lambda: roofline.Counts(1, 1, 1, devices=8, sent_by_group={4: 1},
                             sent_by_groups={((0, 1, 2, 3),): 1}), "mesh_shape"),
    (lambda: roofline.Counts(1, 1, 1, devices=8, mesh_shape=(8,), sent_by_group={4: 1},
                             sent_by_groups={((0, 1, 2, 9),): 1}), "position 9"),
])
def test_counts_and_estimates_that_do_not_add_up_are_refused(call, word):
    with pytest.raises(InputError, match=word):
        call()


def test_counts_that_add_up_are_taken():
    work = roofline.Counts(1, 1, comm_bytes=10, sent_by_kind={"all-reduce": 4, "all-gather": 6})
    assert sum(work.sent_by_kind.values()) == work.comm_bytes
    assert roofline.Estimate(chip="tpu-v5e", flops=1, bytes_accessed=1, comm_bytes=1,
                             compute_s=1, memory_s=1, comm_s=1).chip == "tpu-v5e"
