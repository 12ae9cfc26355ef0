"""Cluster planning: JAX's detection rules read back, and hybrid meshes on stand-in slices."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import cluster

SLURM = {"SLURM_JOB_ID": "12345", "SLURM_STEP_NODELIST": "node[001-004]", "SLURM_NTASKS": "4",
         "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}
OMPI4 = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1,10.148.0.1:34911",
         "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_RANK": "9",
         "OMPI_COMM_WORLD_LOCAL_RANK": "1"}


def test_detectors_say_who_restricts_devices():
    rows = {r["class"]: r for r in cluster.detectors()}
    assert rows["SlurmCluster"]["one device per process"]
    assert rows["OmpiCluster"]["one device per process"]
    assert not rows["K8sCluster"]["one device per process"]
    assert rows["Mpi4pyCluster"]["opt-in only"]
    assert cluster.open_mpi_variable() == "OMPI_MCA_orte_hnp_uri"
    # JAX 0.12: Open MPI 5 goes through mpi4py; SLURM and Kubernetes never do
    assert [rows[c]["needs mpi4py"] for c in ("OmpiCluster", "Mpi4pyCluster", "SlurmCluster",
                                              "K8sCluster")] == ["Open MPI 5", "always", "no", "no"]


_EMPTY = dict.fromkeys(("cluster", "coordinator_address", "num_processes", "process_id",
                        "local_device_ids", "needs", "error"))


def test_detect():
    slurm = cluster.detect(SLURM)
    assert slurm == {**_EMPTY, "cluster": "SlurmCluster", "coordinator_address": "node001:61497",
                     "num_processes": 4, "process_id": 2, "local_device_ids": [0]}
    ompi = cluster.detect(OMPI4)
    assert ompi["cluster"] == "OmpiCluster" and ompi["coordinator_address"].startswith("10.0.0.1:")
    assert (ompi["num_processes"], ompi["process_id"], ompi["local_device_ids"]) == (16, 9, [1])
    assert ompi["needs"] is None and ompi["error"] is None
    assert cluster.detect({}) == _EMPTY
    assert "SLURM_NTASKS" not in os.environ  # the environment is restored


OMPI5_RANKS = {k: v for k, v in OMPI4.items() if k != "OMPI_MCA_orte_hnp_uri"}


@pytest.mark.parametrize("env", [
    OMPI5_RANKS,                                       # PRRTE sets no ORTE variable
    {**OMPI5_RANKS, "OMPI_VERSION": "5.0.3"},          # or says its version
    {**OMPI4, "OMPI_VERSION": "5.0.3"},                # the version wins over the variable
])
@pytest.mark.parametrize("installed", [False, True])
def test_open_mpi_5_needs_mpi4py_and_detect_never_starts_mpi(env, installed, monkeypatch):
    """JAX 0.12 recognises Open MPI 5 and asks MPI (mpi4py) for the ranks. Tested without
    MPI: mpi4py is made to look absent, or present; importing it would fail either way, so
    detect must not touch it."""
    from jax._src.clusters import mpi4py_cluster

    monkeypatch.setattr(mpi4py_cluster, "find_spec", lambda name: object() if installed else None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` raises ImportError
    found = cluster.detect(env)
    assert found["cluster"] == "OmpiCluster" and found["needs"] == "mpi4py"
    assert [found[k] for k in ("coordinator_address", "num_processes", "process_id",
                               "local_device_ids")] == [None] * 4
    if installed:
        assert found["error"] is None
    else:
        assert found["error"] == ("RuntimeError: Open MPI 5 or newer requires mpi4py for "
                                  "distributed initialization.")
    assert cluster.mpi4py_installed() is installed


def test_kubernetes_is_not_detected_without_the_kubernetes_package(monkeypatch):
    """multihost.md: in a pod (KUBERNETES_SERVICE_HOST set) JAX's K8sCluster detects nothing,
    with a warning naming jax[k8s], when the `kubernetes` package cannot be imported."""
    from jax._src.clusters.k8s_cluster import K8sCluster

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    with pytest.warns(UserWarning, match=r"jax\[k8s\]"):
        assert K8sCluster.is_env_present() is False
    assert "K8sCluster" in [row["class"] for row in cluster.detectors()]


def test_open_mpi_4_with_its_version_is_read_from_variables():
    found = cluster.detect({**OMPI4, "OMPI_VERSION": "4.1.6"})
    assert (found["cluster"], found["num_processes"], found["needs"]) == ("OmpiCluster", 16, None)


def test_multihost_page_exercise():
    """Two tasks per node under SLURM: each task is given one device (its local rank)."""
    env = dict(SLURM, SLURM_NTASKS="8", SLURM_PROCID="5", SLURM_LOCALID="1")
    assert cluster.detect(env)["local_device_ids"] == [1]
    mesh, _ = cluster.hybrid_mesh((1, 2), (4, 1), ("data", "fsdp"), slices=4)
    assert mesh.devices.shape == (4, 2)


@pytest.mark.parametrize(("inner", "outer", "slices"), [((1, 4), (2, 1), 2), ((2, 2), (2, 1), 2),
                                                         ((1, 2), (4, 1), 4), ((2,), (4,), 4)])
def test_hybrid_mesh(inner, outer, slices):
    names = ("data", "model")[: len(inner)]
    mesh, slice_of = cluster.hybrid_mesh(inner, outer, names, slices=slices)
    assert mesh.devices.shape == tuple(i * o for i, o in zip(inner, outer, strict=True))
    # the first axis crosses slices in blocks of inner[0] rows; every row of a block is one slice
    for row in range(mesh.devices.shape[0]):
        ids = {slice_of[d.id] for d in np.ravel(mesh.devices[row])}
        assert ids == {row // inner[0]}
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P(names[0])))
    assert float(jax.jit(jnp.sum)(x)) == float(np.arange(32.0).sum())


def test_hybrid_mesh_on_other_devices():
    mesh, slice_of = cluster.hybrid_mesh((1, 2), (2, 1), ("a", "b"), slices=2, devices=DEVICES[4:])
    assert sorted(slice_of) == [4, 5, 6, 7] and [d.id for d in mesh.devices.flat] == [4, 5, 6, 7]


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: cluster.detect({"A": 1}), InputTypeError, "env"),
    (lambda: cluster.detect("SLURM"), InputTypeError, "env"),
    (lambda: cluster.hybrid_mesh((1, 4), (2,), ("a", "b"), slices=2), InputError, "entry"),
    (lambda: cluster.hybrid_mesh((1, 4), (2, 1), ("a", "b"), slices=4), InputError, "slices"),
    (lambda: cluster.hybrid_mesh((1, 8), (2, 1), ("a", "b"), slices=2), InputError, "16"),
    (lambda: cluster.hybrid_mesh((1, 3), (2, 1), ("a", "b"), slices=0), InputError, "slices"),
    (lambda: cluster.hybrid_mesh((0, 4), (2, 1), ("a", "b"), slices=2), InputError, "mesh_shape"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()
