"""checks: the package's input vocabulary. Each check passes good values through (normalised)
and refuses bad ones with an error that names the argument, the value and the fix."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest
from helpers import mesh_of
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.core.checks import InputError, InputTypeError


def test_errors_are_the_builtin_kinds_readers_catch():
    assert issubclass(InputError, ValueError)
    assert issubclass(InputTypeError, InputError) and issubclass(InputTypeError, TypeError)


@given(st.integers(1, 10**6), st.integers(1, 64))
def test_divisible_accepts_exact_multiples_and_names_the_fix(parts, divisor):
    checks.divisible("batch", parts * divisor, divisor)
    if divisor > 1:
        with pytest.raises(InputError, match=f"Use a multiple of {divisor}"):
            checks.divisible("batch", parts * divisor + 1, divisor, why="over axis 'data'")


def test_good_values_come_back_normalised():
    assert checks.count("n", np.int64(3)) == 3 and type(checks.count("n", np.int64(3))) is int
    assert checks.count("n", np.array(5)) == 5
    assert type(checks.count("n", jax.numpy.int32(4))) is int  # a JAX scalar, concrete
    assert checks.count("n", jax.numpy.int32(4)) == 4
    with pytest.raises(InputTypeError, match="must be an integer"):
        checks.count("n", jax.random.key(0))
    assert checks.counts("shape", np.array([4, 2])) == (4, 2)
    assert checks.real("lr", np.float32(0.5)) == 0.5 and checks.real("lr", 2) == 2.0
    assert checks.key("key", 3).dtype == jax.random.key(3).dtype
    assert checks.one_of("kind", "b", {"a": 1, "b": 2}) == "b"
    assert checks.flag("donate", True) is True
    assert checks.function("fn", len) is len
    mesh = mesh_of(4)
    assert checks.mesh("mesh", mesh) is mesh and checks.axis(mesh, "x") == 4
    assert checks.array("x", [1.0, 2.0], ndim=1).shape == (2,)
    checks.spec_fits("x", (8, 3), P("x", None), mesh)
    assert checks.sharding("s", NamedSharding(mesh, P())) is not None


BAD = [
    ("count bool", lambda: checks.count("n", True), InputTypeError, "n must be an integer"),
    ("count float", lambda: checks.count("n", 2.0), InputTypeError, "integer"),
    ("count low", lambda: checks.count("n", 0), InputError, "at least 1"),
    ("count high", lambda: checks.count("n", 9, maximum=8), InputError, "at most 8"),
    ("counts str", lambda: checks.counts("shape", "42"), InputTypeError, "sequence"),
    ("counts short", lambda: checks.counts("shape", [], min_length=1), InputError, "at least 1"),
    ("counts entry", lambda: checks.counts("shape", [4, 0]), InputError, r"shape\[1\]"),
    ("real str", lambda: checks.real("lr", "0.1"), InputTypeError, "real number"),
    ("real nan", lambda: checks.real("lr", float("nan")), InputError, "finite"),
    ("real positive", lambda: checks.real("lr", 0, positive=True), InputError, "positive"),
    ("real below", lambda: checks.real("p", 1.0, maximum=1.0, inclusive_max=False),
     InputError, "below 1.0"),
    ("divisible zero", lambda: checks.divisible("rows", 8, 0), InputError, "0 parts"),
    ("key float", lambda: checks.key("key", 0.5), InputTypeError, "jax.random.key"),
    ("key many", lambda: checks.key("key", jax.random.split(jax.random.key(0))),
     InputError, "one key"),
    ("array str", lambda: checks.array("x", "abc"), InputTypeError, "array"),
    ("array ndim", lambda: checks.array("x", np.ones((2, 2)), ndim=1), InputError, "1 dim"),
    ("array tree empty", lambda: checks.array_tree("params", {}), InputError, "at least one"),
    ("same shape", lambda: checks.same_shape("a", np.ones(3), (4,), other="b"),
     InputError, "match b"),
    ("mesh", lambda: checks.mesh("mesh", "x"), InputTypeError, "jax.make_mesh"),
    ("axis type", lambda: checks.axis(mesh_of(2), 0), InputTypeError, "axis name"),
    ("axis missing", lambda: checks.axis(mesh_of(2), "y"), InputError, "not an axis"),
    ("spec not spec", lambda: checks.spec_fits("x", (4,), ("x",), mesh_of(2)),
     InputTypeError, "PartitionSpec"),
    ("spec too long", lambda: checks.spec_fits("x", (4,), P("x", None), mesh_of(2)),
     InputError, "2 dimensions"),
    ("spec uneven", lambda: checks.spec_fits("x", (3,), P("x"), mesh_of(2)),
     InputError, "dimension 0 of x is 3"),
    ("spec axis twice", lambda: checks.spec_fits("x", (4, 4), P("x", "x"), mesh_of(2)),
     InputError, "twice"),
    ("sharding", lambda: checks.sharding("s", P("x")), InputTypeError, "NamedSharding"),
    ("one_of", lambda: checks.one_of("kind", "c", ["a", "b"]), InputError, "choose one of"),
    ("function", lambda: checks.function("fn", 3), InputTypeError, "function"),
    ("flag", lambda: checks.flag("donate", 1), InputTypeError, "True or False"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD],
                         ids=[row[0] for row in BAD])
def test_bad_values_get_an_error_that_names_them(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_text_instance_record_structure_and_mesh_axes():
    with pytest.raises(InputError, match="title must be a non-empty string"):
        checks.text("title", " ")
    assert checks.text("title", "", empty=True) == ""
    with pytest.raises(InputTypeError, match="title must be a string"):
        checks.text("title", 3)
    with pytest.raises(InputTypeError, match="ax must be an Axes"):
        checks.instance("ax", "left", int, example="an Axes")
    assert checks.record("row", {"a": 1, "b": 2}, required=("a",)) == {"a": 1, "b": 2}
    with pytest.raises(InputError, match="row lacks 'b'"):
        checks.record("row", {"a": 1}, required=("a", "b"))
    with pytest.raises(InputTypeError, match="row must be a dict"):
        checks.record("row", [("a", 1)], required=("a",))
    checks.same_structure("s", {"a": 1, "b": 2}, {"a": 0, "b": 0}, other="params")
    with pytest.raises(InputError, match="s must have one leaf per leaf of params"):
        checks.same_structure("s", {"a": 1}, {"a": 0, "b": 0}, other="params")
    mesh = mesh_of(2, ("data",))
    assert checks.mesh_axes("mesh", mesh, ("data",)) is mesh
    with pytest.raises(InputError, match="needs 'model'"):
        checks.mesh_axes("mesh", mesh, ("data", "model"))


@pytest.mark.parametrize(("value", "error"), [
    ("", InputError), ("  ", InputError), (pathlib.Path(""), InputError),
    (pathlib.PurePosixPath(""), InputError), (pathlib.PureWindowsPath(""), InputError),
    (pathlib.Path("."), InputError), (b"/tmp/x", InputTypeError), (3, InputTypeError),
    (None, InputTypeError), (["a"], InputTypeError)])
def test_path_refuses_what_is_not_a_named_path(value, error):
    """An empty path would mean the current directory: every package function that writes or
    reads a path (checkpoints, results, chips files, problem files) goes through checks.path."""
    with pytest.raises(error, match="out must"):
        checks.path("out", value)


def test_path_returns_a_pathlib_path():
    assert checks.path("out", ".") == pathlib.Path(".")  # a string "." names it explicitly
    assert checks.path("out", pathlib.Path.cwd()) == pathlib.Path.cwd()
    assert checks.path("out", "a/b") == pathlib.Path("a/b")
    assert checks.path("out", pathlib.Path("/tmp")) == pathlib.Path("/tmp")


@pytest.mark.parametrize(("names", "error"), [
    ("data", checks.InputTypeError), (None, checks.InputTypeError), (("a",), checks.InputError),
    (("a", "a"), checks.InputError), (("a", ""), checks.InputError), (("a", 1), checks.InputError),
])
def test_axis_names_are_one_distinct_non_empty_string_per_axis(names, error):
    with pytest.raises(error, match="names"):
        checks.axis_names("names", names, (4, 2))
    assert checks.axis_names("names", ["data", "model"], (4, 2)) == ("data", "model")
