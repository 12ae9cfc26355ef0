"""sharded_save: every process saves and restores a sharded checkpoint (here one process of 8
devices; the two-process save is in test_step's slow launch); process 0 alone never finishes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import sharded_save
from spmd_guide.multihost.multihost import ProcessTimeout, launch


def test_one_process_saves_and_restores_each_leaf_in_its_layout(devices, tmp_path):
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=devices)
    state = {"w": jax.device_put(np.arange(24.0).reshape(6, 4), NamedSharding(mesh, P("a", "b"))),
             "b": jax.device_put(np.ones(3, np.int32), NamedSharding(mesh, P()))}
    saved = sharded_save.save_and_restore(state, tmp_path / "ckpt")
    assert saved["restored_equal"] is True and saved["save_seconds"] >= 0
    assert "ocdbt.process_0" in saved["entries"] and "ocdbt.process_1" not in saved["entries"]


@pytest.mark.parametrize("directory, error", [("", InputError), (None, InputTypeError)])
def test_a_bad_directory_is_refused(devices, directory, error):
    with pytest.raises(error, match="directory"):
        sharded_save.save_and_restore({}, directory)


def test_savers_beyond_the_processes_are_refused(tmp_path):
    with pytest.raises(InputError, match="savers"):
        sharded_save.save_and_restore({}, tmp_path / "c", savers=[1])


@pytest.mark.slow
def test_a_save_called_by_process_0_alone_does_not_finish(tmp_path, nothing_left):
    """multihost.md (review N1): Orbax's save waits for every process; process 0 alone waits
    (here past the launcher's 20 s limit; gloo gives up on the other process after 30 s),
    and nothing reaches the disk."""
    with pytest.raises(ProcessTimeout) as caught:
        launch("spmd_guide.multihost.sharded_save:save_from", num_processes=2,
               devices_per_process=2, timeout=20,
               kwargs={"directory": str(tmp_path / "c"), "savers": [0]})
    assert 0 in caught.value.still_running
    assert not (tmp_path / "c").exists()
    nothing_left(caught.value.results)
