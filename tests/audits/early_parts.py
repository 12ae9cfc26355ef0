"""Bad-input cases for the earlier Parts' public functions (tests/audits/test_audits.py runs them).

The modules covered: prng, data, multihost (and its describe, failures, problem, step), api_changes, timing,
collectives, collective_matmul, show (its non-drawing functions). ``BAD`` maps a case name to a
call with a plausible wrong input: it must raise the package's own error
(``spmd_guide.core.checks.InputError`` or ``InputTypeError``), whose message names the argument,
the value, the rule and the fix; never a deep JAX or NumPy error, never a silent return.
``VALID`` holds valid edge cases (NumPy integers, lists, bfloat16, one-device meshes) that must
return. ``MODULES``, ``DRAWING`` and ``CHECKERS`` say which public functions must check their
input (:func:`unchecked`).

The cases are built when this module is imported (meshes, placed arrays, a saved problem
file), so the tests import it inside a test, not at collection.
"""

from __future__ import annotations

import inspect
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from spmd_guide import ensure_devices  # noqa: E402

ensure_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from spmd_guide.appendix import api_changes  # noqa: E402
from spmd_guide.core import hlo, timing  # noqa: E402
from spmd_guide.meshes import show  # noqa: E402
from spmd_guide.multihost import cluster, describe, failures, multihost, problem, step  # noqa: E402
from spmd_guide.randomness import data, prng  # noqa: E402
from spmd_guide.shard_map import collective_matmul, collectives, ring_costs  # noqa: E402

MODULES = [prng, data, multihost, describe, failures, problem, step, cluster, api_changes, timing,
           collectives, collective_matmul, ring_costs, show]
#: Drawing code, moving to its own module (not part of this audit).
DRAWING = {"ring_diagram", "tpu_v3_tray", "Panel", "draw_panels", "device_color",
           "draw_collective", "example_panels", "draw_ring", "ring_hops", "StandInDevice"}


def mesh_of(k: int, names=("x",), shape=None):
    shape = shape or (k,)
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names),
                         devices=jax.devices()[:k])


M2, M4, M8 = mesh_of(2), mesh_of(4), mesh_of(8)
M24 = mesh_of(8, ("x", "y"), (2, 4))
KEY = jax.random.key(0)
OK = np.ones((8, 8), np.float32)
ROWS = NamedSharding(M2, P("x"))
SHARDED = jax.device_put(np.arange(8.0), ROWS)
DATASET = (np.arange(16.0).reshape(8, 2), np.arange(8))
WORK = tempfile.mkdtemp()
PROBLEM = problem.save_problem(f"{WORK}/problem.npz")
RESULT = multihost.ProcessResult(process_id=0, returncode=0, stdout="", stderr="")


def fake_timing():
    return timing.Timing("t", (0.1, 0.2), 0.3, "cpu", 1)


def op(pairs):
    return hlo.Collective(kind="collective-permute", buffers=(hlo.Buffer("f32", (4,)),),
                          group_size=2, bytes_sent=16, groups=tuple(pairs))


RING8 = [(i, (i + 1) % 8) for i in range(8)]

