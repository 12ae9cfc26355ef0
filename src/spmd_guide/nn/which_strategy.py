"""Which strategy when: the decision guide of Part IV, as code a reader can run on their model.

Two halves:

* :func:`measure_traffic` compiles one SGD step of each Part IV strategy and reads from the
  compiled program (:mod:`spmd_guide.core.hlo`) how many bytes one device sends, next to the bytes of
  parameters it holds: the numbers the guide's rules come from.
* :func:`recommend` walks the guide's questions for *your* model (parameter bytes, device
  memory, global batch, device count) and returns the answer with the reasons in words;
  :func:`flowchart` draws the questions as a flowchart (HTML and CSS, readable on a phone)
  with the path of one recommendation marked.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax

from spmd_guide import nn
from spmd_guide.core import checks, hlo
from spmd_guide.core.display import Html, wrap

#: Bytes of training state per byte of parameters, before the optimizer: the parameters
#: themselves and their gradients.
PARAMS_AND_GRADS = 2

#: The guide's questions, by id; :func:`recommend` and :func:`flowchart` both read them.
QUESTIONS: dict[str, str] = {
    "fits": "Does the whole training state fit in one device's budget?",
    "fits_sharded": "Does 1/n of it fit (sharded over all n devices)?",
    "batch": ("Is the global batch at least n times the smallest batch per device (enough "
              "examples for every device)?"),
}

#: The answers (leaves of the flowchart), by id: what to run and which book strategies do it.
#: FSDP x TP is the transformer's ``fsdp_tp`` (Part IX: ZeRO-3 over ``data``, Megatron pairs
#: over ``model``). Part IV's ``auto_2d`` stores the state split as finely, but its weights and
#: activations are split over different axes at each contraction, so it gathers far more.
ANSWERS: dict[str, tuple[str, str]] = {
    "DP": ("Data parallel (DP)", "dp, auto_dp"),
    "DP x TP": ("2-D: data parallel x tensor parallel", "auto_dp_tp"),
    "FSDP": ("Fully sharded data parallel (FSDP)", "fsdp, auto_fsdp"),
    "FSDP x TP": ("2-D: FSDP x tensor parallel", "Part IX's fsdp_tp"),
    "TP": ("Tensor parallel (TP) over every device", "tp"),
    "none": ("Does not fit: add devices, or pipeline / offload / lower precision", "-"),
}


def training_state_bytes(param_bytes: int, *, optimizer_slots: int = 2) -> int:
    """Parameters + gradients + ``optimizer_slots`` optimizer arrays of the same size.

    AdamW keeps two (``mu`` and ``nu``), SGD with momentum one, plain SGD none. Activations
    come on top: that is what the guide's ``memory_fraction`` leaves room for.
    """
    param_bytes = checks.count("param_bytes", param_bytes)
    slots = checks.count("optimizer_slots", optimizer_slots, minimum=0)
    return param_bytes * (PARAMS_AND_GRADS + slots)


def data_axis_size(batch: int, n_devices: int, *, min_batch_per_device: int = 1) -> int:
    """The largest divisor ``d`` of ``n_devices`` that gives each of its devices at least
    ``min_batch_per_device`` examples of ``batch`` (``batch >= d * min_batch_per_device``;
    1 if none does). Whether ``batch`` splits evenly over ``d`` is not asked: an uneven batch
    is rounded to a multiple of ``d`` (:func:`round_batch`), not answered with a smaller axis."""
    batch = checks.count("batch", batch)
    n_devices = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    min_batch_per_device = checks.count("min_batch_per_device", min_batch_per_device)
    best = 1
    for d in range(1, n_devices + 1):
        if n_devices % d == 0 and batch >= d * min_batch_per_device:
            best = d
    return best


def round_batch(batch: int, data: int) -> tuple[int, int] | None:
    """The multiples of ``data`` just below and just above ``batch`` (drop the remainder, or
    pad), or None when ``data`` already divides ``batch``.

    >>> round_batch(100, 8)
    (96, 104)
    """
    batch = checks.count("batch", batch)
    data = checks.count("data", data, maximum=checks.MAX_DEVICES)
    if batch % data == 0:
        return None
    return batch - batch % data, batch + (-batch) % data


@dataclass(frozen=True)
class Recommendation:
    """What :func:`recommend` chose, the numbers it chose on, and the questions it asked."""

    answer: str
    mesh: dict[str, int]
    state_bytes: int
    state_bytes_per_device: int
    budget_bytes: int
    batch_per_device: float
    path: tuple[tuple[str, bool], ...]
    batch: int = 0
    round_to: tuple[int, ...] | None = None
    pad_to: int | None = None

    @property
    def title(self) -> str:
        return ANSWERS[self.answer][0]

    @property
    def book_strategies(self) -> str:
        """The book's strategies that lay a model out so: names in Part IV's
        ``spmd_guide.nn.STRATEGIES``, or Part IX's transformer for FSDP x TP.
        ``auto_dp_tp``'s model axis is 2 unless built with another ``model_size``."""
        names = ANSWERS[self.answer][1]
        model = self.mesh.get("model", 2)
        if self.answer == "DP x TP" and model != 2:
            return f"{names}, built as AutoDataTensorParallel(model_size={model})"
        return names

    def explain(self) -> str:
        """The recommendation in sentences (wrapped to 76 columns): each question, its answer
        and the numbers."""
        lines = []
        for question, yes in self.path:
            lines.append(f"{QUESTIONS[question]} {'Yes' if yes else 'No'}.")
        mesh = " x ".join(f"{a}={n}" for a, n in self.mesh.items()) or "-"
        lines.append(
            f"Training state {hlo.format_bytes(self.state_bytes)}, "
            f"{hlo.format_bytes(self.state_bytes_per_device)} per device under this layout, "
            f"budget {hlo.format_bytes(self.budget_bytes)} per device; "
            f"examples per device: {self.batch_per_device:g}.")
        data = self.mesh.get("data", 1)
        if self.round_to is not None and self.pad_to is None:
            low, high = self.round_to
            lines.append(
                f"The batch of {self.batch} does not split evenly over data={data}: round it "
                f"to a multiple of {data}, {low} or {high} (drop the last "
                f"{_examples(self.batch - low)}, or pad {_examples(high - self.batch)}).")
        elif self.round_to is not None:
            (low,) = self.round_to
            lines.append(
                f"The batch of {self.batch} does not split evenly over data={data}: round it "
                f"down to {low} (drop the last {_examples(self.batch - low)}).")
        if self.pad_to is not None:
            n = math.prod(self.mesh.values())
            one_d = "FSDP" if self.answer.startswith("FSDP") else "DP"
            lines.append(
                f"Or pad it to {self.pad_to} ({_examples(self.pad_to - self.batch)} more), "
                f"enough for all {n} devices: then the answer is {one_d}, data={n}.")
        lines.append(f"-> {self.title}, mesh {mesh} (in this book: {self.book_strategies}).")
        return wrap("\n".join(lines))


