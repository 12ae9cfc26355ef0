"""Every training strategy compiled by XLA:TPU for a slice you do not have: its collectives,
its memory against the chip's HBM, and XLA:TPU's own cost analysis (Part XIV,
tpu/compiling).

A strategy's training step is compiled on ``jax.ShapeDtypeStruct`` s laid out as the strategy
lays out real arrays, on a mesh over the compile-only devices of
:func:`spmd_guide.tpu.topology.topology_devices`; nothing is allocated or run. The
transformer's step is Part IX's ``train_step`` (AdamW, outputs pinned to their inputs'
layouts, inputs donated); the MLP's is Part IV's ``sgd_step``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from spmd_guide.core import checks, hlo
from spmd_guide.nn import STRATEGIES as NN_STRATEGIES
from spmd_guide.rooflines import hardware, roofline
from spmd_guide.tpu.topology import chip_key, compile_only, topology_devices
from spmd_guide.transformer import lm, pricing, transformer

__all__ = ["FAMILIES", "MLP_SIZES", "TRANSFORMER", "WIDE_FSDP_V5P", "DoesNotFit", "Program",
           "available_hbm", "compile_strategy", "fit_row", "xla_bytes"]

#: The transformer Part XIV compiles by default: wide enough that its AdamW state decides
#: whether a strategy fits a 16 GiB v5e chip, two blocks deep so that a compile stays short.
#: The transformer Part XIV compiles for every strategy: small, because XLA:TPU's compile
#: time grows with the arrays' sizes (a 4096-wide model takes ten times as long).
TRANSFORMER = dict(vocab=128, d_model=64, n_heads=8, d_ff=256, n_layers=1, seq_len=32)
TRANSFORMER_BATCH = 8
#: ``fsdp``'s collectives on v5p:2x2x2 at d_model 1024 and d_ff 4096 (TRANSFORMER otherwise),
#: as XLA:TPU (libtpu 0.0.50.1) writes them: the same kinds as at TRANSFORMER's widths, in
#: other numbers. Too slow to compile on a page; ``tests/tpu/test_programs.py`` recompiles it.
WIDE_FSDP_V5P = "15 all-gather, 1 all-reduce"
#: Part IV's MLP at widths whose float32 weights (2.1e9 parameters, 8 GiB) and gradients do
#: not fit one 16 GiB v5e chip together: [batch 256] x 32768, two layers.
MLP_SIZES = (32768,) * 3
MLP_BATCH = 256

FAMILIES = ("transformer", "mlp")


class DoesNotFit(checks.InputError):
    """XLA:TPU refused to compile a program whose buffers exceed the chip's HBM."""

    def __init__(self, message: str, *, needed: str, available: str) -> None:
        super().__init__(message)
        self.needed, self.available = needed, available


_OOM = re.compile(r"required for ([\w ]+?) \(([\d.]+\w?)\) exceeds available HBM \(([\d.]+\w?)\)")


