"""The facts the random-numbers chapter states, pinned on the installed JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh_of, run_python
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import hlo
from spmd_guide.randomness import prng


@pytest.fixture(scope="module")
def noise_modes():
    """The chapter's example: uniform noise on arange(24) over 8 devices, key(42)."""
    mesh = mesh_of(8, explicit=True)
    x = jax.device_put(jnp.arange(24, dtype=jnp.float32), NamedSharding(mesh, P("x")))
    key = jax.random.key(42)
    return key, x, prng.compare_modes(prng.add_uniform_noise, key, x)


def test_flag_off_needs_collective_permute_and_on_needs_none(noise_modes):
    _, _, results = noise_modes
    assert results[False].collectives["collective-permute"] > 0
    assert results[True].total_collectives == 0
    assert set(results[True].collectives) == set(hlo.KINDS)
    assert results[True].collectives_text() == "none"
    assert "collective-permute" in results[False].collectives_text()


def test_modes_give_different_values_both_valid_noise(noise_modes):
    key, x, results = noise_modes
    off, on = results[False].values, results[True].values
    assert not np.array_equal(off, on)
    for values in (off, on):
        noise = values - np.arange(24)
        assert np.all((noise >= 0) & (noise < 1))
    # partitionable mode is what plain (default) JAX computes
    np.testing.assert_array_equal(on, np.asarray(prng.add_uniform_noise(key, x)))


def test_compare_modes_leaves_the_flag_as_it_was(noise_modes):
    key, x, _ = noise_modes
    before = jax.config.jax_threefry_partitionable
    prng.compare_modes(prng.add_uniform_noise, key, x)
    assert jax.config.jax_threefry_partitionable == before
    assert before is True  # the default since JAX 0.5.0


def test_split_into_sharded_keys_needs_communication_only_with_flag_off():
    mesh = mesh_of(8)
    split = jax.jit(lambda k: jax.random.split(k, 8), out_shardings=NamedSharding(mesh, P("x")))
    results = prng.compare_modes(lambda k: jax.random.key_data(split(k)), jax.random.key(42))
    assert results[False].total_collectives > 0
    assert results[True].total_collectives == 0


def test_counter_is_the_index_only_in_partitionable_mode():
    key = jax.random.key(42)
    assert prng.prefix_matches(key, size=24, prefix=12)
    with jax.threefry_partitionable(False):
        assert not prng.prefix_matches(key, size=24, prefix=12)
    with pytest.raises(ValueError, match="prefix"):
        prng.prefix_matches(key, size=4, prefix=5)


def test_same_key_same_numbers_whatever_the_sharding():
    key = jax.random.key(7)
    reference = np.asarray(jax.random.uniform(key, (16, 8)))
    # (8 devices, columns: see the exercise test below)
    layouts = [(mesh_of(2), P("x")), (mesh_of(8, ("a", "b"), (2, 4)), P("a", "b"))]
    for mesh, spec in layouts:
        sharding = NamedSharding(mesh, spec)
        generate = prng.sampler((16, 8), sharding, distribution=jax.random.uniform)
        sampled = generate(key)
        assert sampled.sharding.is_equivalent_to(sharding, 2)
        np.testing.assert_array_equal(np.asarray(sampled), reference)
        assert sum(hlo.collective_counts(generate, key).values()) == 0


LAYOUT_PROBE = """
import json
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from spmd_guide.randomness import prng

key = jax.random.key(0)
def mesh(k, names=("x",), shape=None):
    return jax.make_mesh(shape or (k,), names, devices=jax.devices()[:k])
CASES = {"page": ((496, 3), mesh(8), P("x")),
         "48x3": ((48, 3), mesh(8), P("x")),
         "40x5 on 4": ((40, 5), mesh(4), P("x")),
         "16x8 on 2x4": ((16, 8), mesh(8, ("a", "b"), (2, 4)), P("a", "b"))}
out = {}
for label in LABELS:
    shape, m, spec = CASES[label]
    out[label] = {r["sampler"]: r for r in prng.layout_differences(
        key, shape, NamedSharding(m, spec), samplers=SAMPLERS)}
if PREFIX:
    normal = jax.jit(jax.random.normal, static_argnums=1)
    out["prefix bits equal"] = bool((jax.random.bits(key, (62, 3))
                                     == jax.random.bits(key, (496, 3))[:62]).all())
    out["prefix normal differ"] = int((normal(key, (62, 3))
                                       != normal(key, (496, 3))[:62]).sum())
print(json.dumps(out))
"""