def _examples(count: int) -> str:
    return f"{count} example" if count == 1 else f"{count} examples"


def recommend(
    param_bytes: int,
    device_bytes: int,
    *,
    batch: int,
    n_devices: int,
    optimizer_slots: int = 2,
    memory_fraction: float = 0.5,
    min_batch_per_device: int = 1,
) -> Recommendation:
    """The guide's answer for a model of ``param_bytes`` on ``n_devices`` of ``device_bytes``.

    The budget per device is ``memory_fraction * device_bytes`` (the rest is for activations
    and temporaries). If the training state (:func:`training_state_bytes`) fits the budget,
    parameters are replicated (DP); if only 1/n of it fits, they are sharded (FSDP); if not
    even that, no layout of this Part fits. Then the batch. When it holds at least
    ``n * min_batch_per_device`` examples, the data axis takes all ``n`` devices. Every
    strategy splits the batch evenly or refuses it, so a batch that ``n`` does not divide is
    to be rounded to a multiple of ``n`` (``round_to``: drop the remainder, or pad); its
    divisibility never turns the layout into tensor parallelism. Only a batch smaller than
    ``n * min_batch_per_device`` shrinks the data axis, to the largest divisor of ``n`` that
    still gives each device ``min_batch_per_device`` examples (:func:`data_axis_size`; the
    batch rounded *down* to a multiple of it if need be: then ``round_to`` holds one size,
    since padding the batch up to ``n * min_batch_per_device`` would call for the 1-D layout
    over all ``n`` instead, offered as ``pad_to``); the devices left over form a ``model`` axis for
    tensor parallelism: 2-D, or tensor parallel alone when the data axis is 1.
    """
    budget_bytes = int(checks.real("memory_fraction", memory_fraction, positive=True,
                                   maximum=1.0) * checks.count("device_bytes", device_bytes))
    n = checks.count("n_devices", n_devices, maximum=checks.MAX_DEVICES)
    batch = checks.count("batch", batch)
    min_batch = checks.count("min_batch_per_device", min_batch_per_device)
    state = training_state_bytes(param_bytes, optimizer_slots=optimizer_slots)

    path: list[tuple[str, bool]] = [("fits", state <= budget_bytes)]
    if not path[-1][1]:
        path.append(("fits_sharded", math.ceil(state / n) <= budget_bytes))
        if not path[-1][1]:
            return Recommendation("none", {}, state, math.ceil(state / n), budget_bytes,
                                  batch / n, tuple(path), batch)
    sharded = not path[0][1]
    path.append(("batch", batch >= n * min_batch))
    data = n if path[-1][1] else data_axis_size(batch, n, min_batch_per_device=min_batch)
    model = n // data
    if model == 1:
        answer, mesh = ("FSDP" if sharded else "DP"), {"data": n}
    elif data == 1:
        answer, mesh = "TP", {"model": n}
    else:
        answer, mesh = ("FSDP x TP" if sharded else "DP x TP"), {"data": data, "model": model}
    # FSDP x TP shards the state over every device, TP too; DP x TP over the model axis only.
    per_device = (math.ceil(state / n) if sharded or answer == "TP"
                  else math.ceil(state / model))
    round_to, pad_to = round_batch(batch, data), None
    if data < n and round_to is not None:
        # A small batch to round: padding it up to n * min_batch would make it 1-D over n.
        round_to, pad_to = round_to[:1], n * min_batch
    return Recommendation(answer, mesh, state, per_device, budget_bytes, batch / data,
                          tuple(path), batch, round_to, pad_to)


