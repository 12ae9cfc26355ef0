"""Bad-input cases for the newer Parts (rooflines, transformer, pipeline, checkpointing,
serving, and the helpers they added to core, nn, meshes and shard_map); tests/audits/
test_audits.py runs them.

``BAD`` maps a case name (``module: what``) to a call with a wrong input, which must raise the
package's ``InputError``/``InputTypeError`` (never another exception, never a silent return);
many come from one battery per numeric argument (a string, a float, ``None``, zero, a negative,
NaN, infinity, a bool), the mistakes a new user makes most. ``VALID`` holds the valid edge
cases (NumPy scalars and arrays, lists for tuples, meshes of Explicit axes), which must return.

The cases are built when this module is imported (a model, a saved checkpoint, compiled
programs), so the tests import it inside a test, not at collection.
"""

from __future__ import annotations

import math
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from spmd_guide import ensure_devices  # noqa: E402

ensure_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

from spmd_guide.checkpointing import checkpoint, training  # noqa: E402
from spmd_guide.core import results  # noqa: E402
from spmd_guide.meshes import tpu_ring  # noqa: E402
from spmd_guide.nn import cheat_sheet, which_strategy  # noqa: E402
from spmd_guide.pipeline import axes, moe, pipeline, schedules  # noqa: E402
from spmd_guide.rooflines import figures, formulas, hardware, roofline, strategies  # noqa: E402
from spmd_guide.serving import serving  # noqa: E402
from spmd_guide.shard_map import ring_costs  # noqa: E402
from spmd_guide.transformer import attention, breakdown, lm, memory, pricing  # noqa: E402
from spmd_guide.transformer import transformer as tf  # noqa: E402
from spmd_guide.transformer import verify as tfv  # noqa: E402

NAN, INF = float("nan"), float("inf")
#: The battery of wrong values for an argument that counts something (a positive int).
COUNT_BAD = {"str": "4", "float": 2.5, "None": None, "0": 0, "-3": -3, "nan": NAN, "bool": True}
#: ... for an argument that is a positive real.
REAL_BAD = {"str": "1.0", "None": None, "0": 0.0, "-1": -1.0, "nan": NAN, "inf": INF}


def mesh_of(k: int, names=("x",), shape=None, explicit=False):
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape or (k,), names, axis_types=(kind,) * len(names),
                         devices=jax.devices()[:k])


M2, M4 = mesh_of(2), mesh_of(4)
S4, ES4 = mesh_of(4, ("stage",)), mesh_of(4, ("stage",), explicit=True)
E2, E4 = mesh_of(2, explicit=True), mesh_of(4, explicit=True)
CFG = lm.Config(vocab=16, d_model=16, n_heads=2, d_ff=32, n_layers=1, seq_len=8)
KEY = jax.random.key(0)
PARAMS = lm.init_params(KEY, CFG)
TOKENS = np.arange(16, dtype=np.int32).reshape(2, 8) % 16
Q = np.ones((1, 8, 2, 4), np.float32)  # [batch, seq, heads, head_dim]
KC = np.ones((1, 2, 8, 4), np.float32)  # a cache [batch, heads, max_len, head_dim]
TOKENS9 = np.arange(18, dtype=np.int32).reshape(2, 9) % 16  # inputs and shifted targets
WORK = tempfile.mkdtemp()
STACK = pipeline.init_stack(KEY, 4, 8)
BATCH = pipeline.make_batch(KEY, 8, 8)
MOE = moe.init_moe(KEY, d_model=8, d_ff=16, n_experts=4)
X8 = np.ones((8, 8), np.float32)
MODEL = axes.Model(n_layers=4, d_model=64, d_ff=256, batch=16, seq_len=32)
ROWS = axes.traffic(MODEL, {"data": 2, "tensor": 2})
PROMPT = np.array([[1, 2, 3]], np.int32)
TRAY = tpu_ring.tpu_v3_tray()
SAVED = checkpoint.save(f"{WORK}/ck", {"w": np.arange(4.0)}, step=1).parent
RES = results.save(f"{WORK}/r.json", benchmark="b", command=["c"], settings={}, rows=[{"a": 1}])
CM = ring_costs.compile_variant("allgather", X8, X8, M2, "x")
SCHED = schedules.build_schedule("gpipe", 2, 2)
WORK_COUNTS = roofline.Counts(flops=1e9, bytes_accessed=1e6, comm_bytes=1e5)
PRED = strategies.predict_strategies({"dp": WORK_COUNTS}, chips=("tpu-v4",))
ROUTING = moe.route(MOE, X8, top_k=1, capacity_factor=1.0)

BAD: dict[str, object] = {}


def battery(label: str, fn, args: tuple, kwargs: dict, where, values: dict) -> None:
    """One bad case per value, put in place of positional ``where`` (int) or keyword (str)."""
    for tag, value in values.items():
        a, k = list(args), dict(kwargs)
        if isinstance(where, int):
            a[where] = value
        else:
            k[where] = value
        BAD[f"{label} {where}={tag}"] = (lambda a=a, k=k: fn(*a, **k))


def batteries(label, fn, args, kwargs, counts=(), reals=()):
    for where in counts:
        battery(label, fn, args, kwargs, where, COUNT_BAD)
    for where in reals:
        battery(label, fn, args, kwargs, where, REAL_BAD)


# ------------------------------------------------------------------------------ numeric APIs
batteries("schedules: build", schedules.build_schedule, ("gpipe", 2, 4), {}, counts=(1, 2))
batteries("schedules: closed_form", schedules.closed_form_bubble, (4, 8), {}, counts=(0, 1))
batteries("schedules: peak", schedules.one_f_one_b_peak, (2, 4), {}, counts=(0,))
batteries("pipeline: buffer", pipeline.activation_buffer_bytes, ("gpipe", 2, 4),
          dict(batch_size=8, width=8), counts=(1, "batch_size", "itemsize"))
batteries("moe: capacity", moe.capacity, (64,), dict(top_k=2, n_experts=8, capacity_factor=1.25),
          counts=(0, "n_experts"), reals=("capacity_factor",))
batteries("moe: dispatch_slots", moe.dispatch_slots, (64, 4),
          dict(top_k=1, n_experts=8, capacity_factor=1.0), counts=(1, "top_k"))
batteries("moe: a2a bytes", moe.all_to_all_bytes, (64, 4),
          dict(top_k=1, n_experts=8, capacity_factor=1.0, d_model=16), counts=("d_model",))
batteries("axes: data_bytes", axes.data_bytes, (1024, 4), {}, counts=(1,))
battery("axes: fsdp_bytes", axes.fsdp_bytes, (1024, 4), {}, "gathers",  # 0: no remat
        {k: v for k, v in COUNT_BAD.items() if k != "0"})
batteries("axes: Model", axes.Model, (), dict(n_layers=4, d_model=64, d_ff=256, batch=16,
                                              seq_len=32), counts=("n_layers", "batch"))
batteries("axes: link_seconds", axes.link_seconds, (ROWS, {"data": "fast", "tensor": "fast"}),
          dict(fast_bandwidth=1e11, slow_bandwidth=1e10), reals=("fast_bandwidth",))
batteries("roofline: intensity", formulas.matmul_intensity, (64, 64, 64), {}, counts=(0, 2))
batteries("roofline: ring_time", formulas.ring_time, (1e6, 4, "tpu-v4"), {}, counts=(1,))
NONNEGATIVE_BAD = {k: v for k, v in REAL_BAD.items() if k != "0"}  # 0 bytes, 0 s are valid
battery("roofline: ring_time", formulas.ring_time, (1e6, 4, "tpu-v4"), {}, 0, NONNEGATIVE_BAD)
batteries("roofline: tp_max_ways", formulas.tp_max_ways, ("tpu-v4", 8192), {}, counts=(1,))
battery("roofline: overlap", formulas.overlapped_time, (1.0, 0.5), {}, 0, NONNEGATIVE_BAD)
batteries("roofline: mlp_flops", formulas.mlp_matmul_flops, ([8, 16, 8], 4), {}, counts=(1,))
batteries("strategies: how_many", strategies.how_many, (3, 8), {}, counts=(1,))
batteries("which_strategy: recommend", which_strategy.recommend, (10**9, 16 * 10**9),
          dict(batch=64, n_devices=8), counts=(0, "n_devices"), reals=("memory_fraction",))
