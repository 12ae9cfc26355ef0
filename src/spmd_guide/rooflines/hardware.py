"""Chips as data: the accelerators of ``chips.toml``, loaded, checked and looked up by name.

Every rate a prediction divides by (peak dense bf16 FLOP/s, HBM bytes and bandwidth, the
interconnect and network bandwidths) lives in ``chips.toml`` beside this module, each with the
page it was published on and the figure it was read from. :data:`CHIPS` is that file loaded
once; :func:`get_chip` and :func:`get_chips` turn names into :class:`Chip` entries.

The page rooflines/rooflines shows the table and its sources ("The chips, as data"); every page
that prices a program on a chip reads :data:`CHIPS` (rooflines/parallelism,
rooflines/transformer, serving/prefill_decode, checkpointing/resuming), through
:mod:`spmd_guide.rooflines.roofline` or directly.

A rate that is not a positive finite number, an entry without a source or a citation per rate,
and a chip name that is not a whole key are refused with :mod:`spmd_guide.core.checks`'s
errors; NumPy strings and arrays of names are taken wherever Python ones are.
"""

from __future__ import annotations

import os
import tomllib
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from spmd_guide.core import checks

CHIPS_FILE = Path(__file__).with_name("chips.toml")

#: Numeric fields of a chip: name -> unit (SI), for tables and checks.
UNITS = {
    "peak_flops_bf16": "FLOP/s",
    "hbm_bytes": "B",
    "hbm_bandwidth": "B/s",
    "interconnect_bandwidth": "B/s",
    "network_bandwidth": "B/s",
}
#: The links a chip sends over: its fast interconnect (ICI/NVLink) or the network between
#: slices or nodes (DCN/InfiniBand).
LINKS = ("interconnect", "network")


def choice(name: str, value: Any, options: Iterable[str]) -> str:
    """``value`` if it is one of the strings ``options``, compared as a whole string (a
    NumPy string too); anything else, a list or an array of names included, is refused."""
    options = tuple(options)
    if not isinstance(value, str):
        raise checks.InputTypeError(
            f"{name} must be one name (a string) such as {options[0]!r}, got {value!r} "
            f"({type(value).__name__}); choose one of {', '.join(map(repr, options))}.")
    return str(checks.one_of(name, str(value), options))