def _probe(labels, samplers, *, prefix=False):
    """Run LAYOUT_PROBE in a child Python of 8 devices at XLA:CPU's default optimization
    (this suite turns LLVM's optimization off, and the float gaps with it)."""
    import json

    head = f"LABELS = {list(labels)!r}\nSAMPLERS = {list(samplers)!r}\nPREFIX = {prefix}\n"
    return json.loads(run_python(head + LAYOUT_PROBE, devices=8))


@pytest.mark.slow  # a child Python: seconds the quick suite cannot spare
def test_the_bits_never_depend_on_the_layout_the_floats_of_normal_may():
    """random_numbers.md (review N2), the contract exactly, on XLA:CPU with JAX 0.12 at its
    default optimization: the bits equal the one-device draw in the page's layout; normal
    differs in a few elements, by 1-2 ulp; a prefix shape keeps the bits but not always
    normal's floats. A JAX release that changes either half fails here, and the page's
    sentences must change with it."""
    out = _probe(["page"], ["bits", "normal"], prefix=True)
    page = out["page"]
    assert page["bits"]["differ from 1 device"] == 0, page["bits"]
    assert 0 < page["normal"]["differ from 1 device"] <= 10, page["normal"]
    assert 1 <= page["normal"]["most ulp apart"] <= 4, page["normal"]
    assert out["prefix bits equal"] is True
    assert 0 < out["prefix normal differ"] <= 5


@pytest.mark.slow
def test_every_sampler_in_every_layout_keeps_the_bits_and_a_few_ulp():
    """The sweep behind the page's table: uniform and bernoulli are exact like the bits in
    every layout and shape; normal and truncated_normal stay within a few ulp."""
    out = _probe(["page", "48x3", "40x5 on 4", "16x8 on 2x4"], list(prng.SAMPLERS))
    assert 0 < out["page"]["truncated_normal"]["differ from 1 device"] <= 10
    for label, rows in out.items():
        for exact in ("bits", "uniform", "bernoulli"):
            assert rows[exact]["differ from 1 device"] == 0, (label, rows[exact])
        assert all(r["most ulp apart"] <= 4 for r in rows.values()), (label, rows)


def test_without_llvm_optimization_the_floats_agree_too(devices):
    """This suite's own setting (--xla_backend_optimization_level=0, helpers.py): the same
    draw of normal agrees in every layout, so the page's 1-2 ulp come from LLVM's
    optimization of the float math, not from the generator."""
    rows = prng.layout_differences(jax.random.key(0), (496, 3),
                                   NamedSharding(mesh_of(8), P("x")))
    assert all(r["differ from 1 device"] == 0 for r in rows), rows


def test_layout_differences_refuses_bad_input():
    sharding = NamedSharding(mesh_of(8), P("x"))
    with pytest.raises(InputTypeError, match="samplers"):
        prng.layout_differences(jax.random.key(0), (8,), sharding, samplers="normal")
    with pytest.raises(InputError, match="choose one of"):
        prng.layout_differences(jax.random.key(0), (8,), sharding, samplers=["gauss"])
    with pytest.raises(InputError, match="not divisible by 8"):
        prng.layout_differences(jax.random.key(0), (7,), sharding)


@pytest.mark.parametrize("explicit", [False, True])
def test_fold_in_gives_each_device_its_own_stream(explicit):
    mesh = mesh_of(8, explicit=explicit)
    ones = jnp.ones((8, 64))
    own = prng.sharded_dropout(jax.random.key(0), ones, mesh, axis_name="x", rate=0.5)
    assert own.sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)
    own = np.asarray(own)
    rows = {row.tobytes() for row in own}
    assert len(rows) == 8
    assert abs(prng.block_correlation(own, blocks=8)) < 0.3
    # inputs placed elsewhere are laid out as the program needs: the same mask
    key_elsewhere = jax.device_put(jax.random.key(0), jax.devices()[3])
    x_by_columns = jax.device_put(ones, NamedSharding(mesh, P(None, "x")))
    again = prng.sharded_dropout(key_elsewhere, x_by_columns, mesh, axis_name="x", rate=0.5)
    np.testing.assert_array_equal(np.asarray(again), own)


@pytest.mark.parametrize("explicit", [False, True])
def test_same_key_on_every_device_gives_the_same_mask(explicit):
    mesh = mesh_of(8, explicit=explicit)
    ones = jnp.ones((8, 64))
    same = np.asarray(prng.sharded_dropout(jax.random.key(0), ones, mesh, axis_name="x",
                                           rate=0.5, per_device_keys=False))
    assert all(np.array_equal(row, same[0]) for row in same)
    assert prng.block_correlation(same, blocks=8) == pytest.approx(1.0)


