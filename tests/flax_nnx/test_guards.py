"""Guard classes: every numeric, dtype, mesh and path argument of Part XIII's public functions
run through one battery (bool, NaN, inf, negative, zero, float for int, strings, NumPy and JAX
scalars; a mesh without the axis a table names, mixed axis types; '', Path(''), a directory
that is not a checkpoint of this model). A bad value gets an InputError that names the
argument; a valid form (a NumPy or JAX scalar, Explicit axes) gets the right answer; no
refused call changes the disk."""

from __future__ import annotations

import functools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import DEVICES, mesh_of
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import checkpoint
from spmd_guide.core.checks import InputError
from spmd_guide.flax_nnx import logical, reading, saving
from spmd_guide.flax_nnx.rules import RULES, mesh_spec
from spmd_guide.transformer import lm
from spmd_guide.transformer.transformer import STRATEGIES

CONFIG = lm.Config(vocab=32, d_model=32, n_heads=8, d_ff=64, n_layers=1, seq_len=8)

#: Values no integer argument takes (each with a word the error must say).
BAD_INTS = [True, False, math.nan, math.inf, -1, 1.5, 2.0, "2", None, np.float32(2.0),
            jnp.float32(2.0), np.array([2])]
#: Values no positive real argument takes.
BAD_REALS = [True, math.nan, math.inf, -math.inf, -1e-3, 0, 0.0, "1e-3", None, np.nan,
             jnp.float32(math.nan), [1e-3]]
#: Values no floating-dtype argument takes.
BAD_DTYPES = [jnp.int32, "int8", np.bool_, True, 1.5, "nonsense", jax.random.key(0).dtype,
              [jnp.float32]]
#: What a path argument must refuse before touching the disk.
EMPTY_PATHS = ["", "  ", pathlib.Path(""), pathlib.PurePosixPath(""), b"/tmp/x", 3, None]


@functools.cache
def tokens():
    return np.asarray(lm.counting_task(jax.random.key(1), batch=8, config=CONFIG))


@functools.cache
def one_device_model():
    return logical.Model(CONFIG, rngs=nnx.Rngs(0))


def _mesh(name, n=2, kind="auto"):
    return STRATEGIES[name].mesh(DEVICES[:n], axis_types=kind)


def refused(call, *words):
    """``call()`` raises the package's own error, whose message holds every word."""
    with pytest.raises(InputError) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    return info.value


def _snapshot(*folders):
    return [sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in f.rglob("*"))
            for f in folders]


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("bad", BAD_INTS + [0, -2])
def test_integer_arguments(bad, tmp_path):
    model, mesh = one_device_model(), _mesh("dp")
    optimizer = logical.make_optimizer(model)
    abstract = logical.abstract_model(CONFIG, strategy="dp", mesh=mesh)
    calls = {
        "microbatches": [lambda: logical.train_step(model, optimizer, tokens(), microbatches=bad),
                         lambda: reading.grad_program(abstract, tokens(), microbatches=bad),
                         lambda: reading.step_program(abstract, tokens(), microbatches=bad),
                         lambda: reading.deferred_reduction(mesh_of(2, ("data",), explicit=True),
                                                            microbatches=bad, deferred=True)],
        "step": [lambda: saving.save(tmp_path / "ck", model, step=bad)],
    }
    if bad is not None:  # restore's default step: the latest
        calls["step"].append(lambda: saving.restore(tmp_path / "ck", CONFIG, strategy="dp",
                                                    mesh=mesh, step=bad))
    if bad != 0:  # seed 0 is a seed
        calls["seed"] = [lambda: logical.create(CONFIG, strategy="dp", mesh=mesh, seed=bad)]
    before = _snapshot(tmp_path)
    for name, group in calls.items():
        if name == "step" and bad == 0:
            continue  # step 0 is a step
        for call in group:
            refused(call, name)
    assert _snapshot(tmp_path) == before and not (tmp_path / "ck").exists()


def test_a_batch_that_does_not_split_says_so_once():
    """NNX-10: the refusal names the batch, the microbatches and the fix, without repeating
    itself."""
    model = one_device_model()
    error = refused(lambda: logical.train_step(model, logical.make_optimizer(model), tokens(),
                                               microbatches=3),
                    "the batch (tokens.shape[0]) is 8", "for microbatches=3", "multiple of 3")
    assert str(error).count("equal") == 1