CM = collective_matmul
RC = ring_costs   # the ring matmuls' costs and schedules, once in collective_matmul
C = collectives
BAD = {
    # ---------------------------------------------------------------- collective_matmul
    "cm: string lhs": lambda: CM.allgather("lhs", OK, M2, "x"),
    "cm: None rhs": lambda: CM.reduce_scatter(OK, None, M2, "x"),
    "cm: dict lhs": lambda: CM.allgather({"a": OK}, OK, M2, "x"),
    "cm: 1-D lhs": lambda: CM.allgather(np.ones(8), OK, M2, "x"),
    "cm: 3-D lhs": lambda: CM.allgather(np.ones((2, 8, 8)), OK, M2, "x"),
    "cm: K mismatch": lambda: CM.allgather(OK, np.ones((4, 8)), M2, "x"),
    "cm: M indivisible": lambda: CM.reduce_scatter(np.ones((6, 8)), OK, M4, "x"),
    "cm: K indivisible bidi": lambda: CM.allgather_bidi(np.ones((8, 4)), np.ones((4, 8)), M4,
                                                        "x"),
    "cm: wrong axis": lambda: CM.allgather(OK, OK, M2, "y"),
    "cm: axis int": lambda: CM.allgather(OK, OK, M2, 0),
    "cm: axis None": lambda: CM.reduce_scatter_overlapped(OK, OK, M2, None),
    "cm: mesh tuple": lambda: CM.allgather(OK, OK, (2,), "x"),
    "cm: mesh None": lambda: CM.allgather_overlapped(OK, OK, None, "x"),
    "cm: unknown variant": lambda: CM.variant("allgater"),
    "cm: variant None": lambda: CM.variant(None),
    "cm: check rows_by -8": lambda: CM.check_shapes(OK, OK, rows_by=-8, contraction_by=1),
    "cm: check rows_by 0": lambda: CM.check_shapes(OK, OK, rows_by=0, contraction_by=1),
    "cm: check contraction 2.0": lambda: CM.check_shapes(OK, OK, rows_by=1,
                                                         contraction_by=2.0),
    "cm: ring bytes m<0": lambda: RC.ring_bound_bytes("allgather", -8, 8, 8, 4, 8),
    "cm: ring bytes ring 0": lambda: RC.ring_bound_bytes("allgather", 8, 8, 8, 4, 0),
    "cm: ring bytes itemsize 0": lambda: RC.ring_bound_bytes("allgather", 8, 8, 8, 0, 8),
    "cm: ring bytes float k": lambda: RC.ring_bound_bytes("allgather", 8, 8.5, 8, 4, 2),
    "cm: ring bytes bad name": lambda: RC.ring_bound_bytes("gather", 8, 8, 8, 4, 2),
    "cm: schedule ring 0": lambda: RC.ring_schedule("allgather_bidi", 0),
    "cm: schedule ring '4'": lambda: RC.ring_schedule("allgather", "4"),
    "cm: bytes_by_direction wrong ring": lambda: RC.bytes_by_direction([op(RING8)], 4),
    "cm: bytes_by_direction ring 0": lambda: RC.bytes_by_direction([op(RING8)], 0),
    "cm: bytes_by_direction strings": lambda: RC.bytes_by_direction(["all-gather"], 2),
    "cm: collective_rows str": lambda: RC.collective_rows("ops"),
    "cm: compile bidi odd K": lambda: RC.compile_variant("allgather_bidi", np.ones((4, 6)),
                                                         np.ones((6, 4)), M2, "x"),
    "cm: compile unknown": lambda: RC.compile_variant("x", OK, OK, M2, "x"),
    "cm: specs axis None": lambda: CM.allgather_specs(None),
    "cm: run_on_ring not fn": lambda: CM.run_on_ring(None, OK, OK, M2, "x",
                                                     specs=CM.allgather_specs("x")),
    # ---------------------------------------------------------------- collectives
    "C: global_sum str": lambda: C.global_sum("abc", M2),
    "C: block_sums None": lambda: C.block_sums(None, M2),
    "C: global_sum scalar": lambda: C.global_sum(3.0, M2),
    "C: global_sum indivisible": lambda: C.global_sum(np.arange(5.0), M2),
    "C: block_sums wrong axis": lambda: C.block_sums(np.arange(4.0), M2, axis_name="y"),
    "C: block_sums axis int": lambda: C.block_sums(np.arange(4.0), M2, axis_name=0),
    "C: global_sum mesh list": lambda: C.global_sum(np.arange(4.0), [0, 1]),
    "C: blocks n 0": lambda: C.blocks(np.arange(4), 0),
    "C: blocks n float": lambda: C.blocks(np.arange(4), 2.0),
    "C: blocks indivisible": lambda: C.blocks(np.arange(5), 2),
    "C: per_device_result str kernel": lambda: C.per_device_result("psum", np.arange(4.0), M2),
    "C: kernel names axis y": lambda: C.per_device_result(lambda b, a: jax.lax.psum(b, "y"),
                                                          np.arange(4.0), M2),
    "C: untiled psum_scatter wrong block": lambda: C.per_device_result(
        C.psum_scatter_kernel, np.arange(8.0), M4),
    "C: tiled psum_scatter wrong block": lambda: C.per_device_result(
        C.psum_scatter_tiled_kernel, np.arange(4.0), M4),
    "C: all_to_all 3 columns": lambda: C.per_device_result(C.all_to_all_kernel,
                                                           np.ones((2, 3)), M2),
    "C: rows_to_columns str": lambda: C.rows_to_columns("m", M2),
    "C: rows_to_columns 1-D": lambda: C.rows_to_columns(np.arange(4.0), M2),
    "C: rows_to_columns cols": lambda: C.rows_to_columns(np.ones((4, 3)), M2),
    "C: example unknown": lambda: C.example("gather"),
    "C: example None": lambda: C.example(None),
    "C: example_input 0": lambda: C.EXAMPLES["psum"].example_input(0),
    "C: traced_types None kernel": lambda: C.traced_types(None, np.arange(4.0), M2),
    "C: per_device_function mesh None": lambda: C.per_device_function(C.psum_kernel, None),
    "C: ring_scaling block 0": lambda: C.ring_scaling(C.psum_kernel, block_elements=0,
                                                      device_counts=[2]),
    "C: ring_scaling 99 devices": lambda: C.ring_scaling(C.psum_kernel, block_elements=4,
                                                         device_counts=[99]),
    "C: ring_scaling counts int": lambda: C.ring_scaling(C.psum_kernel, block_elements=4,
                                                         device_counts=4),
    "C: ring_scaling kernel str": lambda: C.ring_scaling("psum", block_elements=4,
                                                         device_counts=[2]),
    "C: hlo_rows bad axis": lambda: C.hlo_rows(M2, axis_name="z"),
    "C: run_example unknown": lambda: C.run_example("nope", M2),
    "C: axis_size mesh str": lambda: C.axis_size("mesh", "x"),
    # ---------------------------------------------------------------- prng
    "prng: sampler indivisible": lambda: prng.sampler((3,), NamedSharding(M8, P("x"))),
    "prng: sampler spec": lambda: prng.sampler((8,), P("x")),
    "prng: sampler shape str": lambda: prng.sampler("8", ROWS),
    "prng: sampler shape negative": lambda: prng.sampler((-2,), ROWS),
    "prng: sampler spec too long": lambda: prng.sampler((4,), NamedSharding(M2, P(None, "x"))),
    "prng: sampler distribution str": lambda: prng.sampler((4,), ROWS, distribution="normal"),
    "prng: prefix > size": lambda: prng.prefix_matches(KEY, size=4, prefix=5),
    "prng: prefix 0": lambda: prng.prefix_matches(KEY, size=4, prefix=0),
    "prng: size float": lambda: prng.prefix_matches(KEY, size=4.0, prefix=2),
    "prng: key float": lambda: prng.prefix_matches(0.5, size=4, prefix=2),
    "prng: key str": lambda: prng.add_uniform_noise("seed", np.ones(2, np.float32)),
    "prng: keys batch": lambda: prng.add_uniform_noise(jax.random.split(KEY, 2),
                                                       np.ones(2, np.float32)),
    "prng: noise on ints": lambda: prng.add_uniform_noise(KEY, np.ones(2, np.int32)),
    "prng: noise on str": lambda: prng.add_uniform_noise(KEY, "x"),
    "prng: dropout rate 1": lambda: prng.dropout(KEY, np.ones(2, np.float32), rate=1.0),
    "prng: dropout rate -0.1": lambda: prng.dropout(KEY, np.ones(2, np.float32), rate=-0.1),
    "prng: dropout rate nan": lambda: prng.dropout(KEY, np.ones(2, np.float32),
                                                   rate=float("nan")),
    "prng: dropout rate str": lambda: prng.dropout(KEY, np.ones(2, np.float32), rate="0.1"),
    "prng: sharded_dropout axis": lambda: prng.sharded_dropout(
        KEY, np.ones(4, np.float32), M2, axis_name="y", rate=0.1),
    "prng: sharded_dropout rows": lambda: prng.sharded_dropout(
        KEY, np.ones(3, np.float32), M2, axis_name="x", rate=0.1),
    "prng: sharded_dropout mesh None": lambda: prng.sharded_dropout(
        KEY, np.ones(4, np.float32), None, axis_name="x", rate=0.1),
    "prng: sharded_dropout flag 1": lambda: prng.sharded_dropout(
        KEY, np.ones(4, np.float32), M2, axis_name="x", rate=0.1, per_device_keys=1),
    "prng: device_key ()": lambda: prng.device_key(KEY, ()),
    "prng: device_key 0": lambda: prng.device_key(KEY, 0),
    "prng: correlation blocks 1": lambda: prng.block_correlation(np.ones(4), blocks=1),
    "prng: correlation uneven": lambda: prng.block_correlation(np.arange(5.0), blocks=2),
    "prng: correlation str": lambda: prng.block_correlation(["a", "b"], blocks=2),
    "prng: correlation constant": lambda: prng.block_correlation(np.ones(4), blocks=2),
    "prng: compare_modes 3": lambda: prng.compare_modes(3),
    # ---------------------------------------------------------------- data
    "data: batch_axis_size ndim 0": lambda: data.batch_axis_size(ROWS, ndim=0),
    "data: batch_axis_size spec": lambda: data.batch_axis_size(P("x")),
    "data: batch_axis_size ndim 1.0": lambda: data.batch_axis_size(ROWS, ndim=1.0),
    "data: batch 0": lambda: data.sharded_batches(DATASET, 0, ROWS, seed=0),
    "data: batch str": lambda: data.sharded_batches(DATASET, "4", ROWS, seed=0),
    "data: batch > N": lambda: data.sharded_batches(DATASET, 16, ROWS, seed=0),
    "data: batch indivisible": lambda: data.sharded_batches(DATASET, 3, ROWS, seed=0),
    "data: seed -1": lambda: data.sharded_batches(DATASET, 4, ROWS, seed=-1),
    "data: seed 0.5": lambda: data.sharded_batches(DATASET, 4, ROWS, seed=0.5),
    "data: seed None": lambda: data.sharded_batches(DATASET, 4, ROWS, seed=None),
    "data: epoch str": lambda: data.sharded_batches(DATASET, 4, ROWS, seed=0, epoch="1"),
    "data: drop_remainder str": lambda: data.sharded_batches(DATASET, 4, ROWS, seed=0,
                                                             drop_remainder="no"),
    "data: string leaf": lambda: data.sharded_batches({"x": np.ones((4, 2)), "n": "abc"}, 2,
                                                      ROWS, seed=0),
    "data: None leaf only": lambda: data.sharded_batches(None, 2, ROWS, seed=0),
    "data: lengths differ": lambda: data.sharded_batches((np.ones(8), np.ones(6)), 2, ROWS,
                                                         seed=0),
    "data: empty tuple": lambda: data.sharded_batches((), 2, ROWS, seed=0),
    "data: zero examples": lambda: data.sharded_batches(np.ones((0, 2)), 2, ROWS, seed=0),
    "data: sharding spec": lambda: data.sharded_batches(DATASET, 4, P("x"), seed=0),
    "data: sharding tree mismatch": lambda: data.sharded_batches(DATASET, 4, [ROWS], seed=0),
    "data: last batch uneven": lambda: data.sharded_batches((np.ones(9),), 4, ROWS, seed=0),
    "data: epoch_order 0": lambda: data.epoch_order(0, seed=0),
    "data: epoch_order float": lambda: data.epoch_order(4.0, seed=0),
    "data: local batch indivisible": lambda: data.process_local_batches(DATASET, 3, ROWS,
                                                                        seed=0),
    "data: local seed str": lambda: data.process_local_batches(DATASET, 4, ROWS, seed="0"),
    # ---------------------------------------------------------------- timing
    "timing: reading nan": lambda: timing.reading(float("nan")),
    "timing: reading inf": lambda: timing.reading(float("inf")),
    "timing: reading 0": lambda: timing.reading(0),
    "timing: reading str": lambda: timing.reading("2"),
    "timing: reading None": lambda: timing.reading(None),
    "timing: cores 0": lambda: timing.beyond_cores([1.5], cores=0),
    "timing: cores 2.5": lambda: timing.beyond_cores([1.5], cores=2.5),
    "timing: ratios empty": lambda: timing.beyond_cores([], cores=2),
    "timing: ratios number": lambda: timing.beyond_cores(3.0, cores=2),
    "timing: ratios nan": lambda: timing.beyond_cores([float("nan")], cores=2),
    "timing: ratios negative": lambda: timing.beyond_cores([-1.0], cores=2),
    "timing: runs 0": lambda: timing.time_fn(jnp.sin, 1.0, runs=0),
    "timing: warmup 0": lambda: timing.time_fn(jnp.sin, 1.0, warmup=0),
    "timing: runs 2.0": lambda: timing.time_fn(jnp.sin, 1.0, runs=2.0),
    "timing: fn 3.0": lambda: timing.time_fn(3.0),
    "timing: label 3": lambda: timing.time_fn(jnp.sin, 1.0, runs=1, label=3),
    "timing: table floats": lambda: timing.timing_table([1.0]),
    "timing: table empty": lambda: timing.timing_table([]),
    "timing: table one Timing": lambda: timing.timing_table(fake_timing()),
    "timing: speedup floats": lambda: timing.speedup(1.0, 2.0),
    # ---------------------------------------------------------------- api_changes
    "api: typo package": lambda: api_changes.resolve("jaxx.tree_map"),
    "api: double dot": lambda: api_changes.resolve("jax..tree_map"),
    "api: None": lambda: api_changes.resolve(None),
    "api: empty": lambda: api_changes.resolve(""),
    "api: a module object": lambda: api_changes.resolve(jax),
    "api: load 3": lambda: api_changes.load(3),
    # ---------------------------------------------------------------- show
    "show: index float": lambda: show.devices_holding(SHARDED, (2.5,)),
    "show: index str": lambda: show.devices_holding(SHARDED, "3"),
    "show: index out of range": lambda: show.devices_holding(SHARDED, (8,)),
    "show: index negative": lambda: show.devices_holding(SHARDED, (-1,)),
    "show: index too short": lambda: show.devices_holding(SHARDED, ()),
    "show: index int": lambda: show.devices_holding(SHARDED, 3),
    "show: numpy array": lambda: show.layout_table(np.arange(4)),
    "show: 3-D": lambda: show.shard_blocks(jnp.zeros((2, 2, 2))),
    "show: 0-D": lambda: show.layout_grid(jnp.zeros(())),
    "show: data flag str": lambda: show.shard_blocks(SHARDED, data="yes"),
    "show: data too big": lambda: show.shard_blocks(jnp.zeros(5000), data=True),
    "show: describe list": lambda: show.describe([1, 2]),
    "show: title 3": lambda: show.layout_grid(SHARDED, title=3),
    "show: side_by_side str": lambda: show.side_by_side("a", "b"),
    "show: gallery_entry spec str": lambda: show.gallery_entry(np.arange(8), M2, "x"),
    "show: gallery_entry mesh None": lambda: show.gallery_entry(np.arange(8), None, P("x")),
    "show: gallery_entry values str": lambda: show.gallery_entry("abc", M2, P()),
    "show: gallery names mismatch": lambda: show.gallery(np.arange(8), [(2, 4)], [P()],
                                                         axis_names=("x",)),
    "show: gallery shape 0": lambda: show.gallery(np.arange(8), [(0, 8)], [P()]),
    "show: gallery shapes flat": lambda: show.gallery(np.arange(8), (2, 4), [P()]),
    "show: gallery values str": lambda: show.gallery("abc", [(2, 4)], [P()]),
    "show: gallery specs str": lambda: show.gallery(np.arange(8), [(2, 4)], ["x"]),
    "show: gallery names str": lambda: show.gallery(np.arange(8), [(2, 4)], [P()],
                                                    axis_names="xy"),
    # ---------------------------------------------------------------- multihost
    "mh: still_running default pid": lambda: multihost.still_running([RESULT]),
    "mh: still_running one result": lambda: multihost.still_running(RESULT),
    "mh: still_running ints": lambda: multihost.still_running([1234]),
    "mh: launch processes 0": lambda: multihost.launch(failures.misbehave,
                                                       num_processes=0),
    "mh: launch processes 1.5": lambda: multihost.launch(failures.misbehave,
                                                         num_processes=1.5),
    "mh: launch processes 10**6": lambda: multihost.launch(failures.misbehave,
                                                           num_processes=10**6),
    "mh: launch devices 0": lambda: multihost.launch(failures.misbehave,
                                                     devices_per_process=0),
    "mh: launch timeout 0": lambda: multihost.launch(failures.misbehave, timeout=0),
    "mh: launch timeout str": lambda: multihost.launch(failures.misbehave,
                                                       timeout="60"),
    "mh: launch timeout nan": lambda: multihost.launch(failures.misbehave,
                                                       timeout=float("nan")),
    "mh: launch kwargs list": lambda: multihost.launch(failures.misbehave,
                                                       kwargs=[("raise_on", 0)]),
    "mh: launch kwargs object": lambda: multihost.launch(failures.misbehave,
                                                         kwargs={"raise_on": object()}),
    "mh: launch kwargs nan": lambda: multihost.launch(failures.misbehave,
                                                      kwargs={"raise_on": float("nan")}),
    "mh: launch lambda": lambda: multihost.launch(lambda: 1),
    "mh: launch bad name": lambda: multihost.launch("not a target"),
    "mh: launch missing module": lambda: multihost.launch("no_such_module:f"),
    "mh: launch missing script": lambda: multihost.launch("no/such/script.py"),
    "mh: launch args for function": lambda: multihost.launch(failures.misbehave,
                                                             args=["--x"]),
    "mh: launch target None": lambda: multihost.launch(None),
    # ---------------------------------------------------------------- multihost programs
    "mhx: strategies str": lambda: step.data_parallel_step(problem=PROBLEM,
                                                                         strategies="dp"),
    "mhx: strategies ()": lambda: step.data_parallel_step(problem=PROBLEM,
                                                                        strategies=()),
    "mhx: strategies unknown": lambda: step.data_parallel_step(
        problem=PROBLEM, strategies=["dq"]),
    "mhx: batch 0": lambda: step.data_parallel_step(problem=PROBLEM,
                                                                  batch_size=0),
    "mhx: batch 5": lambda: step.data_parallel_step(problem=PROBLEM,
                                                                  batch_size=5),
    "mhx: no problem file": lambda: step.data_parallel_step(problem="nope.npz"),
    "mhx: load 3": lambda: problem.load_problem(3),
    "mhx: rows_per_device 0": lambda: describe.describe_process(rows_per_device=0),
    "mhx: rows_per_device -1": lambda: describe.describe_process(rows_per_device=-1),
    "mhx: raise_on '0'": lambda: failures.misbehave(raise_on="0"),
    "mhx: hang_on -1": lambda: failures.misbehave(hang_on=-1),
    "mhx: layer sizes (8,)": lambda: problem.example_problem(layer_sizes=(8,)),
    "mhx: layer sizes 0": lambda: problem.example_problem(layer_sizes=(8, 0, 4)),
    "mhx: examples 0": lambda: problem.example_problem(num_examples=0),
    "mhx: seed -1": lambda: problem.example_problem(seed=-1),
    "mhx: save None": lambda: problem.save_problem(None),
    "mhx: hosts 0": lambda: cluster.hybrid_mesh((4,), (2,), ("x",), slices=0),
    "mhx: single step batch 0": lambda: step.single_process_step(
        problem=PROBLEM, batch_size=0),
    # ---------------------------------------------------------------- more, unplanned
    "C: axis None": lambda: C.global_sum(np.arange(8.0), M2, axis_name=None),
    "cm: axis tuple": lambda: CM.allgather(OK, OK, M24, ("x", "y")),
    "cm: object lhs": lambda: CM.allgather(np.array([[object()] * 8] * 8), OK, M2, "x"),
    "data: epoch -1": lambda: data.sharded_batches(DATASET, 4, ROWS, seed=0, epoch=-1),
    "show: index bool": lambda: show.devices_holding(SHARDED, [True]),
    "mh: launch args str": lambda: multihost.launch("x.py", args="--x"),
    "C: per_device_function axis 3": lambda: C.per_device_function(C.psum_kernel, M2,
                                                                   axis_name=3),
    "C: traced_types indivisible": lambda: C.traced_types(C.psum_kernel, np.arange(3.0), M2),
    "cm: schedule None": lambda: RC.ring_schedule(None, 4),
    "cm: bytes_by_direction None": lambda: RC.bytes_by_direction(None, 4),
    "prng: device_key mixed names": lambda: prng.device_key(KEY, ["x", 1]),
    "mhx: compare str": lambda: step.compare_to_reference("r", {}),
    "mhx: max_difference no reference": lambda: step.max_difference([], None),
    "show: gallery 16 devices": lambda: show.gallery(np.arange(8), [(16,)], [P()],
                                                     axis_names=("data",)),
    "C: ring_scaling no counts": lambda: C.ring_scaling(C.psum_kernel, block_elements=4,
                                                        device_counts=[]),
    "mhx: slurm env 5": lambda: cluster.detect(5),
    "mhx: hybrid devices 0": lambda: cluster.hybrid_mesh((0,), (2,), ("x",), slices=2),
    "data: process_local dataset str": lambda: data.process_local_batches("abc", 2, ROWS,
                                                                          seed=0),
    "timing: time_fn warmup str": lambda: timing.time_fn(jnp.sin, 1.0, warmup="1"),
    "prng: sharded_dropout x str": lambda: prng.sharded_dropout(KEY, "x", M2, axis_name="x",
                                                                rate=0.1),
    "show: layout_table traced": lambda: jax.jit(lambda a: show.layout_table(a) and a)(SHARDED),
}