def _leaf(target: str) -> str:
    """A flowchart leaf in words; the 2-D leaves say that a data axis of 1 leaves plain TP,
    the 1-D ones that the batch is rounded to a multiple of n."""
    title = ANSWERS[target][0]
    if target in ("DP", "FSDP"):
        return f"{title} (round the batch to a multiple of n)"
    return f"{title} (TP alone if no data axis fits)" if target.endswith("x TP") else title


# ------------------------------------------------------------------------ the flowchart

_BOX = ("border:2px solid {c};border-radius:6px;padding:6px 10px;margin:4px 0;"
        "background:{bg};color:#1a1a1a;max-width:34em;")
_ON, _OFF = ("#0b5cad", "#e8f1fb"), ("#8a8a8a", "#ffffff")


def _flow() -> dict[str, tuple[str, str]]:
    """Each question's (yes, no) successor: a question id or an answer id."""
    return {
        "fits": ("batch_dp", "fits_sharded"),
        "fits_sharded": ("batch_fsdp", "none"),
        "batch_dp": ("DP", "DP x TP"),
        "batch_fsdp": ("FSDP", "FSDP x TP"),
    }


def flowchart(recommendation: Recommendation | None = None) -> Html:
    """The guide as a vertical flowchart (HTML in a notebook, text with ``str()``); the path
    of ``recommendation`` is marked.

    Each question box lists where "yes" and "no" lead; boxes on the path are blue with a
    marker, the others grey. Plain HTML and CSS: it narrows with the page, so it reads on a
    phone, and needs no Sphinx extension.
    """
    if recommendation is not None and not isinstance(recommendation, Recommendation):
        raise checks.InputTypeError(
            f"recommendation must be a Recommendation from recommend(...), got "
            f"{type(recommendation).__name__}.")
    flow = _flow()
    visited: set[str] = set()
    if recommendation is not None:
        node = "fits"
        for _question, yes in recommendation.path:
            visited.add(node)
            node = flow[node][0 if yes else 1]
        visited.add(node)

    def label(node: str) -> str:
        if node == "batch_dp":
            return "(Parameters replicated.) " + QUESTIONS["batch"]
        if node == "batch_fsdp":
            return "(Parameters sharded.) " + QUESTIONS["batch"]
        return QUESTIONS[node]

    steps = {"fits": 1, "fits_sharded": 2, "batch_dp": 3, "batch_fsdp": 4}
    lines: list[str] = []
    out = ['<div class="spmd-flowchart" role="figure" aria-label="Which strategy when: '
           'a flowchart of questions about memory and batch size">']
    for node, (yes, no) in flow.items():
        colour, background = _ON if node in visited else _OFF
        mark = "&#9654; " if node in visited else ""
        branches = []
        lines.append(f"{'>' if node in visited else ' '} {steps[node]}. {label(node)}")
        for word, target in (("yes", yes), ("no", no)):
            plain = f"go to {steps[target]}" if target in flow else _leaf(target)
            lines.append(f"      {word} -> {plain}")
            where = html.escape(plain) if target not in flow else plain
            strong = recommendation is not None and node in visited and target in visited
            text = f"<b>{word} &rarr; {where}</b>" if strong else f"{word} &rarr; {where}"
            branches.append(f"<li>{text}</li>")
        out.append(f'<div style="{_BOX.format(c=colour, bg=background)}">'
                   f"<b>{mark}{steps[node]}. {html.escape(label(node), quote=False)}</b>"
                   f'<ul style="margin:2px 0 0 0">{"".join(branches)}</ul></div>')
    if recommendation is not None:
        colour, background = _ON
        out.append(f'<div style="{_BOX.format(c=colour, bg=background)}"><b>&#9654; '
                   f"{html.escape(recommendation.title)}</b>: "
                   f"{html.escape(recommendation.book_strategies)}</div>")
        lines.append(f"> {recommendation.title}: {recommendation.book_strategies}")
    out.append("</div>")
    return Html("".join(out), "\n".join(lines))


