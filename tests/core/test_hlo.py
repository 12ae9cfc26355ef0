"""Tests of spmd_guide.core.hlo: collectives, bytes (ring model) and memory of compiled programs.

Byte counts are computed here by hand from shapes and group sizes, never read back from the
module under test. Parser tests use literal HLO so they hold even if the compiler changes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo, hlo_text

F32 = 4
ROWS, COLS = 16, 8  # the global test array: f32[16, 8] = 512 bytes
FULL = ROWS * COLS * F32


def no_other_kinds(counts: dict[str, int], **expected: int) -> None:
    """Counts hold exactly the five keys, with ``expected`` (dashes as underscores) and 0 else."""
    assert list(counts) == list(hlo.KINDS)
    want = {kind: expected.get(kind.replace("-", "_"), 0) for kind in hlo.KINDS}
    assert counts == want


def global_array() -> jax.Array:
    return jnp.arange(ROWS * COLS, dtype=jnp.float32).reshape(ROWS, COLS)


def smap(body, mesh, in_specs, out_specs):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=False))


# --------------------------------------------------------------------------- shard_map


@pytest.mark.parametrize("k", [2, 4, 8])
class TestShardMap:
    def test_psum_is_one_all_reduce(self, k):
        f = smap(lambda a: jax.lax.psum(a, "x"), mesh_of(k), P("x"), P())
        x = global_array()
        block = FULL // k
        no_other_kinds(hlo.collective_counts(f, x), all_reduce=1)
        assert hlo.communication_bytes(f, x) == 2 * (k - 1) * block // k
        (op,) = hlo.collectives(f, x)
        assert (op.kind, op.shape, op.dtype, op.group_size) == (
            "all-reduce", (ROWS // k, COLS), "f32", k)

    def test_all_gather_charges_the_gathered_buffer(self, k):
        f = smap(lambda a: jax.lax.all_gather(a, "x", tiled=True), mesh_of(k), P("x"), P())
        x = global_array()
        no_other_kinds(hlo.collective_counts(f, x), all_gather=1)
        assert hlo.communication_bytes(f, x) == (k - 1) * FULL // k
        (op,) = hlo.collectives(f, x)
        assert (op.shape, op.group_size) == ((ROWS, COLS), k)

    def test_psum_scatter_is_reduce_scatter_of_the_input(self, k):
        f = smap(lambda a: jax.lax.psum_scatter(a, "x", tiled=True), mesh_of(k), P(), P("x"))
        x = global_array()
        no_other_kinds(hlo.collective_counts(f, x), reduce_scatter=1)
        assert hlo.communication_bytes(f, x) == (k - 1) * FULL // k
        (op,) = hlo.collectives(f, x)
        assert (op.shape, op.group_size) == ((ROWS, COLS), k)

    def test_ppermute_sends_its_whole_operand(self, k):
        ring = [(i, (i + 1) % k) for i in range(k)]
        f = smap(lambda a: jax.lax.ppermute(a, "x", ring), mesh_of(k), P("x"), P("x"))
        x = global_array()
        no_other_kinds(hlo.collective_counts(f, x), collective_permute=1)
        assert hlo.communication_bytes(f, x) == FULL // k
        assert hlo.collectives(f, x)[0].group_size == k

    def test_all_to_all_keeps_one_chunk(self, k):
        f = smap(lambda a: jax.lax.all_to_all(a, "x", 1, 0, tiled=True),
                 mesh_of(k), P("x", None), P(None, "x"))
        x = global_array()
        block = FULL // k
        no_other_kinds(hlo.collective_counts(f, x), all_to_all=1)
        assert hlo.communication_bytes(f, x) == (k - 1) * block // k
        (op,) = hlo.collectives(f, x)
        assert (op.kind, op.group_size, op.buffer_bytes) == ("all-to-all", k, block)


def test_psum_over_one_axis_of_a_2d_mesh_groups_that_axis():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    f = smap(lambda a: jax.lax.psum(a, "a"), mesh, P("a", "b"), P(None, "b"))
    x = global_array()
    (op,) = hlo.collectives(f, x)
    block = FULL // 8
    assert (op.group_size, op.bytes_sent) == (4, 2 * 3 * block // 4)
    both = smap(lambda a: jax.lax.psum(a, ("a", "b")), mesh, P("a", "b"), P())
    assert hlo.communication_bytes(both, x) == 2 * 7 * block // 8


def test_ops_in_a_loop_body_count_once_per_appearance():
    def body(a):
        step = lambda c, _: (jax.lax.psum(c, "x") * 0.5, None)  # noqa: E731
        return jax.lax.scan(step, a, None, length=3)[0]

    f = smap(body, mesh_of(4), P("x"), P("x"))
    x = global_array()
    assert "while" in hlo.compiled_text(f, x)
    no_other_kinds(hlo.collective_counts(f, x), all_reduce=1)
    assert hlo.communication_bytes(f, x) == 2 * 3 * (FULL // 4) // 4


# --------------------------------------------------------------------------- partitioner


@pytest.mark.parametrize("k", [2, 4, 8])
def test_sum_over_a_sharded_axis_all_reduces_the_partial_sums(k):
    x = jax.device_put(global_array(), NamedSharding(mesh_of(k), P("x", None)))
    f = lambda a: a.sum(axis=0)  # noqa: E731  (plain function: wrapped in jit)
    no_other_kinds(hlo.collective_counts(f, x), all_reduce=1)
    partial_sums = COLS * F32
    assert hlo.communication_bytes(f, x) == 2 * (k - 1) * partial_sums // k


@pytest.mark.parametrize("k", [2, 4, 8])
def test_resharding_to_replicated_all_gathers(k):
    mesh = mesh_of(k)
    x = jax.device_put(global_array(), NamedSharding(mesh, P("x", None)))
    f = jax.jit(lambda a: jax.lax.with_sharding_constraint(a * 2, NamedSharding(mesh, P())))
    no_other_kinds(hlo.collective_counts(f, x), all_gather=1)
    assert hlo.communication_bytes(f, x) == (k - 1) * FULL // k


def test_matmul_contracting_a_sharded_dimension_all_reduces_the_product():
    """x @ x.T with the contracted dimension split over 'b': partial products are summed."""
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("a", "b")))

    def f(a):
        rows_whole = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, "b")))
        return (rows_whole @ rows_whole.T).sum(axis=0)

    ops = hlo.collectives(f, x)
    assert [(op.kind, op.group_size) for op in ops] == [("all-gather", 4), ("all-reduce", 2)]
    gathered = 64 * (32 // 2) * F32  # f32[64,16]: all rows, this device's half of columns
    product = 64 * 64 * F32
    assert [op.bytes_sent for op in ops] == [3 * gathered // 4, 2 * 1 * product // 2]
    assert ops[1].groups == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_partitioner_mesh_groups_match_shard_map_explicit_groups():
    """The same reduction by the partitioner and by shard_map. JAX 0.10 printed the first
    as mesh[...] {...} and the second as {{...}}; JAX 0.12 prints both with mesh axes,
    `replica_groups=mesh['a'=4,'b'=2] {'a'}`. Explicit lists remain for groups that follow
    no mesh axis (axis_index_groups); every spelling reads as the same device groups."""
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    x = jax.device_put(global_array(), NamedSharding(mesh, P("a", "b")))
    auto = hlo.collectives(lambda a: a.sum(axis=0), x)
    manual = hlo.collectives(
        smap(lambda a: jax.lax.psum(a, "a"), mesh, P("a", "b"), P(None, "b")), global_array())
    assert [op.kind for op in auto] == [op.kind for op in manual] == ["all-reduce"]
    for op in auto + manual:
        assert hlo_text.replica_groups_text(op.line) == "mesh['a'=4,'b'=2] {'a'}", op.line
    assert auto[0].groups == manual[0].groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert auto[0].bytes_sent == 2 * 3 * (COLS // 2 * F32) // 4
    listed = hlo.collectives(
        smap(lambda a: jax.lax.psum(a, "x", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]),
             mesh_of(8), P("x"), P("x")), jnp.ones(8))
    assert [hlo_text.replica_groups_text(op.line) for op in listed] == ["{{0,1,2,3},{4,5,6,7}}"]
    assert listed[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and listed[0].group_size == 4


def test_explicit_axes_reshard_all_gathers():
    mesh = mesh_of(4, explicit=True)
    x = jax.device_put(global_array(), NamedSharding(mesh, P("x")))
    f = lambda a: jax.sharding.reshard(a, NamedSharding(mesh, P()))  # noqa: E731
    no_other_kinds(hlo.collective_counts(f, x), all_gather=1)
    assert hlo.communication_bytes(f, x) == 3 * FULL // 4


def test_shape_dtype_structs_compile_without_data():
    mesh = mesh_of(8)
    spec = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    f = lambda a: a.sum(axis=0)  # noqa: E731
    assert hlo.memory_per_device(f, spec).argument_bytes == 1024 * 256 * F32 // 8
    assert hlo.communication_bytes(f, spec) == 2 * 7 * (256 * F32) // 8


def test_a_program_without_collectives_has_zero_counts_and_bytes():
    x = jax.device_put(global_array(), NamedSharding(mesh_of(8), P("x")))
    f = lambda a: jnp.sin(a) * 2  # noqa: E731
    no_other_kinds(hlo.collective_counts(f, x))
    assert hlo.communication_bytes(f, x) == 0
    assert hlo.collectives(f, x) == []


def test_accepts_jitted_lowered_and_compiled():
    x = jax.device_put(global_array(), NamedSharding(mesh_of(4), P("x")))
    jitted = jax.jit(lambda a: a.sum())
    lowered = jitted.lower(x)
    expected = hlo.collective_counts(jitted, x)
    assert expected["all-reduce"] == 1
    assert hlo.collective_counts(lowered) == expected
    assert hlo.collective_counts(lowered.compile()) == expected


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_memory_argument_bytes_are_the_per_device_shard(k):
    x = jax.device_put(global_array(), NamedSharding(mesh_of(k), P("x")))
    stats = hlo.memory_per_device(lambda a: a * 2, x)
    assert stats.argument_bytes == FULL // k
    assert stats.output_bytes == FULL // k
    assert stats.peak_bytes == (stats.argument_bytes + stats.output_bytes
                                - stats.alias_bytes + stats.temp_bytes)
    rows = stats.as_rows()
    assert rows[0] == ("arguments", FULL // k, hlo.format_bytes(FULL // k))


def test_memory_of_a_replicated_argument_is_the_whole_array():
    x = jax.device_put(global_array(), NamedSharding(mesh_of(4), P()))
    assert hlo.memory_per_device(lambda a: a + 1, x).argument_bytes == FULL


def test_donated_argument_is_aliased():
    x = jax.device_put(global_array(), NamedSharding(mesh_of(2), P("x")))
    stats = hlo.memory_per_device(jax.jit(lambda a: a * 2, donate_argnums=0), x)
    assert stats.alias_bytes == FULL // 2
    assert stats.peak_bytes == FULL // 2 + stats.temp_bytes


# --------------------------------------------------------------------------- report


def test_report_lists_ops_totals_and_memory():
    mesh = mesh_of(4)
    x = jax.device_put(global_array(), NamedSharding(mesh, P("x")))
    f = jax.jit(lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P())))
    result = hlo.report(f, x, title="gather")
    sent = 3 * FULL // 4
    assert result.counts["all-gather"] == 1 and result.total_bytes == sent
    text = str(result)
    assert "gather" in text and "f32[16,8]" in text and hlo.format_bytes(sent) in text
    assert "arguments" in text and hlo.format_bytes(FULL // 4) in text
    page = result._repr_html_()
    assert page.count("<table") == 2 and "all-gather" in page and "f32[16,8]" in page
    assert "1 op<" in page and f"{hlo.format_bytes(sent)}</td>" in page


def test_report_of_a_program_without_collectives_says_none():
    result = hlo.report(lambda a: a + 1, jnp.ones(4))
    assert result.ops == () and result.total_bytes == 0
    assert "none" in str(result) and "<table" in result._repr_html_()


# --------------------------------------------------------------------------- bad input


def test_missing_arguments_get_a_clear_error():
    with pytest.raises(TypeError, match="Pass the example arguments"):
        hlo.collective_counts(lambda a, b: a + b, jnp.ones(2))
    with pytest.raises(TypeError, match="Pass the example arguments"):
        hlo.report(jax.jit(lambda a: a))


def test_a_non_function_is_rejected():
    with pytest.raises(TypeError, match="expected a function"):
        hlo.collectives(42)


def test_ring_bytes_rejects_unknown_kinds_and_empty_groups():
    with pytest.raises(ValueError, match="unknown collective kind"):
        hlo.ring_bytes("all-scatter", 8, 2)
    with pytest.raises(ValueError, match="at least 1"):
        hlo.ring_bytes("all-reduce", 8, 0)


@pytest.mark.parametrize("kind", hlo.KINDS[:-2] + ("all-to-all",))
def test_a_group_of_one_sends_nothing(kind):
    assert hlo.ring_bytes(kind, 1024, 1) == 0


# --------------------------------------------------------------------------- format_bytes


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (3 * 2**20, "3 MiB"), (int(2.25 * 2**30), "2.2 GiB"), (2**60, "1024 PiB"),
])
def test_format_bytes(n, text):
    assert hlo.format_bytes(n) == text


def test_format_bytes_rejects_negative_counts():
    with pytest.raises(ValueError, match="at least 0"):
        hlo.format_bytes(-1)


# --------------------------------------------------------------------------- parser, literal HLO


MODULE = """\
HloModule jit_f, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%unused (p: f32[64]) -> f32[64] {
  %p = f32[64]{0} parameter(0)
  ROOT %never = f32[64]{0} all-reduce(%p), channel_id=9, replica_groups={{0,1}}, to_apply=%add
}