batteries("which_strategy: state", which_strategy.training_state_bytes, (1000,), {},
          counts=(0,))
batteries("ring_costs: bound", ring_costs.ring_bound_bytes, ("allgather", 8, 8, 8, 4, 2), {},
          counts=(1, 5))
batteries("training: steps_per_epoch", training.steps_per_epoch, (), dict(batch=8),
          counts=("batch", "examples"))
batteries("lm: Config", lm.Config, (), dict(vocab=16, d_model=16, n_heads=2, d_ff=32,
                                            n_layers=1, seq_len=8), counts=("vocab", "n_heads"))
batteries("attention: positions", attention.layout_positions, (16, 4, "zigzag"), {},
          counts=(0, 1))
batteries("serving: init_cache", serving.init_cache, (CFG,), dict(batch=2, max_len=8),
          counts=("batch", "max_len"))
batteries("pricing: big_arrays", pricing.transformer_big_arrays, (), dict(batch=16, n_devices=8),
          counts=("n_devices",))

# ------------------------------------------------------------------------------ hand-written
BAD.update({
    # ---- lm
    "lm: Config d_model % n_heads": lambda: lm.Config(d_model=30, n_heads=4),
    "lm: Config dtype 'floats'": lambda: lm.Config(dtype="floats"),
    "lm: Config dtype int32": lambda: lm.Config(dtype="int32"),
    "lm: check_config dict": lambda: lm.check_config({"vocab": 16}),
    "lm: init_params key str": lambda: lm.init_params("seed", CFG),
    "lm: init_params config None": lambda: lm.init_params(KEY, None),
    "lm: param_shapes dict": lambda: lm.param_shapes({"vocab": 4}),
    "lm: config_of empty": lambda: lm.config_of({}),
    "lm: check_params other config": lambda: lm.check_params(PARAMS, lm.Config()),
    "lm: forward tokens >= vocab": lambda: lm.forward(PARAMS, TOKENS + 16),
    "lm: forward tokens < 0": lambda: lm.forward(PARAMS, TOKENS - 1),
    "lm: forward float tokens": lambda: lm.forward(PARAMS, TOKENS.astype(np.float32)),
    "lm: forward 1-D tokens": lambda: lm.forward(PARAMS, TOKENS[0]),
    "lm: forward too long": lambda: lm.forward(PARAMS, np.zeros((1, 9), np.int32)),
    "lm: forward str": lambda: lm.forward(PARAMS, "hello"),
    "lm: check_tokens 3-D": lambda: lm.check_tokens(np.zeros((1, 2, 3), np.int32), CFG),
    "lm: cross_entropy shape": lambda: lm.cross_entropy(np.zeros((2, 8, 16)), TOKENS[:, :4]),
    "lm: cross_entropy float targets": lambda: lm.cross_entropy(np.zeros((2, 8, 16)),
                                                                TOKENS.astype(float)),
    "lm: cross_entropy target >= classes": lambda: lm.cross_entropy(np.zeros((2, 8, 16)),
                                                                    TOKENS + 16),
    "lm: lm_loss 1-token": lambda: lm.lm_loss(PARAMS, TOKENS[:, :1], config=CFG),
    "lm: lm_loss tokens >= vocab": lambda: lm.lm_loss(PARAMS, TOKENS + 20, config=CFG),
    "lm: counting_task batch 0": lambda: lm.counting_task(KEY, batch=0, config=CFG),
    "lm: counting_task strides ()": lambda: lm.counting_task(KEY, batch=2, config=CFG,
                                                             strides=()),
    "lm: counting_task stride 0": lambda: lm.counting_task(KEY, batch=2, config=CFG,
                                                           strides=(0,)),
    "lm: optimizer lr -1": lambda: lm.optimizer(-1.0),
    "lm: optimizer lr nan": lambda: lm.optimizer(NAN),
    "lm: optimizer lr str": lambda: lm.optimizer("3e-3"),
    "lm: optimizer decay -1": lambda: lm.optimizer(weight_decay=-1.0),
    "lm: against_uniform vocab 0": lambda: lm.against_uniform(1.0, 0),
    "lm: against_uniform loss nan": lambda: lm.against_uniform(NAN, 16),
    "lm: against_uniform loss str": lambda: lm.against_uniform("2.0", 16),
    "lm: param_count str": lambda: lm.param_count("params"),
    "lm: train steps 0": lambda: lm.train_one_device(KEY, CFG, steps=0, batch=2),
    "lm: train batch -1": lambda: lm.train_one_device(KEY, CFG, steps=1, batch=-1),
    "lm: train lr nan": lambda: lm.train_one_device(KEY, CFG, steps=1, batch=2,
                                                    learning_rate=NAN),
    # ---- attention
    "attention: ref q 3-D": lambda: attention.reference_attention(Q[0], Q, Q, causal=True),
    "attention: ref k shape": lambda: attention.reference_attention(Q, Q[..., :2], Q,
                                                                    causal=True),
    "attention: ref causal str": lambda: attention.reference_attention(Q, Q, Q, causal="yes"),
    "attention: ref str q": lambda: attention.reference_attention("q", Q, Q, causal=True),
    "attention: ref int q": lambda: attention.reference_attention(Q.astype(int), Q, Q,
                                                                  causal=True),
    "attention: layout near-miss": lambda: attention.layout_positions(16, 4, "zig-zag"),
    "attention: layout None": lambda: attention.layout_positions(16, 4, None),
    "attention: zigzag indivisible": lambda: attention.layout_positions(12, 4, "zigzag"),
    "attention: contiguous indivisible": lambda: attention.layout_positions(10, 4,
                                                                            "contiguous"),
    "attention: check_ring n 0": lambda: attention.check_ring(16, 0, "zigzag"),
    "attention: ring wrong axis": lambda: attention.ring_attention(Q, Q, Q, M2, "y",
                                                                   causal=True),
    "attention: ring seq indivisible": lambda: attention.ring_attention(
        np.ones((1, 2, 6, 4), np.float32), np.ones((1, 2, 6, 4), np.float32),
        np.ones((1, 2, 6, 4), np.float32), M4, "x", causal=True, layout="zigzag"),
    "attention: ring mesh None": lambda: attention.ring_attention(Q, Q, Q, None, "x",
                                                                  causal=True),
    "attention: ring layout bad": lambda: attention.ring_attention(Q, Q, Q, M2, "x",
                                                                   causal=True, layout="ring"),
    "attention: ring causal None": lambda: attention.ring_attention(Q, Q, Q, M2, "x",
                                                                    causal=None),
    "attention: ring k mismatch": lambda: attention.ring_attention(Q, Q[..., :2], Q, M2, "x",
                                                                   causal=True),
    "attention: in_layout layout": lambda: attention.ring_attention_in_layout(
        Q, Q, Q, M2, "x", causal=True, layout="zz"),
    "attention: causal_work layout": lambda: attention.causal_work(16, 4, "Zigzag"),
    "attention: causal_work seq 0": lambda: attention.causal_work(0, 4, "zigzag"),
    "attention: ring_schedule 0": lambda: attention.ring_schedule(0),
    "attention: ring_schedule str": lambda: attention.ring_schedule("4"),
    "attention: ring_schedule float": lambda: attention.ring_schedule(4.0),
    "attention: saved axis": lambda: attention.saved_for_backward(Q, Q, Q, M2, "z",
                                                                  causal=True),
    # ---- transformer
    "transformer: auto_mesh None": lambda: tf.auto_mesh(None),
    "transformer: auto_mesh str": lambda: tf.auto_mesh("mesh"),
    "transformer: train_step str strategy": lambda: tf.train_step(
        "dp", M2, CFG, PARAMS, optimizer=lm.optimizer()),
    "transformer: train_step mesh None": lambda: tf.train_step(
        tf.STRATEGIES["dp"], None, CFG, PARAMS, optimizer=lm.optimizer()),
    "transformer: train_step wrong axes": lambda: tf.train_step(
        tf.STRATEGIES["dp"], M2, CFG, PARAMS, optimizer=lm.optimizer()),
    "transformer: train_step params/config": lambda: tf.train_step(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), lm.Config(), PARAMS,
        optimizer=lm.optimizer()),
    "transformer: train_step optimizer str": lambda: tf.train_step(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), CFG, PARAMS, optimizer="adam"),
    "transformer: tp heads indivisible": lambda: tf.train_step(
        tf.STRATEGIES["tp"], mesh_of(4, ("model",)), CFG, PARAMS, optimizer=lm.optimizer()),
    "transformer: check_strategy tokens >= vocab": lambda: tfv.check_strategy(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), CFG, PARAMS, TOKENS + 16),
    "transformer: check_strategy batch odd": lambda: tfv.check_strategy(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), CFG, PARAMS, TOKENS[:1]),
    "transformer: rounding_words str": lambda: tfv.rounding_words("rows"),
    "transformer: spec_table meshes list": lambda: tfv.spec_table(PARAMS, [M2]),
    "transformer: predicted batch 0": lambda: tfv.predicted_comm_bytes(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), CFG, PARAMS, 0),
    "transformer: predicted batch str": lambda: tfv.predicted_comm_bytes(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), CFG, PARAMS, "8"),
    "transformer: predicted batch indivisible": lambda: tfv.predicted_comm_bytes(
        tf.STRATEGIES["dp"], mesh_of(4, ("data",)), CFG, PARAMS, 6),
    "transformer: predicted strategy name": lambda: tfv.predicted_comm_bytes(
        "fsdp", mesh_of(2, ("data",)), CFG, PARAMS, 8),
    # ---- breakdown / memory / pricing
    "breakdown: text None": lambda: breakdown.collective_breakdown(None),
    "breakdown: text int": lambda: breakdown.collective_breakdown(3),
    "breakdown: by unknown": lambda: breakdown.collective_breakdown("", by=("pass", "who")),
    "breakdown: by str": lambda: breakdown.collective_breakdown("", by="pass"),
    "breakdown: module int": lambda: breakdown.collective_breakdown("", module=3),
    "breakdown: mesh str": lambda: breakdown.collective_breakdown("", "mesh"),
    "breakdown: scatter axis": lambda: breakdown.scatter_forms(M2, "y"),
    "breakdown: scatter mesh None": lambda: breakdown.scatter_forms(None, "x"),
    "memory: kept config dict": lambda: memory.kept_per_token({"vocab": 16}),
    "memory: predicted batch 0": lambda: memory.predicted_bytes(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",)), CFG, PARAMS, 0),
    "memory: predicted strategy str": lambda: memory.predicted_bytes(
        "dp", mesh_of(2, ("data",)), CFG, PARAMS, 8),
    "memory: row devices empty": lambda: memory.memory_row(tf.STRATEGIES["dp"], [], CFG,
                                                           PARAMS, TOKENS),
    "memory: row tokens >= vocab": lambda: memory.memory_row(
        tf.STRATEGIES["dp"], jax.devices()[:2], CFG, PARAMS, TOKENS + 16),
    "memory: against_formula str": lambda: memory.against_formula("rows"),
    "memory: against_formula missing keys": lambda: memory.against_formula([{"a": 1}]),
    "pricing: counts unknown": lambda: pricing.transformer_counts("dpp"),
    "pricing: counts bad config key": lambda: pricing.transformer_counts("dp", vocabs=8),
    "pricing: counts batch 0": lambda: pricing.transformer_counts("dp", batch=0),
    "pricing: counts config str": lambda: pricing.transformer_counts("dp", d_model="8"),
    "pricing: abstract_params None": lambda: pricing.abstract_params(None),
    "pricing: big_arrays bad key": lambda: pricing.transformer_big_arrays(dmodel=8),
    # ---- schedules
    "schedules: unknown": lambda: schedules.build_schedule("GPipe", 2, 2),
    "schedules: near-miss": lambda: schedules.build_schedule("1F1B ", 2, 2),
    "schedules: None": lambda: schedules.build_schedule(None, 2, 2),
    "schedules: bubble unknown": lambda: schedules.bubble_fraction("interleaved", 2, 2),
    "schedules: for_bubble 0": lambda: schedules.microbatches_for_bubble(4, 0.0),
    "schedules: for_bubble 1": lambda: schedules.microbatches_for_bubble(4, 1.0),
    "schedules: for_bubble nan": lambda: schedules.microbatches_for_bubble(4, NAN),
    "schedules: for_bubble relative": lambda: schedules.microbatches_for_bubble(
        4, 0.1, relative_to="Ideal"),
    "schedules: for_bubble str": lambda: schedules.microbatches_for_bubble(4, "0.1"),
    "schedules: bubble_rows str": lambda: schedules.bubble_rows(4, "8"),
    "schedules: bubble_rows 0": lambda: schedules.bubble_rows(4, [0]),
    "schedules: idle_rows str": lambda: schedules.idle_rows("gpipe"),
    "schedules: in_flight 0": lambda: schedules.in_flight_rows(0, 4),
    "schedules: draw str": lambda: schedules.draw_schedule("gpipe"),
    "schedules: plot_bubble 0": lambda: schedules.plot_bubble([0]),
    # ---- pipeline
    "pipeline: init key str": lambda: pipeline.init_stack("k", 4, 8),
    "pipeline: init layers 0": lambda: pipeline.init_stack(KEY, 0, 8),
    "pipeline: init width 2.5": lambda: pipeline.init_stack(KEY, 4, 2.5),
    "pipeline: init dtype int": lambda: pipeline.init_stack(KEY, 4, 8, dtype=jnp.int32),
    "pipeline: apply width": lambda: pipeline.apply_layers(STACK, np.ones((8, 4))),
    "pipeline: apply str": lambda: pipeline.apply_layers(STACK, "x"),
    "pipeline: loss batch wrong": lambda: pipeline.stack_loss(STACK, (X8, np.ones((4, 8)))),
    "pipeline: loss batch one": lambda: pipeline.stack_loss(STACK, X8),
    "pipeline: make_batch 0": lambda: pipeline.make_batch(KEY, 0, 8),
    "pipeline: make_batch str": lambda: pipeline.make_batch(KEY, "8", 8),
    "pipeline: check_stack dict": lambda: pipeline.check_stack({"w": X8}, BATCH),
    "pipeline: pipelined unknown": lambda: pipeline.pipelined_loss(S4, schedule="GPipe",
                                                                   n_microbatches=2),
    "pipeline: pipelined micro 0": lambda: pipeline.pipelined_loss(S4, schedule="gpipe",
                                                                   n_microbatches=0),
    "pipeline: pipelined mesh None": lambda: pipeline.pipelined_loss(None, schedule="gpipe",
                                                                     n_microbatches=2),
    "pipeline: pipelined 2-D mesh": lambda: pipeline.pipelined_loss(
        mesh_of(4, ("stage", "b"), (2, 2)), schedule="gpipe", n_microbatches=2),
    "pipeline: pipelined layers indivisible": lambda: pipeline.pipelined_loss(
        mesh_of(8, ("stage",)), schedule="gpipe", n_microbatches=2)(STACK[:3] if isinstance(STACK, list)
                                                        else pipeline.init_stack(KEY, 3, 8),
                                                        BATCH),
    "pipeline: pipelined batch indivisible": lambda: pipeline.pipelined_loss(
        S4, schedule="gpipe", n_microbatches=3)(STACK, BATCH),
    "pipeline: train_step str": lambda: pipeline.make_train_step("gpipe", S4, n_microbatches=2,
                                                                 learning_rate=0.1),
    "pipeline: train_step lr nan": lambda: pipeline.make_train_step(
        pipeline.STRATEGIES["gpipe"], S4, n_microbatches=2, learning_rate=NAN),
    "pipeline: train_step lr -1": lambda: pipeline.make_train_step(
        pipeline.STRATEGIES["gpipe"], S4, n_microbatches=2, learning_rate=-1.0),
    "pipeline: buffer unknown": lambda: pipeline.activation_buffer_bytes(
        "1f1f", 2, 4, batch_size=8, width=8),
    "pipeline: buffer indivisible": lambda: pipeline.activation_buffer_bytes(
        "gpipe", 2, 3, batch_size=8, width=8),
    "pipeline: profile micro 0": lambda: pipeline.profile(STACK, BATCH, S4, n_microbatches=0),
    "pipeline: profile_table str": lambda: pipeline.profile_table("rows"),
    # ---- moe
    "moe: init key None": lambda: moe.init_moe(None, d_model=8, d_ff=16, n_experts=4),
    "moe: init experts 0": lambda: moe.init_moe(KEY, d_model=8, d_ff=16, n_experts=0),
    "moe: init d_model str": lambda: moe.init_moe(KEY, d_model="8", d_ff=16, n_experts=4),
    "moe: capacity top_k > experts": lambda: moe.capacity(64, top_k=9, n_experts=8,
                                                          capacity_factor=1.0),
    "moe: route top_k 0": lambda: moe.route(MOE, X8, top_k=0, capacity_factor=1.0),
    "moe: route top_k 5": lambda: moe.route(MOE, X8, top_k=5, capacity_factor=1.0),
    "moe: route cf nan": lambda: moe.route(MOE, X8, top_k=1, capacity_factor=NAN),
    "moe: route cf 0": lambda: moe.route(MOE, X8, top_k=1, capacity_factor=0.0),
    "moe: route x width": lambda: moe.route(MOE, np.ones((8, 4)), top_k=1, capacity_factor=1.0),
    "moe: route x 1-D": lambda: moe.route(MOE, np.ones(8), top_k=1, capacity_factor=1.0),
    "moe: route groups 3": lambda: moe.route(MOE, X8, top_k=1, capacity_factor=1.0, groups=3),
    "moe: route groups 0": lambda: moe.route(MOE, X8, top_k=1, capacity_factor=1.0, groups=0),
    "moe: route params str": lambda: moe.route("p", X8, top_k=1, capacity_factor=1.0),
    "moe: dropped_at cf -1": lambda: moe.dropped_at(ROUTING, -1.0),
    "moe: dropped_at str": lambda: moe.dropped_at("routing", 1.0),
    "moe: lb_loss shapes": lambda: moe.load_balancing_loss(np.ones((8, 4)) / 4,
                                                           np.zeros(4, np.int32)),
    "moe: lb_loss expert >= n": lambda: moe.load_balancing_loss(np.ones((8, 4)) / 4,
                                                                np.full((8, 1), 7)),
    "moe: aux top_k 0": lambda: moe.router_aux_loss(MOE["router"], X8, top_k=0),
    "moe: reference top_k 0": lambda: moe.reference_moe(MOE, X8, top_k=0, capacity_factor=1.0),
    "moe: layer wrong axis": lambda: moe.moe_layer(MOE, X8, M4, "y", top_k=1,
                                                   capacity_factor=1.0),
    "moe: layer experts indivisible": lambda: moe.moe_layer(
        moe.init_moe(KEY, d_model=8, d_ff=16, n_experts=3), X8, M2, "x", top_k=1,
        capacity_factor=1.0),
    "moe: layer tokens indivisible": lambda: moe.moe_layer(MOE, np.ones((6, 8), np.float32), M4,
                                                           "x", top_k=1, capacity_factor=1.0),
    "moe: buffer rule near-miss": lambda: moe.dispatch_buffer_bytes(
        64, 4, top_k=1, n_experts=8, capacity_factor=1.0, d_model=8, rule="Global"),
    "moe: buffer tokens indivisible": lambda: moe.dispatch_buffer_bytes(
        63, 4, top_k=1, n_experts=8, capacity_factor=1.0, d_model=8, rule="per_device"),
    "moe: lowered fn str": lambda: moe.lowered_all_to_alls("fn", X8),
    "moe: traffic devices 3": lambda: moe.traffic(ROUTING, 3),
    "moe: traffic devices 0": lambda: moe.traffic(ROUTING, 0),
    "moe: draw_traffic 1-D": lambda: moe.draw_traffic(np.ones(4)),
    # ---- axes
    "axes: Model cf nan": lambda: axes.Model(n_layers=4, d_model=64, d_ff=256, batch=16,
                                             seq_len=32, capacity_factor=NAN),
    "axes: Model top_k > experts": lambda: axes.Model(n_layers=4, d_model=64, d_ff=256,
                                                      batch=16, seq_len=32, n_experts=2,
                                                      top_k=3),
    "axes: traffic unknown axis": lambda: axes.traffic(MODEL, {"dat": 2}),
    "axes: traffic size 0": lambda: axes.traffic(MODEL, {"data": 0}),
    "axes: traffic size str": lambda: axes.traffic(MODEL, {"data": "2"}),
    "axes: traffic mesh list": lambda: axes.traffic(MODEL, [("data", 2)]),
    "axes: traffic model dict": lambda: axes.traffic({"n_layers": 4}, {"data": 2}),
    "axes: traffic batch indivisible": lambda: axes.traffic(MODEL, {"data": 3}),
    "axes: traffic layers indivisible": lambda: axes.traffic(MODEL, {"pipeline": 3}),
    "axes: traffic micro 0": lambda: axes.traffic(MODEL, {"data": 2}, n_microbatches=0),
    "axes: traffic remat str": lambda: axes.traffic(MODEL, {"data": 2}, remat="no"),
    "axes: place devices 0": lambda: axes.place_axes(ROWS, devices_per_node=0),
    "axes: place rows str": lambda: axes.place_axes("rows", devices_per_node=8),
    "axes: link unknown placement": lambda: axes.link_seconds(
        ROWS, {"data": "fastest", "tensor": "fast"}, fast_bandwidth=1e11, slow_bandwidth=1e10),
    "axes: link placement missing": lambda: axes.link_seconds(
        ROWS, {"data": "fast"}, fast_bandwidth=1e11, slow_bandwidth=1e10),
    "axes: mixtral missing key": lambda: axes.mixtral_params({"hidden_size": 8}),
    "axes: mixtral str": lambda: axes.mixtral_params("mixtral"),
    "axes: data_program axis": lambda: axes.data_program(M2, "y"),
    "axes: fsdp_program mesh None": lambda: axes.fsdp_program(None, "x"),
    "axes: tensor_program axis int": lambda: axes.tensor_program(M2, 0),
    "axes: pipeline_program axis": lambda: axes.pipeline_program(M2, "data"),
    "axes: tensor_bytes all_reduces -1": lambda: axes.tensor_bytes(100, 2, all_reduces=-1),
    "axes: pipeline_bytes sends str": lambda: axes.pipeline_bytes(100, 2, sends="2"),
    "axes: expert_bytes n 0": lambda: axes.expert_bytes(100, 0, all_to_alls=2),
    # ---- roofline
    "roofline: chip unknown": lambda: hardware.get_chip("tpu-v9"),
    "roofline: chip near-miss": lambda: hardware.get_chip("TPU v4"),
    "roofline: chip prefix": lambda: hardware.get_chip("tpu"),
    "roofline: chip None": lambda: hardware.get_chip(None),
    "roofline: chips str list": lambda: hardware.get_chips(["tpu-v4", "v5e"]),
    "roofline: chips empty": lambda: hardware.get_chips([]),
    "roofline: choice unknown": lambda: hardware.choice("link", "ici", hardware.LINKS),
    "roofline: load_chips missing": lambda: hardware.load_chips(f"{WORK}/nope.toml"),
    "roofline: as_devices str": lambda: roofline.as_devices("cpu"),
    "roofline: as_devices 0": lambda: roofline.as_devices(0),
    "roofline: as_devices 99": lambda: roofline.as_devices(99),
    "roofline: counts fn str": lambda: roofline.counts("fn", X8),
    "roofline: estimate work dict": lambda: roofline.estimate({"flops": 1}, "tpu-v4"),
    "roofline: estimate link": lambda: roofline.estimate(WORK_COUNTS, "tpu-v4", link="ICI"),
    "roofline: estimate byte_scale 0": lambda: roofline.estimate(WORK_COUNTS, "tpu-v4",
                                                                 byte_scale=0),
    "roofline: estimate byte_scale nan": lambda: roofline.estimate(WORK_COUNTS, "tpu-v4",
                                                                   byte_scale=NAN),
    "roofline: Counts flops -1": lambda: roofline.Counts(flops=-1, bytes_accessed=1,
                                                         comm_bytes=0),
    "roofline: Counts nan": lambda: roofline.Counts(flops=NAN, bytes_accessed=1, comm_bytes=0),
    "roofline: Counts str": lambda: roofline.Counts(flops="1", bytes_accessed=1, comm_bytes=0),
    "roofline: predict chip": lambda: roofline.predict(jnp.sin, X8, chip="h100"),
    "roofline: intensity bpe 0": lambda: formulas.matmul_intensity(8, 8, 8, bytes_per_element=0),
    "roofline: critical_batch d 0": lambda: formulas.critical_batch("tpu-v4", d=0, f=8),
    "roofline: critical_batch d only": lambda: formulas.critical_batch("tpu-v4", d=8),
    "roofline: ring_time kind": lambda: formulas.ring_time(1e6, 4, "tpu-v4", kind="allgather"),
    "roofline: ring_time link": lambda: formulas.ring_time(1e6, 4, "tpu-v4", link="nvlink"),
    "roofline: dp_critical n 0": lambda: formulas.dp_critical_batch("tpu-v4", n=0),
    "roofline: dp_critical group 0": lambda: formulas.dp_critical_batch("tpu-v4", n=8, group=0),
    "roofline: dp_critical group > n": lambda: formulas.dp_critical_batch("tpu-v4", n=4,
                                                                          group=8),
    "roofline: fsdp_critical phase": lambda: formulas.fsdp_critical_batch("tpu-v4", n=8,
                                                                          phase="fwd"),
    "roofline: fsdp_critical gathers 0": lambda: formulas.fsdp_critical_batch("tpu-v4", n=8,
                                                                              gathers=0),
    "roofline: tp_min_width n 1": lambda: formulas.tp_min_width("tpu-v4", 0),
    "roofline: tp_min_width n str": lambda: formulas.tp_min_width("tpu-v4", "8"),
    "roofline: overlap ways 0": lambda: formulas.overlapped_time(1.0, 1.0, ways=0),
    "roofline: speedup comm -1": lambda: formulas.overlap_speedup(1.0, -1.0),
    "roofline: speedup nan": lambda: formulas.overlap_speedup(NAN, 1.0),
    "roofline: balance ways 0": lambda: formulas.ring_matmul_balance_rows(0, "tpu-v4"),
    "roofline: cm_times ways 0": lambda: formulas.collective_matmul_times(
        64, 64, 64, 0, "tpu-v4"),
    "roofline: cm_times m 0": lambda: formulas.collective_matmul_times(0, 64, 64, 4, "tpu-v4"),
    "roofline: mlp sizes one": lambda: formulas.mlp_matmul_flops([8], 4),
    "roofline: mlp sizes str": lambda: formulas.mlp_matmul_flops("8,16", 4),
    "roofline: mlp sizes 0": lambda: formulas.mlp_matmul_flops([8, 0], 4),
    "roofline: elementwise batch 0": lambda: formulas.mlp_elementwise_flops([8, 16], 0),
    "roofline: elementwise sizes float": lambda: formulas.mlp_elementwise_flops([8, 16.5], 4),
    # ---- rooflines.strategies
    "strategies: strategy unknown": lambda: strategies.strategy_counts("ddp"),
    "strategies: strategy sizes 1": lambda: strategies.strategy_counts(
        "dp", layer_sizes=(8,)),
    "strategies: strategy batch 0": lambda: strategies.strategy_counts("dp", batch=0),
    "strategies: strategy batch indivisible": lambda: strategies.strategy_counts(
        "dp", layer_sizes=(8, 8), batch=7),
    "strategies: strategy devices str": lambda: strategies.strategy_counts(
        "dp", layer_sizes=(8, 8), batch=8, devices="cpu"),
    "strategies: predict not counts": lambda: strategies.predict_strategies(
        {"dp": 3.0}, chips=("tpu-v4",)),
    "strategies: predict chip": lambda: strategies.predict_strategies(
        {"dp": WORK_COUNTS}, chips=("tpu-v7",)),
    "strategies: predict list": lambda: strategies.predict_strategies([WORK_COUNTS]),
    "strategies: ranking chip absent": lambda: strategies.ranking(PRED, "h100-sxm"),
    "strategies: ranking chip unknown": lambda: strategies.ranking(PRED, "v4"),
    "strategies: rows str": lambda: strategies.prediction_rows("preds", "tpu-v4"),
    "strategies: chip_for str": lambda: strategies.chip_for("tpu"),
    "strategies: how_many count > total": lambda: strategies.how_many(9, 8),
    "strategies: how_many -1": lambda: strategies.how_many(-1, 8),
    "strategies: plot_curves mismatch": lambda: figures.plot_curves(
        np.arange(4), {"a": np.arange(3)}, xlabel="x", ylabel="y"),
    "strategies: plot_rooflines bad point": lambda: figures.plot_rooflines(
        {"a": "x"}, chips=("tpu-v4",)),
    # ---- results
    "results: save rows str": lambda: results.save(f"{WORK}/a.json", benchmark="b",
                                                   command=["c"], settings={}, rows="rows"),
    "results: save benchmark 3": lambda: results.save(f"{WORK}/a.json", benchmark=3,
                                                      command=["c"], settings={}, rows=[]),
    "results: save settings list": lambda: results.save(f"{WORK}/a.json", benchmark="b",
                                                        command=["c"], settings=[1], rows=[]),
    "results: save rows of ints": lambda: results.save(f"{WORK}/a.json", benchmark="b",
                                                       command=["c"], settings={}, rows=[1, 2]),
    "results: save path int": lambda: results.save(3, benchmark="b", command=["c"], settings={},
                                                   rows=[]),
    "results: load missing": lambda: results.load(f"{WORK}/missing.json"),
    "results: load None": lambda: results.load(None),
    "results: load_all missing": lambda: results.load_all(f"{WORK}/nope"),
    "results: load_all script int": lambda: results.load_all(WORK, script=3),
    # ---- cheat_sheet
    "cheat_sheet: spec_text ndim -1": lambda: cheat_sheet.spec_text(None, -1),
    "cheat_sheet: spec_text ndim str": lambda: cheat_sheet.spec_text(None, "2"),
    "cheat_sheet: spec_of str": lambda: cheat_sheet.spec_of("P('x')", 2),
    "cheat_sheet: family mesh list": lambda: cheat_sheet.family([2], "data", ["-"]),
    "cheat_sheet: family weights str": lambda: cheat_sheet.family({"data": 2}, "data", "-"),
    "cheat_sheet: per_layer str": lambda: cheat_sheet.per_layer("abc"),
    "cheat_sheet: per_layer empty": lambda: cheat_sheet.per_layer([]),
    "cheat_sheet: gradient_program str": lambda: cheat_sheet.gradient_program("loss"),
    "cheat_sheet: adam how": lambda: cheat_sheet.adam_state_shardings({}, how="pinned"),
    "cheat_sheet: layout unknown": lambda: cheat_sheet.layout("ddp", None, None),
    "cheat_sheet: sheet names str": lambda: cheat_sheet.cheat_sheet("dp"),
    "cheat_sheet: sheet unknown": lambda: cheat_sheet.cheat_sheet(("dp", "zero")),
    "cheat_sheet: sheet batch 0": lambda: cheat_sheet.cheat_sheet(("dp",), batch_size=0),
    "cheat_sheet: sheet batch indivisible": lambda: cheat_sheet.cheat_sheet(("dp",),
                                                                            batch_size=7),
    "cheat_sheet: sheet sizes one": lambda: cheat_sheet.cheat_sheet(("dp",), layer_sizes=(8,)),
    "cheat_sheet: sheet devices str": lambda: cheat_sheet.cheat_sheet(("dp",), devices="cpu"),
    "cheat_sheet: sheet sizes 0": lambda: cheat_sheet.cheat_sheet(("dp",), layer_sizes=(8, 0)),
    "cheat_sheet: table part": lambda: cheat_sheet.sheet_table([], part="weights"),
    "cheat_sheet: table str": lambda: cheat_sheet.sheet_table("layouts"),
    "cheat_sheet: notes str": lambda: cheat_sheet.notes("layouts"),
    # ---- which_strategy
    "which_strategy: fraction 1.5": lambda: which_strategy.recommend(10**9, 16 * 10**9, batch=64,
                                                                     n_devices=8,
                                                                     memory_fraction=1.5),
    "which_strategy: slots -1": lambda: which_strategy.training_state_bytes(
        1000, optimizer_slots=-1),
    "which_strategy: axis batch 0": lambda: which_strategy.data_axis_size(0, 8),
    "which_strategy: axis min 0": lambda: which_strategy.data_axis_size(
        8, 8, min_batch_per_device=0),
    "which_strategy: axis str": lambda: which_strategy.data_axis_size("8", 8),
    "which_strategy: flowchart str": lambda: which_strategy.flowchart("fsdp"),
    "which_strategy: traffic names str": lambda: which_strategy.measure_traffic(
        "dp", layer_sizes=(8, 8), batch_sizes=(8,)),
    "which_strategy: traffic unknown": lambda: which_strategy.measure_traffic(
        ["dpp"], layer_sizes=(8, 8), batch_sizes=(8,)),
    "which_strategy: traffic batch 0": lambda: which_strategy.measure_traffic(
        ["dp"], layer_sizes=(8, 8), batch_sizes=(0,)),
    "which_strategy: traffic batches int": lambda: which_strategy.measure_traffic(
        ["dp"], layer_sizes=(8, 8), batch_sizes=8),
    # ---- tpu_ring
    "tpu_ring: hops order str": lambda: tpu_ring.ring_hops(TRAY, "0123"),
    "tpu_ring: hops order unknown": lambda: tpu_ring.ring_hops(TRAY, [0, 99]),
    "tpu_ring: hops devices None": lambda: tpu_ring.ring_hops(None, [0]),
    "tpu_ring: grid 1-D": lambda: tpu_ring.grid_hops(TRAY, [0, 1, 2]),
    "tpu_ring: grid ragged": lambda: tpu_ring.grid_hops(TRAY, [[0, 1], [2]]),
    "tpu_ring: diagonal repeats": lambda: tpu_ring.diagonal_steps(TRAY, [0, 0]),
    "tpu_ring: diagram title int": lambda: tpu_ring.ring_diagram(TRAY, range(8), title=1),
    "tpu_ring: TrayDevice coords 2": lambda: tpu_ring.TrayDevice(0, (0, 0), 0),
    "tpu_ring: TrayDevice id -1": lambda: tpu_ring.TrayDevice(-1, (0, 0, 0), 0),
    # ---- ring_costs
    "ring_costs: compile unknown": lambda: ring_costs.compile_variant("all_gather", X8, X8, M2,
                                                                      "x"),
    "ring_costs: compile axis": lambda: ring_costs.compile_variant("allgather", X8, X8, M2, "y"),
    "ring_costs: compile K mismatch": lambda: ring_costs.compile_variant(
        "allgather", X8, np.ones((4, 8)), M2, "x"),
    "ring_costs: compile str lhs": lambda: ring_costs.compile_variant("allgather", "a", X8, M2,
                                                                      "x"),
    "ring_costs: bound name": lambda: ring_costs.ring_bound_bytes("gather", 8, 8, 8, 4, 2),
    "ring_costs: rows str": lambda: ring_costs.collective_rows("ops"),
    "ring_costs: by_direction ring 0": lambda: ring_costs.bytes_by_direction([], 0),
    "ring_costs: memory_row str": lambda: ring_costs.memory_row("compiled"),
    "ring_costs: before_first str": lambda: ring_costs.matmuls_before_first_transfer(None),
    "ring_costs: summed str": lambda: ring_costs.summed_at_end("x"),
    "ring_costs: words unit": lambda: ring_costs.amounts_in_words({"a": 1}, unit=3),
    "ring_costs: words negative": lambda: ring_costs.amounts_in_words({"a": -1}),
    "ring_costs: words str": lambda: ring_costs.amounts_in_words("a"),
    "ring_costs: schedule ring 1": lambda: ring_costs.ring_schedule("allgather", [4]),
    "ring_costs: schedule name": lambda: ring_costs.ring_schedule("allgather ", 4),
    "ring_costs: draw ring 0": lambda: ring_costs.draw_ring("allgather", 0),
    # ---- checkpoint
    "checkpoint: steps None": lambda: checkpoint.steps(None),
    "checkpoint: steps int": lambda: checkpoint.steps(3),
    "checkpoint: latest file": lambda: checkpoint.latest_step(RES),
    "checkpoint: save step -1": lambda: checkpoint.save(f"{WORK}/c2", {"w": X8}, step=-1),
    "checkpoint: save step str": lambda: checkpoint.save(f"{WORK}/c2", {"w": X8}, step="1"),
    "checkpoint: save step 1.5": lambda: checkpoint.save(f"{WORK}/c2", {"w": X8}, step=1.5),
    "checkpoint: save state str": lambda: checkpoint.save(f"{WORK}/c2", "state", step=1),
    "checkpoint: save state None": lambda: checkpoint.save(f"{WORK}/c2", None, step=1),
    "checkpoint: save exists": lambda: checkpoint.save(SAVED, {"w": np.arange(4.0)}, step=1),
    "checkpoint: start_save step None": lambda: checkpoint.start_save(f"{WORK}/c3", {"w": X8},
                                                                     step=None),
    "checkpoint: abstract str": lambda: checkpoint.abstract("like"),
    "checkpoint: saved_arrays no step": lambda: checkpoint.saved_arrays(SAVED, step=7),
    "checkpoint: saved_arrays empty dir": lambda: checkpoint.saved_arrays(WORK),
    "checkpoint: saved_layout step str": lambda: checkpoint.saved_layout(SAVED, step="1"),
    "checkpoint: restore like None": lambda: checkpoint.restore(SAVED, like=None),
    "checkpoint: restore like shape": lambda: checkpoint.restore(SAVED,
                                                                 like={"w": np.zeros(5)}),
    "checkpoint: restore like keys": lambda: checkpoint.restore(SAVED,
                                                                like={"v": np.zeros(4)}),
    "checkpoint: restore step -1": lambda: checkpoint.restore(SAVED, like={"w": np.zeros(4)},
                                                              step=-1),
    "checkpoint: restore missing dir": lambda: checkpoint.restore(f"{WORK}/none",
                                                                  like={"w": np.zeros(4)}),
    # ---- training
    "training: prepare unknown": lambda: training.prepare(CFG, strategy="ddp", n_devices=2,
                                                          batch=4),
    "training: prepare devices 0": lambda: training.prepare(CFG, strategy="dp", n_devices=0,
                                                            batch=4),
    "training: prepare devices 99": lambda: training.prepare(CFG, strategy="dp", n_devices=99,
                                                             batch=4),
    "training: prepare batch indivisible": lambda: training.prepare(CFG, strategy="dp",
                                                                    n_devices=4, batch=6),
    "training: prepare config dict": lambda: training.prepare({"vocab": 16}, strategy="dp",
                                                              n_devices=2, batch=4),
    "training: state_like strategy None": lambda: training.state_like(CFG, strategy=None,
                                                                      n_devices=2),
    "training: abstract_state str": lambda: training.abstract_state("run"),
    "training: train steps 0": lambda: training.train_lm(CFG, strategy="dp", n_devices=2,
                                                         steps=0, batch=4),
    "training: train seed -1": lambda: training.train_lm(CFG, strategy="dp", n_devices=2,
                                                         steps=1, batch=4, seed=-1),
    "training: train save_every 0": lambda: training.train_lm(
        CFG, strategy="dp", n_devices=2, steps=1, batch=4, checkpoint_dir=f"{WORK}/t",
        save_every=0),
    "training: train save_every no dir": lambda: training.train_lm(
        CFG, strategy="dp", n_devices=2, steps=1, batch=4, save_every=1),
    "training: train resume str": lambda: training.train_lm(
        CFG, strategy="dp", n_devices=2, steps=1, batch=4, resume="yes"),
    "training: train examples < batch": lambda: training.train_lm(
        CFG, strategy="dp", n_devices=2, steps=1, batch=4, examples=2),
    "training: max_abs lengths": lambda: training.max_abs_difference([1.0], [1.0, 2.0]),
    "training: max_abs str": lambda: training.max_abs_difference("ab", "cd"),
    "training: max_abs nan": lambda: training.max_abs_difference([NAN], [1.0]),
    # ---- serving
    "serving: cached q 3-D": lambda: serving.cached_attention(Q[0], KC, KC, start=0),
    "serving: cached start -1": lambda: serving.cached_attention(Q[:, :1], KC, KC, start=-1),
    "serving: cached start 9": lambda: serving.cached_attention(Q[:, :1], KC, KC, start=9),
    "serving: cached start str": lambda: serving.cached_attention(Q[:, :1], KC, KC, start="0"),
    "serving: server strategy unknown": lambda: serving.server(CFG, strategy="dpp", mesh=M2),
    "serving: server cp": lambda: serving.server(CFG, strategy="cp", mesh=mesh_of(2, ("seq",))),
    "serving: server mesh str": lambda: serving.server(CFG, strategy="dp", mesh="m"),
    "serving: server wrong axes": lambda: serving.server(CFG, strategy="dp", mesh=M2),
    "serving: cache max_len > seq_len": lambda: serving.init_cache(CFG, batch=1, max_len=9),
    "serving: cache_bytes str": lambda: serving.cache_bytes("cache"),
    "serving: prompt >= vocab": lambda: serving.check_prompt(PROMPT + 16, CFG),
    "serving: prompt < 0": lambda: serving.check_prompt(-PROMPT, CFG),
    "serving: prompt float": lambda: serving.check_prompt(PROMPT.astype(float), CFG),
    "serving: prompt 1-D": lambda: serving.check_prompt(PROMPT[0], CFG),
    "serving: prompt empty": lambda: serving.check_prompt(np.zeros((1, 0), np.int32), CFG),
    "serving: prompt str": lambda: serving.check_prompt("hello", CFG),
    "serving: generate steps 0": lambda: serving.generate(PARAMS, PROMPT, config=CFG, steps=0),
    "serving: generate steps str": lambda: serving.generate(PARAMS, PROMPT, config=CFG,
                                                            steps="2"),
    # 3 prompt tokens + 7 steps feed 9 positions (the last new token is never fed back): one
    # more than seq_len=8.
    "serving: generate too long": lambda: serving.generate(PARAMS, PROMPT, config=CFG, steps=7),
    "serving: generate params/config": lambda: serving.generate(PARAMS, PROMPT,
                                                                config=lm.Config(), steps=1),
    "serving: generate prompt >= vocab": lambda: serving.generate(PARAMS, PROMPT + 16,
                                                                  config=CFG, steps=1),
    "serving: logits steps -1": lambda: serving.generate_with_logits(PARAMS, PROMPT, config=CFG,
                                                                     steps=-1),
    "serving: recompute steps nan": lambda: serving.recompute_generate(PARAMS, PROMPT,
                                                                       config=CFG, steps=NAN),
    "serving: abstract srv str": lambda: serving.abstract_params(CFG, "server"),
    "serving: compiled length > max": lambda: serving.compiled_step(CFG, batch=1, length=9,
                                                                    max_len=8),
    "serving: compiled batch 0": lambda: serving.compiled_step(CFG, batch=0, length=1,
                                                               max_len=8),
    "serving: decode unknown": lambda: serving.decode_collectives(CFG, strategy="tensor",
                                                                  n_devices=2, batch=2),
    "serving: decode devices 99": lambda: serving.decode_collectives(CFG, strategy="dp",
                                                                     n_devices=99, batch=2),
    "serving: decode batch indivisible": lambda: serving.decode_collectives(
        CFG, strategy="dp", n_devices=2, batch=3),
    "serving: donation max_len 0": lambda: serving.donation_rows(CFG, batch=1, max_len=0),
    "serving: sharded_row unknown": lambda: serving.sharded_row(
        PARAMS, PROMPT, config=CFG, steps=1, strategy="ddp", mesh=M2, reference=(None, None)),
})

