"""Tests for spmd_guide.rooflines.hardware: the chips file (every rate cited, SI units, the
figures as published), its loader's refusals, looking chips up by name, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.rooflines import hardware

REQUIRED = {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "h100-sxm", "h200", "b200"}


def test_every_required_chip_is_listed_with_a_source():
    assert REQUIRED <= set(hardware.CHIPS)
    for key, chip in hardware.CHIPS.items():
        assert chip.key == key
        assert chip.source.split()[0].startswith("https://"), key
        assert chip.read_via and chip.date_read.count("-") == 2
        assert chip.interconnect and chip.network
        assert set(chip.cite) == set(hardware.CITED), key  # every rate cites its figure
        assert all(len(text) > 20 for text in chip.cite.values()), key
        assert [row["rate"] for row in chip.citations()] == list(hardware.CITED)
        assert chip.topology in hardware.TOPOLOGIES


@pytest.mark.parametrize("key", sorted(REQUIRED))
def test_chip_numbers_are_plain_floats_in_si_units(key):
    chip = hardware.CHIPS[key]
    for name in hardware.UNITS:
        assert type(getattr(chip, name)) is float
    # SI, not tera- or giga-: plausible ranges for 2021-2025 accelerators.
    assert 1e14 <= chip.peak_flops_bf16 <= 1e16
    assert 8e9 <= chip.hbm_bytes <= 3e11
    assert 5e11 <= chip.hbm_bandwidth <= 2e13
    assert 1e10 <= chip.interconnect_bandwidth <= 2e12
    assert 1e9 <= chip.network_bandwidth < chip.interconnect_bandwidth
    assert 50 < chip.ridge < 1000


def test_published_figures_as_read():
    assert hardware.CHIPS["tpu-v5e"].peak_flops_bf16 == 1.97e14
    assert hardware.CHIPS["tpu-v5e"].hbm_bandwidth == 8.19e11
    assert hardware.CHIPS["h100-sxm"].peak_flops_bf16 == 9.89e14  # half the sparse 1,979 TFLOPS
    assert hardware.CHIPS["h100-sxm"].interconnect_bandwidth == 4.5e11  # 900 GB/s bidirectional
    assert hardware.CHIPS["tpu-v5p"].network_bandwidth == 50e9 / 8  # 50 Gbps per chip
    # Google prints the TPU v4 and (current revision) v5p capacities in GiB.
    assert hardware.CHIPS["tpu-v4"].hbm_bytes == 32 * 2**30
    assert hardware.CHIPS["tpu-v5p"].hbm_bytes == 95 * 2**30
    assert "32 GiB" in hardware.CHIPS["tpu-v4"].cite["hbm_bytes"]
    # v5e's and v6e's "16 GB"/"32 GB" are binary too: XLA:TPU's out-of-memory limit says so.
    assert hardware.CHIPS["tpu-v5e"].hbm_bytes == 16 * 2**30
    assert hardware.CHIPS["tpu-v6e"].hbm_bytes == 32 * 2**30
    assert "15.75G" in hardware.CHIPS["tpu-v5e"].cite["hbm_bytes"]


def _write(tmp_path, text):
    path = tmp_path / "chips.toml"
    path.write_text(text)
    return path


GOOD = """[chip.x]
name = "X"
peak_flops_bf16 = 1e14
hbm_bytes = 1e10
hbm_bandwidth = 1e12
interconnect_bandwidth = 1e11
interconnect = "links"
network_bandwidth = 1e10
network = "dcn"
topology = "switch"
source = "https://example.org"
read_via = "a copy"
date_read = "2026-11-23"

