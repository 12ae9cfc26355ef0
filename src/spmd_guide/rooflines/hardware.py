"""Chips as data: the accelerators of ``chips.toml``, loaded, checked and looked up by name.

Every rate a prediction divides by (peak dense bf16 FLOP/s, HBM bytes and bandwidth, the
interconnect and network bandwidths) lives in ``chips.toml`` beside this module, each with the
page it was published on and the figure it was read from. :data:`CHIPS` is that file loaded
once; :func:`get_chip` and :func:`get_chips` turn names into :class:`Chip` entries.

The page rooflines/rooflines shows the table and its sources ("The chips, as data"); every page
that prices a program on a chip reads :data:`CHIPS` (rooflines/parallelism,
rooflines/transformer, serving/prefill_decode, checkpointing/resuming), through
:mod:`spmd_guide.rooflines.roofline` or directly.

Each chip also says how its fast links join the chips (``topology``: a 2D or 3D torus, or a
GPU node's NVSwitch), and :func:`axis_wraps` turns that and an axis length into the answer
the communication times need: does a collective along this axis run on a ring, or on a line
without the wraparound link, which takes twice as long (:func:`topology_factor`)?

A rate that is not a positive finite number, an entry without a source or a citation per rate,
a file that is not valid TOML (named in the error), and a chip name that is not a whole key
are refused with :mod:`spmd_guide.core.checks`'s
errors; NumPy strings and arrays of names are taken wherever Python ones are.
"""

from __future__ import annotations

import functools
import math
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
#: How a chip's fast links join the chips (``chips.toml``'s ``topology``), in words.
TOPOLOGIES = {
    "torus-2d": "2D torus; an axis wraps around only when it is a full 16 (TPU v5e, v6e)",
    "torus-3d": "3D torus of 4x4x4 cubes; axes wrap only in slices of whole cubes (TPU v4, v5p)",
    "switch": "NVSwitch: every GPU of a node joined to every other (all-to-all)",
}
#: The 8-chip slice of each torus (the slice the pages price 8-device programs on).
SLICE_OF_8 = {"torus-2d": (2, 4), "torus-3d": (2, 2, 2)}
#: The rate :data:`UNITS` does not list but ``cite`` must: where the topology was read.
CITED = (*UNITS, "topology")
#: GPUs an NVSwitch node joins (``chips.toml``: "all-to-all in an 8-GPU node"); a group of
#: more GPUs crosses the network between nodes.
NODE_GPUS = 8
#: How many times a ring's time a collective takes over a group whose chips form each shape
#: of :data:`spmd_guide.meshes.tpu_slices.SHAPES`: a ring 1, a line 2 (its end chips have
#: one link where a ring's have two). A scattered group (no chip next to another) is priced
#: as a line too: an estimate, since its steps cross chips that other groups also use.
SHAPE_FACTORS = {"one chip": 1.0, "ring": 1.0, "line": 2.0, "scattered": 2.0}
#: Keys of every :class:`Chip` built so far (the chips file's and any other file's): what an
#: estimate may name.
KNOWN_KEYS: set[str] = set()


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
    #: How the fast links join the chips: a key of :data:`TOPOLOGIES`.
    topology: str
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
        choice(f"chip {self.key!r}: topology", self.topology, TOPOLOGIES)
        if not isinstance(self.cite, Mapping):
            raise checks.InputTypeError(
                f"chip {self.key!r}: cite must map each rate to its source, got {self.cite!r}.")
        missing = sorted(set(CITED) - set(self.cite))
        unknown = sorted(set(self.cite) - set(CITED))
        empty = sorted(k for k, v in self.cite.items() if not isinstance(v, str) or not v.strip())
        if missing or unknown or empty:
            raise checks.InputError(
                f"chip {self.key!r}: cite needs one non-empty source per rate; missing "
                f"{missing}, unknown {unknown}, empty {empty}; the rates are {sorted(CITED)}.")
        object.__setattr__(self, "cite", types.MappingProxyType(dict(self.cite)))
        KNOWN_KEYS.add(self.key)

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
                 "source": self.cite[name]} for name, unit in UNITS.items()] + [
            {"chip": self.key, "rate": "topology", "value": self.topology,
             "source": self.cite["topology"]}]

    def link_bandwidth(self, link: str = "interconnect") -> float:
        """Bytes per second one chip sends over ``link``: ``"interconnect"`` (ICI/NVLink) or
        ``"network"`` (DCN/InfiniBand, across slices or nodes)."""
        return (self.network_bandwidth if choice("link", link, LINKS) == "network"
                else self.interconnect_bandwidth)


