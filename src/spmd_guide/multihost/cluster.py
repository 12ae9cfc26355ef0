"""Planning for a real pod or cluster from one machine (Part VIII).

Two questions a reader has before the first multi-host run, answered without a cluster:

* What will an argument-less ``jax.distributed.initialize()`` pick up from the scheduler's
  environment? :func:`detect` runs JAX's own detection step on a given set of environment
  variables (and only those), connecting to nothing; :func:`detectors` lists the cluster
  environments JAX knows and which of them restrict each process to one device.
* What does a hybrid ICI x DCN mesh look like? :func:`hybrid_mesh` calls
  ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` on this machine's devices grouped
  into stand-in *slices*, and returns a real ``Mesh`` of the real devices, usable with arrays.

The detection helpers read JAX's private registry (``jax._src.clusters``): that is where the
rules live, and they change between JAX versions, which is why the book reads them rather than
restating them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from spmd_guide.core import checks


def _registry() -> Any:
    from jax._src.clusters import ClusterEnv

    return ClusterEnv


def detectors() -> list[dict[str, Any]]:
    """The cluster environments ``initialize()`` tries, in order, whether each one restricts
    a process to one device (``local_device_ids=[local rank]``) on its own, and whether it
    asks MPI itself (through the ``mpi4py`` package) for the ranks.

    A class restricts when it defines ``get_local_process_id``; JAX then sets
    ``local_device_ids`` to that local rank unless you passed ``local_device_ids`` (or set
    ``JAX_LOCAL_DEVICE_IDS``), and never on a Cloud TPU VM. ``Mpi4pyCluster`` asks MPI;
    from JAX 0.12 so does ``OmpiCluster`` under Open MPI 5 (it hands over to
    ``Mpi4pyCluster``).
    """
    base = _registry()
    rows = []
    for env in base._cluster_types:
        overrides = env.get_local_process_id.__func__ is not base.get_local_process_id.__func__
        rows.append({"class": env.__name__, "name": env.name or "-",
                     "opt-in only": env.opt_in_only_method,
                     "one device per process": overrides,
                     "needs mpi4py": _asks_mpi(env)})
    return rows


def _asks_mpi(env: Any) -> str:
    """When ``env`` reads the ranks from MPI (``mpi4py``): ``"always"``, ``"Open MPI 5"``
    (JAX 0.12's ``OmpiCluster``, which hands Open MPI 5 to ``Mpi4pyCluster``) or ``"no"``."""
    if env.__name__ == "Mpi4pyCluster":
        return "always"
    if callable(getattr(env, "_mpi4py_cluster", None)):
        return "Open MPI 5"
    return "no"


def mpi4py_installed() -> bool:
    """Whether ``mpi4py`` can be imported here: what JAX's ``Mpi4pyCluster`` checks (it
    looks the package up without importing it)."""
    return bool(_registry_class("Mpi4pyCluster").is_env_present())


def _registry_class(name: str) -> Any:
    return next(c for c in _registry()._cluster_types if c.__name__ == name)


def open_mpi_variable() -> str:
    """The variable of ORTE, Open MPI's runtime up to version 4, whose presence makes JAX
    detect an Open MPI launch. (From JAX 0.12, Open MPI 5 is recognised too: by
    ``OMPI_VERSION``, or by the rank variables without this one.)"""
    from jax._src.clusters import ompi_cluster

    return ompi_cluster._ORTE_URI


def detect(env: Mapping[str, str]) -> dict[str, Any]:
    """What an argument-less ``jax.distributed.initialize()`` would use if the process's
    environment were exactly ``env``.

    Runs ``ClusterEnv.auto_detect_unset_distributed_params`` (the detection step of
    ``initialize``) with ``os.environ`` replaced by ``env`` for the duration of the call; it
    connects to nothing. ``cluster`` is the detected class name, or ``None``.

    An environment whose values come from MPI itself (Open MPI 5 in JAX 0.12: see
    :func:`detectors`) cannot be read from variables: ``needs`` is then ``"mpi4py"`` and the
    four values are ``None``. If ``mpi4py`` is missing, ``error`` holds what ``initialize()``
    would raise; if it is installed, MPI is not started here (it would answer for this
    process alone), and ``error`` is ``None``.
    """
    if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise checks.InputTypeError(
            f"env must be a mapping of variable names to string values, such as "
            f"{{'SLURM_NTASKS': '8'}}, got {env!r}.")
    base = _registry()
    values: tuple[Any, ...] = (None, None, None, None)
    needs = error = None
    with mock.patch.dict(os.environ, dict(env), clear=True):
        found = next((c for c in base._cluster_types
                      if not c.opt_in_only_method and c.is_env_present()), None)
        if found is not None and _asks_mpi(found) == "Open MPI 5" and found._is_ompi_5():
            needs = "mpi4py"
            if not mpi4py_installed():  # then JAX raises before it touches MPI
                try:
                    base.auto_detect_unset_distributed_params(None, None, None, None, None, 300)
                except RuntimeError as raised:
                    error = f"{type(raised).__name__}: {raised}"
        else:
            values = base.auto_detect_unset_distributed_params(
                None, None, None, None, None, 300)
    address, count, index, local = values
    return {"cluster": found.__name__ if found else None, "coordinator_address": address,
            "num_processes": count, "process_id": index,
            "local_device_ids": None if local is None else list(local),
            "needs": needs, "error": error}


@dataclass(frozen=True)
class SliceStandIn:
    """A real device dressed with a ``slice_index``, as the devices of a multi-slice TPU have.

    ``create_hybrid_device_mesh`` groups devices by that attribute; CPU devices have none.
    """

    device: Any
    slice_index: int

    @property
    def id(self) -> int:
        return self.device.id

    @property
    def platform(self) -> str:
        return self.device.platform

    @property
    def device_kind(self) -> str:
        return self.device.device_kind

    @property
    def process_index(self) -> int:
        return self.device.process_index


def hybrid_mesh(
    mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int],
    axis_names: Sequence[str],
    *,
    slices: int,
    devices: Sequence[jax.Device] | None = None,
) -> tuple[Mesh, dict[int, int]]:
    """A ``Mesh`` from ``create_hybrid_device_mesh(mesh_shape, dcn_mesh_shape)``, with
    ``devices`` (default ``jax.devices()``) grouped into ``slices`` stand-in slices of
    consecutive devices. Returns the mesh and each device id's slice.

    Axis ``i`` of the mesh has size ``mesh_shape[i] * dcn_mesh_shape[i]``; ``mesh_shape`` is
    the layout inside one slice (fast links, ICI), ``dcn_mesh_shape`` how slices line up
    (the data-center network).
    """
    inner = checks.counts("mesh_shape", mesh_shape)
    outer = checks.counts("dcn_mesh_shape", dcn_mesh_shape)
    if len(inner) != len(outer) or len(tuple(axis_names)) != len(inner):
        raise checks.InputError(
            f"mesh_shape {inner}, dcn_mesh_shape {outer} and axis_names {tuple(axis_names)} "
            "must have one entry per mesh axis each.")
    slices = checks.count("slices", slices)
    devices = list(jax.devices() if devices is None else devices)
    needed = int(np.prod(inner)) * int(np.prod(outer))
    if len(devices) < needed:
        raise checks.InputError(
            f"a hybrid mesh of {inner} x {outer} needs {needed} devices, got {len(devices)}.")
    devices = devices[:needed]
    checks.divisible("the number of devices", needed, slices, why="into equal slices")
    if int(np.prod(outer)) != slices:
        raise checks.InputError(
            f"dcn_mesh_shape {outer} lines up {int(np.prod(outer))} slices, but slices={slices}.")
    per_slice = needed // slices
    stand_ins = [SliceStandIn(d, i // per_slice) for i, d in enumerate(devices)]
    grid = mesh_utils.create_hybrid_device_mesh(inner, outer, devices=stand_ins)
    real = np.vectorize(lambda s: s.device, otypes=[object])(grid)
    mesh = Mesh(real, tuple(axis_names), axis_types=(AxisType.Auto,) * len(inner))
    return mesh, {s.id: s.slice_index for s in stand_ins}