def test_device_key_is_fold_in_of_the_linear_mesh_index():
    mesh = mesh_of(8, ("a", "b"), (2, 4))
    key = jax.random.key(3)

    def body(k):
        return jax.random.key_data(prng.device_key(k, ("a", "b")))[None]

    keys = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(("a", "b")))(key)
    fold = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(key, i)))
    expected = np.asarray(fold(jnp.arange(8)))
    np.testing.assert_array_equal(np.asarray(keys), expected)
    with pytest.raises(ValueError, match="axis name"):
        prng.device_key(key, ())


def test_dropout_under_jit_is_sharding_independent_and_communication_free():
    mesh = mesh_of(8)
    key = jax.random.key(5)
    x = jnp.ones((16, 8))
    drop = jax.jit(lambda k, v: prng.dropout(k, v, rate=0.25))
    reference = np.asarray(drop(key, x))
    sharded = jax.device_put(x, NamedSharding(mesh, P("x")))
    np.testing.assert_array_equal(np.asarray(drop(key, sharded)), reference)
    assert sum(hlo.collective_counts(drop, key, sharded).values()) == 0
    kept = reference != 0
    np.testing.assert_allclose(reference[kept], 1 / 0.75)


def test_bad_inputs_raise_clear_errors():
    mesh = mesh_of(8)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        prng.sharded_dropout(key, jnp.ones((8, 2)), mesh, axis_name="y", rate=0.5)
    with pytest.raises(ValueError, match="multiple of 8"):
        prng.sharded_dropout(key, jnp.ones((6, 2)), mesh, axis_name="x", rate=0.5)
    with pytest.raises(ValueError, match="rate"):
        prng.dropout(key, jnp.ones(4), rate=1.0)
    with pytest.raises(ValueError, match="blocks"):
        prng.block_correlation(np.ones((6, 2)), blocks=4)


def test_typed_and_legacy_keys():
    typed, legacy = jax.random.key(42), jax.random.PRNGKey(42)
    assert typed.shape == () and jax.dtypes.issubdtype(typed.dtype, jax.dtypes.prng_key)
    assert legacy.shape == (2,) and legacy.dtype == jnp.uint32
    np.testing.assert_array_equal(jax.random.key_data(typed), legacy)
    with pytest.raises(TypeError):
        typed + 1  # noqa: B018 -- keys are not numbers
    np.testing.assert_array_equal(jax.random.uniform(typed, (3,)), jax.random.uniform(legacy, (3,)))


def test_sharded_batch_of_typed_keys():
    mesh = mesh_of(8)
    keys = jax.device_put(jax.random.split(jax.random.key(42), 8), NamedSharding(mesh, P("x")))
    assert keys.shape == (8,)
    data = jax.random.key_data(keys)
    assert data.shape == (8, 2) and data.sharding.spec == P("x", None)
    per_key = jax.jit(jax.vmap(lambda k: jax.random.uniform(k, (4,))))
    out = per_key(keys)
    assert out.sharding.spec[0] == "x"
    assert sum(hlo.collective_counts(per_key, keys).values()) == 0


# ------------------------------------------------------------------ the chapter's exercises


@pytest.mark.parametrize("explicit", [False, True])
def test_sampler_on_both_kinds_of_axes(explicit):
    sharding = NamedSharding(mesh_of(8, ("a", "b"), (2, 4), explicit=explicit), P("a", "b"))
    generate = prng.sampler((16, 8), sharding)
    values = generate(jax.random.key(2))
    assert values.sharding.is_equivalent_to(sharding, 2)
    np.testing.assert_array_equal(np.asarray(values),
                                  np.asarray(jax.random.normal(jax.random.key(2), (16, 8))))
    assert sum(hlo.collective_counts(generate, jax.random.key(2)).values()) == 0


def test_exercise_column_sharding_needs_no_communication():
    """Exercise 1: normal(key, (16, 8)) laid out P(None, 'x') is local and equals the unsharded."""
    key = jax.random.key(0)
    generate = prng.sampler((16, 8), NamedSharding(mesh_of(8), P(None, "x")))
    assert sum(hlo.collective_counts(generate, key).values()) == 0
    np.testing.assert_array_equal(np.asarray(generate(key)),
                                  np.asarray(jax.random.normal(key, (16, 8))))