# ------------------------------------------------------------------------ the measurements


@dataclass(frozen=True)
class Traffic:
    """What one device sends and stores in one SGD step of a strategy, from its compiled program."""

    strategy: str
    batch: int
    n_devices: int
    param_bytes: int
    param_bytes_per_device: int
    bytes_sent: int

    @property
    def sent_per_param_byte(self) -> float:
        """Bytes sent per step per byte of parameters (the whole model's)."""
        return self.bytes_sent / self.param_bytes

    def row(self) -> dict[str, str]:
        return {
            "strategy": self.strategy,
            "batch": str(self.batch),
            "params / device": hlo.format_bytes(self.param_bytes_per_device),
            "sent / step / device": hlo.format_bytes(self.bytes_sent),
            "sent / param bytes": f"{self.sent_per_param_byte:.2f}",
        }


def measure_traffic(
    names: Sequence[str],
    *,
    layer_sizes: Sequence[int],
    batch_sizes: Sequence[int],
    devices: Sequence[jax.Device] | None = None,
    learning_rate: float = 0.01,
) -> list[Traffic]:
    """One :class:`Traffic` per strategy and batch size: the compiled SGD step's bytes sent
    (ring model, :func:`spmd_guide.core.hlo.report`) and the parameter bytes each device holds."""
    if isinstance(names, (str, bytes)):
        raise checks.InputTypeError(
            f"names must be a list of strategy names, got the string {names!r}; wrap it: "
            f"[{names!r}].")
    if not isinstance(names, Sequence) or not names:
        raise checks.InputError(f"names must name at least one strategy, e.g. ['dp'], got "
                                f"{names!r:.60}.")
    names = [checks.one_of("strategy", n, nn.STRATEGIES) for n in names]
    sizes = checks.counts("layer_sizes", layer_sizes, min_length=2)
    batches = checks.counts("batch_sizes", batch_sizes)
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    params = nn.init_mlp(jax.random.key(0), sizes)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    rows = []
    for name in names:
        strategy = nn.STRATEGIES[name]
        mesh = strategy.mesh(devices)
        loss = strategy.loss(mesh)
        step = nn.make_sgd_step(loss, learning_rate=learning_rate)
        for b in batches:
            batch = nn.make_regression_batch(jax.random.key(1), b, sizes[0], sizes[-1])
            placed, placed_batch = strategy.shard(params, batch, mesh)
            # compiled to be read: XLA's passes in full, no LLVM optimization
            report = hlo.report(hlo.compile(step, placed, placed_batch,
                                            compiler_options=hlo.FAST_COMPILE))
            rows.append(Traffic(name, b, mesh.size, total, nn.param_bytes_per_device(placed),
                                report.total_bytes))
    return rows
