"""compare: the book's compiler claims on XLA:CPU and XLA:TPU (the table of tpu/cpu_vs_tpu)."""

import pytest
from jax.sharding import AxisType

from spmd_guide.core import checks
from spmd_guide.core.devices import build_mesh
from spmd_guide.tpu import compare
from spmd_guide.tpu.topology import tpu_mesh


@pytest.fixture(scope="module")
def meshes(devices):
    return (build_mesh((8,), ("data",), devices=devices),
            tpu_mesh("v5e:2x4", (8,), ("data",), axis_types=(AxisType.Auto,)))


def _read(key, mesh):
    claim = next(c for c in compare.CLAIMS if c.key == key)
    return claim.read(compare.probe_program(claim, mesh))


def test_bf16_collectives_stay_bf16_on_tpu_and_widen_to_f32_on_cpu(meshes):
    cpu, tpu = (_read("mixed_precision", m) for m in meshes)
    assert "bf16" not in cpu and "f32" in cpu
    assert "f32" not in tpu and "all-gather: bf16" in tpu


def test_accumulation_reduces_in_the_loop_on_cpu_and_after_it_on_tpu(meshes):
    cpu, tpu = (_read("accumulation_dp", m) for m in meshes)
    assert cpu == "1 in the loop, 0 outside"
    assert tpu == "0 in the loop, 1 outside"


@pytest.mark.slow
def test_the_whole_table(devices):
    rows = {r["claim (as the book words it)"]: r for r in compare.compare("v5e:2x4")}
    assert len(rows) == len(compare.CLAIMS)
    fsdp = next(r for k, r in rows.items() if "hoisted" in k)
    # XLA:CPU hoists all three weight gathers; XLA:TPU gathers them in the loop. Both gather
    # the activations of the two sharded-weight products in the loop.
    assert fsdp["XLA:CPU"] == ("weight gathers: 0 in the loop, 3 outside; "
                               "activations gathers: 2 in the loop, 0 outside")
    assert fsdp["XLA:TPU (v5e:2x4)"].startswith("weight gathers: 3 in the loop, 0 outside")
    combining = next(r for k, r in rows.items() if "combined" in k)
    assert combining["XLA:CPU"] == combining["XLA:TPU (v5e:2x4)"]
    assert combining["XLA:CPU"].startswith("1 op(s)")


def test_bad_claims_and_meshes_are_refused(meshes, devices):
    with pytest.raises(checks.InputError):
        compare.probe_program("speed", meshes[0])
    with pytest.raises(checks.InputError):
        compare.probe_program("async", build_mesh((8,), ("x",), devices=devices))
    with pytest.raises(checks.InputError):
        compare.probe_program("async", meshes[0], compiler_options={3: 1})


def test_xla_tpu_reduce_scatter_fusion_is_read_as_a_reduce_scatter(meshes):
    """XLA:TPU reduces fsdp's gradients in a kCustom fusion calling %all-reduce-scatter.N;
    the book counts it as a reduce-scatter, with a reduce-scatter's bytes."""
    from spmd_guide.core import hlo

    text = compare.probe_program("async", meshes[1])
    assert "calls=%all-reduce-scatter" in text
    fused = [op for op in hlo.collectives_in_text(text)
             if hlo.is_reduce_scatter_fusion(op.computation)]
    assert fused and {op.kind for op in fused} == {"reduce-scatter"}
    for op in fused:
        assert op.bytes_sent == hlo.ring_bytes("reduce-scatter", op.buffer_bytes, 8)


@pytest.mark.parametrize("shape, what", [
    ("bf16[1024,512]", "weight"), ("f32[512,1024]", "weight"), ((1024, 1024), "weight"),
    ("bf16[256,512]", "activations"), ("f32[64,1024]", "activations"), ((512,), "activations")])
def test_gathers_tells_weights_from_activations_without_libtpu(shape, what):
    assert compare.gathers(shape) == what


def test_gathers_refuses_text_that_is_not_a_shape_without_libtpu():
    with pytest.raises(checks.InputError, match="shape"):
        compare.gathers("bf16")


def test_overlap_rows_say_what_each_collective_carries(meshes):
    """tpu/cpu_vs_tpu: the overlapped gathers carry one weight (w2, during the forward
    pass) and activations (during the backward pass); the reduce-scatter, gradients."""
    rows = compare.overlap_rows(compare.probe_program("async", meshes[1]))
    over = [r for r in rows if r["matmuls in between"]]
    assert sorted(r["carries"] for r in over) == ["activations", "activations", "weight"]
    assert {r["carries"] for r in rows if r["collective"] == "reduce-scatter"} == {"gradients"}
    sync = [r for r in rows if r["starts at"] == r["waits at"]]
    assert len(sync) == len(rows) - len(over)