@pytest.mark.parametrize("bad", BAD_REALS)
def test_real_arguments(bad):
    model = one_device_model()
    abstract = logical.abstract_model(CONFIG, strategy="dp", mesh=_mesh("dp"))
    for call in (lambda: logical.make_optimizer(model, learning_rate=bad),
                 lambda: reading.step_program(abstract, tokens(), learning_rate=bad)):
        refused(call, "learning_rate")


@pytest.mark.parametrize("bad", BAD_DTYPES + [None])
def test_dtype_arguments(bad, tmp_path):
    mesh = _mesh("dp")
    calls = [("param_dtype", lambda: logical.create(CONFIG, strategy="dp", mesh=mesh,
                                                    param_dtype=bad)),
             ("param_dtype", lambda: logical.abstract_model(CONFIG, strategy="dp", mesh=mesh,
                                                            param_dtype=bad)),
             ("param_dtype", lambda: logical.Model(CONFIG, rngs=nnx.Rngs(0), param_dtype=bad)),
             ("param_dtype", lambda: saving.restore(tmp_path, CONFIG, strategy="dp", mesh=mesh,
                                                    param_dtype=bad))]
    if bad is not None:  # no compute dtype is a valid choice: compute in param_dtype
        calls += [("compute_dtype", lambda: logical.create(CONFIG, strategy="dp", mesh=mesh,
                                                           compute_dtype=bad)),
                  ("compute_dtype", lambda: logical.Model(CONFIG, rngs=nnx.Rngs(0),
                                                          compute_dtype=bad))]
    for name, call in calls:
        refused(call, name)


@pytest.mark.parametrize("shape", [(8.5,), (-8,), ("8",), (True,), (np.float32(8),), 8, "8",
                                   None])
def test_mesh_spec_shapes(shape):
    names = ("embed",) if isinstance(shape, tuple) else ("embed",)
    refused(lambda: mesh_spec(names, shape, RULES["fsdp"], mesh_of(8, ("data",))), "shape")


def test_mesh_spec_valid_forms_give_the_answer():
    mesh = mesh_of(8, ("data",))
    want = P("data", None)
    for shape in ((32, 4), (np.int64(32), np.int32(4)), (jnp.int32(32), 4), np.array([32, 4])):
        assert mesh_spec(("embed", "mlp"), shape, RULES["fsdp"], mesh) == want
    assert mesh_spec((), (), RULES["fsdp"], mesh) == P()
    assert mesh_spec(("embed",), (0,), RULES["fsdp"], mesh) == P("data")  # 0 splits evenly
    for bad, word in ((("data", "data"), "twice"), ((3,), "target"), (("nope",), "nope")):
        refused(lambda bad=bad: mesh_spec(("embed",), (8,), (("embed", bad),), mesh), word)
    refused(lambda: mesh_spec("embed", (8,), RULES["fsdp"], mesh), "names")
    refused(lambda: mesh_spec(("embed",), (8,), RULES["fsdp"], "data"), "mesh")
    refused(lambda: mesh_spec(("embed",), (8,), RULES["fsdp"], mesh, skip_indivisible=1),
            "skip_indivisible")


# --------------------------------------------------------------------------- meshes


def test_meshes():
    dp, tp = _mesh("dp"), _mesh("tp")
    mixed = jax.make_mesh((2, 1), ("data", "model"), devices=DEVICES[:2],
                          axis_types=(AxisType.Auto, AxisType.Explicit))
    for mesh, words in ((dp, ("'model'", "('data',)")), (mixed, ("Auto or all Explicit",)),
                        ("data", ("mesh",)), (None, ("mesh",)), (DEVICES[:2], ("mesh",))):
        for call in (lambda mesh=mesh: logical.create(CONFIG, strategy="tp", mesh=mesh),
                     lambda mesh=mesh: logical.abstract_model(CONFIG, strategy="tp", mesh=mesh),
                     lambda mesh=mesh: reading.init_memory(CONFIG, strategy="tp", mesh=mesh),
                     lambda mesh=mesh: saving.restore(pathlib.Path("/nonexistent"), CONFIG, strategy="tp",
                                            mesh=mesh),
                     lambda mesh=mesh: logical.param_specs(one_device_model(), RULES["tp"], mesh)):
            refused(call, *words)
    refused(lambda: reading.deferred_reduction(dp, deferred=True), "Explicit")
    refused(lambda: reading.deferred_reduction(tp, deferred=True), "'data'")
    refused(lambda: reading.deferred_reduction(mesh_of(2, ("data",), explicit=True),
                                               deferred=1), "deferred")


