"""programs: strategies compiled by XLA:TPU; the facts Part XIV's pages state."""

import re

import pytest

from spmd_guide.core import checks, hlo
from spmd_guide.tpu import programs


def test_replicated_weights_do_not_fit_a_v5e_chip_and_fsdp_does():
    # tpu/compiling: XLA:TPU refuses at compile time a program that does not fit one chip.
    with pytest.raises(programs.DoesNotFit) as err:
        programs.compile_strategy("mlp", "auto_dp", "v5e:2x4")
    assert err.value.available == "15.75G"
    assert float(err.value.needed.rstrip("G")) > 15.75
    row = programs.fit_row("mlp", "dp", "v5e:2x4")
    # XLA's G is GiB: the limit it prints is 15.75 x 2^30 B, and the row's units agree.
    assert programs.available_hbm("v5e:2x4") == 15.75 * 2**30
    assert row["fits"].startswith("no") and float(row["GiB per device"]) > 15.75
    assert float(row["of the 15.75 GiB usable"].rstrip("%")) > 100
    fsdp = programs.compile_strategy("mlp", "fsdp", "v5e:2x4")
    assert fsdp.chip == "tpu-v5e"
    assert 0 < fsdp.memory.peak_bytes < fsdp.hbm_bytes
    fits = programs.fit_row("mlp", "fsdp", "v5e:2x4")
    assert fits["fits"] == "yes"
    assert float(fits["GiB per device"]) == round(fsdp.memory.peak_bytes / 2**30, 2)
    assert hlo.count_kinds(fsdp.collectives)["reduce-scatter"] > 0


def test_fsdp_gathers_float32_weights_as_bfloat16():
    # tpu/strategies: every parameter is float32, the weight gathers move bf16.
    program = programs.compile_strategy("transformer", "fsdp", "v5p:2x2x2")
    gathers = {re.search(r'op_name="([^"]*)"', op.line).group(1): op.dtype
               for op in program.collectives if op.kind == "all-gather"}
    matmul_weights = {n: d for n, d in gathers.items() if "blocks" in n or "unembed" in n}
    lookups = {n: d for n, d in gathers.items() if n not in matmul_weights}
    assert len(matmul_weights) >= 6 and set(matmul_weights.values()) == {"bf16"}
    assert lookups and set(lookups.values()) == {"f32"}  # the embedding, read by a gather
    assert program.row()["gathers move"] == "bf16/f32"
    cost = program.cost_row()
    assert float(cost["FLOPs (XLA:TPU)"]) > 0 and cost["roofline bound"].endswith("µs")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp", "fsdp", "tp", "tp_sp", "cp", "fsdp_tp"])
@pytest.mark.parametrize("slice_", ["v4:2x2x2", "v5e:2x4", "v6e:2x4"])
def test_every_transformer_strategy_compiles_on_three_generations(name, slice_):
    program = programs.compile_strategy("transformer", name, slice_)
    counts = hlo.count_kinds(program.collectives)
    expected = {"dp": "all-reduce", "fsdp": "all-gather", "tp": "all-reduce",
                "tp_sp": "all-gather", "cp": "collective-permute", "fsdp_tp": "all-gather"}
    assert counts[expected[name]] > 0
    if name == "cp":  # tpu/strategies, exercise 1: the ring's permutes are its most common op
        assert max(counts, key=counts.get) == "collective-permute"
    assert 0 < program.memory.peak_bytes < program.hbm_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name", ["auto_fsdp", "fsdp", "tp", "auto_2d"])
def test_strategies_that_split_the_weights_fit(name):
    assert programs.fit_row("mlp", name, "v5e:2x4")["fits"] == "yes"


@pytest.mark.parametrize(("args", "kwargs", "error"), [
    (("cnn", "dp", "v5e:2x4"), {}, checks.InputError),
    (("mlp", "single", "v5e:2x4"), {}, checks.InputError),
    (("mlp", "dp", "v5e:2x4"), {"depth": 3}, checks.InputError),
    (("mlp", "dp", "v5e:2x4"), {"batch": 0}, checks.InputError),
    (("mlp", "dp", "v5e:2x4"), {"batch": 2.0}, checks.InputTypeError),
    (("transformer", "dp", "v5e:2x4"), {"width": 3}, checks.InputError),
    (("transformer", "tp", "v5e:2x4"), {"n_heads": 3, "d_model": 96}, checks.InputError),
    (("mlp", "dp", "v5e:2x4"), {"compiler_options": {1: True}}, checks.InputError),
])
def test_bad_arguments_are_refused_before_compiling(args, kwargs, error):
    with pytest.raises(error):
        programs.compile_strategy(*args, **kwargs)


def test_negative_estimates_are_shown_as_none_given_without_libtpu():
    assert programs._us(-1.2e-5) == "none given"
    assert programs._us(2.5e-5) == "25 µs"
    assert programs._us(1.234e-8) == "0.0123 µs"


@pytest.mark.parametrize("text, expected", [
    ("15.75G", 15.75 * 2**30), ("512M", 512 * 2**20), ("3K", 3072), ("12", 12.0),
    (" 1.5T ", 1.5 * 2**40)])
def test_xla_sizes_are_binary_without_libtpu(text, expected):
    assert programs.xla_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "15.75 GB", "G", "-1G", "1e9"])
def test_xla_bytes_refuses_what_xla_does_not_print_without_libtpu(bad):
    with pytest.raises(checks.InputError, match="text"):
        programs.xla_bytes(bad)


def test_small_fsdp_and_tp_sp_all_reduce_where_the_designs_reduce_scatter():
    """tpu/strategies: at TRANSFORMER's widths XLA:TPU all-reduces fsdp's whole gradients in
    one op and tp_sp's activations, with no reduce-scatter in either program."""
    fsdp = programs.compile_strategy("transformer", "fsdp", "v5p:2x2x2")
    assert hlo.count_kinds(fsdp.collectives)["reduce-scatter"] == 0
    widest = max((op for op in fsdp.collectives if op.kind == "all-reduce"),
                 key=lambda op: len(op.buffers))
    assert (256, 64) in [b.shape for b in widest.buffers]  # a whole d_model x d_ff gradient
    tp_sp = programs.compile_strategy("transformer", "tp_sp", "v4:2x2x2")
    assert hlo.count_kinds(tp_sp.collectives)["reduce-scatter"] == 0


@pytest.mark.slow
def test_wider_fsdp_has_the_same_kinds_in_other_numbers():
    wide = programs.compile_strategy("transformer", "fsdp", "v5p:2x2x2", d_model=1024, d_ff=4096)
    small = programs.compile_strategy("transformer", "fsdp", "v5p:2x2x2")
    assert wide.row()["collectives"] == programs.WIDE_FSDP_V5P
    assert set(hlo.count_kinds(wide.collectives).items()) != set(
        hlo.count_kinds(small.collectives).items())
    assert {k for k, n in hlo.count_kinds(wide.collectives).items() if n} == {
        k for k, n in hlo.count_kinds(small.collectives).items() if n}
