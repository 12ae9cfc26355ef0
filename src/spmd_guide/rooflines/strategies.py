"""The Part IV MLP priced per strategy and chip: each strategy's training step compiled (not
run) for a model too big for CPU memory, its counts priced on every chip of
:mod:`spmd_guide.rooflines.hardware`, and the predictions ranked per chip
(rooflines/parallelism). (The Part IX transformer's counts live with the transformer, in
:mod:`spmd_guide.transformer.pricing`, and feed :func:`predict_strategies` too.)

A tiny model is sharded with the strategy's public ``shard`` to learn each array's sharding,
and the big program is compiled on ``jax.ShapeDtypeStruct``s with those shardings. Nothing is
run; these are predictions.

Every public function checks its arguments first (:mod:`spmd_guide.core.checks`): strategy and
chip names as whole strings, NumPy numbers and arrays wherever Python ones are taken, NaN
refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from spmd_guide import nn
from spmd_guide.core import checks, hlo
from spmd_guide.rooflines import hardware, roofline

#: The MLP the page prices: widths of a transformer-sized feed-forward stack, and its batch.
MLP_SIZES = (4096, 16384, 16384, 4096)
MLP_BATCH = 8192


def _abstract_like(tree: Any, shapes: Any) -> Any:
    return jax.tree.map(lambda leaf, shape: jax.ShapeDtypeStruct(shape, leaf.dtype,
                                                                 sharding=leaf.sharding),
                        tree, shapes, is_leaf=lambda x: isinstance(x, tuple) and
                        all(isinstance(i, int) for i in x))


def strategy_counts(name: str, *, layer_sizes: Sequence[int] = MLP_SIZES,
                    batch: int = MLP_BATCH, devices: Any = None,
                    gradient: bool = True) -> roofline.Counts:
    """Per-device counts of one training step (loss and gradient) of strategy ``name`` on an
    MLP of ``layer_sizes`` and a batch of ``batch`` examples (float32), compiled, not run;
    ``gradient=False`` compiles the loss alone (the forward pass).

    ``devices``: a list of devices, or a mesh (Auto or Explicit axes) whose devices to use;
    the strategy builds its own mesh over them, as Part IV does. Sizes that do not split
    evenly over that mesh raise the strategy's ``InputError``."""
    name = hardware.choice("strategy", name, nn.STRATEGIES)
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batch = checks.count("batch", batch)
    return _strategy_counts(name, sizes, batch, roofline.as_devices(devices),
                            checks.flag("gradient", gradient))