def test_param_specs_refuses_typos_and_nameless_trees():
    model, mesh = one_device_model(), _mesh("fsdp", 8)
    error = refused(lambda: logical.param_specs(model, (("embd", "data"),), mesh), "'embd'")
    assert "'embed'" in str(error)  # the known names, to pick the right one
    for plain in (logical.to_lm_params(model), nnx.to_pure_dict(nnx.state(model)), {}, None):
        refused(lambda plain=plain: logical.param_specs(plain, RULES["fsdp"], mesh),
                "model_or_state")
    specs = logical.param_specs(model, RULES["fsdp"], mesh)
    assert specs["blocks"][0]["wq"] == P("data", None, None)


def test_abstract_models_and_bad_models():
    abstract = logical.abstract_model(CONFIG, strategy="dp", mesh=_mesh("dp"))
    refused(lambda: logical.make_optimizer(abstract), "abstract")
    refused(lambda: logical.loss(abstract, tokens()), "abstract")
    for bad in (None, {}, logical.to_lm_params(one_device_model()), "model"):
        refused(lambda bad=bad: logical.make_optimizer(bad), "model")
        refused(lambda bad=bad: logical.loss(bad, tokens()), "model")
    for bad in (None, {}, "model", [None]):
        refused(lambda bad=bad: reading.bytes_per_device(bad), "tree")
    refused(lambda: reading.bytes_per_device([np.ones(3)]), "jax.Array")


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize("bad", EMPTY_PATHS)
def test_paths_that_are_not_named_are_refused_before_the_disk(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty path would mean here
    before = _snapshot(tmp_path)
    refused(lambda: saving.save(bad, one_device_model(), step=1), "directory")
    refused(lambda: saving.restore(bad, CONFIG, strategy="dp", mesh=_mesh("dp")), "directory")
    assert _snapshot(tmp_path) == before == [[]]


def test_a_foreign_directory_is_refused_and_left_alone(tmp_path):
    """A folder of other files, a file, a checkpoint of another tree: each is named as what it
    is, and nothing in it changes."""
    mesh = _mesh("dp")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a checkpoint")
    (other / "3").mkdir()  # looks like a step, has no commit marker
    foreign = tmp_path / "foreign"
    checkpoint.save(foreign, {"params": {"w": np.ones(4, np.float32)}}, step=1)
    before = _snapshot(tmp_path)
    refused(lambda: saving.restore(other, CONFIG, strategy="dp", mesh=mesh), "no complete")
    refused(lambda: saving.restore(other / "notes.txt", CONFIG, strategy="dp", mesh=mesh),
            "is a file")
    refused(lambda: saving.restore(foreign, CONFIG, strategy="dp", mesh=mesh), "config",
            "params.w")
    refused(lambda: saving.save(other / "notes.txt", one_device_model(), step=1), "is a file")
    refused(lambda: saving.save(other, one_device_model(), step=3), "not a complete step")
    assert _snapshot(tmp_path) == before


@pytest.mark.slow
def test_valid_forms_give_the_plain_answer(tmp_path):
    """NumPy and JAX scalars, dtype names and Explicit axes give what the plain forms give."""
    mesh, explicit = _mesh("fsdp", 4), _mesh("fsdp", 4, "explicit")
    plain = logical.create(CONFIG, strategy="fsdp", mesh=mesh, seed=3)
    for seed, m, dtype in ((np.int64(3), mesh, "float32"), (jnp.int32(3), explicit, np.float32)):
        other = logical.create(CONFIG, strategy="fsdp", mesh=m, seed=seed, param_dtype=dtype)
        for a, b in zip(jax.tree.leaves(logical.to_lm_params(plain)),
                        jax.tree.leaves(logical.to_lm_params(other)), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            assert b.sharding.is_equivalent_to(a.sharding, a.ndim)
    saving.save(tmp_path, plain, step=np.int32(2))
    back = saving.restore(tmp_path, CONFIG, strategy="fsdp", mesh=explicit, step=jnp.int32(2))
    np.testing.assert_allclose(logical.loss(back, tokens()), logical.loss(plain, tokens()),
                               rtol=1e-6)
    losses = []
    for k, lr in ((2, 1e-2), (np.int64(2), np.float32(1e-2)), (jnp.int32(2), jnp.float32(1e-2))):
        model = logical.create(CONFIG, strategy="fsdp", mesh=mesh, seed=3)
        losses.append(float(logical.train_step(model, logical.make_optimizer(
            model, learning_rate=lr), tokens(), microbatches=k)))
        losses[-1] = (losses[-1], float(logical.loss(model, tokens())))
    assert losses[0] == losses[1] == losses[2]
