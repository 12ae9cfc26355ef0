"""The one HLO parser: generated text with nested tuples and parenthesised operands, and the
readers of the entry computation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_guide.core import checks, hlo, hlo_text

DTYPES = ["f32", "bf16", "s32", "pred", "u8", "f16"]


@st.composite
def buffers(draw):
    dtype = draw(st.sampled_from(DTYPES))
    dims = draw(st.lists(st.integers(1, 9), max_size=3))
    return hlo_text.Buffer(dtype, tuple(dims))


@st.composite
def shapes(draw, depth=2):
    """An HLO shape: an array with a layout, or a (possibly nested) tuple of shapes."""
    if depth == 0 or draw(st.booleans()):
        b = draw(buffers())
        layout = "{" + ",".join(map(str, reversed(range(len(b.shape))))) + "}" if b.shape else ""
        return f"{b}{layout}", [b]
    parts = [draw(shapes(depth=depth - 1)) for _ in range(draw(st.integers(1, 3)))]
    return "(" + ", ".join(t for t, _ in parts) + ")", [b for _, bs in parts for b in bs]


@settings(max_examples=25, deadline=None)
@given(shape=shapes(), n_operands=st.integers(0, 3))
def test_generated_instructions_parse_whole(shape, n_operands):
    text, flat = shape
    operands = [f"{text} %p.{i}" for i in range(n_operands)]  # typed operands hold brackets
    line = (f"  ROOT %out.1 = {text} custom-call({', '.join(operands)}), "
            f'custom_call_target="x(y)", metadata={{op_name="a(b)"}}')
    instruction = hlo_text._parse_instruction(line)
    assert instruction is not None
    assert instruction.name == "out.1" and instruction.opcode == "custom-call"
    assert instruction.operands == tuple(f"p.{i}" for i in range(n_operands))
    assert list(instruction.result) == flat
    assert hlo_text.parse_shape(text) == tuple(flat)


def test_reads_a_real_compiled_program_and_its_entry():
    f = jax.jit(lambda x, y: (jnp.sin(x) @ y).sum())
    compiled = hlo.compile(f, jnp.ones((4, 8)), jnp.ones((8, 2)))
    instructions = hlo_text.entry_instructions(compiled)
    assert instructions[-1].name in hlo_text.entry_computation(compiled)
    assert {i.opcode for i in instructions} >= {"parameter"}
    assert "metadata=" not in hlo_text.entry_computation(compiled.as_text())
    assert hlo_text.lines_with(compiled, "parameter(0)")


MAIN = """\
HloModule m, num_partitions=8

ENTRY %main.3 (p: f32[1,8]) -> f32[4,8] {
  %p = f32[1,8]{1,0} parameter(0)
  ROOT %all-gather.7 = f32[4,8]{1,0} all-gather(%p), channel_id=1, replica_groups=GROUPS, dimensions={0}
}
"""


def test_same_program_reads_through_the_spelling_of_replica_groups():
    """0.12 names a mesh's axes 'x','y' in one program and 'axis_0','axis_1' in another:
    the same groups. Different groups, or another instruction, are another program."""
    def program(groups, number="7"):
        return MAIN.replace("GROUPS", groups).replace("all-gather.7", f"all-gather.{number}")

    spellings = ["mesh['x'=4,'y'=2] {'x'}", "mesh['axis_0'=4,'axis_1'=2] {'axis_0'}",
                 "{{0,2,4,6},{1,3,5,7}}", "[2,4]<=[4,2]T(1,0)"]
    for spelling in spellings[1:]:
        assert hlo_text.same_program(program(spellings[0]), program(spelling, "2"))
    assert hlo_text.differing_lines(program(spellings[0]), program(spellings[0], "2")) == []
    ((left, right),) = hlo_text.differing_lines(program(spellings[0]), program(spellings[1]))
    assert "{'x'}" in left and "{'axis_0'}" in right
    assert not hlo_text.same_program(program("mesh['x'=4,'y'=2] {'y'}"), program(spellings[0]))
    assert not hlo_text.same_program(program("[4,2]<=[8]"), program(spellings[0]))
    assert not hlo_text.same_program(program(spellings[0]),
                                     program(spellings[0]).replace("dimensions={0}", "dimensions={1}"))


def test_device_numbers_are_positions_in_the_mesh_not_device_ids():
    """A mesh over the devices in reverse order prints the same tile assignment and the same
    replica groups as one in id order; mapped through ``mesh.devices.flat`` they name the
    devices that really hold each block and that really sum together."""
    from jax import P
    from jax.sharding import Mesh, NamedSharding

    devices = np.array(jax.devices()[:8])
    forward, backward = (Mesh(d.reshape(4, 2), ("a", "b")) for d in (devices, devices[::-1]))
    texts, groups = [], []
    for mesh in (forward, backward):
        x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("b", "a")))
        lowered = jax.jit(lambda v: v * 2).lower(x).compiler_ir("hlo").as_hlo_text()
        (line,) = hlo_text.lines_with(lowered, "parameter(0)")
        notation = "{" + line.split("sharding={", 1)[1].split("}", 1)[0] + "}"
        texts.append(notation)
        grid = hlo_text.device_ids(hlo_text.parse_tile_assignment(notation), mesh)
        holder = {(s.index[0].start // 4, s.index[1].start // 2): s.device.id
                  for s in x.addressable_shards}
        assert grid.tolist() == [[holder[(i, j)] for j in range(4)] for i in range(2)]
        summed = jax.jit(lambda v: v.sum(axis=1), out_shardings=NamedSharding(mesh, P("b")))
        (op,) = [c for c in hlo.collectives(summed, x) if c.kind == "all-reduce"]
        groups.append(op.groups)
        ids = hlo_text.device_ids(op.groups, mesh)
        b_of = {d.id: int(np.argwhere(mesh.devices == d)[0][1]) for d in mesh.devices.flat}
        assert all(len({b_of[i] for i in group}) == 1 for group in ids)
    assert texts[0] == texts[1] and groups[0] == groups[1]
    assert hlo_text.device_ids(groups[1], backward) != groups[1]
    assert hlo_text.device_ids(groups[0], list(forward.devices.flat)) == groups[0]


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: hlo_text.device_ids(((0, 8),), jax.devices()[:8]), checks.InputError,
     "position 8"),
    (lambda: hlo_text.device_ids(np.array([[0.5]]), jax.devices()[:1]), checks.InputTypeError,
     "integer"),
    (lambda: hlo_text.device_ids((0, 1), jax.devices()[:2]), checks.InputTypeError,
     "tile grid"),
    (lambda: hlo_text.device_ids(((0,),), [0, 1]), checks.InputTypeError, "Mesh"),
    (lambda: hlo_text.parse_shape("float32[4]"), checks.InputError, "HLO element type"),
    (lambda: hlo_text.parse_shape(4), checks.InputTypeError, "shape text"),
    (lambda: hlo_text.Buffer("f32", (-1, 4)), checks.InputError, "non-negative"),
    (lambda: hlo_text.Buffer("float32", (4,)), checks.InputError, "HLO element type"),
    (lambda: hlo_text.program_text(3), checks.InputTypeError, "compiled program"),
    (lambda: hlo_text.entry_computation("HloModule m\n"), checks.InputError, "ENTRY"),
    (lambda: hlo_text.lines_with("x", ""), checks.InputError, "non-empty"),
    (lambda: hlo_text.parse_replica_groups("<mystery>"), ValueError, "replica_groups"),
])
def test_bad_input_is_refused(call, error, word):
    with pytest.raises(error, match=word):
        call()
