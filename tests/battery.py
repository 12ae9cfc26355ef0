"""The bad-input battery: classes of argument, each with the values a user could plausibly
pass, and the rule each answer is held to (bad-input audits C, D, E).

A *call* is a public function with one valid set of arguments and, for each argument it
guards, the *class* of that argument (a count, a real, a flag, a key, a mesh, an axis name, a
path, an array, a choice). Each class yields cases: a bad value, which must raise the
package's ``InputError`` naming the argument (CLEAR; another exception or an unnamed argument
is OBSCURE, a return is SILENT), or a valid form of the valid value (a NumPy or JAX integer
scalar where an int is meant, a raw key where a key is meant, Explicit mesh axes), which must
give the answer the plain value gives. Path cases also check that nothing on disk changed.

``python tests/battery.py`` prints the clear/obscure/silent counts per module.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spmd_guide.core.checks import InputError

#: Every directory the battery makes lives under one root, removed when Python exits.
ROOT = pathlib.Path(tempfile.mkdtemp(prefix="spmd-battery-"))
atexit.register(shutil.rmtree, ROOT, ignore_errors=True)


def fresh_root() -> pathlib.Path:
    """A new empty directory under :data:`ROOT`."""
    return pathlib.Path(tempfile.mkdtemp(dir=ROOT))


BAD = "bad"      # must be refused clearly
SAME = "same"    # a valid form: must give the plain value's answer
WORKS = "works"  # a valid form whose answer is not comparable (a figure, a timing)


@dataclasses.dataclass(frozen=True)
class Count:
    """An integer argument, at least ``minimum`` (and at most ``maximum``)."""
    minimum: int = 1
    maximum: int | None = None
    optional: bool = False  # None is a valid value (the default: "the latest", "never")

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        out = [("bool", True, BAD), ("nan", math.nan, BAD), ("inf", math.inf, BAD),
               ("-inf", -math.inf, BAD), ("half", valid + 0.5, BAD), ("string", str(valid), BAD),
               ("none", None, WORKS if self.optional else BAD), ("list", [valid], BAD), ("below", self.minimum - 1, BAD),
               ("numpy bool", np.bool_(True), BAD),
               ("numpy int", np.int64(valid), SAME),
               ("float-for-int", float(valid), "bad-or-same")]
        if abs(valid) < 2**31:
            out.append(("jax int", jnp.int32(valid), SAME))
        if self.minimum > 0:
            out.append(("zero", 0, BAD))
        if self.minimum >= 0:
            out.append(("negative", -4, BAD))
        if self.maximum is not None:
            out.append(("above", self.maximum + 1, BAD))
        return out


@dataclasses.dataclass(frozen=True)
class Index:
    """An axis (dimension) index into an array of ``ndim`` dimensions; negative counts from
    the end, as in NumPy."""
    ndim: int

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        return [("bool", True, BAD), ("nan", math.nan, BAD), ("half", 0.5, BAD),
                ("string", "0", BAD), ("none", None, BAD), ("past the end", self.ndim, BAD),
                ("before the start", -self.ndim - 1, BAD),
                ("numpy int", np.int64(valid), SAME), ("jax int", jnp.int32(valid), SAME)]


@dataclasses.dataclass(frozen=True)
class Real:
    """A real argument: finite, positive (or at least ``minimum``), below ``maximum``."""
    positive: bool = True
    minimum: float | None = None
    maximum: float | None = None

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        out = [("bool", True, BAD), ("nan", math.nan, BAD), ("inf", math.inf, BAD),
               ("-inf", -math.inf, BAD), ("string", str(valid), BAD), ("none", None, BAD),
               ("list", [valid], BAD), ("numpy bool", np.bool_(True), BAD),
               ("numpy float", np.float64(valid), SAME), ("jax float", jnp.float32(valid), SAME)]
        if self.positive:
            out += [("zero", 0.0, BAD), ("negative", -1.0, BAD)]
        if self.minimum is not None:
            out.append(("below", self.minimum - 1.0, BAD))
        if self.maximum is not None:
            out.append(("above", self.maximum + 1.0, BAD))
        return out


@dataclasses.dataclass(frozen=True)
class Flag:
    """A ``bool`` option."""
    optional: bool = False

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        return [("int", int(valid), BAD), ("string", str(valid), BAD),
                ("none", None, WORKS if self.optional else BAD),
                ("numpy bool", np.bool_(valid), SAME)]


@dataclasses.dataclass(frozen=True)
class Key:
    """A PRNG key: typed or raw, never a float, a string or a batch of keys."""

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        return [("float", 0.5, BAD), ("string", "0", BAD), ("none", None, BAD),
                ("batched", jax.random.split(jax.random.key(0), 2), BAD),
                ("float array", jnp.zeros(2), BAD), ("bool", True, BAD),
                ("raw", jax.random.PRNGKey(0), SAME), ("typed", jax.random.key(0), SAME)]


@dataclasses.dataclass(frozen=True)
class MeshArg:
    """A mesh that must have ``axes``: never a device list, nor a mesh missing an axis; its
    Explicit-axes twin must give the same answer."""
    axes: tuple[str, ...] = ("x",)
    explicit: bool = True
    missing_ok: bool = False  # a missing axis is an answer (a gallery records JAX's error)

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        renamed = jax.make_mesh(valid.axis_sizes, tuple(f"{a}_other" for a in valid.axis_names),
                                devices=valid.devices.flat)
        out = [("none", None, BAD), ("devices", list(valid.devices.flat), BAD),
               ("missing axis", renamed, WORKS if self.missing_ok else BAD),
               ("string", "x", BAD)]
        if self.explicit:
            kind = jax.sharding.AxisType.Explicit
            twin = jax.make_mesh(valid.axis_sizes, valid.axis_names,
                                 axis_types=(kind,) * len(valid.axis_names),
                                 devices=valid.devices.flat)
            out.append(("explicit", twin, SAME))
        return out


@dataclasses.dataclass(frozen=True)
class Devices:
    """A list of devices: never a string, a count, ints, an empty list, a device twice, a
    mesh; a tuple or a NumPy array of the same devices gives the same answer."""
    optional: bool = True  # None means every device

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        first = list(valid)[0]
        out = [("string", "cpu", BAD), ("count", len(valid), BAD), ("ints", list(range(len(valid))), BAD),
               ("empty", [], BAD), ("twice", [first] * len(valid), BAD),
               ("tuple", tuple(valid), SAME), ("numpy array", np.array(valid, dtype=object), SAME)]
        if not self.optional:
            out.append(("none", None, BAD))
        return out


@dataclasses.dataclass(frozen=True)
class Axis:
    """A mesh axis name."""

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        return [("unknown", "nope", BAD), ("int", 0, BAD), ("none", None, BAD),
                ("empty", "", BAD)]


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of a set of names (a strategy, a schedule, a layout)."""

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        return [("unknown", "nonsense", BAD), ("int", 3, BAD), ("none", None, BAD),
                ("empty", "", BAD), ("list", [valid], BAD)]