%rs_wrapped (q: f32[64,8]) -> f32[16,8] {
  %q = f32[64,8]{1,0} parameter(0)
  ROOT %rs = f32[16,8]{1,0} reduce-scatter(%q), channel_id=5, replica_groups=[2,4]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
}

ENTRY %main (param.1: f32[16,8], param.2: bf16[4,16], param.3: f32[64,8]) -> f32[16,8] {
  %param.1 = f32[16,8]{1,0} parameter(0), sharding={devices=[4,2]<=[8]}
  %param.2 = bf16[4,16]{1,0} parameter(1)
  %param.3 = f32[64,8]{1,0} parameter(2)
  %ag-start = (f32[16,8]{1,0}, f32[64,8]{1,0}) all-gather-start(%param.1), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true, metadata={op_name="body=%unused"}
  %ag-done = f32[64,8]{1,0} all-gather-done(%ag-start)
  %ar-start = f32[16,8]{1,0} all-reduce-start(%param.1), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ar-done = f32[16,8]{1,0} all-reduce-done(%ar-start)
  %cp-start = (f32[16,8]{1,0}, f32[16,8]{1,0}, u32[], u32[]) collective-permute-start(%ar-done), channel_id=3, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  %cp-done = f32[16,8]{1,0} collective-permute-done(%cp-start)
  %a2a = (bf16[4,16]{1,0}, bf16[4,16]{1,0}, bf16[4,16]{1,0}, bf16[4,16]{1,0}) all-to-all(%param.2, /*index=1*/%param.2, %param.2, %param.2), channel_id=4, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}
  %rs-start = ((f32[64,8]{1,0}), f32[16,8]{1,0}) async-start(%param.3), calls=%rs_wrapped
  %rs-done = f32[16,8]{1,0} async-done(%rs-start), calls=%rs_wrapped
  %pair = (f32[16,8]{1,0}, f32[16,8]{1,0}) all-reduce(%param.1, %param.1), channel_id=6, replica_groups={}, use_global_device_ids=true, to_apply=%add
  %meshed = f32[16,8]{1,0} all-reduce(%param.1), channel_id=8, replica_groups=mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_1'}, use_global_device_ids=true, to_apply=%add
  ROOT %self = f32[16,8]{1,0} collective-permute(%cp-done), channel_id=7, source_target_pairs={{0,0},{1,1}}
}
"""


def test_literal_module_async_tuple_and_unreachable_forms():
    ops = hlo.collectives_in_text(MODULE)
    by_name = {op.name: op for op in ops}
    # Async pairs count once (from -start); the async-wrapped reduce-scatter once; the
    # all-reduce in the unreferenced computation (named only in metadata) not at all.
    assert sorted(by_name) == [
        "a2a", "ag-start", "ar-start", "cp-start", "meshed", "pair", "rs", "self"]
    gathered = 64 * 8 * F32
    assert (by_name["ag-start"].shape, by_name["ag-start"].group_size) == ((64, 8), 4)
    assert by_name["ag-start"].bytes_sent == 3 * gathered // 4
    block = 16 * 8 * F32
    assert (by_name["ar-start"].group_size, by_name["ar-start"].bytes_sent) == (8, 2 * 7 * block // 8)
    assert (by_name["cp-start"].group_size, by_name["cp-start"].bytes_sent) == (2, block)
    assert by_name["self"].bytes_sent == 0  # every pair sends to itself
    a2a = by_name["a2a"]
    assert (a2a.dtype, a2a.group_size, a2a.buffer_bytes) == ("bf16", 4, 4 * 4 * 16 * 2)
    assert a2a.bytes_sent == 3 * (4 * 4 * 16 * 2) // 4
    assert a2a.shape_text == "4 x bf16[4,16]"
    assert (by_name["rs"].group_size, by_name["rs"].bytes_sent) == (4, 3 * gathered // 4)
    # replica_groups={} with global ids: one group of all 8 devices; both arrays charged.
    pair = by_name["pair"]
    assert pair.group_size == 8 and pair.shape == ((16, 8), (16, 8))
    assert pair.bytes_sent == 2 * 7 * (2 * block) // 8
    # The mesh spelling with device_ids runs past its inner commas up to `{axes}`.
    meshed = by_name["meshed"]
    assert meshed.groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert meshed.bytes_sent == 2 * 1 * block // 2
    counts = hlo.count_kinds(ops)
    assert counts == {"all-gather": 1, "all-reduce": 3, "reduce-scatter": 1,
                      "collective-permute": 2, "all-to-all": 1}


def test_literal_module_with_an_undefined_operand_raises():
    broken = MODULE.replace("all-to-all(%param.2,", "all-to-all(%nowhere,")
    with pytest.raises(ValueError, match="nowhere"):
        hlo.collectives_in_text(broken)


def test_parse_shape_flattens_tuples_and_reads_dtypes():
    buffers = hlo_text.parse_shape("(f32[4,16]{1,0}, (bf16[], pred[3]), s4[8], f8e4m3fn[2,2])")
    assert [(b.dtype, b.shape, b.nbytes) for b in buffers] == [
        ("f32", (4, 16), 256), ("bf16", (), 2), ("pred", (3,), 3), ("s4", (8,), 4),
        ("f8e4m3fn", (2, 2), 4)]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: hlo.format_bytes(float("nan")), checks.InputError, "finite"),
    (lambda: hlo.format_bytes("12"), checks.InputTypeError, "real number"),
    (lambda: hlo.ring_bytes("all-gather", -8, 4), checks.InputError, "buffer_bytes"),
    (lambda: hlo.ring_bytes("all-gather", 8, 0), checks.InputError, "group_size"),
    (lambda: hlo.ring_bytes("gather", 8, 4), checks.InputError, "unknown collective kind"),
    (lambda: hlo.collectives(lambda x, axis: x, jnp.ones(4), "x"), checks.InputTypeError,
     "functools.partial"),
    (lambda: hlo.collective_counts(lambda x: x), TypeError, "argument"),
    (lambda: hlo.collective_counts("f", jnp.ones(2)), checks.InputTypeError, "function"),
    (lambda: hlo.collectives_in_text(12), checks.InputTypeError, "compiled program"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_text_readers_accept_a_compiled_program():
    compiled = hlo.compile(lambda x: x * 2, jnp.ones(4))
    assert hlo.collectives_in_text(compiled) == []


def test_xla_cpu_peak_memory_leaves_out_the_temporaries():
    """Why MemoryStats.peak_bytes is the bound, not XLA's peak_memory_in_bytes: on XLA:CPU
    the latter is arguments + outputs (to within a few bytes), with no temporaries."""
    x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh_of(8), P("x")))
    stats = hlo.memory_per_device(lambda a: jnp.tanh(a @ a.T) @ a, x)
    assert stats.temp_bytes > 0
    assert abs(stats.xla_peak_bytes - (stats.argument_bytes + stats.output_bytes)) <= 64


@pytest.mark.slow
def test_fast_compile_leaves_counts_memory_and_results_unchanged():
    """FAST_COMPILE skips only LLVM's optimization of the CPU code: the collectives, FLOPs,
    bytes and memory analysis the book reads are those of the full compile."""
    from spmd_guide.rooflines import roofline
    from spmd_guide.transformer import transformer

    config = transformer.Config(vocab=64, d_model=64, n_heads=8, d_ff=128, n_layers=1,
                                seq_len=32)
    strategy = transformer.STRATEGIES["tp"]
    mesh = strategy.mesh(jax.devices())
    params = transformer.init_params(jax.random.key(0), config)
    params, tokens = strategy.shard(params, jnp.zeros((8, 33), jnp.int32), mesh)
    lowered = jax.jit(jax.value_and_grad(strategy.loss(mesh, config))).lower(params, tokens)
    full, fast = lowered.compile(), lowered.compile(hlo.FAST_COMPILE)
    assert roofline.counts(fast) == roofline.counts(full)
    assert hlo.memory_per_device(fast) == hlo.memory_per_device(full)
    assert hlo.collectives_in_text(fast.as_text()) == hlo.collectives_in_text(full.as_text())
    loss_full, _ = full(params, tokens)
    loss_fast, _ = fast(params, tokens)
    assert float(loss_fast) == pytest.approx(float(loss_full), rel=1e-6)


ASYNC_WRAPPED = """\
HloModule m, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%async_rs (p0: f32[16]) -> f32[4] {
  %p0 = f32[16]{0} parameter(0)
  ROOT %rs = f32[4]{0} reduce-scatter(%p0), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}

