"""Every numeric argument of the rooflines public functions through one battery of values
(bool, NaN, inf, negative, zero, float-for-int, NumPy and JAX scalars): each call raises
the package's InputError (InputTypeError is one) naming the argument, or returns the answer
the plain Python value gives. A class of input, not a list of cases (bad-input audit C/D)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from spmd_guide.core.checks import InputError
from spmd_guide.rooflines import formulas, hardware, roofline

BATTERY = {
    "bool": True, "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "negative": -4,
    "zero": 0, "float-for-int": 4.0, "half": 2.5, "numpy int": np.int64(4),
    "numpy float": np.float64(4.0), "jax int": jnp.int32(4), "jax float": jnp.float32(4.0),
    "numpy bool": np.bool_(True), "string": "4",
}
#: Arguments for which 0 is a valid value (nothing sent, nothing computed).
ZERO_OK = {"buffer_bytes", "flops", "bytes_accessed", "comm_bytes", "devices", "converts"}
#: (function, valid keyword arguments, its numeric arguments)
CALLS = [
    (formulas.matmul_intensity, dict(m=8, k=8, n=8), ("m", "k", "n", "bytes_per_element")),
    (formulas.ring_time, dict(buffer_bytes=1e6, n=4, chip="tpu-v5e", slice_chips=8),
     ("buffer_bytes", "n", "slice_chips")),
    (formulas.collective_matmul_times, dict(m=64, k=64, n=64, ways=4, chip="tpu-v5e"),
     ("m", "k", "n", "ways", "bytes_per_element")),
    (formulas.ring_matmul_balance_rows, dict(ways=4, chip="tpu-v5e"),
     ("ways", "bytes_per_element")),
    (formulas.tp_min_width, dict(chip="tpu-v5e", n=4), ("n", "bytes_per_element")),
    (formulas.dp_critical_batch, dict(chip="tpu-v5e", n=8), ("n", "bytes_per_element")),
    (hardware.axis_wraps, dict(chip="tpu-v5e", axis_length=4, slice_chips=8),
     ("axis_length", "slice_chips")),
    (hardware.topology_factor, dict(chip="tpu-v5e", axis_length=4, slice_chips=8),
     ("axis_length", "slice_chips")),
    (roofline.Counts, dict(flops=1e9, bytes_accessed=1e6, comm_bytes=1e6),
     ("flops", "bytes_accessed", "comm_bytes", "devices", "converts")),
    (roofline.estimate, dict(work=roofline.Counts(1e9, 1e6, 1e6), chip="h200"),
     ("byte_scale",)),
    (roofline.predict, dict(fn=lambda x: x @ x, chip="h200"), ("byte_scale",)),
]
CASES = [pytest.param(fn, valid, arg, value, id=f"{fn.__name__}-{arg}-{tag}")
         for fn, valid, args in CALLS for arg in args for tag, value in BATTERY.items()]


def _call(fn, kwargs):
    if fn is roofline.predict:
        return fn(kwargs.pop("fn"), jnp.ones((4, 4)), **kwargs)
    return fn(**kwargs)


def _plain(value):
    """The Python number a NumPy or JAX scalar stands for."""
    return value.item() if hasattr(value, "item") else value


@pytest.mark.parametrize("fn, valid, arg, value", CASES)
def test_every_numeric_argument_is_refused_or_answered_rightly(fn, valid, arg, value):
    try:
        got = _call(fn, valid | {arg: value})
    except InputError as error:
        assert arg in str(error), f"{fn.__name__}({arg}={value!r}): {error}"
        return
    # Accepted: then the value must be a valid one, and the answer the plain value's.
    assert not isinstance(value, (bool, np.bool_, str)), f"{arg}={value!r} was accepted"
    plain = _plain(value)
    assert math.isfinite(plain) and (plain > 0 or plain == 0 and arg in ZERO_OK), \
        f"{arg}={value!r} was accepted"
    assert got == _call(fn, valid | {arg: plain})


def test_chips_rates_are_positive_finite_numbers():
    for chip in hardware.CHIPS.values():
        for name in hardware.UNITS:
            value = getattr(chip, name)
            assert isinstance(value, float) and math.isfinite(value) and value > 0
    entry = {name: getattr(hardware.CHIPS["h200"], name) for name in (
        "name", "peak_flops_bf16", "hbm_bytes", "hbm_bandwidth", "interconnect_bandwidth",
        "interconnect", "network_bandwidth", "network", "topology", "source", "read_via",
        "date_read", "cite")}
    for tag, value in BATTERY.items():
        if tag in ("numpy int", "numpy float", "jax int", "jax float", "float-for-int", "half"):
            continue
        with pytest.raises(InputError, match="peak_flops_bf16"):
            hardware.Chip(key="x", **entry | {"peak_flops_bf16": value})