@dataclass(frozen=True)
class Chip:
    """One accelerator's published rates (SI units) and where they were published."""

    key: str
    name: str
    peak_flops_bf16: float
    hbm_bytes: float
    hbm_bandwidth: float
    interconnect_bandwidth: float
    interconnect: str
    network_bandwidth: float
    network: str
    source: str
    read_via: str
    date_read: str
    #: For each rate of :data:`UNITS`, the published figure it comes from and the arithmetic.
    cite: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in ("key", "name", "interconnect", "network", "source", "read_via",
                     "date_read"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise checks.InputError(
                    f"chip {self.key!r}: {name} must be a non-empty string (every number "
                    f"needs its source), got {value!r}.")
        for name, unit in UNITS.items():
            value = checks.real(f"chip {self.key!r}: {name} (in {unit})", getattr(self, name),
                                positive=True)
            object.__setattr__(self, name, value)
        if not isinstance(self.cite, Mapping):
            raise checks.InputTypeError(
                f"chip {self.key!r}: cite must map each rate to its source, got {self.cite!r}.")
        missing = sorted(set(UNITS) - set(self.cite))
        unknown = sorted(set(self.cite) - set(UNITS))
        empty = sorted(k for k, v in self.cite.items() if not isinstance(v, str) or not v.strip())
        if missing or unknown or empty:
            raise checks.InputError(
                f"chip {self.key!r}: cite needs one non-empty source per rate; missing "
                f"{missing}, unknown {unknown}, empty {empty}; the rates are {sorted(UNITS)}.")
        object.__setattr__(self, "cite", types.MappingProxyType(dict(self.cite)))

    @property
    def ridge(self) -> float:
        """FLOPs per HBM byte at which compute time equals memory time (the roofline's knee)."""
        return self.peak_flops_bf16 / self.hbm_bandwidth

    @property
    def comm_ridge(self) -> float:
        """FLOPs per byte sent at which compute time equals interconnect time."""
        return self.peak_flops_bf16 / self.interconnect_bandwidth

    def row(self) -> dict[str, Any]:
        """A table row: the rates in engineering units, and the source."""
        return {
            "chip": self.key,
            "bf16 TFLOP/s": f"{self.peak_flops_bf16 / 1e12:g}",
            "HBM GB": f"{self.hbm_bytes / 1e9:.3g}",
            "HBM TB/s": f"{self.hbm_bandwidth / 1e12:g}",
            "ring GB/s": f"{self.interconnect_bandwidth / 1e9:g}",
            "network GB/s": f"{self.network_bandwidth / 1e9:g}",
        }

    def citations(self) -> list[dict[str, str]]:
        """Table rows: each rate of this chip, its SI value and where it was published."""
        return [{"chip": self.key, "rate": name, "value": f"{getattr(self, name):.4g} {unit}",
                 "source": self.cite[name]} for name, unit in UNITS.items()]

    def link_bandwidth(self, link: str = "interconnect") -> float:
        """Bytes per second one chip sends over ``link``: ``"interconnect"`` (ICI/NVLink) or
        ``"network"`` (DCN/InfiniBand, across slices or nodes)."""
        return (self.network_bandwidth if choice("link", link, LINKS) == "network"
                else self.interconnect_bandwidth)


def load_chips(path: str | os.PathLike[str] = CHIPS_FILE) -> dict[str, Chip]:
    """The chips of a TOML file like ``chips.toml``; refuses unknown or missing fields, a
    rate that is not a positive number (a string such as ``"16 GB"`` included), and an entry
    without a source, or without a citation for each of its rates."""
    if not isinstance(path, (str, os.PathLike)):
        raise checks.InputTypeError(f"path must be a file path, got {path!r}.")
    if not os.path.isfile(path):
        raise checks.InputError(
            f"path {str(path)!r} is not a file; pass a TOML file like {str(CHIPS_FILE)!r}.")
    with open(path, "rb") as file:
        table = tomllib.load(file).get("chip", {})
    wanted = {f.name for f in fields(Chip)} - {"key"}
    chips = {}
    for key, entry in table.items():
        unknown = set(entry) - wanted
        missing = wanted - set(entry)
        if unknown or missing:
            raise checks.InputError(
                f"chip {key!r} in {path}: unknown fields {sorted(unknown)}, missing fields "
                f"{sorted(missing)}; the fields are {sorted(wanted)}.")
        chips[key] = Chip(key=key, **entry)
    if not chips:
        raise checks.InputError(f"{path} lists no [chip.<key>] tables.")
    return chips


CHIPS: dict[str, Chip] = load_chips()


def get_chip(chip: str | Chip, *, name: str = "chip") -> Chip:
    """``chip`` itself, or the entry of :data:`CHIPS` its whole name names."""
    if isinstance(chip, Chip):
        return chip
    if not isinstance(chip, str):
        raise checks.InputTypeError(f"{name} must be a key of CHIPS such as 'tpu-v5e' or a "
                                    f"Chip, got {chip!r} ({type(chip).__name__}).")
    return CHIPS[choice(name, chip, CHIPS)]


def get_chips(chips: str | Chip | Iterable[str | Chip], *, name: str = "chips") -> list[Chip]:
    """A list of chips from one chip (a name or a :class:`Chip`) or several, in order and
    without repeats. A single name is one chip, never its letters."""
    if isinstance(chips, (str, Chip)):
        return [get_chip(chips, name=name)]
    if isinstance(chips, Mapping) or not isinstance(chips, (Sequence, np.ndarray, Iterable)):
        raise checks.InputTypeError(
            f"{name} must be a chip name such as 'h100-sxm' or a sequence of them, got "
            f"{chips!r}.")
    found = {c.key: c for c in (get_chip(item, name=f"an entry of {name}")
                                for item in list(np.asarray(chips, dtype=object).ravel()
                                                 if isinstance(chips, np.ndarray) else chips))}
    if not found:
        raise checks.InputError(f"{name} is empty; name at least one chip of {sorted(CHIPS)}.")
    return list(found.values())
