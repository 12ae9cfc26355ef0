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
    (lambda: hardware.get_chips(["h200", "nope"]), InputError, "nope"),
    (lambda: hardware.load_chips(5), InputTypeError, "path"),
    (lambda: hardware.get_chip("tpu-v9"), InputError, "tpu-v5e"),
    (lambda: hardware.get_chip(5), InputTypeError, "chip"),
    (lambda: hardware.load_chips("no/such/chips.toml"), InputError, "chips.toml"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
