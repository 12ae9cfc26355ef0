"""Every guarded argument of the pipeline functions through its class battery (battery.py):
numbers, keys, meshes, axis names, schedule names, arrays. Each answer is the package's
InputError naming the argument, or (for a valid form: NumPy/JAX integer scalars, raw keys,
Explicit axes) the plain value's answer."""

from __future__ import annotations

import jax
from battery import (
    Array,
    Axis,
    Choice,
    Count,
    Key,
    MeshArg,
    Real,
    Text,
    battery_tests,
    call,
)
from helpers import mesh_of

from spmd_guide.pipeline import axes, moe, pipeline, schedules


def _moe_params():
    return moe.init_moe(jax.random.key(0), d_model=8, d_ff=16, n_experts=4)


def _x():
    return jax.random.normal(jax.random.key(1), (16, 8))


NUMERIC = [
    call(axes.data_bytes, dict(grad_bytes=1024, n=4), grad_bytes=Count(0), n=Count()),
    call(axes.fsdp_bytes, dict(param_bytes=1024, n=4, gathers=2), param_bytes=Count(0),
         n=Count(), gathers=Count(0)),
    call(axes.tensor_bytes, dict(activation_bytes=1024, n=4, all_reduces=2),
         activation_bytes=Count(0), n=Count(), all_reduces=Count(0)),
    call(axes.pipeline_bytes, dict(activation_bytes=1024, n=4, sends=2),
         activation_bytes=Count(0), n=Count(), sends=Count(0)),
    call(axes.expert_bytes, dict(buffer_bytes=1024, n=4, all_to_alls=2),
         buffer_bytes=Count(0), n=Count(), all_to_alls=Count(0)),
    call(axes.Model, dict(n_layers=2, d_model=8, d_ff=16, batch=4, seq_len=8, n_experts=4,
                          top_k=2, capacity_factor=1.25, bytes_per_value=2),
         n_layers=Count(), d_model=Count(), d_ff=Count(), batch=Count(), seq_len=Count(),
         n_experts=Count(), top_k=Count(maximum=4), capacity_factor=Real(),
         bytes_per_value=Count()),
    call(axes.traffic, lambda: dict(model=axes.Model(n_layers=4, d_model=8, d_ff=16, batch=8,
                                                     seq_len=8),
                                    mesh={"data": 2, "pipeline": 2}, n_microbatches=2),
         n_microbatches=Count()),
    call(axes.place_axes, lambda: dict(rows=axes.traffic(
        axes.Model(n_layers=4, d_model=8, d_ff=16, batch=8, seq_len=8),
        {"data": 2, "pipeline": 2}), devices_per_node=2), devices_per_node=Count()),
    call(schedules.build_schedule, dict(name="1f1b", n_stages=4, n_microbatches=8),
         name=Choice(), n_stages=Count(), n_microbatches=Count()),
    call(schedules.bubble_fraction, dict(schedule="gpipe", n_stages=4, n_microbatches=8),
         schedule=Choice(), n_stages=Count(), n_microbatches=Count()),
    call(schedules.closed_form_bubble, dict(n_stages=4, n_microbatches=8),
         n_stages=Count(), n_microbatches=Count()),
    call(schedules.microbatches_for_bubble, dict(n_stages=4, bubble=0.1),
         n_stages=Count(), bubble=Real(maximum=0.99)),
    call(schedules.bubble_rows, dict(n_stages=4, microbatches=[4, 8]), n_stages=Count()),
    call(schedules.one_f_one_b_peak, dict(n_stages=4, n_microbatches=8),
         n_stages=Count(), n_microbatches=Count()),
    call(schedules.in_flight_rows, dict(n_stages=4, n_microbatches=8),
         n_stages=Count(), n_microbatches=Count()),
    call(pipeline.activation_buffer_bytes, dict(schedule="1f1b", n_stages=4, n_microbatches=8,
                                                batch_size=16, width=8, itemsize=4),
         schedule=Choice(), n_stages=Count(), n_microbatches=Count(), batch_size=Count(),
         width=Count(), itemsize=Count()),
    call(moe.capacity, dict(tokens=64, top_k=2, n_experts=4, capacity_factor=1.25),
         tokens=Count(), top_k=Count(maximum=4), n_experts=Count(), capacity_factor=Real()),
    call(moe.dispatch_slots, dict(tokens=64, n_devices=4, top_k=2, n_experts=4,
                                  capacity_factor=1.25),
         tokens=Count(), n_devices=Count(), top_k=Count(maximum=4), n_experts=Count(),
         capacity_factor=Real()),
    call(moe.dispatch_buffer_bytes, dict(tokens=64, n_devices=4, top_k=2, n_experts=4,
                                         capacity_factor=1.25, d_model=8, bytes_per_element=4),
         tokens=Count(), n_devices=Count(), top_k=Count(maximum=4), n_experts=Count(),
         capacity_factor=Real(), d_model=Count(), bytes_per_element=Count()),
    call(moe.all_to_all_bytes, dict(tokens=64, n_devices=4, top_k=2, n_experts=4,
                                    capacity_factor=1.25, d_model=8, bytes_per_element=4),
         tokens=Count(), n_devices=Count(), top_k=Count(maximum=4), n_experts=Count(),
         capacity_factor=Real(), d_model=Count(), bytes_per_element=Count()),
]