@dataclasses.dataclass(frozen=True)
class Text:
    """A string (a title, a label, HLO text)."""
    empty_ok: bool = True

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        out = [("int", 3, BAD), ("list", [valid], BAD), ("bytes", b"x", BAD)]
        if not self.empty_ok:
            out.append(("empty", "", BAD))
        return out


@dataclasses.dataclass(frozen=True)
class Array:
    """An array argument of a given rank and dtype kind."""
    ndim: int | None = None
    kind: str = "f"

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        out = [("none", None, BAD), ("string", "x", BAD), ("dict", {"a": valid}, BAD)]
        if self.ndim is not None:
            out.append(("extra rank", jnp.asarray(valid)[None], BAD))
            if self.ndim > 0:
                out.append(("scalar", jnp.zeros((), valid.dtype), BAD))
        if "f" in self.kind and "i" not in self.kind:
            out.append(("int dtype", jnp.asarray(valid).astype(jnp.int32), BAD))
        if "i" in self.kind and "f" not in self.kind:
            out.append(("float dtype", jnp.asarray(valid).astype(jnp.float32), BAD))
        return out


@dataclasses.dataclass(frozen=True)
class Tree:
    """A pytree of arrays (parameters, a state): never a string or nothing; unless ``free``
    (any tree will do), never another structure either."""
    free: bool = False
    single_ok: bool = True  # with ``free``: one bare array is a tree too

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        leaves = jax.tree.leaves(valid)
        out = [("none", None, BAD), ("string", "x", BAD), ("empty dict", {}, BAD),
               ("one leaf", leaves[0], WORKS if self.free and self.single_ok else BAD),
               ("a string leaf", {"a": "x"}, BAD)]
        if self.free:
            return out
        if isinstance(valid, dict):
            first = next(iter(valid))
            out.append(("missing key", {k: v for k, v in valid.items() if k != first}, BAD))
        if isinstance(valid, (tuple, list)):
            out.append(("shorter", type(valid)(list(valid)[:-1]), BAD))
        return out


