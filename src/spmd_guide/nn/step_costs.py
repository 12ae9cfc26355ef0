"""Part IV's measurements: a strategy against the one-device reference, and what one
training step costs per device (collectives, bytes, memory, time), side by side.

Every count comes from the compiled program of the whole step (:mod:`spmd_guide.core.hlo`);
times from :mod:`spmd_guide.core.timing`, on whatever hardware the devices are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from spmd_guide.core import checks, hlo
from spmd_guide.core.display import Table
from spmd_guide.core.timing import Timing, time_fn
from spmd_guide.nn.mlp import Batch, Params, mlp_loss, param_bytes_per_device, train
from spmd_guide.nn.strategies import STRATEGIES, Strategy


@dataclass(frozen=True)
class ReferenceCheck:
    """A strategy's loss and gradient next to ``mlp_loss``'s on one device."""

    strategy: str
    loss: float
    reference_loss: float
    max_grad_error: float
    max_grad: float

    def row(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "loss": f"{self.loss:.6f}",
            "one-device loss": f"{self.reference_loss:.6f}",
            "largest |gradient difference|": f"{self.max_grad_error:.1e}",
            "largest |gradient|": f"{self.max_grad:.2f}",
        }


@jax.jit
def _reference_value_and_grad(params: Params, batch: Batch) -> tuple[jax.Array, Params]:
    return jax.value_and_grad(mlp_loss)(params, batch)


def check_against_reference(
    strategy: Strategy | str,
    params: Params,
    batch: Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> ReferenceCheck:
    """Loss and gradient of ``strategy`` on ``devices`` against ``mlp_loss``
    on the first device alone."""
    strategy = _lookup(strategy)
    mesh = strategy.mesh(devices)
    placed_params, placed_batch = strategy.shard(params, batch, mesh)
    value_and_grad = jax.jit(jax.value_and_grad(strategy.loss(mesh)))
    loss, grads = value_and_grad(placed_params, placed_batch)
    first_device = mesh.devices.flat[0]
    one_device = jax.device_put(jax.device_get((params, batch)), first_device)
    reference_loss, reference_grads = _reference_value_and_grad(*one_device)
    grads, reference_grads = jax.device_get(
        (jax.tree.leaves(grads), jax.tree.leaves(reference_grads))
    )
    grad_errors = [
        np.max(np.abs(g - r)) for g, r in zip(grads, reference_grads, strict=True)
    ]
    return ReferenceCheck(
        strategy=strategy.name,
        loss=float(loss),
        reference_loss=float(reference_loss),
        max_grad_error=float(max(grad_errors)),
        max_grad=max(float(np.max(np.abs(r))) for r in reference_grads),
    )


# --------------------------------------------------------------------------------------
# Measuring one training step of each strategy
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepProfile:
    """What one SGD step of a strategy costs per device, read from its compiled program.

    ``report`` holds the collectives and the compiler's memory analysis
    (:func:`spmd_guide.core.hlo.report`); ``param_bytes`` is what one device stores of the
    parameters; ``step`` is the measured wall-clock time of the whole step. ``peak_bytes``
    is the memory analysis' upper bound (arguments + outputs + temporaries, as if all were
    live at once; see :class:`spmd_guide.core.hlo.MemoryStats`).
    """

    strategy: str
    kind: str
    mesh_axes: dict[str, int]
    report: hlo.Report
    param_bytes: int
    step: Timing

    @property
    def counts(self) -> dict[str, int]:
        return self.report.counts

    @property
    def n_collectives(self) -> int:
        return len(self.report.ops)

    @property
    def comm_bytes(self) -> int:
        return self.report.total_bytes

    @property
    def peak_bytes(self) -> int:
        return self.report.memory.peak_bytes

    @property
    def mesh_text(self) -> str:
        return " x ".join(f"{name}={size}" for name, size in self.mesh_axes.items())

    def row(self) -> dict[str, Any]:
        """A table row: every number per device, times in milliseconds."""
        used = ", ".join(f"{n} {kind}" for kind, n in self.counts.items() if n) or "none"
        low, high = self.step.spread
        return {
            "strategy": self.strategy,
            "mesh": self.mesh_text,
            "collectives per step": used,
            "bytes sent": hlo.format_bytes(self.comm_bytes),
            "param bytes": hlo.format_bytes(self.param_bytes),
            "temporaries": hlo.format_bytes(self.report.memory.temp_bytes),
            "peak memory (bound)": hlo.format_bytes(self.peak_bytes),
            "step ms: median (min-max)": f"{self.step.median * 1e3:.2f} ({low * 1e3:.2f}-{high * 1e3:.2f})",
        }


def profile_step(
    strategy: Strategy | str,
    params: Params,
    batch: Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
    learning_rate: float = 0.01,
    runs: int = 10,
) -> StepProfile:
    """Lay out ``params``/``batch`` with ``strategy`` on ``devices``, compile
    one SGD step, measure it.

    The collectives, bytes and memory come from the one compiled program
    (:func:`spmd_guide.core.hlo.report`); the time from
    :func:`spmd_guide.core.timing.time_fn` (``runs`` timed calls after a compiling
    warm-up), on whatever hardware ``devices`` are.
    """
    strategy = _lookup(strategy)
    runs = checks.count("runs", runs)
    mesh = strategy.mesh(devices)
    params, batch = strategy.shard(params, batch, mesh)
    step = strategy.sgd_step(mesh, params, learning_rate=learning_rate)
    report = hlo.report(step, params, batch, title=strategy.name)
    timing = time_fn(step, params, batch, runs=runs, label=strategy.name)
    return StepProfile(
        strategy=strategy.name,
        kind=strategy.kind,
        mesh_axes=dict(mesh.shape),
        report=report,
        param_bytes=param_bytes_per_device(params),
        step=timing,
    )


def _lookup(strategy: Strategy | str) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    return STRATEGIES[checks.one_of("strategy", strategy, sorted(STRATEGIES))]


def compare(
    names: Sequence[str],
    params: Params,
    batch: Batch,
    *,
    devices: Sequence[jax.Device] | None = None,
    learning_rate: float = 0.01,
    runs: int = 10,
) -> list[StepProfile]:
    """:func:`profile_step` for each strategy in ``names``, on the same model, batch and devices."""
    strategies = [_lookup(name) for name in names]  # fail on a bad name before any compiling
    return [
        profile_step(s, params, batch, devices=devices, learning_rate=learning_rate, runs=runs)
        for s in strategies
    ]


@dataclass(frozen=True)
class TrainingRun:
    """One strategy trained for a few steps: the arrays as placed, as trained, the losses,
    and the profile of the very step that trained them."""

    strategy: str
    params: Params
    batch: Batch
    trained: Params
    losses: list[float]
    profile: StepProfile

    @property
    def layouts_kept(self) -> bool:
        """Whether every trained parameter has the sharding it was placed with."""
        return all(new.sharding.is_equivalent_to(old.sharding, old.ndim) for new, old in
                   zip(jax.tree.leaves(self.trained), jax.tree.leaves(self.params), strict=True))


def train_run(strategy: Strategy | str, params: Params, batch: Batch, *, steps: int,
              learning_rate: float = 0.01, devices: Sequence[jax.Device] | None = None,
              runs: int = 10) -> TrainingRun:
    """Lay out ``params``/``batch`` with ``strategy``, train ``steps`` SGD steps with
    :meth:`Strategy.sgd_step` (layouts pinned), and profile that same step."""
    strategy = _lookup(strategy)
    steps = checks.count("steps", steps)
    mesh = strategy.mesh(devices)
    placed_params, placed_batch = strategy.shard(params, batch, mesh)
    step = strategy.sgd_step(mesh, placed_params, learning_rate=learning_rate)
    trained, losses = train(step, placed_params, placed_batch, steps=steps)
    profile = profile_step(strategy, params, batch, devices=devices,
                           learning_rate=learning_rate, runs=runs)
    return TrainingRun(strategy.name, placed_params, placed_batch, trained, losses, profile)


def comparison_table(profiles: Sequence[StepProfile]) -> Table:
    """The profiles side by side, one row per strategy (HTML in a notebook, text with
    ``str()``)."""
    if not profiles or not all(isinstance(p, StepProfile) for p in profiles):
        raise checks.InputTypeError(
            "profiles must be a non-empty list of StepProfile, as compare() returns.")
    return Table([p.row() for p in profiles])


def plot_comparison(profiles: Sequence[StepProfile]) -> Any:
    """A matplotlib figure: one horizontal bar chart per column of :func:`comparison_table`.

    Collectives per step are stacked by kind; bytes are in KiB; the step time bar is the median
    with a line from the fastest to the slowest run. The key to the collective kinds' colours
    sits above the first panel, at the left edge, where a phone showing only the left column
    still shows it; the sixth panel says what ran where.
    Sized for the book's text column (two charts a row), no text under 8.5 pt (11 CSS px).
    """
    from spmd_guide.core.drawing import subplots

    names = [p.strategy for p in profiles]
    rows = np.arange(len(profiles))
    fig, grid = subplots(3, 2, figsize=(7.0, 3 * (0.28 * len(profiles) + 1.0)), keep_open=True,
                         alt="Bar charts comparing " + ", ".join(names) + " per device and SGD "
                         "step: collectives, bytes sent, parameter bytes, peak memory, step time.")
    axes = grid.ravel()
    left = np.zeros(len(profiles))
    for i, kind in enumerate(hlo.KINDS):
        counts = np.array([p.counts[kind] for p in profiles])
        if counts.any():
            axes[0].barh(rows, counts, left=left, label=kind, color=f"C{i}")
            left += counts
    axes[0].set_title("collectives per step")
    panels = [
        ("bytes sent per device (KiB)", [p.comm_bytes / 1024 for p in profiles]),
        ("parameter bytes per device (KiB)", [p.param_bytes / 1024 for p in profiles]),
        ("peak memory per device, bound (KiB)", [p.peak_bytes / 1024 for p in profiles]),
    ]
    for ax, (title, values) in zip(axes[1:4], panels, strict=True):
        ax.barh(rows, values, color="C7")
        ax.set_title(title)
    medians = np.array([p.step.median * 1e3 for p in profiles])
    lows = np.array([p.step.spread[0] * 1e3 for p in profiles])
    highs = np.array([p.step.spread[1] * 1e3 for p in profiles])
    axes[4].barh(rows, medians, xerr=[medians - lows, highs - medians], color="C9", capsize=2)
    axes[4].set_title("step time (ms, median, min-max)")
    for ax in axes[:5]:
        ax.set_yticks(rows, names)
        ax.invert_yaxis()
        ax.title.set_fontsize(9.5)
        ax.tick_params(labelsize=8.5)
        ax.xaxis.get_offset_text().set_fontsize(8.5)
        ax.grid(axis="x", alpha=0.3)
    # The colour key goes above the first panel, at the figure's left edge: a phone that shows
    # only the left column of panels still shows it.
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(handles, labels, loc="lower left", bbox_to_anchor=(-0.32, 1.12),
                       ncol=2, fontsize=8.5, title="collective kinds (bar colours)",
                       title_fontsize=9, alignment="left", frameon=False, borderaxespad=0,
                       handlelength=1.2, columnspacing=1.0)
    axes[5].axis("off")
    if profiles:
        axes[5].text(0.0, 0.5, "per device, one SGD step;\ntimes measured on "
                     f"{profiles[0].step.device_kind} devices", transform=axes[5].transAxes,
                     fontsize=8.5, va="center")
    fig.tight_layout()
    return fig
