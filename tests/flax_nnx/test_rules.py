"""Rule tables and their resolution, dimension by dimension (pure Python: no compiles)."""

from __future__ import annotations

import pytest
from helpers import mesh_of
from jax.sharding import PartitionSpec as P

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.flax_nnx.rules import (
    ACTIVATION_NAMES,
    NAMES,
    PARAM_NAMES,
    RULES,
    check_rules,
    mesh_spec,
    rules_of,
)
from spmd_guide.transformer.transformer import STRATEGIES


def test_tables_list_every_name_and_use_part_ix_axes():
    assert {"dp", "fsdp", "tp", "fsdp_tp"} <= set(RULES)
    used = {n for names in (*PARAM_NAMES.values(), *ACTIVATION_NAMES.values()) for n in names}
    assert used == set(NAMES)
    for name, table in RULES.items():
        assert tuple(n for n, _ in table) == NAMES
        axes = {a for _, t in table for a in ((t,) if isinstance(t, str) else t or ())}
        assert axes <= set(STRATEGIES[name].axes), name


def test_dimensions_claim_in_order_once_and_only_when_they_divide():
    mesh = mesh_of(8, ("data",))
    fsdp = RULES["fsdp"]
    assert mesh_spec(("embed", "heads", "head_dim"), (32, 8, 4), fsdp, mesh) == \
        P("data", None, None)
    # heads (4) does not split 8 ways: the next dimension that does takes data, as Part IX.
    assert mesh_spec(("heads", "head_dim", "embed"), (4, 8, 32), fsdp, mesh) == \
        P(None, "data", None)
    assert mesh_spec(("heads", "head_dim", "embed"), (4, 4, 4), fsdp, mesh) == P(None, None, None)
    # Activations reserve the axis a dimension could not take (no split of another one).
    assert mesh_spec(("batch", "length", "embed"), (2, 16, 32), fsdp, mesh,
                     skip_indivisible=False) == P(None, None, None)
    assert mesh_spec(("batch", "length", "embed"), (8, 16, 32), fsdp, mesh) == \
        P("data", None, None)


def test_fallback_rules_tuples_and_none():
    mesh = mesh_of(8, ("a", "b"), (4, 2))
    rules = (("x", ("a", "b")), ("y", "a"), ("y", "b"), ("z", None), ("z", "a"))
    assert mesh_spec(("x", "y"), (8, 4), rules, mesh) == P(("a", "b"), None)
    assert mesh_spec(("y", "x"), (4, 8), rules, mesh) == P("a", None)
    assert mesh_spec(("y", "y2"), (2, 4), rules, mesh) == P("b", None)
    assert mesh_spec(("z", None), (8, 8), rules, mesh) == P(None, None)


def test_errors():
    mesh = mesh_of(2, ("data",))
    with pytest.raises(InputError, match="names mesh axis 'model'"):
        mesh_spec(("heads",), (8,), RULES["tp"], mesh)
    with pytest.raises(InputError, match="unknown strategy 'zero'"):
        rules_of("zero")
    with pytest.raises(InputTypeError, match="strategy must be a name"):
        rules_of(RULES["dp"])
    with pytest.raises(InputError, match="2 dimensions"):
        mesh_spec(("a", "b"), (4,), RULES["dp"], mesh)
    for bad in ("data", 3, (("a",),), (("a", 1),), ((1, "data"),), None):
        with pytest.raises(InputTypeError):
            check_rules(bad)
    assert check_rules([("a", "data")], mesh) == (("a", "data"),)
