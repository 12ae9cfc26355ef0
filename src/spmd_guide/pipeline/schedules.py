"""Pipeline schedules as data: for each time step and stage, what runs.

A pipeline splits a stack of layers into ``S`` *stages* (one per device) and a batch into ``M``
*microbatches*. A schedule says, for every time step ``t`` and stage ``s``, whether that stage
runs the forward pass of some microbatch, its backward pass, or nothing (an idle slot, the
*bubble*). :func:`build_schedule` returns that table; :mod:`spmd_guide.pipeline.pipeline` executes it and
the chapter draws it, so the picture and the program cannot disagree.

Model of time: a forward and a backward step each take one time unit and a stage does one
at a time. A forward of microbatch ``m`` on stage ``s`` needs that microbatch's forward on
stage ``s - 1`` in an earlier step; its backward needs its backward on stage ``s + 1`` (on the
last stage: its own forward) in an earlier step. Each stage works through a fixed order of
operations, as soon as their inputs are there:

* ``gpipe``: all ``M`` forwards, then all ``M`` backwards;
* ``1f1b``: ``S - 1 - s`` warm-up forwards, then one forward and one backward in turn, then
  the remaining backwards (PipeDream-flush, non-interleaved).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from spmd_guide.core import checks

IDLE, FORWARD, BACKWARD = 0, 1, 2
#: The schedules :func:`build_schedule` knows.
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``kind[t, s]`` is IDLE, FORWARD or BACKWARD and ``micro[t, s]``
    the microbatch it works on (-1 when idle), for ``T`` time steps and ``S`` stages."""

    name: str
    n_stages: int
    n_microbatches: int
    kind: np.ndarray  # int [T, S]
    micro: np.ndarray  # int [T, S]

    @property
    def n_steps(self) -> int:
        return int(self.kind.shape[0])

    @property
    def idle_slots(self) -> int:
        """Time-step x stage slots in which a stage does nothing."""
        return int(np.sum(self.kind == IDLE))

    def in_flight(self) -> np.ndarray:
        """``[T, S]``: microbatches a stage holds activations for *during* step ``t``.

        A microbatch is held from the step its input arrives (the step after the previous
        stage's forward; its own forward on stage 0) until its backward on that stage ends.
        """
        held = np.zeros(self.kind.shape, dtype=int)
        for s in range(self.n_stages):
            for m in range(self.n_microbatches):
                start = self.step_of(FORWARD, m, s - 1) + 1 if s else self.step_of(FORWARD, m, 0)
                held[start : self.step_of(BACKWARD, m, s) + 1, s] += 1
        return held

    def peak_in_flight(self) -> np.ndarray:
        """``[S]``: the most microbatches each stage holds at once."""
        return self.in_flight().max(axis=0)

    @property
    def n_slots(self) -> int:
        """Activation buffers per stage the executed pipeline needs: the peak over stages."""
        return int(self.peak_in_flight().max())

    def step_of(self, kind: int, m: int, s: int) -> int:
        """The time step at which stage ``s`` runs ``kind`` (FORWARD or BACKWARD) of
        microbatch ``m``."""
        checks.one_of("kind", kind, (FORWARD, BACKWARD))
        m = checks.count("m", m, minimum=0, maximum=self.n_microbatches - 1)
        s = checks.count("s", s, minimum=0, maximum=self.n_stages - 1)
        (t,) = np.nonzero((self.kind[:, s] == kind) & (self.micro[:, s] == m))[0]
        return int(t)

    def tables(self) -> dict[str, np.ndarray]:
        """``[T, S]`` int32 tables the executor reads at each step: what to run (``kind``,
        ``slot``, ``micro``) and where the activation (``recv_f``) and gradient (``recv_b``)
        that arrive at the end of the step go (a slot, or -1 for nothing)."""
        n_slots = self.n_slots
        slot = np.where(self.kind == IDLE, 0, self.micro % n_slots)
        recv_f = np.full(self.kind.shape, -1)
        recv_b = np.full(self.kind.shape, -1)
        recv_f[:, 1:] = np.where(self.kind[:, :-1] == FORWARD, slot[:, :-1], -1)
        recv_b[:, :-1] = np.where(self.kind[:, 1:] == BACKWARD, slot[:, 1:], -1)
        return {name: table.astype(np.int32) for name, table in
                (("kind", self.kind), ("micro", np.maximum(self.micro, 0)),
                 ("slot", slot), ("recv_f", recv_f), ("recv_b", recv_b))}

    def rows(self) -> list[dict[str, str]]:
        """The schedule as table rows: one per stage, ``F3``/``B3``/``.`` per step."""
        names = {IDLE: ".", FORWARD: "F", BACKWARD: "B"}
        return [{"stage": str(s), **{
            str(t): names[int(k)] + (str(int(m)) if k != IDLE else "")
            for t, (k, m) in enumerate(zip(self.kind[:, s], self.micro[:, s], strict=True))}}
            for s in range(self.n_stages)]


