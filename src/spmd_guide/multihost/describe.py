"""What one process of several sees: its devices, every device, and its shards of a global array.

:func:`describe_process` runs in *each* process that
:func:`spmd_guide.multihost.multihost.launch` starts, after ``jax.distributed.initialize``: the
same code, a different ``jax.process_index()``. It prints what its process sees (the page
multihost/multihost shows that output) and returns a JSON-able summary for the tests.
"""

from __future__ import annotations

import ipaddress
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks
from spmd_guide.multihost import global_arrays


def describe_process(*, rows_per_device: int = 2) -> dict[str, Any]:
    """Print and return what this process sees: its devices, all devices,
    and its shards of a global array built from per-process data."""
    rows_per_device = checks.count("rows_per_device", rows_per_device)
    me, count = jax.process_index(), jax.process_count()
    local_ids = [d.id for d in jax.local_devices()]
    global_ids = [d.id for d in jax.devices()]
    print(f"process {me} of {count}")
    print(f"  local devices:  {local_ids}")
    print(f"  global devices: {global_ids}")

    # x = arange(rows_per_device * device_count), sharded over every device.
    # Each process passes only its own part: rows_here consecutive values.
    mesh = jax.make_mesh((jax.device_count(),), ("data",),
                         axis_types=(AxisType.Explicit,))
    sharding = NamedSharding(mesh, P("data"))
    rows_here = rows_per_device * jax.local_device_count()
    local_part = np.arange(me * rows_here, (me + 1) * rows_here,
                           dtype=np.int32)
    x = jax.make_array_from_process_local_data(sharding, local_part)
    print(f"x: global shape {x.shape}, "
          f"fully addressable: {x.is_fully_addressable}")
    shards = []
    for shard in x.addressable_shards:
        (rows,) = shard.index
        data = np.asarray(shard.data).tolist()
        shards.append({"device": shard.device.id, "start": rows.start,
                       "stop": rows.stop, "data": data})
        print(f"  device {shard.device.id:>4} holds "
              f"x[{rows.start}:{rows.stop}] = {data}")
    elsewhere = [i for i in global_ids if i not in local_ids]
    print(f"  devices {elsewhere} hold the rest")

    # One program on all devices: its all-reduce crosses processes.
    total = int(jax.jit(jnp.sum)(x))
    print(f"sum(x) over all {len(global_ids)} devices = {total}")
    try:
        np.asarray(x)
        fetch_error = None
    except RuntimeError as error:
        fetch_error = f"{type(error).__name__}: {error}"
        first = re.match(r".*?\.(?=\s|$)", str(error))
        print(textwrap.fill(
            f"np.asarray(x) -> {type(error).__name__}: "
            f"{first.group(0) if first else error}",
            76, subsequent_indent="    "))

    return {
        "process_index": me, "process_count": count,
        "local_devices": local_ids, "global_devices": global_ids,
        "device_process": {str(d.id): d.process_index
                           for d in jax.devices()},
        "global_shape": list(x.shape),
        "fully_addressable": x.is_fully_addressable,
        "shards": shards, "other_devices": elsewhere, "sum": total,
        "fetch_error": fetch_error,
        "hybrid_mesh": hybrid_mesh_ids(),
        "listening": listening_addresses(),
        "global_arrays": global_arrays.facts(x, local_part.shape),
    }


def hybrid_mesh_ids() -> list[list[int]]:
    """Device ids of a ``("data", "model")`` mesh whose ``data`` axis crosses processes.

    ``create_hybrid_device_mesh`` builds a mesh per *granule* (a slice on a multi-slice TPU, a
    process with ``process_is_granule=True``) from ``mesh_shape`` and lays the granules out by
    ``dcn_mesh_shape``: here ``model`` stays inside a process (the fast links) and ``data``
    goes between processes (the slow network).
    """
    devices = mesh_utils.create_hybrid_device_mesh(
        mesh_shape=(1, jax.local_device_count()),
        dcn_mesh_shape=(jax.process_count(), 1),
        process_is_granule=True,
    )
    return [[d.id for d in row] for row in devices]


def listening_addresses() -> list[str] | None:
    """``host:port`` of every TCP socket this process listens on (Linux ``/proc``; else None)."""
    if not Path("/proc/self/fd").is_dir():
        return None
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = local.split(":")
            raw = bytes.fromhex(host_hex)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian words
            address = ipaddress.ip_address(raw)
            if address.version == 6 and address.ipv4_mapped:
                address = address.ipv4_mapped
            found.append(f"{address}:{int(port_hex, 16)}")
    return sorted(found)