[chip.x.cite]
peak_flops_bf16 = "p"
hbm_bytes = "c"
hbm_bandwidth = "b"
interconnect_bandwidth = "i"
network_bandwidth = "n"
topology = "t"
"""


@pytest.mark.parametrize("edit, word", [
    (lambda t: t.replace('date_read = "2026-11-23"\n', 'date_read = "2026-11-23"\ncolour = "red"\n'),
     "unknown"),
    (lambda t: t.replace('source = "https://example.org"\n', ""), "missing"),
    (lambda t: t.replace('"https://example.org"', '"  "'), "source"),
    (lambda t: t.replace("hbm_bytes = 1e10", "hbm_bytes = -1.0"), "positive"),
    (lambda t: t.replace("hbm_bytes = 1e10", "hbm_bytes = nan"), "finite"),
    (lambda t: t.replace("hbm_bytes = 1e10", 'hbm_bytes = "16 GB"'), "real number"),
    (lambda t: t.replace('network_bandwidth = "n"\n', ""), "cite"),
    (lambda t: t.replace('network_bandwidth = "n"', 'network_bandwidth = " "'), "cite"),
    (lambda t: t.split("[chip.x.cite]")[0], "missing"),
    (lambda t: "", "no"),
])
def test_loader_refuses_bad_entries(tmp_path, edit, word):
    assert hardware.load_chips(_write(tmp_path, GOOD))["x"].hbm_bytes == 1e10
    with pytest.raises(ValueError, match=word):
        hardware.load_chips(_write(tmp_path, edit(GOOD)))


def test_a_chip_sends_over_its_interconnect_or_its_network():
    chip = hardware.CHIPS["h100-sxm"]
    assert chip.link_bandwidth() == chip.link_bandwidth("interconnect") == 4.5e11
    assert chip.link_bandwidth(np.str_("network")) == chip.network_bandwidth == 5e10
    with pytest.raises(InputError, match="link"):
        chip.link_bandwidth("pcie")


def test_choice_takes_one_whole_name():
    assert hardware.choice("link", np.str_("network"), hardware.LINKS) == "network"
    assert type(hardware.choice("link", np.str_("network"), hardware.LINKS)) is str
    with pytest.raises(InputTypeError, match="one name"):
        hardware.choice("link", ["network"], hardware.LINKS)
    with pytest.raises(InputError, match="link"):
        hardware.choice("link", "net", hardware.LINKS)


def test_numpy_names_work_wherever_python_ones_do():
    assert [c.key for c in hardware.get_chips(np.array(["h200", "b200", "h200"]))] == ["h200", "b200"]
    assert [c.key for c in hardware.get_chips("h100-sxm")] == ["h100-sxm"]  # a name, not letters


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, error, word", [
    (lambda: hardware.get_chip(["h200"]), InputTypeError, "chip"),
    (lambda: hardware.get_chip("h"), InputError, "unknown chip 'h'"),
    (lambda: hardware.get_chips([]), InputError, "empty"),
    (lambda: hardware.get_chips({"h200": 1}), InputTypeError, "chips"),
    (lambda: hardware.get_chips({"h200", "b200"}), InputTypeError, "a set has no order"),
    (lambda: hardware.get_chips(["h200", "nope"]), InputError, "nope"),
    (lambda: hardware.load_chips(5), InputTypeError, "path"),
    (lambda: hardware.get_chip("tpu-v9"), InputError, "tpu-v5e"),
    (lambda: hardware.get_chip(5), InputTypeError, "chip"),
    (lambda: hardware.load_chips("no/such/chips.toml"), InputError, "chips.toml"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


# --------------------------------------------------------------------------- topology


@pytest.mark.parametrize("chip, axis, slice_chips, wraps", [
    ("tpu-v5e", 8, 8, True),     # all 8 chips of a 2x4: a cycle through every chip
    ("tpu-v5e", 4, 8, False),    # the long axis of a 2x4 has no wraparound link
    ("tpu-v5e", 2, 8, False),
    ("tpu-v6e", 4, None, True),  # a 2x2 slice of its own: a cycle of 4
    ("tpu-v6e", 16, 256, True),  # a full axis of a 16x16 pod wraps
    ("tpu-v6e", 8, 128, False),  # the short axis of an 8x16 does not
    ("tpu-v4", 8, 8, True),      # the 2x2x2 cube: a cycle through its 8 chips
    ("tpu-v4", 4, 8, False),
    ("tpu-v5p", 2, 8, False),
    ("tpu-v5p", 2, None, False),  # two chips joined by one link: a line
    ("tpu-v5p", 4, 64, True),    # a 4x4x4 cube has its optical wraparounds
    ("tpu-v5p", 4, 16, False),   # a 2x2x4 has none
    ("h100-sxm", 2, 8, True),    # NVSwitch: every GPU to every other
    ("b200", 4, 8, True),
    ("h200", 1, 8, True),
])
def test_which_axes_are_rings(chip, axis, slice_chips, wraps):
    assert hardware.axis_wraps(chip, axis, slice_chips=slice_chips) is wraps
    assert hardware.topology_factor(chip, axis, slice_chips=slice_chips) == (1 if wraps else 2)


def test_every_chip_says_how_its_links_join_and_where_that_was_read():
    for chip in hardware.CHIPS.values():
        source = chip.cite["topology"]
        if chip.topology == "switch":
            assert "NVSwitch" in source and chip.key[0] in "hb"
        else:
            assert chip.key.startswith("tpu") and "tpus.md" in source
            assert "doubles the time of most communication" in source  # the book's words
            shape = "x".join(map(str, hardware.SLICE_OF_8[chip.topology]))
            assert f"The 8-chip slice is {shape}" in source


@pytest.mark.parametrize("text, word", [
    ("[chip.x\nname = 1\n", "not valid TOML"),
    ("chip = 3\n", "must be a table"),
    ("[chip]\nx = 3\n", "chip 'x' must be a"),
    (GOOD.replace('topology = "switch"', 'topology = "ring"'), "topology"),
    (GOOD.replace('topology = "t"\n', ""), "cite"),
])
def test_a_malformed_chips_file_is_named_in_the_error(tmp_path, text, word):
    path = _write(tmp_path, text)
    with pytest.raises(InputError, match=word) as info:
        hardware.load_chips(path)
    assert str(path) in str(info.value)


def test_an_unreadable_chips_file_is_named_in_the_error(tmp_path):
    path = tmp_path / "chips.toml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="cannot read") as info:
        hardware.load_chips(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("call, error, word", [
    (lambda: hardware.axis_wraps("tpu-v5e", 0), InputError, "axis_length"),
    (lambda: hardware.axis_wraps("tpu-v5e", True), InputTypeError, "axis_length"),
    (lambda: hardware.axis_wraps("tpu-v5e", "4"), InputTypeError, "axis_length"),
    (lambda: hardware.axis_wraps("tpu-v5e", 4.0), InputTypeError, "axis_length"),
    (lambda: hardware.axis_wraps("tpu-v5e", 8, slice_chips=4), InputError, "slice_chips=4"),
    (lambda: hardware.axis_wraps("tpu-v5e", 4, slice_chips=True), InputTypeError, "slice_chips"),
    (lambda: hardware.axis_wraps("tpu-v5e", 4, slice_chips=10**6), InputError, "slice_chips"),
    (lambda: hardware.axis_wraps("tpu-v9", 4), InputError, "unknown chip 'tpu-v9'"),
    (lambda: hardware.axis_wraps(["tpu-v5e"], 4), InputTypeError, "chip"),
    (lambda: hardware.topology_factor("h200", -2), InputError, "axis_length"),
    (lambda: hardware.get_chip(b"h200"), InputTypeError, "chip"),
    (lambda: hardware.get_chips({"h200": 1}), InputTypeError, "chips"),
    (lambda: hardware.get_chips({"h200", "b200"}), InputTypeError, "a set has no order"),
    (lambda: hardware.get_chips(["h200", "h9"]), InputError, "an entry of chips"),
    (lambda: hardware.load_chips(b"/x"), InputTypeError, "path"),
    (lambda: hardware.load_chips("/nonexistent/chips.toml"), InputError, "not a file"),
    (lambda: hardware.CHIPS["h200"].link_bandwidth(["network"]), InputTypeError, "link"),
])
def test_bad_input_names_the_argument(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_a_gpu_group_longer_than_a_node_is_refused():
    """T5-M2: NVSwitch joins the 8 GPUs of a node; a longer group crosses the network."""
    assert hardware.axis_wraps("h100-sxm", 8) is True
    for chip in ("h100-sxm", "h200", "b200"):
        with pytest.raises(InputError, match="axis_length=16.*link='network'"):
            hardware.axis_wraps(chip, 16)
    assert hardware.axis_wraps("tpu-v5e", 16) is True  # a full v5e axis wraps


def test_layout_factor_prices_groups_by_their_chips():
    quads = ((0, 2, 4, 6), (1, 3, 5, 7))
    pairs = ((0, 1), (2, 3), (4, 5), (6, 7))
    assert hardware.layout_factor("tpu-v4", (4, 2), quads) == 1.0  # a 2x2 face
    assert hardware.layout_factor("tpu-v5e", (4, 2), quads) == 2.0  # scattered
    assert hardware.layout_shapes("tpu-v5p", (4, 2), quads) == ["scattered", "scattered"]
    assert hardware.layout_factor("tpu-v5e", (4, 2), pairs) == 2.0  # neighbours: a line
    assert hardware.layout_factor("tpu-v6e", (8,), (tuple(range(8)),)) == 1.0
    assert hardware.layout_factor("h100-sxm", (4, 2), quads) is None  # not a torus
    assert hardware.layout_factor("tpu-v5e", (16,), (tuple(range(16)),)) is None
    with pytest.raises(InputError, match="position 8"):
        hardware.layout_factor("tpu-v5e", (4, 2), ((0, 8),))
    with pytest.raises(InputTypeError, match="groups"):
        hardware.layout_factor("tpu-v5e", (4, 2), "0123")