def load_chips(path: str | os.PathLike[str] = CHIPS_FILE) -> dict[str, Chip]:
    """The chips of a TOML file like ``chips.toml``; refuses unknown or missing fields, a
    rate that is not a positive number (a string such as ``"16 GB"`` included), and an entry
    without a source, or without a citation for each of its rates."""
    path = checks.path("path", path, what="a file path")
    if not os.path.isfile(path):
        raise checks.InputError(
            f"path {str(path)!r} is not a file; pass a TOML file like {str(CHIPS_FILE)!r}.")
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file).get("chip", {})
    except tomllib.TOMLDecodeError as error:
        raise checks.InputError(f"{str(path)!r} is not valid TOML: {error}.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise checks.InputError(f"cannot read {str(path)!r}: {error}.") from None
    if not isinstance(table, Mapping):
        raise checks.InputError(
            f"{path}: 'chip' must be a table of [chip.<key>] tables, got {table!r:.60}.")
    wanted = {f.name for f in fields(Chip)} - {"key"}
    chips = {}
    for key, entry in table.items():
        if not isinstance(entry, Mapping):
            raise checks.InputError(
                f"{path}: chip {key!r} must be a [chip.{key}] table of fields, got "
                f"{entry!r:.60}.")
        unknown = set(entry) - wanted
        missing = wanted - set(entry)
        if unknown or missing:
            raise checks.InputError(
                f"chip {key!r} in {path}: unknown fields {sorted(unknown)}, missing fields "
                f"{sorted(missing)}; the fields are {sorted(wanted)}.")
        try:
            chips[key] = Chip(key=key, **entry)
        except checks.InputError as error:
            raise type(error)(f"{path}: {error}") from None
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
    if isinstance(chips, (Mapping, set, frozenset)) or not isinstance(
            chips, (Sequence, np.ndarray, Iterable)):
        raise checks.InputTypeError(
            f"{name} must be a chip name such as 'h100-sxm' or a sequence of them (a list or "
            f"tuple: a set has no order), got {chips!r}.")
    found = {c.key: c for c in (get_chip(item, name=f"an entry of {name}")
                                for item in list(np.asarray(chips, dtype=object).ravel()
                                                 if isinstance(chips, np.ndarray) else chips))}
    if not found:
        raise checks.InputError(f"{name} is empty; name at least one chip of {sorted(CHIPS)}.")
    return list(found.values())


def axis_wraps(chip: str | Chip, axis_length: int, *, slice_chips: int | None = None) -> bool:
    """Whether a collective along a mesh axis of ``axis_length`` chips, in a slice (or node)
    of ``slice_chips`` chips (default: the axis is the whole slice), runs on a **ring**:
    ``chip.interconnect_bandwidth`` is what a chip sends along a ring, two links at once.

    * A GPU's NVSwitch joins every GPU of a node to every other: a ring's rate, for groups of
      up to :data:`NODE_GPUS`; a longer GPU group is refused (it crosses the network).
    * An axis through every chip of a TPU slice of 4 or more (2x2, 2x4, 2x2x2, ...) closes a
      cycle through all of them (a Hamiltonian cycle), so it is a ring; two chips joined by
      one link are a line.
    * A shorter TPU axis is a ring only where the torus wraps around: a full axis of 16 on a
      v5e or v6e ("torus-2d"); a multiple of 4 in a slice of whole 4x4x4 cubes (64 chips
      and more) on a v4 or v5p ("torus-3d"). Anything else is a **line**: the scaling book
      (tpus.md) says a topology without wraparounds "typically doubles the time of most
      communication" (:func:`topology_factor`).

    This rule knows only the axis length. Which chips ``jax.make_mesh`` puts in a group
    decides what they form; :func:`layout_factor` prices a group by its chips on the slices
    Part I lays out."""
    spec = get_chip(chip)
    n = checks.count("axis_length", axis_length, maximum=checks.MAX_DEVICES)
    size = n if slice_chips is None else checks.count(
        "slice_chips", slice_chips, maximum=checks.MAX_DEVICES)
    if n > size:
        raise checks.InputError(
            f"axis_length={n} is longer than the slice it runs in, slice_chips={size}.")
    if spec.topology == "switch":
        if n > NODE_GPUS:
            raise checks.InputError(
                f"axis_length={n}: an NVSwitch node of {spec.key} joins {NODE_GPUS} GPUs; a "
                f"group of {n} crosses the network between nodes: price it with "
                "link='network'.")
        return True
    if n == 1:
        return True
    if n == size:
        return n >= 4
    if spec.topology == "torus-2d":
        return n == 16
    return n % 4 == 0 and size % 64 == 0


def topology_factor(chip: str | Chip, axis_length: int, *,
                    slice_chips: int | None = None) -> float:
    """How many times a ring's time a collective along the axis takes: 1 on a ring
    (:func:`axis_wraps`), 2 on a line (a bidirectional line: the chips at its ends have one
    link where a ring's have two, so its throughput halves)."""
    return 1.0 if axis_wraps(chip, axis_length, slice_chips=slice_chips) else 2.0


def layout_factor(chip: str | Chip, mesh_shape: Sequence[int],
                  groups: Sequence[Sequence[int]]) -> float | None:
    """How many times a ring's time a collective over ``groups`` takes, priced by the chips
    they are on: ``groups`` are positions in the flat device list of a mesh of
    ``mesh_shape`` (a program's replica groups), laid on a slice of ``chip`` as
    ``jax.make_mesh`` lays it (:func:`spmd_guide.meshes.tpu_slices.mesh_chips`). Each group's
    chips form a ring, a line or neither (:func:`~spmd_guide.meshes.tpu_slices.group_shape`,
    :data:`SHAPE_FACTORS`); the slowest group sets the time. ``None`` where the layout is not
    known: a GPU, or a slice other than :data:`~spmd_guide.meshes.tpu_slices.SLICES`."""
    from spmd_guide.meshes import tpu_slices

    spec = get_chip(chip)
    shape = checks.counts("mesh_shape", mesh_shape, min_length=1)
    total = math.prod(shape)
    if isinstance(groups, (str, bytes)) or not isinstance(groups, (Sequence, np.ndarray)) \
            or len(groups) == 0:
        raise checks.InputTypeError(
            f"groups must be a non-empty list of device positions per group, got {groups!r:.60}.")
    positions = [checks.counts("a group of groups", g, minimum=0) for g in groups]
    if max(max(g) for g in positions) >= total:
        raise checks.InputError(
            f"groups name position {max(max(g) for g in positions)}, but a mesh of "
            f"{shape} has positions 0 to {total - 1}.")
    if (spec.key, total) not in tpu_slices.SLICES:
        return None
    laid = _laid(spec.key, shape).ravel()
    return max(SHAPE_FACTORS[_shape(tuple(laid[p] for p in group))] for group in positions)


def layout_shapes(chip: str | Chip, mesh_shape: Sequence[int],
                  groups: Sequence[Sequence[int]]) -> list[str] | None:
    """What the chips of each group form (:func:`layout_factor`'s groups and layout), or
    ``None`` where the layout is not known."""
    if layout_factor(chip, mesh_shape, groups) is None:
        return None
    laid = _laid(get_chip(chip).key, tuple(mesh_shape)).ravel()
    return [_shape(tuple(laid[int(p)] for p in group)) for group in groups]


@functools.cache
def _laid(key: str, shape: tuple[int, ...]) -> np.ndarray:
    from spmd_guide.meshes import tpu_slices

    return tpu_slices.mesh_chips(key, shape)


@functools.cache
def _shape(group: tuple[tuple[int, int, int], ...]) -> str:
    from spmd_guide.meshes import tpu_slices

    return tpu_slices.group_shape(group)