ENTRY %main (a: f32[16]) -> f32[4] {
  %a = f32[16]{0} parameter(0)
  %start = ((f32[16]{0}), f32[4]{0}) async-start(%a), calls=%async_rs
  ROOT %done = f32[4]{0} async-done(%start)
}
"""


def test_a_collective_wrapped_in_async_start_is_counted_once():
    """Backends that run a reduce-scatter or all-to-all asynchronously wrap it in a generic
    async-start/async-done pair that calls a computation holding the collective (the
    chapter says so): the reader finds it there, once."""
    (op,) = hlo.collectives_in_text(ASYNC_WRAPPED)
    assert (op.kind, op.group_size, op.computation) == ("reduce-scatter", 4, "async_rs")
    assert op.bytes_sent == 3 * 16 * F32 // 4


# XLA:TPU's reduce-scatter: a kCustom fusion calling %all-reduce-scatter.N, which all-reduces
# its inputs and keeps each device's slice (trimmed from a compiled v5e program).
TPU_REDUCE_SCATTER = """\
HloModule m, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%all-reduce-scatter.3 (input_0: f32[512,1024], input_1: f32[1024,512]) -> (f32[64,1024], f32[128,512]) {
  %input_0 = f32[512,1024]{1,0} parameter(0)
  %input_1 = f32[1024,512]{1,0} parameter(1)
  %all-reduce.10 = (f32[512,1024]{1,0}, f32[1024,512]{1,0}) all-reduce(%input_0, %input_1), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %get-tuple-element = f32[512,1024]{1,0} get-tuple-element(%all-reduce.10), index=0
  %partition-id.7 = u32[] partition-id()
  %constant.78 = u32[] constant(64)
  %multiply.14 = u32[] multiply(%partition-id.7, %constant.78)
  %constant.79 = u32[] constant(0)
  %dynamic-slice.16 = f32[64,1024]{1,0} dynamic-slice(%get-tuple-element, %multiply.14, %constant.79), dynamic_slice_sizes={64,1024}
  %get-tuple-element.2 = f32[1024,512]{1,0} get-tuple-element(%all-reduce.10), index=1
  %constant.80 = u32[] constant(128)
  %multiply.15 = u32[] multiply(%partition-id.7, %constant.80)
  %dynamic-slice.18 = f32[128,512]{1,0} dynamic-slice(%get-tuple-element.2, %multiply.15, %constant.79), dynamic_slice_sizes={128,512}
  ROOT %tuple.3 = (f32[64,1024]{1,0}, f32[128,512]{1,0}) tuple(%dynamic-slice.16, %dynamic-slice.18)
}