@functools.cache
def _strategy_counts(name: str, sizes: tuple[int, ...], batch: int,
                     devices: tuple[jax.Device, ...], gradient: bool = True) -> roofline.Counts:
    strategy = nn.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    n = math.prod(mesh.devices.shape)
    small = [n * 2] * len(sizes)
    params = nn.init_mlp(jax.random.key(0), small)
    tiny = (jnp.zeros((n * 2, small[0])), jnp.zeros((n * 2, small[-1])))
    params, tiny = strategy.shard(params, tiny, mesh)
    shapes = [((a, b), (b,)) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    big_params = _abstract_like(params, shapes)
    big_batch = _abstract_like(tiny, ((batch, sizes[0]), (batch, sizes[-1])))
    loss = strategy.loss(mesh)
    step = jax.jit(jax.value_and_grad(loss) if gradient else loss)
    with jax.set_mesh(mesh):  # the strategy's mesh, whatever mesh the caller has set
        compiled = step.lower(big_params, big_batch).compile(hlo.FAST_COMPILE)
    return roofline.counts(compiled)


@dataclass(frozen=True)
class Prediction:
    """One strategy's predicted step on one chip (peak rates, bf16 bytes)."""

    strategy: str
    chip: str
    estimate: roofline.Estimate

    def __post_init__(self) -> None:
        for name in ("strategy", "chip"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise checks.InputTypeError(
                    f"{name} must be a non-empty string, got {getattr(self, name)!r}.")
        if not isinstance(self.estimate, roofline.Estimate):
            raise checks.InputTypeError(
                f"estimate must be a roofline.Estimate, got {type(self.estimate).__name__}.")


def predict_strategies(counts_by_name: Mapping[str, roofline.Counts],
                       chips: Any = tuple(hardware.CHIPS), *,
                       topology: bool = True) -> list[Prediction]:
    """Each strategy's counts priced on each chip, bytes as bfloat16 (``byte_scale=0.5``).
    ``chips``: one chip name (``'h100-sxm'``) or a sequence of them. Each collective is
    priced on its axis's topology (:func:`spmd_guide.rooflines.roofline.comm_seconds`: on a
    TPU slice an axis without a wraparound link is a line, twice a ring's time);
    ``topology=False`` prices every axis as a ring."""
    topology = checks.flag("topology", topology)
    if not isinstance(counts_by_name, Mapping) or not counts_by_name:
        raise checks.InputTypeError(
            "counts_by_name must be a non-empty dict of strategy name -> roofline.Counts, "
            f"got {counts_by_name!r}.")
    for name, work in counts_by_name.items():
        if not isinstance(name, str) or not isinstance(work, roofline.Counts):
            raise checks.InputTypeError(
                f"counts_by_name must map strategy names (strings) to roofline.Counts, got "
                f"{name!r}: {type(work).__name__}.")
    keys = [chip.key for chip in hardware.get_chips(chips)]
    return [Prediction(str(name), chip, roofline.estimate(work, chip, byte_scale=0.5,
                                                          topology=topology))
            for name, work in counts_by_name.items() for chip in keys]


def _for_chip(predictions: Any, chip: Any) -> tuple[str, list[Prediction]]:
    """The key of ``chip`` and its predictions; refuses a chip with none."""
    if isinstance(predictions, (str, bytes, Mapping)) or not isinstance(predictions, Sequence):
        raise checks.InputTypeError(
            f"predictions must be a list of Prediction (from predict_strategies), got "
            f"{type(predictions).__name__}.")
    bad = [p for p in predictions if not isinstance(p, Prediction)]
    if bad:
        raise checks.InputTypeError(
            f"predictions must hold Prediction objects, got {type(bad[0]).__name__}.")
    key = hardware.get_chip(chip).key
    rows = [p for p in predictions if p.chip == key]
    if not rows:
        have = sorted({p.chip for p in predictions})
        raise checks.InputError(f"no predictions for chip {key!r}; they cover {have}.")
    return key, rows


def ranking(predictions: Sequence[Prediction], chip: str) -> list[str]:
    """Strategies on ``chip``, fastest predicted step first."""
    _, rows = _for_chip(predictions, chip)
    return [p.strategy for p in sorted(rows, key=lambda p: p.estimate.step_s)]


def leaders(predictions: Sequence[Prediction], chip: str, *, places: int = 2) -> list[str]:
    """The strategies in the first ``places`` places on ``chip``, fastest first, where
    strategies whose predicted steps are equal (to 1 part in 10^9) share a place: ``dp`` and
    ``auto_dp``, which send the same bytes over the same group, tie, and both are listed."""
    places = checks.count("places", places)
    _, rows = _for_chip(predictions, chip)
    ordered = sorted(rows, key=lambda p: p.estimate.step_s)
    times: list[float] = []
    out = []
    for p in ordered:
        if not any(math.isclose(p.estimate.step_s, s, rel_tol=1e-9) for s in times):
            if len(times) == places:
                break
            times.append(p.estimate.step_s)
        out.append(p.strategy)
    return out


def tie_factor(counts_by_name: Mapping[str, roofline.Counts], chip: str, name: str,
               other: str) -> float:
    """The price of a scattered group (times a ring's time; :data:`hardware.SHAPE_FACTORS`
    says 2) at which strategy ``name``'s predicted step (bf16 bytes) equals ``other``'s:
    above it ``other`` is faster. Only ``name``'s scattered groups on ``chip`` change with
    the price; ``inf`` when ``name`` never catches up, 1 when it leads at a ring's price."""
    if not isinstance(counts_by_name, Mapping):
        raise checks.InputTypeError(
            f"counts_by_name must be a dict of strategy name -> roofline.Counts, got "
            f"{type(counts_by_name).__name__}.")
    spec = hardware.get_chip(chip)
    name, other = (hardware.choice(n, v, counts_by_name) for n, v in
                   (("name", name), ("other", other)))
    work, target = counts_by_name[name], roofline.estimate(counts_by_name[other], spec,
                                                            byte_scale=0.5).step_s
    mine = roofline.estimate(work, spec, byte_scale=0.5)
    scattered = sum(sent for groups, sent in work.sent_by_groups.items()
                    if "scattered" in (hardware.layout_shapes(spec, work.mesh_shape, groups)
                                       or ()))
    per_unit = scattered * 0.5 / spec.interconnect_bandwidth
    floor = max(mine.compute_s, mine.memory_s)
    if floor >= target or not per_unit:
        return math.inf if mine.step_s > target else 1.0
    at_two = hardware.SHAPE_FACTORS["scattered"]
    return max(1.0, at_two + (target - mine.comm_s) / per_unit)


def first_places(predictions: Sequence[Prediction]) -> str:
    """How many chips each strategy is predicted fastest on, for a sentence:
    ``"auto_dp_tp on 1, tp on 6"`` (strategies in alphabetical order)."""
    if isinstance(predictions, (str, bytes, Mapping)) or not isinstance(predictions, Sequence) \
            or not predictions or not all(isinstance(p, Prediction) for p in predictions):
        raise checks.InputTypeError(
            "predictions must be a non-empty list of Prediction (from predict_strategies), got "
            f"{checks.value_text(predictions)}.")
    firsts = [ranking(predictions, chip)[0] for chip in dict.fromkeys(p.chip for p in predictions)]
    return ", ".join(f"{name} on {firsts.count(name)}" for name in sorted(set(firsts)))


def prediction_rows(predictions: Sequence[Prediction], chip: str) -> list[dict[str, Any]]:
    """Table rows for one chip: the three predicted times in ms, the predicted step (their
    largest), the bound, the rank."""
    _, rows = _for_chip(predictions, chip)
    ordered = sorted(rows, key=lambda p: p.estimate.step_s)
    return [{"strategy": p.strategy, "compute ms": f"{p.estimate.compute_s * 1e3:.3g}",
             "memory ms": f"{p.estimate.memory_s * 1e3:.3g}",
             "comm ms": f"{p.estimate.comm_s * 1e3:.3g}",
             "step ms": f"{p.estimate.step_s * 1e3:.3g}", "bound": p.estimate.bound,
             "rank": rank} for rank, p in enumerate(ordered, start=1)]


#: Device kinds (lower case, spaces removed) -> chip keys. Variants whose rates differ from
#: the chips file's (H100 PCIe and NVL, H200 NVL, the GH200, and the GB200, whose B200 runs
#: at 2,500 dense bf16 TFLOP/s against the HGX B200's 2,250) are matched to ``None`` first.
_KINDS = {"h100pcie": None, "h100nvl": None, "h200nvl": None, "gh200": None, "gb200": None,
          "h100": "h100-sxm",
          "h200": "h200", "b200": "b200", "tpuv4": "tpu-v4", "tpuv5lite": "tpu-v5e",
          "tpuv5e": "tpu-v5e", "tpuv5p": "tpu-v5p", "tpuv5": "tpu-v5p",
          "tpuv6lite": "tpu-v6e", "tpuv6e": "tpu-v6e"}


def chip_for(device: Any) -> str | None:
    """The key of :data:`~spmd_guide.rooflines.hardware.CHIPS` for ``device`` (a
    ``jax.Device``, read by its ``device_kind``), or ``None`` when the chips file does not
    list it: a CPU, or a variant with other rates (an H100 PCIe or NVL, an H200 NVL, a
    GH200, a GB200)."""
    kind = getattr(device, "device_kind", None)
    if not isinstance(kind, str):
        raise checks.InputTypeError(
            f"device must be a jax.Device (such as jax.devices()[0]), got {device!r}.")
    kind = kind.lower().replace(" ", "")
    for name in sorted(_KINDS, key=len, reverse=True):
        if name in kind:
            return _KINDS[name]
    return None


def how_many(count: int, total: int) -> str:
    """``count`` of ``total`` in words for a sentence: "all 7", "none of the 7", "5 of the 7"."""
    total = checks.count("total", total)
    count = checks.count("count", count, minimum=0, maximum=total)
    if count == total:
        return f"all {total}"
    return f"none of the {total}" if count == 0 else f"{count} of the {total}"