@dataclass(frozen=True)
class Program:
    """One strategy's training step compiled by XLA:TPU for one slice."""

    family: str
    strategy: str
    topology: str
    chip: str
    compiled: jax.stages.Compiled

    @functools.cached_property
    def collectives(self) -> list[hlo.Collective]:
        return hlo.collectives_in_text(self.compiled.as_text())

    @functools.cached_property
    def memory(self) -> hlo.MemoryStats:
        return hlo._memory(self.compiled)

    @property
    def hbm_bytes(self) -> float:
        """HBM of one chip of the slice, from ``rooflines/chips.toml`` (with its source)."""
        return hardware.get_chip(self.chip).hbm_bytes

    def row(self) -> dict[str, Any]:
        """Collectives by kind, their device groups and bytes, and memory per device
        against the chip's HBM."""
        ops = self.collectives
        counts = hlo.count_kinds(ops)
        kinds = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"
        groups = "/".join(str(g) for g in sorted({op.group_size for op in ops})) or "-"
        def moved(kinds: tuple[str, ...]) -> str:
            return "/".join(sorted({str(b.dtype) for op in ops if op.kind in kinds
                                    for b in op.buffers if b.nbytes >= 1024})) or "-"

        gathers, reductions = moved(("all-gather",)), moved(("all-reduce", "reduce-scatter"))
        peak = self.memory.peak_bytes
        return {"strategy": self.strategy, "slice": self.topology, "collectives": kinds,
                "group sizes": groups, "gathers move": gathers, "reductions move": reductions,
                "sent per device": hlo.format_bytes(sum(op.bytes_sent for op in ops)),
                "memory per device": hlo.format_bytes(peak),
                "of HBM": f"{peak / self.hbm_bytes:.1%}"}

    def cost_row(self) -> dict[str, Any]:
        """XLA:TPU's own cost analysis beside Part V's roofline for the same program."""
        cost = self.compiled.cost_analysis() or {}
        est = roofline.estimate(roofline.counts(self.compiled), self.chip)
        return {"strategy": self.strategy, "slice": self.topology,
                "FLOPs (XLA:TPU)": f"{float(cost.get('flops', 0)):.3g}",
                "HBM bytes (XLA:TPU)": hlo.format_bytes(float(cost.get("bytes accessed", 0))),
                "XLA:TPU's optimal time": _us(float(cost.get("optimal_seconds", -1))),
                "roofline: compute": _us(est.compute_s), "memory": _us(est.memory_s),
                "communication": _us(est.comm_s), "roofline bound": _us(est.step_s),
                "bound by": est.bound}


def _us(seconds: float) -> str:
    """Microseconds; a negative `optimal_seconds` is shown as "none given", not as a time."""
    return f"{seconds * 1e6:.3g} µs" if seconds >= 0 else "none given"


def _sds(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def compile_strategy(family: str, strategy: str, topology: str, *,
                     compiler_options: dict[str, Any] | None = None,
                     **sizes: int) -> Program:
    """Compile ``strategy`` of ``family`` (``"transformer"``: Part IX's ``STRATEGIES``;
    ``"mlp"``: Part IV's) for every device of the TPU slice ``topology``.

    ``sizes`` override :data:`TRANSFORMER` (and ``batch``) or, for the MLP, ``batch``.
    ``compiler_options`` go to XLA:TPU (``{"xla_tpu_...": ...}``)."""
    family = hardware.choice("family", family, FAMILIES)
    try:
        return _compile_strategy(family, strategy, topology, compiler_options, sizes)
    except jax.errors.JaxRuntimeError as error:
        match = _OOM.search(str(error))
        if "RESOURCE_EXHAUSTED" not in str(error) or not match:
            raise
        raise DoesNotFit(
            f"{family} strategy {strategy!r} does not fit one chip of {topology}: XLA:TPU "
            f"needs {match.group(2)} for {match.group(1)}, and the chip has {match.group(3)} "
            "of HBM available.", needed=match.group(2), available=match.group(3)) from None


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def xla_bytes(text: str) -> float:
    """Bytes of a size as XLA:TPU prints it in its out-of-memory message (``"15.75G"``).

    XLA's K, M, G are binary (KiB, MiB, GiB): it compiles a 16.2e9-byte program for one v5e
    chip and refuses a 17.0e9-byte one as "15.83G exceeds available HBM (15.75G)"."""
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", checks.text("text", text).strip())
    if not match:
        raise checks.InputError(f"text={text!r} is not a size as XLA prints it ('15.75G').")
    return float(match.group(1)) * _UNITS[match.group(2)]


@functools.cache
def available_hbm(topology: str) -> float:
    """Bytes of one chip's HBM that XLA:TPU lets a program of ``topology`` use: compiles a
    program twice the chip's nominal HBM and reads the limit from XLA:TPU's refusal."""
    devices = topology_devices(topology)
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    n = int(hardware.get_chip(chip_key(devices)).hbm_bytes) // 4
    double = jax.jit(lambda x: x * 2, in_shardings=sharding, out_shardings=sharding)
    try:
        compile_only(double.lower(jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding)))
    except jax.errors.JaxRuntimeError as error:
        match = _OOM.search(str(error))
        if match:
            return xla_bytes(match.group(3))
        raise
    raise RuntimeError(f"XLA:TPU compiled a program of twice the HBM of {topology}'s chip.")


