"""ensure_devices and environment_summary: the entry point of every chapter."""

import dataclasses

import numpy as np
import pytest
from helpers import run_python
from jax.sharding import AxisType

from spmd_guide import ensure_devices, environment_summary
from spmd_guide.core import checks
from spmd_guide.core.devices import build_mesh


def test_returns_the_eight_devices_of_this_session(devices):
    got = ensure_devices(8)
    assert [d.id for d in got] == list(range(8))
    assert got == devices


@pytest.mark.parametrize(("bad", "word"), [
    (0, "at least 1"), (-3, "at least 1"), (2.0, "integer"), ("8", "integer"),
    (True, "integer"), (None, "integer"), (10**6, "at most"),
])
def test_rejects_a_count_that_is_not_a_positive_int(bad, word):
    with pytest.raises(checks.InputError, match=word):
        ensure_devices(bad)


def test_accepts_numpy_integers():
    assert len(ensure_devices(np.int64(8))) == 8


@pytest.mark.slow
def test_requested_count_wins_over_xla_flags():
    out = run_python(
        """
        from spmd_guide import ensure_devices
        print(len(ensure_devices(4)))
        """,
        devices=2,
    )
    assert out.split() == ["4"]


@pytest.mark.parametrize(("shape", "names", "kwargs", "word"), [
    ((4, 2), ("a",), {}, "one distinct axis name"),
    ((2, 2), ("a", "a"), {}, "one distinct axis name"),
    ((4, 4), ("a", "b"), {}, "needs 16 devices"),
    ((8,), "x", {}, "tuple of strings"),
    ((0,), ("x",), {}, "at least 1"),
    ((8,), ("x",), {"axis_types": "manual"}, "choose one of"),
])
def test_build_mesh_refuses_bad_meshes(shape, names, kwargs, word):
    with pytest.raises(checks.InputError, match=word):
        build_mesh(shape, names, **kwargs)


def test_build_mesh_takes_ints_and_numpy_ints_and_both_axis_types():
    assert build_mesh(8, ("x",)).shape == {"x": 8}
    mesh = build_mesh((np.int64(4), 2), ("a", "b"), axis_types="explicit")
    assert dict(mesh.shape) == {"a": 4, "b": 2}
    assert set(mesh.axis_types) == {AxisType.Explicit}
    assert set(build_mesh((2,), ("x",)).axis_types) == {AxisType.Auto}


def test_a_different_count_after_jax_started_says_how_to_fix():
    with pytest.raises(RuntimeError) as err:
        ensure_devices(4)
    message = str(err.value)
    assert "8 CPU device(s)" in message and "needs 4" in message
    assert "restart the kernel" in message


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 4])
def test_fresh_process_gets_exactly_n_cpu_devices(n):
    out = run_python(
        f"""
        import jax
        from spmd_guide import ensure_devices
        devs = ensure_devices({n})
        print(len(devs), len(jax.devices()), devs[0].platform)
        """
    )
    assert out.split() == [str(n), str(n), "cpu"]


def test_fails_clearly_when_jax_started_first_with_other_count():
    out = run_python(
        """
        import jax
        jax.devices()  # starts the backends with 2 devices
        from spmd_guide import ensure_devices
        try:
            ensure_devices(8)
        except RuntimeError as e:
            print("RuntimeError:", e)
        """,
        devices=2,
    )
    assert out.startswith("RuntimeError: JAX is running with 2 CPU device(s), but this code needs 8")


def test_environment_summary_describes_the_mock_devices():
    env = environment_summary()
    assert env.backend == "cpu" and env.device_count == 8 and env.mock_devices
    text = str(env)
    assert "8 x cpu" in text and "mock devices" in text and env.jax_version in text
    assert env.hardware == f"8 x cpu (CPU mock devices sharing {env.host_cores} host cores)"
    real = dataclasses.replace(env, backend="gpu", device_kind="H100", mock_devices=False)
    assert real.hardware == "8 x H100"
