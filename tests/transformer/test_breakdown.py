"""breakdown: each collective of a compiled program by pass, source line and mesh axis."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from helpers import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.devices import build_mesh
from spmd_guide.transformer import breakdown


def _matmul_loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def test_collective_breakdown_reads_pass_source_and_axis():
    """A row-parallel matmul: one all-reduce, in the forward pass, at `x @ w`, over 'a'."""
    mesh = build_mesh((2, 2), ("a", "b"), devices=DEVICES[:4])
    w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("a", None)))
    x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P(None, "a")))
    text = jax.jit(jax.grad(_matmul_loss)).lower(w, x).compile().as_text()
    rows = breakdown.collective_breakdown(text, mesh, by=("pass", "where", "axis"),
                                            module="test_breakdown.py")
    assert rows == [{"pass": "forward", "where": "x @ w", "axis": "a",
                     "collective": "all-reduce", "ops": 1, "each carries": "f32[4,4]",
                     "bytes sent": 64}]
    assert breakdown._pass("jit(f)/transpose(jvp())/dot_general") == "backward"
    assert breakdown._pass("jit(f)/(jvp()/gather:transpose(jvp())/reduce_sum)") == \
        "forward + backward"
    # combined ops under a shared backward prefix are backward (XLA:CPU's combined expert
    # gradient all-reduce in pipeline/composing)
    assert breakdown._pass("jit(loss)/transpose(jvp(jit(layer)))/shard_map/(a/psum_invariant:"
                           "b/psum_invariant)") == "backward"
    assert breakdown._pass("jit(f)/jvp()/(dot:add)") == "forward"
    with pytest.raises(ValueError, match="breakdown key"):
        breakdown.collective_breakdown(text, mesh, by=("carries",))


def test_an_argument_laid_out_anew_is_named_by_its_path():
    """JAX 0.12 gives an op that re-lays an argument out (fsdp_tp's embedding table, pinned in
    test_transformer) no source line, only the argument's path as its op_name."""
    mesh = build_mesh((2, 2), ("a", "b"), devices=DEVICES[:4])
    w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("a", None)))
    x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P(None, "a")))
    text = jax.jit(jax.grad(_matmul_loss)).lower(w, x).compile().as_text()
    line = next(ln for ln in text.splitlines() if " all-reduce(" in ln)
    relaid = re.sub(r'metadata=\{[^}]*\}', "metadata={op_name=\"params[\\'w\\']\"}", line)
    rows = breakdown.collective_breakdown(text.replace(line, relaid), mesh,
                                          by=("pass", "where"))
    assert rows[0]["where"] == "argument params['w']" and rows[0]["pass"] == "forward"


@pytest.mark.parametrize("explicit", [False, True])
def test_scatter_forms_on_auto_and_explicit_axes(explicit):
    """tensor_parallelism.md: XLA:CPU keeps the partitioner's all-reduce, but compiles an
    explicit psum_scatter to a reduce-scatter."""
    mesh = build_mesh((4,), ("model",), devices=DEVICES[:4],
                      axis_types="explicit" if explicit else "auto")
    assert breakdown.scatter_forms(mesh, "model") == {
        "jax.jit, output pinned split by rows": "1 all-reduce",
        "shard_map with psum_scatter": "1 reduce-scatter"}


def _text():
    mesh = build_mesh((2,), ("a",), devices=DEVICES[:2])
    x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P(None, "a")))
    w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("a", None)))
    return jax.jit(_matmul_loss).lower(w, x).compile(), mesh


BAD = {
    "text None": (lambda t, m: breakdown.collective_breakdown(None), TypeError, "text"),
    "by a string": (lambda t, m: breakdown.collective_breakdown(t, m, by="pass"), TypeError,
                    "by"),
    "by empty": (lambda t, m: breakdown.collective_breakdown(t, m, by=()), TypeError, "by"),
    "by an unknown key": (lambda t, m: breakdown.collective_breakdown(t, m, by=("carries",)),
                          ValueError, "breakdown key"),
    "axis without a mesh": (lambda t, m: breakdown.collective_breakdown(t, by=("axis",)),
                            TypeError, "Mesh"),
    "mesh a string": (lambda t, m: breakdown.collective_breakdown(t, "mesh"), TypeError,
                      "Mesh"),
    "module 3": (lambda t, m: breakdown.collective_breakdown(t, m, module=3), TypeError,
                 "module"),
    "collectives of bytes": (lambda t, m: breakdown.collectives(b"x"), TypeError, "text"),
    "scatter_forms: unknown axis": (lambda t, m: breakdown.scatter_forms(m, "model"),
                                    ValueError, "not an axis"),
    "scatter_forms: mesh a list": (lambda t, m: breakdown.scatter_forms(DEVICES, "a"),
                                   TypeError, "Mesh"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_a_clear_error(case):
    compiled, mesh = _text()
    call, error, words = BAD[case]
    with pytest.raises(error, match=words):
        call(compiled, mesh)


def test_a_compiled_program_is_read_like_its_text():
    compiled, mesh = _text()
    assert breakdown.collective_breakdown(compiled, mesh) == \
        breakdown.collective_breakdown(compiled.as_text(), mesh)


def test_axes_read_the_same_from_a_mesh_of_explicit_axes():
    """The mesh only names the device grid's axes: Auto or Explicit gives the same labels."""
    compiled, mesh = _text()
    explicit = build_mesh((2,), ("a",), devices=DEVICES[:2], axis_types="explicit")
    assert breakdown.collective_breakdown(compiled, explicit, by=("axis",)) == \
        breakdown.collective_breakdown(compiled, mesh, by=("axis",)) == [
            {"axis": "a", "collective": "all-reduce", "ops": 1, "each carries": "f32[4,4]",
             "bytes sent": 64}]


# --------------------------------------------------------------------------- bad input, by class
def _summed_over_a():
    """A program on a 4 x 2 mesh ('a', 'b') with an all-reduce over 'a'."""
    mesh = build_mesh((4, 2), ("a", "b"), devices=DEVICES)
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("a", "b")))
    return jax.jit(lambda t: t.sum(0)).lower(x).compile().as_text(), mesh


def test_collective_breakdown_refuses_a_mesh_that_is_not_the_programs():
    text, mesh = _summed_over_a()
    assert {r["axis"] for r in breakdown.collective_breakdown(text, mesh, by=("axis",))} == {"a"}
    other = build_mesh((2, 4), ("a", "b"), devices=DEVICES)
    with pytest.raises(checks.InputError, match="names the mesh"):
        breakdown.collective_breakdown(text, other, by=("axis",))
    scrambled = build_mesh((4, 2), ("c", "d"), devices=DEVICES)  # other names: groups decide
    assert breakdown.collective_breakdown(text, scrambled, by=("axis",))[0]["axis"] == "c"
    ring = [DEVICES[i] for i in (0, 1, 2, 3, 4, 5, 6, 7)]
    flat = build_mesh((8,), ("x",), devices=ring)
    assert breakdown.collective_breakdown(text, flat, by=("axis",))[0]["axis"] == "x"
    small = build_mesh((4,), ("a",), devices=DEVICES[:4])
    with pytest.raises(checks.InputError, match="runs on 8"):
        breakdown.collective_breakdown(text, small, by=("axis",))


@pytest.mark.parametrize(("text", "error"), [("garbage", "ENTRY"), ([], "text must"),
                                             ({"a": 1}, "text must")])
def test_collectives_refuses_what_is_not_a_program(text, error):
    with pytest.raises(checks.InputError, match=error):
        breakdown.collectives(text)
