"""A process killed (SIGKILL) while it saves leaves its step unfinished and the step before it
the latest complete one, restorable and unchanged; the next save of that step succeeds."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import checkpoint, crash
from spmd_guide.core.checks import InputError


@pytest.mark.slow
def test_a_save_killed_mid_write_loses_nothing(tmp_path):
    mesh = mesh_of(8, ("data", "model"), (4, 2))
    state = {"w": jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data"))),
             "b": jax.device_put(np.ones(8, np.float32), NamedSharding(mesh, P()))}
    checkpoint.save(tmp_path, state, step=1)
    killed = crash.killed_save(tmp_path, step=2)
    assert killed.signal == "SIGKILL"
    assert killed.listing_when_killed == ["1", "2" + checkpoint.TMP_SUFFIX]
    # the unfinished step is still there, never renamed; the latest complete step is 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2" + checkpoint.TMP_SUFFIX]
    assert checkpoint.latest_step(tmp_path) == 1
    with pytest.raises(InputError, match="never finished"):
        checkpoint.restore(tmp_path, like=state, step=2)
    restored = checkpoint.restore(tmp_path, like=state)
    for name in state:
        np.testing.assert_array_equal(restored[name], state[name])
    # saving step 2 again replaces the leftover
    checkpoint.save(tmp_path, jax.tree.map(lambda x: x * 2, state), step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]
    np.testing.assert_array_equal(checkpoint.restore(tmp_path, like=state)["w"], 2 * state["w"])


def test_killed_save_needs_a_complete_step_and_a_new_one(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        crash.killed_save(tmp_path / "nowhere", step=1)
    with pytest.raises(InputError, match="no complete step"):
        crash.killed_save(tmp_path, step=1)
    checkpoint.save(tmp_path, {"x": np.arange(3)}, step=1)
    with pytest.raises(InputError, match="already complete"):
        crash.killed_save(tmp_path, step=1)


def test_killed_save_refuses_bad_sizes_and_paths(tmp_path):
    checkpoint.save(tmp_path, {"x": np.arange(3)}, step=1)
    for kwargs, words in [({"timeout": "x"}, "timeout"), ({"timeout": 0}, "timeout"),
                          ({"n_devices": 0}, "n_devices"), ({"n_devices": 10**6}, "n_devices"),
                          ({"step": -1}, "step")]:
        with pytest.raises(InputError, match=words):
            crash.killed_save(tmp_path, **{"step": 2} | kwargs)
    for bad in ("", "  ", None):
        with pytest.raises(InputError, match="directory"):
            crash.killed_save(bad, step=2)
    assert checkpoint.steps(tmp_path) == [1] and len(list(tmp_path.iterdir())) == 1


@pytest.mark.slow
def test_a_child_without_the_saved_devices_is_a_clear_error(tmp_path):
    mesh = mesh_of(8)
    checkpoint.save(tmp_path, {"w": jax.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))},
                    step=1)
    with pytest.raises(InputError, match="devices this process does not have"):
        crash.killed_save(tmp_path, step=2, n_devices=2)
    assert checkpoint.steps(tmp_path) == [1] and len(list(tmp_path.iterdir())) == 1
