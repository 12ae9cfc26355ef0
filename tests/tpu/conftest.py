"""Part XIV's tests compile for TPU slices: they need libtpu (Linux x86_64) and skip, with the
reason, where it is absent; only the tests named ``..._without_libtpu`` run everywhere."""

import pytest

from spmd_guide.tpu.topology import unavailable


def pytest_collection_modifyitems(config, items):
    why = unavailable()
    if not why:
        return
    skip = pytest.mark.skip(reason=f"XLA:TPU is not available: {why}")
    for item in items:
        if "tests/tpu/" in str(item.fspath) and "without_libtpu" not in item.name:
            item.add_marker(skip)