@dataclasses.dataclass(frozen=True)
class PathArg:
    """A directory path. ``reads``: the directory must exist (a missing or foreign one is the
    caller's mistake); otherwise the call may create it. Never '' nor Path('') (the current
    directory), never a file where a directory is meant."""
    reads: bool = True
    valid_forms: bool = True
    file: bool = False  # a path to a file (written), not a directory

    def cases(self, valid: Any) -> list[tuple[str, Any, str]]:
        root = pathlib.Path(valid).parent
        root.mkdir(parents=True, exist_ok=True)
        afile = root / "a-file.txt"
        afile.write_text("not a directory")
        foreign = root / "foreign"
        foreign.mkdir(exist_ok=True)
        (foreign / "notes.txt").write_text("not a checkpoint")
        out = [("empty", "", BAD), ("Path('')", pathlib.Path(""), BAD),
               ("pure ''", pathlib.PurePosixPath(""), BAD), ("none", None, BAD),
               ("int", 5, BAD), ("bytes", os.fsencode(str(valid)), BAD),
               ("a file's child", afile / "sub", BAD)]
        out.append(("a directory", foreign, BAD) if self.file else ("a file", afile, BAD))
        if self.reads:
            out += [("missing", root / "missing", BAD), ("foreign", foreign, BAD)]
        if self.valid_forms:
            out.append(("str", str(valid), SAME))
        return out


@dataclasses.dataclass
class Call:
    """One public function, its valid arguments and the class of each guarded argument.

    ``run(kwargs)`` calls the function; ``valid`` is the valid keyword set; ``args`` maps an
    argument name to its class; ``same`` compares two answers (default: equal pytrees).
    """
    label: str
    run: Callable[[dict[str, Any]], Any]
    valid: dict[str, Any] | Callable[[], dict[str, Any]]
    args: dict[str, Any]
    same: Callable[[Any, Any], bool] | None = None
    names: dict[str, str] = dataclasses.field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        return dict(self.valid() if callable(self.valid) else self.valid)


