"""Choosing the next token from the logits: greedy, or sampled with temperature, top-k, top-p.

Greedy decoding takes the most likely token. Sampling draws it from
``softmax(logits / temperature)``, restricted first to the ``top_k`` most likely tokens and
then to the smallest set of them whose probability reaches ``top_p`` (the *nucleus*), and
renormalised. A temperature below 1 sharpens the distribution, above 1 flattens it; ``top_k``
and ``top_p`` cut off the long tail of unlikely tokens.

Ties at a cut-off are all kept: with logits ``[2, 2, 1]``, ``top_k=1`` keeps both 2s and
draws between them (as Hugging Face's and vLLM's top-k do), where greedy takes the first.

A temperature is 0 (greedy) or at least :data:`MIN_TEMPERATURE`, float32's smallest normal
number: the logits are shifted so that each row's largest is 0 before they are divided, so
no quotient overflows and a tiny temperature gives the argmax (ties drawn among), but a
subnormal one is flushed to 0 by XLA:CPU, and the division would give NaN.

Sharded, the draw must not depend on the layout, given the same logits. Two things make
it so:

* each row of logits is gathered whole (the vocabulary unsplit) on the devices that draw it,
  so the cut-offs (a sort and a cumulative sum over the vocabulary) see every token of that
  row;
* the random numbers come from a key that depends on the step alone (``fold_in(key, t)``),
  and JAX's ``jax_threefry_partitionable`` (the default) makes each element's random bits a
  function of the key and the element's index only, not of which device computes it
  (Part VII, book/randomness/random_numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spmd_guide.core import checks

__all__ = ["GREEDY", "MIN_TEMPERATURE", "Sampler", "check_key", "chi_square", "draw_rows",
           "draws_figure", "frequencies", "is_key_row", "probabilities", "restrict", "sample",
           "sampler", "step_key"]

#: The smallest temperature above 0 a sampler takes: float32's smallest normal number.
#: Below it the float32 temperature is subnormal, which XLA:CPU flushes to 0.
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)


def _temperature(value: Any) -> float:
    temperature = checks.real("temperature", value, minimum=0.0)
    if 0 < temperature < MIN_TEMPERATURE:
        raise checks.InputError(
            f"temperature={temperature} is below {MIN_TEMPERATURE:.3g}, float32's smallest "
            "normal number: XLA:CPU flushes such a temperature to 0 and the division gives "
            "NaN. Pass temperature=0 for greedy decoding, or at least that bound.")
    return temperature


@dataclass(frozen=True)
class Sampler:
    """How the next token is chosen: ``temperature`` 0 is greedy (``top_k``/``top_p`` then
    change nothing); above 0 (and at least :data:`MIN_TEMPERATURE`), a draw from the
    restricted softmax. ``top_k`` is at least 1, ``top_p`` in ``(0, 1]`` (1 is stored as
    ``None``: no cut). The fields are checked when the sampler is made. Hashable: compiled
    programs are cached per sampler."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # a frozen dataclass: normalise the fields once
        set_(self, "temperature", _temperature(self.temperature))
        if self.top_k is not None:
            set_(self, "top_k", checks.count("top_k", self.top_k, minimum=1))
        if self.top_p is not None:
            top_p = checks.real("top_p", self.top_p, maximum=1.0)
            if top_p <= 0:
                raise checks.InputError(f"top_p must be in (0, 1] (the probability the kept "
                                        f"tokens reach), got {top_p}.")
            set_(self, "top_p", None if top_p == 1.0 else top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampler()


def sampler(*, temperature: Any = 0.0, top_k: Any = None, top_p: Any = None, key: Any = None,
            vocab: int) -> Sampler:
    """The checked :class:`Sampler`: ``temperature`` 0 or at least :data:`MIN_TEMPERATURE`
    (a key is needed above 0), ``top_k`` in ``[1, vocab]``, ``top_p`` in ``(0, 1]``."""
    temperature = _temperature(temperature)
    if temperature > 0 and key is None:
        raise checks.InputError(
            f"temperature={temperature} samples, which needs a random key: pass "
            "key=jax.random.key(0) (the same key gives the same tokens), or temperature=0 "
            "for greedy decoding.")
    if top_k is not None:
        top_k = checks.count("top_k", top_k, minimum=1, maximum=vocab)
    return Sampler(temperature, top_k, top_p)


def _check_sampler(value: Any) -> Sampler:
    return checks.instance("sampler", value, Sampler,
                           example="a Sampler such as sampling.Sampler(0.8, top_p=0.9)")


def _check_logits(logits: Any) -> Any:
    """Float logits ``[..., vocab]``; concrete ones must be finite (an inf or NaN logit has
    no probability)."""
    logits = checks.array("logits", logits, min_ndim=1, dtype_kind="f")
    if not checks.is_traced(logits) and not isinstance(logits, jax.ShapeDtypeStruct):
        if not np.all(np.isfinite(np.asarray(jax.device_get(logits)))):
            raise checks.InputError("logits must be finite; got an inf or NaN logit.")
    return logits


def restrict(logits: Any, sampler: Sampler) -> jax.Array:
    """``logits / temperature`` with every token outside the top-k and the top-p set at
    ``-inf`` (``[..., vocab]``), each row shifted so that its largest is 0 (the softmax does
    not change, and no quotient overflows). Ties at the k-th value, and at the top-p
    boundary, are all kept. A sampler with temperature > 0 only: greedy has no
    distribution to restrict."""
    sampler = _check_sampler(sampler)
    if sampler.greedy:
        raise checks.InputError(
            "restrict needs a sampler with temperature > 0; greedy decoding takes the argmax "
            "(sample() and probabilities() handle it).")
    logits = jnp.asarray(_check_logits(logits))
    if sampler.top_k is not None:
        checks.count("sampler.top_k", sampler.top_k, maximum=logits.shape[-1])
    raw = logits.astype(jnp.float32)
    scaled = (raw - jnp.max(raw, axis=-1, keepdims=True)) / sampler.temperature
    if sampler.top_k is not None:
        kth = jax.lax.top_k(scaled, sampler.top_k)[0][..., -1:]
        scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
    if sampler.top_p is not None:
        ordered = -jnp.sort(-scaled, axis=-1)
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # the mass of the likelier tokens
        floor = jnp.min(jnp.where(before < sampler.top_p, ordered, jnp.inf), axis=-1,
                        keepdims=True)
        scaled = jnp.where(scaled >= floor, scaled, -jnp.inf)
    return scaled


def probabilities(logits: Any, sampler: Sampler) -> jax.Array:
    """The distribution :func:`sample` draws from: the softmax of :func:`restrict` (one-hot
    on the argmax if greedy)."""
    if _check_sampler(sampler).greedy:
        logits = jnp.asarray(_check_logits(logits))
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1])
    return jax.nn.softmax(restrict(jnp.asarray(logits), sampler), axis=-1)


