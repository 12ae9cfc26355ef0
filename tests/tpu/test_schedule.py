"""schedule: where a program starts each collective and waits for it; chain_id counting."""

from jax.sharding import AxisType

from spmd_guide.core import hlo
from spmd_guide.tpu import compare, schedule
from spmd_guide.tpu.topology import tpu_mesh

# A TPU-style chain (start fusion, a fused matmul while in flight, done fusion) and a
# -start/-done pair with a matmul between, as other backends write them.
HLO = """HloModule m, is_scheduled=true, num_partitions=8

%start_comp (p0: bf16[4,8]) -> (bf16[4,8], bf16[32,8]) {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %all-gather.1 = bf16[32,8]{1,0} all-gather(%p0), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="3"}
  ROOT %cc = (bf16[4,8]{1,0}, bf16[32,8]{1,0}) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%mid_comp (p0: bf16[4,8], p1: f32[8,8]) -> (f32[8,8], bf16[32,8]) {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %convolution.1 = f32[8,8]{1,0} convolution(%p1, %p1), dim_labels=bf_io->bf
  %all-gather.2 = bf16[32,8]{1,0} all-gather(%p0), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="3"}
  ROOT %t = (f32[8,8]{1,0}, bf16[32,8]{1,0}) tuple(%convolution.1, %all-gather.2)
}

%done_comp (p0: bf16[4,8]) -> bf16[32,8] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %all-gather.3 = bf16[32,8]{1,0} all-gather(%p0), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="3"}
  ROOT %cc = bf16[32,8]{1,0} custom-call(%p0, %all-gather.3), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (a: bf16[4,8], b: f32[8,8], c: f32[8]) -> f32[8] {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = f32[8,8]{1,0} parameter(1)
  %c = f32[8]{0} parameter(2)
  %s = (bf16[4,8]{1,0}, bf16[32,8]{1,0}) fusion(%a), kind=kCustom, calls=%start_comp
  %m = (f32[8,8]{1,0}, bf16[32,8]{1,0}) fusion(%a, %b), kind=kCustom, calls=%mid_comp
  %d = bf16[32,8]{1,0} fusion(%a), kind=kCustom, calls=%done_comp
  %ars = f32[8]{0} all-reduce-start(%c), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %dot.1 = f32[8,8]{1,0} dot(%b, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ard = f32[8]{0} all-reduce-done(%ars)
  ROOT %ar = f32[8]{0} all-reduce(%ard), channel_id=3, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %z = f32[] add(%x, %y)
}
"""


def test_a_chain_counts_once_and_its_copies_share_a_chain_id_without_libtpu():
    ops = hlo.collectives_in_text(HLO)
    assert hlo.count_kinds(ops) == {"all-gather": 1, "all-reduce": 2, "reduce-scatter": 0,
                                    "collective-permute": 0, "all-to-all": 0}
    gather = next(op for op in ops if op.kind == "all-gather")
    assert gather.shape == (32, 8) and gather.bytes_sent == 7 * 32 * 8 * 2 // 8


def test_starts_waits_and_matmuls_between_without_libtpu():
    rows = [o.row() for o in schedule.async_collectives(HLO)]
    assert [(r["collective"], r["starts at"], r["waits at"], r["matmuls in between"],
             r["fused with it"]) for r in rows] == [
        ("all-gather", 3, 5, 1, 1), ("all-reduce", 6, 8, 1, 0), ("all-reduce", 9, 9, 0, 0)]
    assert rows[1]["buffer"] == "f32[8]"
    assert schedule.overlap_summary(HLO) == {
        "collectives": 3, "overlapped with a matmul": 2,
        "with a matmul fused into the transfer": 1, "waited for with no matmul in between": 1}


def test_xla_tpu_overlaps_fsdp_gathers_and_the_flag_turns_it_off(devices):
    # tpu/cpu_vs_tpu: the TPU program overlaps gathers with matmuls; XLA:CPU's does not.
    mesh = tpu_mesh("v5e:2x4", (8,), ("data",), axis_types=(AxisType.Auto,))
    on = schedule.overlap_summary(compare.probe_program("async", mesh))
    off = schedule.overlap_summary(compare.probe_program(
        "async", mesh, compiler_options={"xla_tpu_enable_async_collective_fusion": False}))
    assert on["with a matmul fused into the transfer"] > 0
    assert on["overlapped with a matmul"] >= on["with a matmul fused into the transfer"]
    assert off["overlapped with a matmul"] == 0 and off["collectives"] == on["collectives"]
    cpu = compare.build_mesh((8,), ("data",), devices=devices)
    assert schedule.overlap_summary(compare.probe_program("async", cpu))[
        "overlapped with a matmul"] == 0