%all-reduce.1 (a: f32[64]) -> f32[64] {
  %a = f32[64]{0} parameter(0)
  ROOT %ar = f32[64]{0} all-reduce(%a), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
}

ENTRY %main (g0: f32[512,1024], g1: f32[1024,512], b: f32[64]) -> (f32[64,1024], f32[128,512], f32[64]) {
  %g0 = f32[512,1024]{1,0} parameter(0)
  %g1 = f32[1024,512]{1,0} parameter(1)
  %b = f32[64]{0} parameter(2)
  %fusion.24 = (f32[64,1024]{1,0}, f32[128,512]{1,0}) fusion(%g0, %g1), kind=kCustom, calls=%all-reduce-scatter.3
  %fusion.25 = f32[64]{0} fusion(%b), kind=kCustom, calls=%all-reduce.1
  %r0 = f32[64,1024]{1,0} get-tuple-element(%fusion.24), index=0
  %r1 = f32[128,512]{1,0} get-tuple-element(%fusion.24), index=1
  ROOT %out = (f32[64,1024]{1,0}, f32[128,512]{1,0}, f32[64]{0}) tuple(%r0, %r1, %fusion.25)
}
"""


def test_xla_tpu_reduce_scatter_fusion_counts_as_a_reduce_scatter():
    """The all-reduce inside %all-reduce-scatter.N is a reduce-scatter: (n-1)/n of its
    inputs on the wire, not an all-reduce's 2(n-1)/n; a plain all-reduce stays one."""
    ops = hlo.collectives_in_text(TPU_REDUCE_SCATTER)
    (rs,) = [op for op in ops if op.computation == "all-reduce-scatter.3"]
    (ar,) = [op for op in ops if op.computation == "all-reduce.1"]
    assert (rs.kind, rs.group_size, rs.computation) == ("reduce-scatter", 8,
                                                        "all-reduce-scatter.3")
    assert rs.shape == ((512, 1024), (1024, 512))
    assert rs.bytes_sent == 7 * (2 * 512 * 1024 * F32) // 8
    assert (ar.kind, ar.bytes_sent) == ("all-reduce", 2 * 7 * 64 * F32 // 8)
    assert hlo.count_kinds([rs, ar])["reduce-scatter"] == 1


@pytest.mark.parametrize("name, expected", [
    ("all-reduce-scatter", True), ("all-reduce-scatter.3", True),
    ("all-reduce-scatter.3.clone.1", True), ("all-reduce.3", False),
    ("my-all-reduce-scatter.3", False), ("all-reduce-scatterer", False)])
def test_is_reduce_scatter_fusion_matches_xla_tpu_names_only(name, expected):
    assert hlo.is_reduce_scatter_fusion(name) is expected