def is_key_row(key: Any) -> bool:
    """Whether ``key`` is a 1-D array of typed keys (one per row of a batch), as
    ``jax.random.split(key, batch)`` makes."""
    return ((isinstance(key, (jax.Array, np.ndarray)) or checks.is_traced(key))
            and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 1)


def check_key(key: Any, *, batch: int | None = None, name: str = "key") -> jax.Array:
    """One key (as :func:`checks.key` takes it), or one typed key per row: a ``[batch]`` key
    array (``batch`` rows if given)."""
    if is_key_row(key):
        if batch is not None and key.shape != (batch,):
            raise checks.InputError(
                f"{name} holds {key.shape[0]} keys but there are {batch} rows: pass one key, "
                f"or one per row (jax.random.split(key, {batch})).")
        return key
    return checks.key(name, key)


def step_key(key: jax.Array, t: Any) -> jax.Array:
    """The key of generation step ``t`` (an integer >= 0, or traced): a function of the key
    and the step only. A row of keys gives a row of step keys, each folded alike."""
    key = check_key(key)
    if not checks.is_traced(t):
        t = checks.count("t", t, minimum=0)
    elif not jnp.issubdtype(t.dtype, jnp.integer) or t.ndim:
        raise checks.InputTypeError(f"t must be an integer scalar, got {t.dtype}{list(t.shape)}.")
    if key.ndim == 1:
        return jax.vmap(lambda k: jax.random.fold_in(k, t))(key)
    return jax.random.fold_in(key, t)


def sample(logits: jax.Array, key: jax.Array, sampler: Sampler) -> jax.Array:
    """One token per row of ``logits`` ``[batch, vocab]`` (int32 ``[batch]``): the argmax
    if greedy, else a draw from :func:`probabilities` with ``key`` (the Gumbel-max trick
    of ``jax.random.categorical``). ``key`` is one key, whose noise ``[batch, vocab]``
    differs from row to row, or one key per row (``[batch]``): then each row's draw is
    the one that row would get alone in a batch of 1 with its own key."""
    if _check_sampler(sampler).greedy:
        return jnp.argmax(_check_logits(logits), axis=-1).astype(jnp.int32)
    cut = restrict(logits, sampler)
    if cut.ndim == 2 and is_key_row(key):
        keys = check_key(key, batch=cut.shape[0])
        return jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, cut).astype(
            jnp.int32)
    return jax.random.categorical(checks.key("key", key), cut, axis=-1).astype(jnp.int32)


def frequencies(logits: Any, sampler: Sampler, *, key: Any, draws: int) -> np.ndarray:
    """How often each token comes out of ``draws`` independent draws from one row of
    ``logits`` ``[vocab]`` (each draw with its own key, split from ``key``): the empirical
    distribution, to set against :func:`probabilities`."""
    logits = checks.array("logits", logits, ndim=1, dtype_kind="f")
    draws = checks.count("draws", draws)
    if _check_sampler(sampler).greedy:
        raise checks.InputError("frequencies needs a sampler with temperature > 0.")
    keys = jax.random.split(checks.key("key", key), draws)
    rows = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (draws, logits.shape[0]))
    tokens = jax.vmap(lambda row, k: sample(row[None], k, sampler)[0])(rows, keys)
    return np.bincount(np.asarray(tokens), minlength=logits.shape[0]) / draws