def test_exercise_fold_in_only_the_axes_that_split_the_data():
    """Exercise 2: x split over 'data', replicated over 'model': fold in 'data' only."""
    mesh = mesh_of(8, ("data", "model"), (2, 4))
    x = jax.device_put(jnp.ones((4, 32)), NamedSharding(mesh, P("data")))

    def masks(axes):
        def body(k, block):
            return prng.dropout(prng.device_key(k, axes), block, rate=0.5)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")),
                                     out_specs=P("data")))(jax.random.key(0), x)

    out = masks("data")
    # the replicas over 'model' of each block hold the same mask
    by_block: dict[int, list[np.ndarray]] = {}
    for shard in out.addressable_shards:
        by_block.setdefault(shard.index[0].start, []).append(np.asarray(shard.data))
    assert sorted(by_block) == [0, 2] and all(len(v) == 4 for v in by_block.values())
    for replicas in by_block.values():
        assert all(np.array_equal(r, replicas[0]) for r in replicas)
    assert not np.array_equal(by_block[0][0], by_block[2][0])
    with pytest.raises(Exception, match="model"):
        masks(("data", "model"))


def test_exercise_legacy_key_batch_shape():
    """Exercise 3: eight legacy keys are uint32[8, 2]; typed keys are key<fry>[8]."""
    legacy = jax.random.split(jax.random.PRNGKey(0), 8)
    typed = jax.random.split(jax.random.key(0), 8)
    assert legacy.shape == (8, 2) and legacy.dtype == jnp.uint32
    assert typed.shape == (8,)
    np.testing.assert_array_equal(legacy, jax.random.key_data(typed))


# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402

_KEY = jax.random.key(0)
BAD_INPUT = [
    ("sampler indivisible", lambda: prng.sampler((3,), NamedSharding(mesh_of(8), P("x"))),
     InputError, "divisible by 8"),
    ("sampler a spec", lambda: prng.sampler((8,), P("x")), InputTypeError, "NamedSharding"),
    ("sampler shape str", lambda: prng.sampler("8", NamedSharding(mesh_of(2), P("x"))),
     InputTypeError, "shape"),
    ("sampler negative", lambda: prng.sampler((-2,), NamedSharding(mesh_of(2), P("x"))),
     InputError, "at least 0"),
    ("sampler spec too long", lambda: prng.sampler(
        (4,), NamedSharding(mesh_of(2), P(None, "x"))), InputError, "dimensions"),
    ("prefix > size", lambda: prng.prefix_matches(_KEY, size=4, prefix=5), InputError,
     "at most 4"),
    ("prefix 0", lambda: prng.prefix_matches(_KEY, size=4, prefix=0), InputError, "prefix"),
    ("key a float", lambda: prng.prefix_matches(0.5, size=4, prefix=2), InputTypeError,
     "random key"),
    ("key a string", lambda: prng.add_uniform_noise("seed", np.ones(2, np.float32)),
     InputTypeError, "random key"),
    ("noise on ints", lambda: prng.add_uniform_noise(_KEY, np.ones(2, np.int32)),
     InputTypeError, "floating"),
    ("dropout rate 1", lambda: prng.dropout(_KEY, np.ones(2, np.float32), rate=1.0), InputError,
     "below 1.0"),
    ("dropout rate nan", lambda: prng.dropout(_KEY, np.ones(2, np.float32), rate=float("nan")),
     InputError, "finite"),
    ("dropout rate str", lambda: prng.dropout(_KEY, np.ones(2, np.float32), rate="0.1"),
     InputTypeError, "real number"),
    ("sharded dropout bad axis", lambda: prng.sharded_dropout(
        _KEY, np.ones(4, np.float32), mesh_of(2), axis_name="y", rate=0.1), InputError,
     "not an axis"),
    ("sharded dropout rows", lambda: prng.sharded_dropout(
        _KEY, np.ones(3, np.float32), mesh_of(2), axis_name="x", rate=0.1), InputError,
     "multiple of 2"),
    ("sharded dropout flag 1", lambda: prng.sharded_dropout(
        _KEY, np.ones(4, np.float32), mesh_of(2), axis_name="x", rate=0.1, per_device_keys=1),
     InputTypeError, "True or False"),
    ("device_key no names", lambda: prng.device_key(_KEY, ()), InputError, "axis names"),
    ("device_key int name", lambda: prng.device_key(_KEY, 0), InputError, "axis names"),
    ("correlation blocks 1", lambda: prng.block_correlation(np.ones(4), blocks=1), InputError,
     "blocks"),
    ("correlation uneven", lambda: prng.block_correlation(np.arange(5.0), blocks=2),
     InputError, "evenly"),
    ("correlation strings", lambda: prng.block_correlation(["a", "b"], blocks=2),
     InputTypeError, "numbers"),
    ("compare_modes not fn", lambda: prng.compare_modes(3), InputTypeError, "function"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_an_int_seed_is_a_key_and_bfloat16_is_a_float():
    noisy = prng.add_uniform_noise(0, jnp.zeros(4, jnp.bfloat16))
    assert noisy.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(noisy),
                                  np.asarray(prng.add_uniform_noise(jax.random.key(0),
                                                                    jnp.zeros(4, jnp.bfloat16))))