def equal(a: Any, b: Any) -> bool:
    """Two answers are the same: equal pytrees of arrays or plain values."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    if ta != tb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, (jax.Array, np.ndarray, np.generic)) or isinstance(
                y, (jax.Array, np.ndarray, np.generic)):
            if jax.dtypes.issubdtype(getattr(x, "dtype", None) or np.float32,
                                     jax.dtypes.prng_key):
                x, y = jax.random.key_data(x), jax.random.key_data(y)
            x, y = np.asarray(x), np.asarray(y)
            if x.shape != y.shape or not np.allclose(x, y, equal_nan=True):
                return False
        elif isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=1e-6) and not (math.isnan(x) and math.isnan(y)):
                return False
        elif x != y:
            return False
    return True


def cases(calls: list[Call]) -> list[tuple[Call, str, str, str]]:
    """(call, argument, case tag, expectation) for every class case of every call."""
    out = []
    for call in calls:
        valid = call.kwargs()
        for arg, cls in call.args.items():
            for tag, _value, expect in cls.cases(valid[arg]):
                out.append((call, arg, tag, expect))
    return out


def _listing(root: pathlib.Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
                  for p in root.rglob("*"))


def classify(call: Call, arg: str, tag: str) -> tuple[str, str]:
    """Run one case; return (verdict, detail): CLEAR, OBSCURE, SILENT, OK or WRONG."""
    valid = call.kwargs()
    cls = call.args[arg]
    value, expect = next((v, e) for t, v, e in cls.cases(valid[arg]) if t == tag)
    watched = [pathlib.Path.cwd()] + (
        [pathlib.Path(valid[arg]).parent] if isinstance(cls, PathArg) else [])
    before = [_listing(w) if w != pathlib.Path.cwd() else sorted(os.listdir(w))
              for w in watched]
    name = call.names.get(arg, arg)
    home = os.getcwd()
    if isinstance(cls, PathArg):  # a call that writes into the cwd writes where we watch
        os.chdir(pathlib.Path(valid[arg]).parent)
        watched = [pathlib.Path(valid[arg]).parent]
        before = [_listing(watched[0])]
    try:
        try:
            got = call.run(valid | {arg: value})
        finally:
            os.chdir(home)
    except InputError as error:
        after = [_listing(w) if w != pathlib.Path.cwd() else sorted(os.listdir(w))
                 for w in watched]
        if after != before:
            return "SILENT", f"refused but changed the disk: {error}"
        if expect in (SAME, WORKS):
            return "WRONG", f"a valid form refused: {error}"
        if name not in str(error):
            return "OBSCURE", f"does not name {name!r}: {error}"
        return "CLEAR", str(error)
    except Exception as error:  # noqa: BLE001 - the verdict names any other exception
        if expect in (SAME, WORKS):
            return "WRONG", f"a valid form failed: {type(error).__name__}: {error}"
        return "OBSCURE", f"{type(error).__name__}: {str(error)[:300]}"
    if expect == BAD:
        return "SILENT", f"returned {str(got)[:200]}"
    if expect == "bad-or-same" or expect == SAME:
        reference = call.run(call.kwargs())
        same = call.same or equal
        if not same(got, reference):
            return ("SILENT" if expect == "bad-or-same" else "WRONG"), "a different answer"
    return "OK", ""


def report(modules: dict[str, list[Call]]) -> dict[str, dict[str, int]]:
    """Verdict counts per module (and the failures printed)."""
    totals = {}
    for module, calls in modules.items():
        counts: dict[str, int] = {}
        for call, arg, tag, _ in cases(calls):
            verdict, detail = classify(call, arg, tag)
            counts[verdict] = counts.get(verdict, 0) + 1
            if verdict not in ("CLEAR", "OK"):
                print(f"  {verdict:7} {call.label}({arg}={tag}): {detail[:240]}")
        totals[module] = counts
        print(module, counts, flush=True)
    return totals


def call(fn: Callable[..., Any], valid: dict[str, Any] | Callable[[], dict[str, Any]],
         *, label: str | None = None, same: Callable[[Any, Any], bool] | None = None,
         names: dict[str, str] | None = None, **args: Any) -> Call:
    """A :class:`Call` of ``fn(**kwargs)``; ``args`` maps each guarded argument to its class."""
    return Call(label or f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__qualname__}",
                lambda kw: fn(**kw), valid, args, same, names or {})


def anything(a: Any, b: Any) -> bool:
    """For answers that are not comparable (figures, HTML): any answer will do."""
    return True


def params(calls: list[Call]) -> list[Any]:
    """pytest parameters, one per guarded argument of each call (its whole class battery runs
    in one test). Nothing is built here, so collecting a test module stays cheap."""
    import pytest
    return [pytest.param(c, arg, id=f"{c.label}-{arg}") for c in calls for arg in c.args]


def check(call_: Call, arg: str) -> None:
    """The assertion every battery test makes: each case of ``arg``'s class is CLEAR or OK."""
    tags = [tag for tag, _, _ in call_.args[arg].cases(call_.kwargs()[arg])]
    failed = []
    for tag in tags:
        verdict, detail = classify(call_, arg, tag)
        if verdict not in ("CLEAR", "OK"):
            failed.append(f"{verdict}: {call_.label}({arg}={tag}): {detail}")
    assert not failed, "\n".join(failed)


def battery_tests(calls: list[Call], quick: list[Call]) -> tuple[Callable[..., None], ...]:
    """The two tests of a topic's battery, for its test module to bind to its own names:
    every guarded argument of ``calls`` (slow) and the representative ``quick`` ones."""
    import pytest

    @pytest.mark.slow
    @pytest.mark.parametrize("c, arg", params(calls))
    def every_guarded_argument(c: Call, arg: str) -> None:
        check(c, arg)

    @pytest.mark.parametrize("c, arg", params(quick))
    def quick_ones(c: Call, arg: str) -> None:
        check(c, arg)

    return every_guarded_argument, quick_ones