def fit_row(family: str, strategy: str, topology: str, **sizes: Any) -> dict[str, Any]:
    """One row of "does it fit": the program's memory per device (GiB) against the HBM that
    XLA:TPU lets a program use (:func:`available_hbm`), or, where XLA:TPU refuses to compile
    it, what its error says it needs."""
    available = available_hbm(topology)
    try:
        program = compile_strategy(family, strategy, topology, **sizes)
    except DoesNotFit as error:
        needed = xla_bytes(error.needed)
        return {"strategy": strategy, "collectives": "-",
                "GiB per device": f"{needed / 2**30:.2f}",
                f"of the {available / 2**30:.2f} GiB usable":
                    f"{needed / available:.1%}",
                "fits": "no: XLA:TPU refuses to compile it"}
    row = program.row()
    peak = program.memory.peak_bytes
    return {"strategy": strategy, "collectives": row["collectives"],
            "GiB per device": f"{peak / 2**30:.2f}",
            f"of the {available / 2**30:.2f} GiB usable": f"{peak / available:.1%}",
            "fits": "yes"}


def _compile_strategy(family: str, strategy: str, topology: str,
                      compiler_options: dict[str, Any] | None, sizes: dict[str, Any]
                      ) -> Program:
    options = dict(compiler_options or {})
    for key in options:
        checks.text("a compiler option's name", key)
    devices = topology_devices(topology)
    if family == "transformer":
        name = hardware.choice("strategy", strategy, transformer.STRATEGIES)
        compiled = _transformer_step(name, tuple(devices), tuple(sorted(sizes.items())),
                                     tuple(sorted(options.items())))
    else:
        name = hardware.choice("strategy", strategy, [s for s in NN_STRATEGIES if s != "single"])
        unknown = sorted(set(sizes) - {"batch", "widths"})
        if unknown:
            raise checks.InputError(f"the MLP takes only batch= and widths=, got {unknown}.")
        batch = checks.count("batch", sizes.get("batch", MLP_BATCH))
        widths = checks.counts("widths", sizes.get("widths", MLP_SIZES), min_length=2)
        compiled = _mlp_step(name, tuple(devices), batch, widths,
                             tuple(sorted(options.items())))
    return Program(family, name, topology, chip_key(devices), compiled)


@functools.cache
def _transformer_step(name: str, devices: tuple[jax.Device, ...], sizes: tuple, options: tuple
                      ) -> jax.stages.Compiled:
    sizes = dict(sizes)
    batch = checks.count("batch", sizes.pop("batch", TRANSFORMER_BATCH))
    config = transformer.Config(**pricing._sizes(TRANSFORMER | sizes))
    strategy = transformer.STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    pricing._check_layout(name, config, batch, devices)
    shapes = pricing.abstract_params(config)
    trainer = transformer.train_step(strategy, mesh, config, shapes, optimizer=lm.optimizer())
    params = _sds(shapes, trainer.param_shardings)
    state = _sds(jax.eval_shape(trainer.init, params), trainer.state_shardings)
    tokens = jax.ShapeDtypeStruct((batch, config.seq_len + 1), jnp.int32,
                                  sharding=NamedSharding(mesh, strategy.token_spec()))
    with jax.set_mesh(mesh):
        return compile_only(trainer.step.trace(params, state, tokens).lower(), dict(options))


@functools.cache
def _mlp_step(name: str, devices: tuple[jax.Device, ...], batch: int,
              widths: tuple[int, ...], options: tuple) -> jax.stages.Compiled:
    strategy = NN_STRATEGIES[name]
    mesh = strategy.mesh(list(devices))
    shapes = [(jax.ShapeDtypeStruct((a, b), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.float32))
              for a, b in zip(widths[:-1], widths[1:], strict=True)]
    params = _sds(shapes, strategy.param_shardings(shapes, mesh))
    rows = strategy.batch_sharding(mesh)
    batch_ = (jax.ShapeDtypeStruct((batch, widths[0]), jnp.float32, sharding=rows),
              jax.ShapeDtypeStruct((batch, widths[-1]), jnp.float32, sharding=rows))
    step = strategy.sgd_step(mesh, shapes, learning_rate=1e-2)
    with jax.set_mesh(mesh):
        return compile_only(step.trace(params, batch_).lower(), dict(options))
