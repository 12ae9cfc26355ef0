"""What JAX traced: the primitives and collectives in a function's jaxpr.

The jaxpr is the program *before* the compiler optimizes it (:mod:`spmd_guide.core.hlo` reads
the program after). Comparing the two shows what the compiler merged or removed, e.g. the
all-gathers that rematerialization asks for again in the backward pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
from jax.extend.core import jaxprs_in_params, subjaxprs

from spmd_guide.core import checks


def primitive_counts(fn: Callable[..., Any], *args: Any) -> Counter[str]:
    """How often each primitive appears in the jaxpr of ``fn(*args)``, nested jaxprs included.

    This is the program JAX *traced* (``jax.make_jaxpr``), before the compiler optimizes it:
    ``primitive_counts(jax.grad(loss), params, batch)["all_gather"]`` counts the all-gathers
    the gradient program asks for, forward and backward.
    """
    checks.function("fn", fn)

    def count(jaxpr: Any) -> Counter[str]:
        counts = Counter(eqn.primitive.name for eqn in jaxpr.eqns)
        for inner in subjaxprs(jaxpr):
            counts.update(count(inner))
        return counts

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


def traced_collectives(fn: Callable[..., Any], *args: Any) -> list[tuple[int, str, str]]:
    """The collectives of the jaxpr of ``fn(*args)`` in program order, nested jaxprs included.

    One ``(top, primitive, shapes)`` per collective: ``top`` is the index of the top-level
    equation it sits in (for ``jax.grad`` of a ``shard_map`` loss the forward and the backward
    pass are two top-level ``shard_map`` equations), ``shapes`` reads ``in -> out``.
    """
    checks.function("fn", fn)
    names = {"all_gather", "reduce_scatter", "psum", "psum_invariant", "all_to_all", "ppermute"}
    found: list[tuple[int, str, str]] = []

    def visit(jaxpr: Any, top: int | None) -> None:
        for index, eqn in enumerate(jaxpr.eqns):
            where = index if top is None else top
            if eqn.primitive.name in names:
                shapes = (
                    ", ".join(str(v.aval.str_short()) for v in eqn.invars)
                    + " -> "
                    + ", ".join(str(v.aval.str_short()) for v in eqn.outvars)
                )
                found.append((where, eqn.primitive.name, shapes))
            for inner in jaxprs_in_params(eqn.params):
                visit(inner, where)

    visit(jax.make_jaxpr(fn)(*args).jaxpr, None)
    return found


