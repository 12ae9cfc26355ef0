"""ensure_devices and environment_summary: the entry point of every chapter."""

import pytest

from conftest import run_python
from spmd_guide import ensure_devices, environment_summary


def test_returns_the_eight_devices_of_this_session(devices):
    got = ensure_devices(8)
    assert [d.id for d in got] == list(range(8))
    assert got == devices


@pytest.mark.parametrize("bad", [0, -3, 2.0, "8", True])
def test_rejects_a_count_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="positive integer"):
        ensure_devices(bad)


def test_a_different_count_after_jax_started_says_how_to_fix():
    with pytest.raises(RuntimeError) as err:
        ensure_devices(4)
    message = str(err.value)
    assert "8 CPU device(s)" in message and "needs 4" in message
    assert "restart the kernel" in message


@pytest.mark.parametrize("n", [1, 2, 4])
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
