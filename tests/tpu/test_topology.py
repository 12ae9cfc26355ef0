"""topology: a TPU slice's compile-only devices and tpu_mesh, against meshes built directly
from get_topology_desc's devices."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from jax.experimental import mesh_utils
from jax.sharding import AxisType

from spmd_guide.core import checks
from spmd_guide.tpu import topology
from spmd_guide.tpu.topology import chip_key, topology_devices, tpu_mesh


@pytest.mark.parametrize(("name", "shape", "names"), [
    ("v5e:2x4", (4, 2), ("data", "model")),
    ("v4:2x2x2", (8,), ("data",)),
    ("v6e:2x4", (2, 2, 2), ("a", "b", "c")),
    ("v5p:2x2x2", (2, 4), ("data", "model")),
    ("v5e:4x4", (4, 4), ("data", "model")),
])
def test_tpu_mesh_lays_out_the_slice_as_create_device_mesh_does(name, shape, names):
    devices = topology_devices(name)
    mesh = tpu_mesh(name, shape, names)
    direct = mesh_utils.create_device_mesh(shape, devices)
    assert [d.id for d in mesh.devices.flat] == [d.id for d in direct.flat]
    assert mesh.axis_names == names
    assert set(mesh.axis_types) == {AxisType.Explicit}  # jax.make_mesh's default
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_axis_types_when_told_and_numpy_sizes():
    mesh = tpu_mesh("v5e:2x4", (np.int64(8),), ("x",), axis_types=(AxisType.Auto,))
    assert mesh.axis_types == (AxisType.Auto,) and mesh.shape == {"x": 8}


@pytest.mark.parametrize(("name", "count", "kind", "chip"), [
    ("v5e:2x4", 8, "TPU v5 lite", "tpu-v5e"), ("v4:2x2x2", 8, "TPU v4", "tpu-v4"),
    ("v5p:2x2x2", 8, "TPU v5", "tpu-v5p"), ("v6e:2x4", 8, "TPU v6 lite", "tpu-v6e"),
    ("v4:4x4x4", 64, "TPU v4", "tpu-v4"),
])
def test_one_device_per_chip_and_its_chips_toml_entry(name, count, kind, chip):
    devices = topology_devices(name)
    assert len(devices) == count
    assert {d.device_kind for d in devices} == {kind}
    assert chip_key(devices) == chip


@pytest.mark.parametrize(("args", "words"), [
    (("v9:2x2", (4,), ("x",)), ["unknown TPU topology", "v5e:2x4"]),
    (("v5e", (4,), ("x",)), ["unknown TPU topology"]),
    (("", (4,), ("x",)), ["unknown TPU topology"]),
    (("v5e:3x3", (9,), ("x",)), ["cannot describe the slice", "chips_per_host_bounds",
                                 "v5e:2x4"]),
    (("v5e:2x4", (4, 4), ("a", "b")), ["hold 16 devices", "has 8"]),
    (("v5e:2x4", (3,), ("x",)), ["hold 3 devices"]),
    (("v5e:2x4", (4, 2), ("a",)), ["one distinct"]),
    (("v5e:2x4", (4, 2), ("a", "a")), ["one distinct"]),
    (("v5e:2x4", (4, 2), ("a", "")), ["one distinct"]),
    (("v5e:2x4", (4, 2), ("a", 1)), ["one distinct"]),
    (("v5e:2x4", (0, 8), ("a", "b")), ["at least 1"]),
])
def test_bad_input_is_refused_with_the_rule(args, words):
    with pytest.raises(checks.InputError) as err:
        tpu_mesh(*args)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(("args", "kwargs"), [
    ((5, (4,), ("x",)), {}),
    (("v5e:2x4", (True, 8), ("a", "b")), {}),
    (("v5e:2x4", (8.0,), ("x",)), {}),
    (("v5e:2x4", 8, ("x",)), {}),
    (("v5e:2x4", (8,), "x"), {}),
    (("v5e:2x4", (8,), ("x",)), {"axis_types": AxisType.Auto}),
    (("v5e:2x4", (8,), ("x",)), {"axis_types": ("auto",)}),
])
def test_bad_types_are_refused(args, kwargs):
    with pytest.raises(checks.InputError):
        tpu_mesh(*args, **kwargs)


def test_chip_key_refuses_cpu_devices(devices):
    with pytest.raises(checks.InputError, match="one TPU generation"):
        chip_key(devices)


def test_unavailable_is_empty_here_and_names_the_platform_elsewhere(monkeypatch):
    assert topology.unavailable() == ""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(topology.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(topology.platform, "machine", lambda: "arm64")
    why = topology.unavailable()
    assert "not available on this platform" in why and "Darwin" in why
    with pytest.raises(RuntimeError, match="not available on this platform"):
        topology_devices("v5e:2x4")


def test_jax_starts_on_cpu_without_a_word_from_libtpu():
    # With libtpu installed and no TPU chip: no platform chosen, ensure_devices starts JAX
    # on its CPU backend alone, and describing a slice prints nothing either.
    code = textwrap.dedent("""
        from spmd_guide import ensure_devices
        print(ensure_devices(8)[0].platform)
        from spmd_guide.tpu import tpu_mesh
        print(tpu_mesh("v6e:2x4", (8,), ("x",)).devices.flat[0].device_kind)
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "XLA_FLAGS") and not k.startswith("TPU_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["cpu", "TPU v6 lite"]
    assert proc.stderr == ""


@pytest.mark.slow
def test_compile_only_keeps_tpu_programs_out_of_the_compile_cache(tmp_path):
    # JAX 0.12 writes a compile-only TPU program to the persistent cache but cannot load it
    # back ("PjRtCompiler must be constructed with a Client"): it warns on every later run.
    # compile_only compiles with the cache off, so a second process prints nothing either.
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from spmd_guide import ensure_devices
        ensure_devices(8)
        from spmd_guide.tpu.topology import compile_only, tpu_mesh
        mesh = tpu_mesh("v5e:2x4", (8,), ("x",))
        x = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=NamedSharding(mesh, P("x")))
        print(compile_only(jax.jit(lambda v: v.sum()).trace(x).lower()).as_text()[:9])
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "XLA_FLAGS") and not k.startswith("TPU_")}
    env["SPMD_COMPILE_CACHE"] = str(tmp_path / "cache")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.startswith("HloModule"), proc.stdout[:200]
        assert proc.stderr == "", proc.stderr[-2000:]