VALID = {
    "show: gallery 3 of 8 devices": lambda: show.gallery(np.arange(8), [(3,)], [P()],
                                                         axis_names=("data",)),
    "cm: zero rows": lambda: CM.allgather(np.ones((0, 8)), OK, M2, "x"),
    "data: 2-D sharding on 1-D ndim 2": lambda: data.batch_axis_size(
        NamedSharding(M24, P("x", "y")), ndim=2),
    "cm: lists": lambda: CM.allgather(OK.tolist(), OK.tolist(), M2, "x"),
    "cm: one-device mesh": lambda: CM.reduce_scatter_bidi(np.ones((2, 3)), np.ones((3, 2)),
                                                          mesh_of(1), "x"),
    "cm: bfloat16": lambda: CM.allgather(jnp.ones((4, 4), jnp.bfloat16),
                                         jnp.ones((4, 4), jnp.bfloat16), M2, "x"),
    "cm: 2-D mesh axis y": lambda: CM.allgather_overlapped(OK, OK, M24, "y"),
    "cm: ring bytes numpy ints": lambda: RC.ring_bound_bytes("allgather", *np.int64([8] * 5)),
    "cm: bytes_by_direction ring 2": lambda: RC.bytes_by_direction([op([(0, 1), (1, 0)])], 2),
    "C: global_sum list": lambda: C.global_sum(list(range(8)), M2),
    "C: block_sums jax array": lambda: C.block_sums(jnp.arange(8.0), M8),
    "C: blocks numpy n": lambda: C.blocks(np.arange(8), np.int64(4)),
    "C: ring_scaling numpy counts": lambda: C.ring_scaling(
        C.psum_kernel, block_elements=np.int64(2), device_counts=np.array([2])),
    "prng: int seed": lambda: prng.add_uniform_noise(0, np.zeros(2, np.float32)),
    "prng: legacy key": lambda: prng.prefix_matches(jax.random.PRNGKey(0), size=4, prefix=2),
    "prng: bfloat16 dropout": lambda: prng.dropout(KEY, jnp.ones(4, jnp.bfloat16), rate=0.5),
    "prng: dropout rate numpy": lambda: prng.dropout(KEY, jnp.ones(4), rate=np.float32(0.5)),
    "prng: sampler shape list": lambda: prng.sampler([8], NamedSharding(M8, P("x")))(KEY),
    "data: numpy ints": lambda: list(data.sharded_batches(DATASET, np.int64(4), ROWS,
                                                          seed=np.int32(1))),
    "data: dict dataset": lambda: list(data.sharded_batches({"a": np.ones((4, 2))}, 2, ROWS,
                                                            seed=0)),
    "timing: numpy ratio": lambda: timing.reading(np.float32(2.0)),
    "timing: ratios tuple": lambda: timing.beyond_cores((1.0, 3.0), cores=np.int64(2)),
    "show: numpy index": lambda: show.devices_holding(SHARDED, (np.int64(5),)),
    "show: gallery list values": lambda: show.gallery([[0, 1], [2, 3]], [(2, 1)], [P("data")],
                                                      devices=jax.devices()[:2]),
    "mhx: 2-D batch layouts": lambda: step.data_parallel_step(
        problem=PROBLEM, strategies=("tp", "auto_2d")),
    "api: present": lambda: api_changes.resolve("jax.shard_map"),
}


