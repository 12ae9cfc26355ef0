"""api_changes: the appendix's "what does the installed JAX do with the old spelling" column."""

import jax
import pytest

from spmd_guide.appendix.api_changes import CHANGES, load, resolve, rows

# What JAX 0.12.0.1 does with each old spelling (this file said 0.10 before the move; the
# statuses of the first 17 rows did not change, except check_rep=, whose old probe looked at
# the wrong function: the experimental spelling still runs, with a warning).
EXPECTED = {
    "jax.sharding.PositionalSharding": "removed",
    "jax.tree_map": "removed",
    "jax.random.PRNGKey(0) (raw uint32[2] key)": "present",
    "jax.make_mesh default axis_types (Auto)": "default axis type AxisType.Explicit",
    "jax.sharding.PartitionSpec (long name)": "alias",
    "jax.sharding.use_mesh(mesh)": "removed",
    "with mesh: (a Mesh as context manager)": "deprecated",
    "jax.experimental.shard.reshard / auto_axes / explicit_axes": "removed",
    "GSPMD partitioner (jax_use_shardy_partitioner=False)": "jax_use_shardy_partitioner = True",
    "jax.experimental.shard_map.shard_map": "deprecated",
    "shard_map(..., check_rep=...)": "deprecated",
    "jax.lax.pvary(x, 'x')": "removed",
    "jax.pmap": "present",
    "jax.device_put_sharded / jax.device_put_replicated": "removed",
    "jax.xla_computation(f)(x)": "removed",
    "jax_threefry_partitionable=False (old, non-partitionable random bits)":
        "jax_threefry_partitionable = True",
    "jax_cpu_enable_gloo_collectives=True": "removed",
    "Python 3.11": "requires Python >=3.12",
    "compiled.as_text() printing each parameter's sharding={devices=[...]<=[...]}": "not printed",
    "replica_groups={{0,2,4,6},{1,3,5,7}} on shard_map collectives": "mesh axes",
    "ShardingTypeError: dot_general requires contracting dimensions to have consistent sharding":
        "new wording",
    "jax.experimental.shard_alike.shard_alike(x, y)": "removed",
    "jax.sharding.get_abstract_mesh() / jax.sharding.get_mesh()": "alias",
    "jax.custom_remat(f, f_fwd, f_rem, f_bwd)": "removed",
    "from jax.checkpoint_policies import dots_saveable": "SimpleNamespace, not a module",
    "jax.checkpoint as it always worked": "jax_remat3 = False",
    "jax.lax.psend / jax.lax.precv (point-to-point send and receive)": "deprecated",
}


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.old)
def test_each_change_is_what_the_installed_jax_does(change):
    assert change.status() == EXPECTED[change.old]


def test_every_change_is_pinned_and_names_are_unique():
    assert sorted(c.old for c in CHANGES) == sorted(EXPECTED)


def test_resolve_tells_present_deprecated_and_removed_apart():
    assert resolve("jax.shard_map") == "present"
    assert resolve("jax.numpy.definitely_not_a_function") == "absent"
    assert resolve("jax.no_such_module.thing") == "absent"
    assert resolve("jax.tree_mapp") == "absent"  # a typo is not a removal
    assert resolve("jax.tree_map") == "removed"  # the table of changes records it
    assert resolve("jax.sharding.PositionalSharding") == "removed"
    assert resolve("jax.experimental.shard_map.shard_map") == "deprecated"


def test_the_new_rows_say_what_the_installed_jax_does():
    """The 0.11/0.12 rows checked directly, not only through their probes."""
    import importlib
    import sys
    from importlib.metadata import metadata

    import jax.numpy as jnp
    from helpers import mesh_of
    from jax.sharding import PartitionSpec as P

    from spmd_guide.appendix import api_changes
    from spmd_guide.core.display import error_of

    assert sys.version_info >= (3, 12) and metadata("jax")["Requires-Python"] == ">=3.12"
    assert not hasattr(jax, "custom_remat")
    assert jax.get_abstract_mesh is jax.sharding.get_abstract_mesh
    assert jax.get_mesh is jax.sharding.get_mesh
    assert callable(jax.checkpoint_policies.dots_saveable)
    with pytest.raises(ImportError):
        importlib.import_module("jax.checkpoint_policies")
    with pytest.raises(ImportError):
        importlib.import_module("jax.experimental.shard_alike")
    assert jax.config.jax_remat3 is False
    assert resolve("jax.lax.psend") == resolve("jax.lax.precv") == "deprecated"
    assert callable(jax.lax.ppermute) and resolve("jax.lax.ppermute") == "present"
    with jax.set_mesh(mesh_of(4, ("x", "y"), (2, 2), explicit=True)):
        a = jax.device_put(jnp.ones((4, 4)), P("x", "y"))
        b = jax.device_put(jnp.ones((4, 4)), P("x", None))
        message = error_of(jnp.matmul, a, b)
    assert message.startswith("ShardingTypeError: " + api_changes.NEW_CONTRACTING_ERROR)
    assert api_changes.OLD_CONTRACTING_ERROR not in message


def test_rows_carry_the_installed_version():
    table = rows()
    assert len(table) == len(CHANGES)
    assert all(f"in JAX {jax.__version__}" in row for row in table)


def test_html_table_has_a_row_and_an_example_per_change():
    from spmd_guide.appendix.api_changes import table_html

    html = table_html()
    assert html.count("<tr>") == 1 + 2 * len(CHANGES)
    assert "jax.sharding.PositionalSharding" in html and "removed" in html


def test_an_entry_with_an_unknown_probe_kind_is_refused(tmp_path):
    table = tmp_path / "changes.toml"
    table.write_text(
        '[[change]]\nold = "a"\nnew = "b"\nchanged_in = "0.1"\nexample = "a -> b"\n'
        'part = "I"\nprobe = "guess:jax.a"\n'
    )
    with pytest.raises(ValueError, match="unknown probe kinds.*guess"):
        load(table)


# --------------------------------------------------------------------------- bad input, table

from spmd_guide.core.checks import InputError, InputTypeError  # noqa: E402

BAD_INPUT = [
    ("a typo'd package", lambda: resolve("jaxx.tree_map"), InputError, "never existed"),
    ("not a name", lambda: resolve("jax..tree_map"), InputError, "dotted"),
    ("not a string", lambda: resolve(None), InputError, "dotted"),
    ("empty", lambda: resolve(""), InputError, "dotted"),
    ("load a number", lambda: load(3),
     InputTypeError, "TOML"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_the_old_random_setting_communicates_but_gives_one_devices_numbers():
    """The sharp bit as coming_from_notebooks.md states it (the docs' example: key 42, 24
    numbers, 8 devices): in both modes sharded numbers equal one device's; only the old
    mode communicates; the modes give different numbers (the docs' two printed lists)."""
    import numpy as np
    from helpers import mesh_of
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from spmd_guide.randomness import prng

    key = jax.random.key(42)
    x = jax.numpy.arange(24.0)
    sharded = prng.compare_modes(prng.add_uniform_noise, key,
                                 jax.device_put(x, NamedSharding(mesh_of(8), P("x"))))
    single = prng.compare_modes(prng.add_uniform_noise, key, x)
    for mode in (False, True):
        np.testing.assert_array_equal(sharded[mode].values, single[mode].values)
    assert sharded[False].collectives["collective-permute"] > 0
    assert sharded[True].total_collectives == 0
    np.testing.assert_allclose(sharded[False].values[:3], [0.72503686, 1.8532515, 2.983416])
    np.testing.assert_allclose(sharded[True].values[:3], [0.48870957, 1.6797972, 2.6162715])