VALID = {
    "lm: numpy Config": lambda: lm.Config(vocab=np.int64(16), d_model=np.int32(16),
                                          n_heads=np.int64(2), d_ff=32, n_layers=1, seq_len=8),
    "lm: forward jax tokens": lambda: lm.forward(PARAMS, jnp.asarray(TOKENS)),
    "lm: forward int64 tokens": lambda: lm.forward(PARAMS, TOKENS.astype(np.int64)),
    "lm: lm_loss list tokens": lambda: lm.lm_loss(PARAMS, TOKENS9.tolist(), config=CFG),
    "lm: counting numpy batch": lambda: lm.counting_task(KEY, batch=np.int64(2), config=CFG,
                                                         strides=[1, 2]),
    "lm: optimizer numpy lr": lambda: lm.optimizer(np.float32(1e-3)),
    "lm: against_uniform numpy": lambda: lm.against_uniform(np.float32(2.0), np.int64(16)),
    "lm: train numpy": lambda: lm.train_one_device(KEY, CFG, steps=np.int64(1),
                                                   batch=np.int32(2)),
    "attention: numpy seq": lambda: attention.layout_positions(np.int64(16), np.int32(4),
                                                               "zigzag"),
    "attention: ring explicit": lambda: attention.ring_attention(Q, Q, Q, E2, "x", causal=True),
    "attention: ring zigzag explicit": lambda: attention.ring_attention(
        Q, Q, Q, E2, "x", causal=True, layout="zigzag"),
    "attention: ref numpy bool": lambda: attention.reference_attention(Q, Q, Q,
                                                                       causal=np.bool_(True)),
    "attention: schedule numpy": lambda: attention.ring_schedule(np.int64(4)),
    "attention: saved explicit": lambda: attention.saved_for_backward(Q, Q, Q, E2, "x",
                                                                      causal=True),
    "transformer: auto_mesh explicit": lambda: tf.auto_mesh(mesh_of(2, ("data",), explicit=True)),
    "transformer: check_strategy explicit": lambda: tfv.check_strategy(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",), explicit=True), CFG, PARAMS, TOKENS9),
    "transformer: predicted numpy batch": lambda: tfv.predicted_comm_bytes(
        tf.STRATEGIES["fsdp"], mesh_of(2, ("data",)), CFG, PARAMS, np.int64(8)),
    "transformer: spec_table explicit": lambda: tfv.spec_table(
        PARAMS, {"dp": mesh_of(2, ("data",), explicit=True)}),
    "breakdown: scatter explicit": lambda: breakdown.scatter_forms(E2, "x"),
    "memory: predicted numpy": lambda: memory.predicted_bytes(
        tf.STRATEGIES["dp"], mesh_of(2, ("data",), explicit=True), CFG, PARAMS, np.int64(8)),
    "pricing: big numpy": lambda: pricing.transformer_big_arrays(batch=np.int64(16),
                                                                 n_devices=np.int32(8)),
    "schedules: numpy": lambda: schedules.build_schedule("1f1b", np.int64(2), np.int32(4)),
    "schedules: bubble numpy": lambda: schedules.bubble_fraction("gpipe", np.int64(4),
                                                                 np.int64(8)),
    "schedules: for_bubble numpy": lambda: schedules.microbatches_for_bubble(
        np.int64(4), np.float32(0.1)),
    "schedules: bubble_rows array": lambda: schedules.bubble_rows(4, np.array([4, 8])),
    "schedules: in_flight numpy": lambda: schedules.in_flight_rows(np.int64(2), np.int64(4)),
    "pipeline: init numpy": lambda: pipeline.init_stack(KEY, np.int64(4), np.int32(8)),
    "pipeline: make_batch numpy": lambda: pipeline.make_batch(KEY, np.int64(8), np.int64(8)),
    "pipeline: pipelined explicit": lambda: pipeline.pipelined_loss(
        ES4, schedule="gpipe", n_microbatches=2)(STACK, BATCH),
    "pipeline: train_step explicit": lambda: pipeline.make_train_step(
        pipeline.STRATEGIES["1f1b"], ES4, n_microbatches=np.int64(2),
        learning_rate=np.float32(0.1))(STACK, BATCH),
    "pipeline: buffer numpy": lambda: pipeline.activation_buffer_bytes(
        "1f1b", np.int64(2), np.int64(4), batch_size=np.int64(8), width=8),
    "moe: capacity numpy": lambda: moe.capacity(np.int64(64), top_k=np.int32(2),
                                                n_experts=np.int64(8),
                                                capacity_factor=np.float32(1.25)),
    "moe: route jax x": lambda: moe.route(MOE, jnp.asarray(X8), top_k=np.int64(2),
                                          capacity_factor=np.float64(1.0)),
    "moe: layer explicit": lambda: moe.moe_layer(MOE, X8, E2, "x", top_k=1,
                                                 capacity_factor=1.0),
    "moe: traffic numpy": lambda: moe.traffic(ROUTING, np.int64(2)),
    "moe: buffer per_device": lambda: moe.dispatch_buffer_bytes(
        np.int64(64), 4, top_k=1, n_experts=8, capacity_factor=1.0, d_model=8,
        rule="per_device"),
    "axes: Model numpy": lambda: axes.Model(n_layers=np.int64(4), d_model=64, d_ff=256,
                                            batch=np.int32(16), seq_len=32,
                                            capacity_factor=np.float32(1.25)),
    "axes: traffic numpy sizes": lambda: axes.traffic(MODEL, {"data": np.int64(2)},
                                                      n_microbatches=np.int64(2)),
    "axes: data_program explicit": lambda: axes.data_program(E2, "x"),
    "axes: tensor_program explicit": lambda: axes.tensor_program(E2, "x"),
    "axes: bytes numpy": lambda: axes.fsdp_bytes(np.int64(1024), np.int32(4),
                                                 gathers=np.int64(2)),
    "roofline: numpy intensity": lambda: formulas.matmul_intensity(np.int64(64), 64,
                                                                   np.int32(64)),
    "roofline: numpy ring_time": lambda: formulas.ring_time(np.float32(1e6), np.int64(4),
                                                            "tpu-v4"),
    "roofline: Counts numpy": lambda: roofline.estimate(
        roofline.Counts(flops=np.float64(1e9), bytes_accessed=np.int64(10**6),
                        comm_bytes=np.float32(0)), "h100-sxm"),
    "roofline: Chip object": lambda: hardware.get_chip(hardware.CHIPS["tpu-v4"]),
    "roofline: chips tuple": lambda: hardware.get_chips(("tpu-v4", "b200")),
    "roofline: mlp array sizes": lambda: formulas.mlp_matmul_flops(np.array([8, 16, 8]),
                                                                   np.int64(4)),
    "roofline: critical numpy": lambda: formulas.critical_batch("tpu-v4", d=np.int64(8),
                                                                f=np.int64(32)),
    "roofline: overlap numpy": lambda: formulas.overlap_speedup(np.float64(1.0),
                                                                np.float32(0.5),
                                                                ways=np.int64(4)),
    "strategies: strategy numpy": lambda: strategies.strategy_counts(
        "dp", layer_sizes=np.array([8, 8]), batch=np.int64(8), devices=E2),
    "strategies: how_many numpy": lambda: strategies.how_many(np.int64(3), 8),
    "results: save numpy values": lambda: results.save(
        f"{WORK}/n.json", benchmark="b", command=["python", "x"],
        settings={"n": np.int64(2)}, rows=[{"t": np.float32(0.5), "n": np.int64(3)}]),
    "results: load path str": lambda: results.load(str(RES)),
    "results: NaN propagates (documented)": lambda: math.isnan(results.load(results.save(
        f"{WORK}/nan.json", benchmark="b", command=["c"], settings={},
        rows=[{"t": NAN}])).rows[0]["t"]) or 1 / 0,
    "cheat_sheet: spec_text numpy ndim": lambda: cheat_sheet.spec_text(
        jax.sharding.NamedSharding(M2, jax.P("x")), np.int64(2)),
    "which_strategy: numpy": lambda: which_strategy.recommend(
        np.int64(10**9), np.int64(16 * 10**9), batch=np.int64(64), n_devices=np.int32(8),
        memory_fraction=np.float32(0.5)),
    "which_strategy: axis numpy": lambda: which_strategy.data_axis_size(np.int64(8),
                                                                        np.int64(8)),
    "tpu_ring: order array": lambda: tpu_ring.ring_hops(TRAY, np.arange(8)),
    "tpu_ring: grid array": lambda: tpu_ring.grid_hops(TRAY, np.arange(8).reshape(2, 4)),
    "ring_costs: compile explicit": lambda: ring_costs.compile_variant("allgather", X8, X8,
                                                                       E2, "x"),
    "ring_costs: bound numpy": lambda: ring_costs.ring_bound_bytes(
        "allgather", np.int64(8), 8, 8, np.int32(4), np.int64(2)),
    "ring_costs: schedule numpy": lambda: ring_costs.ring_schedule("allgather", np.int64(4)),
    "ring_costs: words numpy": lambda: ring_costs.amounts_in_words({"a": np.int64(3)}),
    "checkpoint: numpy step": lambda: checkpoint.save(f"{WORK}/c4", {"w": X8}, step=np.int64(2)),
    "checkpoint: restore numpy step": lambda: checkpoint.restore(
        SAVED, like={"w": jnp.zeros(4)}, step=np.int64(1)),
    "checkpoint: saved_arrays str dir": lambda: checkpoint.saved_arrays(str(SAVED)),
    "training: steps numpy": lambda: training.steps_per_epoch(batch=np.int64(8)),
    "training: max_abs arrays": lambda: training.max_abs_difference(np.ones(3), np.ones(3)),
    "serving: generate numpy steps": lambda: serving.generate(PARAMS, PROMPT, config=CFG,
                                                              steps=np.int64(2)),
    "serving: generate list prompt": lambda: serving.generate(PARAMS, [[1, 2, 3]], config=CFG,
                                                              steps=1),
    "serving: generate explicit": lambda: serving.generate(
        PARAMS, np.ones((2, 3), np.int32), config=CFG, steps=1, strategy="dp",
        mesh=mesh_of(2, ("data",), explicit=True)),
    "serving: cached numpy start": lambda: serving.cached_attention(Q[:, :1], KC, KC,
                                                                    start=np.int32(3)),
    "serving: init_cache numpy": lambda: serving.init_cache(CFG, batch=np.int64(1),
                                                            max_len=np.int64(8)),
}