def chi_square(counts: Any, probs: Any) -> tuple[float, int]:
    """Pearson's statistic of observed ``counts`` against ``probs`` over the tokens whose
    probability is above 0, and its degrees of freedom (tokens - 1). A count on a token of
    probability 0 gives ``inf``. ``counts``: finite, >= 0, not all 0; ``probs``: a
    distribution of the same shape (finite, >= 0, summing to 1 within 1e-4)."""
    counts = np.asarray(checks.array("counts", counts, ndim=1, dtype_kind="iuf"), float)
    probs = np.asarray(checks.array("probs", probs, ndim=1, dtype_kind="f"), float)
    checks.same_shape("probs", probs, counts.shape, other="counts")
    if not np.all(np.isfinite(counts)) or counts.min() < 0 or counts.sum() == 0:
        raise checks.InputError(f"counts must be finite, at least 0 and not all 0, got "
                                f"{checks.value_text(counts.tolist())}.")
    if (not np.all(np.isfinite(probs)) or probs.min() < 0
            or abs(probs.sum() - 1) > 1e-4):
        raise checks.InputError(f"probs must be a distribution (finite, at least 0, summing "
                                f"to 1), got {checks.value_text(probs.tolist())} (sum "
                                f"{probs.sum():.4g}).")
    if np.any(counts[probs == 0] > 0):
        return math.inf, int((probs > 0).sum()) - 1
    n, live = counts.sum(), probs > 0
    expected = n * probs[live]
    return float(np.sum((counts[live] - expected) ** 2 / expected)), int(live.sum()) - 1


def draw_rows(logits: Any, samplers: dict[str, Sampler], *, key: Any, draws: int
              ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per sampler (titled by its key in ``samplers``): the probabilities :func:`sample`
    gives each token of ``logits`` ``[vocab]`` and the share of ``draws`` draws that picked
    it."""
    logits = np.asarray(checks.array("logits", logits, ndim=1, dtype_kind="f"))
    if not isinstance(samplers, dict) or not samplers or not all(
            isinstance(s, Sampler) for s in samplers.values()):
        raise checks.InputTypeError("samplers must map titles to Sampler objects.")
    return {label: (np.asarray(probabilities(logits, s)),
                    frequencies(logits, s, key=key, draws=draws))
            for label, s in samplers.items()}


def draws_figure(rows: dict[str, tuple[np.ndarray, np.ndarray]], *, draws: int,
                 show: int | None = None) -> Any:
    """One panel per row of :func:`draw_rows`: the probability of each of the ``show``
    likeliest tokens (bars; default 12, or the whole vocabulary if it is smaller) and how
    often the ``draws`` draws picked it (dots). Vector figure with alt text
    (:mod:`spmd_guide.core.drawing`)."""
    from spmd_guide.core.drawing import subplots

    message = "rows must be draw_rows(...)'s dict of title -> (probabilities, shares)."
    if not isinstance(rows, dict) or not rows:
        raise checks.InputTypeError(message)
    for label, pair in rows.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise checks.InputTypeError(f"{message} rows[{label!r}] is not such a pair.")
        for name, part in zip(("probabilities", "shares"), pair, strict=True):
            checks.array(f"rows[{label!r}]'s {name}", part, ndim=1, dtype_kind="f")
    vocab = {np.shape(part)[0] for pair in rows.values() for part in pair}
    if len(vocab) != 1:
        raise checks.InputError(f"{message} Its arrays have {sorted(vocab)} tokens, not one "
                                "vocabulary.")
    draws = checks.count("draws", draws)
    first = np.asarray(next(iter(rows.values()))[0])
    show = (min(12, first.shape[0]) if show is None
            else checks.count("show", show, maximum=first.shape[0]))
    order = np.argsort(-first, kind="stable")[:show]
    gap = max(float(np.max(np.abs(np.asarray(p) - np.asarray(f)))) for p, f in rows.values())
    fig, axes = subplots(len(rows), 1, figsize=(4.4, 1.7 * len(rows) + 0.5), sharex=True,
                         squeeze=False, alt=(
                             f"Bar charts, one per sampler ({'; '.join(rows)}): the probability "
                             f"of each of the {show} likeliest tokens (bars) and the fraction "
                             f"of {draws:,} draws that picked it (dots). The dots sit on the "
                             f"bars: the largest gap is {gap:.3f}; tokens cut off by top-k or "
                             f"top-p have no bar and no dot."))
    x = np.arange(show)
    for ax, (label, (p, f)) in zip(axes[:, 0], rows.items(), strict=True):
        p, f = np.asarray(p), np.asarray(f)
        ax.bar(x, p[order], color="#77AADD", edgecolor="#1F4E79", label="probability")
        ax.plot(x, f[order], "o", color="#B5402A", markersize=4, label="share of draws")
        ax.set_title(label, fontsize=10)
        ax.set_ylabel("probability", fontsize=9)
        ax.tick_params(labelsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=9, frameon=False)
    axes[-1, 0].set_xticks(x, [str(t) for t in order])
    axes[-1, 0].set_xlabel("token id, likeliest first", fontsize=9)
    fig.tight_layout()
    return fig