def _schedule(value: object) -> Schedule:
    if not isinstance(value, Schedule):
        raise checks.InputTypeError(
            f"schedule must be a Schedule such as build_schedule('gpipe', 4, 8) returns, got "
            f"{type(value).__name__}.")
    kind = checks.array("schedule.kind", value.kind, ndim=2, dtype_kind="iu")
    micro = checks.array("schedule.micro", value.micro, ndim=2, dtype_kind="iu")
    if kind.shape != micro.shape or kind.shape[1:] != (value.n_stages,) or not kind.shape[0]:
        raise checks.InputError(
            f"schedule's kind {kind.shape} and micro {micro.shape} tables must both be [time "
            f"steps, n_stages={value.n_stages}]: build it with build_schedule.")
    return value


def _order(name: str, n_stages: int, n_microbatches: int,
           stage: int) -> list[tuple[int, int]]:
    """The fixed order of ``(kind, microbatch)`` one stage works through."""
    forwards = [(FORWARD, m) for m in range(n_microbatches)]
    backwards = [(BACKWARD, m) for m in range(n_microbatches)]
    if name == "gpipe":
        return forwards + backwards
    warmup = min(n_stages - 1 - stage, n_microbatches)
    order = forwards[:warmup]
    for i in range(n_microbatches - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[n_microbatches - warmup:]


def build_schedule(name: str, n_stages: int, n_microbatches: int) -> Schedule:
    """The schedule ``name`` (``"gpipe"`` or ``"1f1b"``) for ``n_stages`` stages and
    ``n_microbatches`` microbatches (any M >= 1, M < S included).

    Each stage runs the next operation of its order as soon as the operation's input was
    produced in an earlier step (see the module docs).
    """
    checks.one_of("schedule name", name, SCHEDULES)
    n_stages = checks.count("n_stages", n_stages, maximum=checks.MAX_DEVICES)
    n_microbatches = checks.count("n_microbatches", n_microbatches, maximum=100_000)
    orders = [_order(name, n_stages, n_microbatches, s) for s in range(n_stages)]
    done: dict[tuple[int, int, int], int] = {}  # (kind, m, stage) -> step it ran
    position = [0] * n_stages
    steps: list[list[tuple[int, int]]] = []
    t = 0
    while any(p < len(o) for p, o in zip(position, orders, strict=True)):
        row = []
        for s in range(n_stages):
            op = orders[s][position[s]] if position[s] < len(orders[s]) else None
            if op is not None:
                kind, m = op
                if kind == FORWARD:
                    needs = (FORWARD, m, s - 1) if s else None
                else:
                    needs = (BACKWARD, m, s + 1) if s < n_stages - 1 else (FORWARD, m, s)
                if needs is None or done.get(needs, t) < t:
                    row.append(op)
                    continue
            row.append((IDLE, -1))
        for s, (kind, m) in enumerate(row):
            if kind != IDLE:
                done[(kind, m, s)] = t
                position[s] += 1
        steps.append(row)
        t += 1
    table = np.array(steps, dtype=int)  # [T, S, 2]
    return Schedule(name, n_stages, n_microbatches, table[..., 0], table[..., 1])


def bubble_fraction(schedule: str, n_stages: int, n_microbatches: int) -> float:
    """The share of stage-steps that are idle in the schedule ``schedule`` (counted from
    :func:`build_schedule`, not from a formula)."""
    built = build_schedule(schedule, n_stages, n_microbatches)
    return built.idle_slots / (built.n_steps * built.n_stages)


def closed_form_bubble(n_stages: int, n_microbatches: int) -> float:
    """``(S - 1) / (M + S - 1)``: the bubble of GPipe (and plain 1F1B) with equal step times."""
    n_stages = checks.count("n_stages", n_stages)
    n_microbatches = checks.count("n_microbatches", n_microbatches)
    return (n_stages - 1) / (n_microbatches + n_stages - 1)


def microbatches_for_bubble(n_stages: int, bubble: float, *, relative_to: str = "total") -> int:
    """The fewest microbatches M that bring the bubble of ``n_stages`` stages to ``bubble`` or
    less, in one of the two conventions papers use:

    * ``"total"``: idle over total time, ``(S - 1) / (M + S - 1)`` (this module, the GPipe
      paper);
    * ``"ideal"``: idle relative to the time with no bubble, ``(S - 1) / M`` (Narayanan et
      al. 2021, Megatron-LM).

    Exact arithmetic, the target read as the decimal it prints as (0.1, not 0.1000...0555).
    """
    n_stages = checks.count("n_stages", n_stages, maximum=checks.MAX_DEVICES)
    target = Fraction(repr(checks.real("bubble", bubble, positive=True, maximum=1,
                                       inclusive_max=False)))
    checks.one_of("relative_to", relative_to, ("total", "ideal"))
    idle = n_stages - 1
    needed = idle * (1 - target) / target if relative_to == "total" else idle / target
    return max(1, math.ceil(needed))


def draw_schedule(schedule: Schedule, *, ax: object = None, title: str | None = None) -> object:
    """Draw ``schedule`` as a grid: time steps across, stages down, one colour per
    microbatch; forward cells light with ``F``, backward cells dark with ``B``, idle blank.
    Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes
    from matplotlib.colors import to_rgb

    schedule = _schedule(schedule)
    if title is not None and not isinstance(title, str):
        raise checks.InputTypeError(f"title must be a string or None, got {title!r}.")
    if ax is not None:
        checks.instance("ax", ax, Axes, example="a matplotlib Axes (plt.subplots()[1]) or None")

    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.4 * schedule.n_steps + 1),
                                      0.55 * schedule.n_stages + 1.0))
    colours = plt.get_cmap("tab10").colors
    for t in range(schedule.n_steps):
        for s in range(schedule.n_stages):
            kind, m = int(schedule.kind[t, s]), int(schedule.micro[t, s])
            if kind == IDLE:
                ax.add_patch(plt.Rectangle((t, s), 1, 1, facecolor="white",
                                           edgecolor="#bbbbbb", hatch="///", linewidth=0.5))
                continue
            base = np.array(to_rgb(colours[m % len(colours)]))
            face = 0.45 * base + 0.55 if kind == FORWARD else 0.75 * base
            text = "black" if kind == FORWARD else "white"
            ax.add_patch(plt.Rectangle((t, s), 1, 1, facecolor=face, edgecolor="white"))
            ax.text(t + 0.5, s + 0.5, ("F" if kind == FORWARD else "B") + str(m),
                    ha="center", va="center", fontsize=12, color=text)
    ax.set_xlim(0, schedule.n_steps)
    ax.set_ylim(schedule.n_stages, 0)
    ax.set_yticks(np.arange(schedule.n_stages) + 0.5, [f"stage {s}" for s in
                                                        range(schedule.n_stages)])
    ax.set_xticks(np.arange(0, schedule.n_steps, 2) + 0.5,
                  [str(t) for t in range(0, schedule.n_steps, 2)])
    ax.set_xlabel("time step", fontsize=13)
    ax.tick_params(length=0, labelsize=13)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title or f"{schedule.name}: {schedule.n_stages} stages, "
                 f"{schedule.n_microbatches} microbatches, {schedule.idle_slots} idle slots",
                 fontsize=13, loc="left")
    ax.figure.tight_layout()
    return ax.figure


def bubble_rows(n_stages: int, microbatches: list[int]) -> list[dict[str, object]]:
    """For each M: idle slots counted in both executed schedules, their bubble fractions and
    the closed form, side by side."""
    n_stages = checks.count("n_stages", n_stages, maximum=checks.MAX_DEVICES)
    rows = []
    for m in checks.counts("microbatches", microbatches):
        gpipe, one_f = (build_schedule(n, n_stages, m) for n in SCHEDULES)
        rows.append({"M": m, "steps": gpipe.n_steps, "idle slots (gpipe)": gpipe.idle_slots,
                     "idle slots (1f1b)": one_f.idle_slots,
                     "bubble (counted)": f"{bubble_fraction('gpipe', n_stages, m):.3f}",
                     "(S-1)/(M+S-1)": f"{closed_form_bubble(n_stages, m):.3f}"})
    return rows


def plot_bubble(stage_counts: list[int], *, max_microbatches: int = 32) -> object:
    """Bubble fraction against M: dots counted from the GPipe and 1F1B schedules, lines the
    closed form, one colour per number of stages. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    stage_counts = checks.counts("stage_counts", stage_counts)
    for s in stage_counts:  # every point builds two schedules: keep the picture small
        checks.count("a stage count", s, maximum=64)
    max_microbatches = checks.count("max_microbatches", max_microbatches, maximum=1000)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ms = np.arange(1, max_microbatches + 1)
    for i, s in enumerate(stage_counts):
        ax.plot(ms, [closed_form_bubble(s, int(m)) for m in ms], color=f"C{i}",
                label=f"S = {s}: (S-1)/(M+S-1)")
        for name, marker in (("gpipe", "o"), ("1f1b", "x")):
            ax.plot(ms, [bubble_fraction(name, s, int(m)) for m in ms], marker, color=f"C{i}",
                    markersize=4, linestyle="none")
    ax.plot([], [], "ko", markersize=4, label="counted, gpipe")
    ax.plot([], [], "kx", markersize=4, label="counted, 1f1b")
    ax.set_xlabel("microbatches M", fontsize=12)
    ax.set_ylabel("bubble fraction", fontsize=12)
    ax.tick_params(labelsize=12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=11, frameon=False)
    fig.tight_layout()
    return fig


def idle_rows(schedule: Schedule) -> list[dict[str, int]]:
    """Per stage: idle steps before its first operation, between its first and last, and
    after its last, and their total."""
    schedule = _schedule(schedule)
    rows = []
    for s in range(schedule.n_stages):
        busy = np.nonzero(schedule.kind[:, s] != IDLE)[0]
        first, last = int(busy[0]), int(busy[-1])
        between = int(np.sum(schedule.kind[first:last + 1, s] == IDLE))
        after = schedule.n_steps - 1 - last
        rows.append({"stage": s, "idle before": first, "idle between": between,
                     "idle after": after, "idle in all": first + between + after})
    return rows


def one_f_one_b_peak(n_stages: int, n_microbatches: int) -> list[int]:
    """The most microbatches each stage holds at once under 1F1B, by rule:
    ``min(M, S)`` on stage 0 and ``min(M, S - s + 1)`` on stage ``s >= 1``. Stage ``s`` runs
    ``S - 1 - s`` warm-up forwards plus one before its first backward; a later stage also
    holds the next microbatch, whose input arrives while it runs a backward."""
    s_count = checks.count("n_stages", n_stages, maximum=checks.MAX_DEVICES)
    m = checks.count("n_microbatches", n_microbatches, maximum=100_000)
    return [min(m, s_count - s + (1 if s else 0)) for s in range(s_count)]


def in_flight_rows(n_stages: int, n_microbatches: int) -> list[dict[str, int]]:
    """Per stage: the most microbatches it holds at once under each schedule, counted from
    the tables, and :func:`one_f_one_b_peak`'s rule beside them."""
    peaks = {n: build_schedule(n, n_stages, n_microbatches).peak_in_flight() for n in SCHEDULES}
    rule = one_f_one_b_peak(n_stages, n_microbatches)
    return [{"stage": s, **{n: int(p[s]) for n, p in peaks.items()}, "1f1b rule": rule[s]}
            for s in range(n_stages)]
