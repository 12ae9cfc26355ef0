"""Shared test helpers: the session's 8 CPU devices, meshes over the first k of them, and a
runner for code that needs a fresh Python (another device count, several processes).

``tests/conftest.py`` imports this module first, so JAX starts with 8 CPU devices before any
test module touches it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compile hundreds of small programs: skip LLVM's code optimisation (about a fifth of
# the suite's time). It changes only machine-code generation, not the HLO passes that decide
# shardings and collectives, which is what the tests pin.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# One persistent compile cache for the book's build and the tests, in the checkout's _build/
# (spmd_guide.core.compile_cache): both pytest workers, the subprocesses they start and a
# second run load the programs compiled before instead of compiling them again. The flag above
# is part of every program's key, so the tests' programs never stand in for the pages'.
# SPMD_COMPILE_CACHE=off runs the tests without it.
from spmd_guide.core import compile_cache  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault(compile_cache.ENV, str(compile_cache.default_directory(ROOT)))

from spmd_guide import ensure_devices  # noqa: E402

DEVICES = ensure_devices(8)


def run_python(code: str, *, devices: int | None = None, timeout: float = 120) -> str:
    """Run ``code`` in a fresh Python with ``devices`` CPU devices; return its stdout.

    Fails the test with the child's stderr if it exits non-zero.
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        pytest.fail(f"child Python failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def mesh_of(k: int, names: tuple[str, ...] = ("x",), shape: tuple[int, ...] | None = None, *,
            explicit: bool = False):
    """A mesh over the first ``k`` devices (Auto axes unless ``explicit``)."""
    import jax
    from jax.sharding import AxisType

    shape = shape or (k,)
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(names), devices=DEVICES[:k])


def contrast_ratio(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#RRGGBB`` colours (4.5 is AA for text)."""
    def luminance(colour: str) -> float:
        channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)