ARRAYS = [
    call(pipeline.init_stack, dict(key=jax.random.key(0), n_layers=4, width=8),
         key=Key(), n_layers=Count(), width=Count()),
    call(pipeline.make_batch, dict(key=jax.random.key(0), batch_size=8, width=8),
         key=Key(), batch_size=Count(), width=Count()),
    call(moe.init_moe, dict(key=jax.random.key(0), d_model=8, d_ff=16, n_experts=4),
         key=Key(), d_model=Count(), d_ff=Count(), n_experts=Count()),
    call(moe.route, lambda: dict(params=_moe_params(), x=_x(), top_k=2, capacity_factor=1.25,
                                 groups=2),
         x=Array(ndim=2), top_k=Count(maximum=4), capacity_factor=Real(), groups=Count()),
    call(moe.reference_moe, lambda: dict(params=_moe_params(), x=_x(), top_k=2,
                                         capacity_factor=1.25),
         x=Array(ndim=2), top_k=Count(maximum=4), capacity_factor=Real()),
    call(moe.router_aux_loss, lambda: dict(router=_moe_params()["router"], x=_x(), top_k=2),
         top_k=Count(maximum=4)),
    call(moe.moe_layer, lambda: dict(params=_moe_params(), x=_x(), mesh=mesh_of(4),
                                     axis_name="x", top_k=2, capacity_factor=1.25),
         mesh=MeshArg(), axis_name=Axis(), top_k=Count(maximum=4), capacity_factor=Real()),
    call(pipeline.pipelined_loss, lambda: dict(mesh=mesh_of(4, ("stage",)), schedule="gpipe",
                                               n_microbatches=2),
         mesh=MeshArg(explicit=False), schedule=Choice(), n_microbatches=Count(),
         same=lambda a, b: callable(a) and callable(b)),
    call(axes.data_program, lambda: dict(mesh=mesh_of(4), axis_name="x"), mesh=MeshArg(
        explicit=False), axis_name=Axis(), same=lambda a, b: callable(a)),
    call(axes.tensor_program, lambda: dict(mesh=mesh_of(4), axis_name="x"), mesh=MeshArg(
        explicit=False), axis_name=Axis(), same=lambda a, b: callable(a)),
]

CALLS = NUMERIC + ARRAYS


def _rows():
    return axes.traffic(axes.Model(n_layers=4, d_model=8, d_ff=16, batch=8, seq_len=8),
                        {"data": 2, "pipeline": 2})


def _routing():
    return moe.route(_moe_params(), _x(), top_k=2, capacity_factor=1.25)


MORE = [
    call(moe.traffic, lambda: dict(routing=_routing(), n_devices=4), n_devices=Count()),
    call(moe.dropped_at, lambda: dict(routing=_routing(), capacity_factor=1.25),
         capacity_factor=Real()),
    call(moe.draw_traffic, lambda: dict(matrix=moe.traffic(_routing(), 4), title="t"),
         title=Text(), same=lambda a, b: True),
    call(schedules.plot_bubble, dict(stage_counts=[2, 4], max_microbatches=8),
         max_microbatches=Count(), same=lambda a, b: True),
    call(schedules.draw_schedule, lambda: dict(schedule=schedules.build_schedule("1f1b", 2, 4),
                                               title="t"),
         title=Text(), same=lambda a, b: True),
    call(axes.link_seconds, lambda: dict(rows=_rows(), placement=axes.place_axes(
        _rows(), devices_per_node=2), fast_bandwidth=1e11, slow_bandwidth=1e10),
        fast_bandwidth=Real(), slow_bandwidth=Real()),
    call(axes.pipeline_program, lambda: dict(mesh=mesh_of(4), axis_name="x"),
         mesh=MeshArg(explicit=False), axis_name=Axis(), same=lambda a, b: callable(a)),
    call(axes.fsdp_program, lambda: dict(mesh=mesh_of(4), axis_name="x"),
         mesh=MeshArg(explicit=False), axis_name=Axis(), same=lambda a, b: callable(a)),
]
CALLS += MORE

QUICK = [c for c in NUMERIC if c.label in ("axes.Model", "moe.dispatch_buffer_bytes")]
test_every_guarded_argument, test_numbers_quick = battery_tests(CALLS, QUICK)
