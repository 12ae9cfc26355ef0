"""global_arrays: a global shape and an abstract array from a local shape (in one process of 8
devices, against JAX's own private computation, and in each of two processes, read from the
quick suite's launch), what process_allgather compiles, and the refused gather onto one."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax._src.sharding_impls import local_to_global_shape  # JAX's own, private: the reference
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import hlo
from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.multihost import global_arrays


@pytest.mark.parametrize("spec, local", [
    (P("a", "b"), (4, 8)), (P(("a", "b")), (8, 3)), (P(None, "b"), (5, 8)), (P(), (3, 2)),
])
def test_in_one_process_the_global_shape_is_the_local_shape(devices, spec, local):
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=devices)
    sharding = NamedSharding(mesh, spec)
    assert global_arrays.global_shape(sharding, local) == local_to_global_shape(sharding, local)
    shaped = global_arrays.abstract(sharding, local, np.int32)
    assert shaped.shape == local and shaped.dtype == np.int32 and shaped.sharding == sharding


def test_in_each_of_two_processes_the_global_shape_comes_from_the_local_shape(described):
    for result in described:
        facts = result.value["global_arrays"]
        assert facts["global_shape_from_local"] == result.value["global_shape"] == [16]
        assert facts["eval_shape"] == "(16,) P('data',)"
        assert facts["abstract"] == "ShapeDtypeStruct((16,), int32, P('data',))"
        assert facts["allgathered"] == list(range(16))  # every process gets all of it


def test_a_gather_onto_process_0_is_refused_in_both_processes(described):
    errors = [r.value["global_arrays"]["gather_to_one_error"] for r in described]
    assert errors[0].startswith("NotImplementedError: Cannot reshard an input that is not "
                                "fully addressable")
    assert errors[1].startswith("ValueError: For a cross-host reshard in multi-controller JAX")


def test_process_allgather_compiles_one_all_gather_of_the_whole_array(devices):
    mesh = jax.make_mesh((8,), ("data",), devices=devices)
    x = jax.device_put(np.arange(64, dtype=np.float32), NamedSharding(mesh, P("data")))
    program = global_arrays.allgather_program(x.sharding)
    counts = hlo.collective_counts(program, x)
    assert counts["all-gather"] == 1 and sum(counts.values()) == 1
    assert hlo.communication_bytes(program, x) == 64 * 4 * 7 // 8
    out = program(x)
    assert out.sharding.spec == P() and np.array_equal(np.asarray(out), np.arange(64))


BAD_INPUT = [
    ("sharding not named", lambda m: global_arrays.global_shape(None, (4,)), InputTypeError,
     "NamedSharding"),
    ("local shape negative", lambda m: global_arrays.global_shape(
        NamedSharding(m, P("data")), (-1,)), InputError, "local_shape"),
    ("local shape float", lambda m: global_arrays.global_shape(
        NamedSharding(m, P("data")), (4.0,)), InputTypeError, "local_shape"),
    ("spec longer than shape", lambda m: global_arrays.global_shape(
        NamedSharding(m, P("data", None)), (4,)), InputError, "more than"),
    ("local rows do not split", lambda m: global_arrays.global_shape(
        NamedSharding(m, P("data")), (3,)), InputError, "does not split"),
    ("allgather of a spec", lambda m: global_arrays.allgather_program(P()), InputTypeError,
     "NamedSharding"),
    ("gather a list", lambda m: global_arrays.gather_to_one_error([1]), InputTypeError,
     "jax.Array"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(devices, call, error, word):
    mesh = jax.make_mesh((8,), ("data",), devices=devices)
    with pytest.raises(error, match=word):
        call(mesh)