CHECKERS = ("checks.", "_placed(", "axis_size(", "ring_size(", "check_shapes(", "variant(",
            "example(", "_check_array(", "shard_blocks(", "_layout_fits(", "_strategy_names(",
            "_process_id(", "_dotted_parts(", "_check_ops(", "_check_count(", "_leaves(",
            "_batch_sizes(", "_kernel_fits(", "_array(", "_check_spec(", "load_problem(",
            "_axis_name(", "_resolve_target(", "sharded_batches(", "per_device_result(",
            "compare_to_reference(")


def coverage() -> tuple[int, int, int, list[str]]:
    """(public functions with inputs, of which checked, without inputs, unchecked names): a
    function checks its input when its source calls one of ``CHECKERS``."""
    checked, with_inputs, without, unchecked = 0, 0, 0, []
    for module in MODULES:
        for name, obj in vars(module).items():
            if name.startswith("_") or name in DRAWING or not inspect.isfunction(obj):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if not inspect.signature(obj).parameters:
                without += 1
                continue
            with_inputs += 1
            source = inspect.getsource(obj)
            if any(marker in source for marker in CHECKERS):
                checked += 1
            else:
                unchecked.append(f"{module.__name__.split('.')[-1]}.{name}")
    return with_inputs, checked, without, unchecked
