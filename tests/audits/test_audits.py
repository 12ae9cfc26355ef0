"""The bad-input audits: every case of ``early_parts`` and ``newer_parts`` run as a check.

Each wrong input must raise the package's own error (``InputError`` or ``InputTypeError``),
each valid edge case must return, and every public function the early audit covers must check
its input. The cases build meshes, a model, checkpoints and compiled programs when their module
is imported, so each test imports its module itself (collecting the quick suite stays cheap)
and the audits run in the slow sweep (about three minutes on 2 cores).
"""

from __future__ import annotations

import importlib

import pytest

from spmd_guide.core.checks import InputError

pytestmark = pytest.mark.slow

AUDITS = ("early_parts", "newer_parts")


def _outcome(call) -> str | None:
    """None if ``call()`` raised the package's error, else what it did instead."""
    try:
        call()
    except InputError:
        return None
    except Exception as error:  # noqa: BLE001 - any other exception is the finding
        return f"raised {type(error).__name__}: {str(error)[:200]}"
    return "returned"


@pytest.mark.parametrize("audit", AUDITS)
def test_every_bad_input_gets_the_packages_error(audit):
    cases = importlib.import_module(audit)
    assert len(cases.BAD) >= {"early_parts": 223, "newer_parts": 661}[audit]  # none lost
    wrong = {name: what for name, call in cases.BAD.items()
             if (what := _outcome(call)) is not None}
    assert not wrong, "\n".join(f"{name}: {what}" for name, what in wrong.items())


@pytest.mark.parametrize("audit", AUDITS)
def test_every_valid_edge_case_returns(audit):
    cases = importlib.import_module(audit)
    failed = {}
    for name, call in cases.VALID.items():
        try:
            call()
        except Exception as error:  # noqa: BLE001 - every failure is reported by name
            failed[name] = f"{type(error).__name__}: {str(error)[:200]}"
    assert not failed, "\n".join(f"{name}: {what}" for name, what in failed.items())


#: Public functions of the early audit's modules that take input but call no check: kernels
#: that run inside ``shard_map`` on one device's traced block, the per-device bodies of the
#: ring matmuls, helpers fed only by checked callers.
UNCHECKED = {
    "failures.failure_table", "collectives.block_sum",
    "collectives.summed_over_devices", "collectives.psum_kernel", "collectives.pmean_kernel",
    "collectives.all_gather_kernel", "collectives.all_gather_tiled_kernel",
    "collectives.axis_index_kernel", "collectives.psum_in_two_steps",
    "collectives.global_positions", "collectives.flat_caption", "collective_matmul.as_operand",
    "collective_matmul.pass_along", "collective_matmul.allgather_per_device",
    "collective_matmul.allgather_overlapped_per_device",
    "collective_matmul.allgather_bidi_per_device", "collective_matmul.reduce_scatter_per_device",
    "collective_matmul.reduce_scatter_overlapped_per_device",
    "collective_matmul.reduce_scatter_bidi_per_device",
    "collective_matmul.allgather_bidi_fused_per_device",
    # Reads the stderr text of a process that failures.failure_modes (which checks) started.
    "failures.short_verdict",
    # Readers of a compiled program that ring_costs.compile_variant (which checks) made.
    "ring_costs.matmuls_before_first_transfer", "ring_costs.is_bidi", "ring_costs.summed_at_end",
}


def test_every_new_public_function_of_the_early_audit_checks_its_input():
    cases = importlib.import_module("early_parts")
    with_inputs, checked, _, unchecked = cases.coverage()
    assert with_inputs >= 102 and checked >= 81
    new = sorted(set(unchecked) - UNCHECKED)
    assert not new, f"public functions that take input and call no check: {new}"
