"""display: tables that render as HTML and text, and errors shown as wrapped text."""

import pytest

from spmd_guide.core import checks
from spmd_guide.core.display import Table, error_of, wrap


def test_table_renders_as_html_and_text_with_multiline_cells():
    table = Table([{"what": "a", "inputs": "P('a')\nP(None, 'b')"}, {"what": "b", "inputs": "P()"}])
    html = table._repr_html_()
    assert html.count("<tr>") == 3 and "<br>" in html and "P(&#x27;a&#x27;)" in html
    assert str(table).splitlines()[0].split() == ["what", "inputs"]


def test_table_refuses_no_rows():
    with pytest.raises(ValueError, match="at least one row"):
        Table([])


def test_error_of_wraps_and_insists_on_an_error():
    def fails():
        raise KeyError("x" * 10 + " word" * 40)

    text = error_of(fails)
    assert text.startswith("KeyError: ")
    assert all(len(line) <= 76 for line in text.splitlines())
    with pytest.raises(AssertionError, match="expected to raise"):
        error_of(lambda: 1)
    assert wrap("a" * 100) == "a" * 100  # long words are not broken


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: Table([{"a": 1}, {"a": 2, "b": 3}]), checks.InputError, "same columns"),
    (lambda: Table([{"a": 1}, {"b": 2}]), checks.InputError, "same columns"),
    (lambda: Table([]), checks.InputError, "at least one row"),
    (lambda: Table("rows"), checks.InputTypeError, "list of dicts"),
    (lambda: Table([1, 2]), checks.InputTypeError, "dict"),
    (lambda: Table([{"a": 1}], align={"b": "left"}), checks.InputError, "unknown column"),
    (lambda: Table([{"a": 1}], align={"a": "middle"}), checks.InputError, "alignment"),
    (lambda: error_of(5), checks.InputTypeError, "function"),
    (lambda: error_of(None), checks.InputTypeError, "function"),
    (lambda: wrap(12), checks.InputTypeError, "string"),
])
def test_bad_input_gets_a_clear_error(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_table_text_html_alignment_and_total_row():
    table = Table([{"op": "all-gather", "bytes": "12 B"}, {"op": "total", "bytes": "12 B"}],
                  title="t", align={"bytes": "right"}, bold_last=True)
    html = table._repr_html_()
    assert "<caption" in html and "text-align:right" in html and "font-weight:bold" in html
    assert str(table).splitlines()[0] == "t" and "all-gather" in str(table)


def test_table_from_tuples_and_float_format():
    table = Table.from_tuples(["what", "value"], [("pi", 3.14159), ("e", 2.71828)], floatfmt=".2f")
    assert table.rows == [{"what": "pi", "value": "3.14"}, {"what": "e", "value": "2.72"}]
    with pytest.raises(checks.InputError, match="3 cells"):
        Table.from_tuples(["a", "b"], [(1, 2, 3)])


def test_listed_writes_an_english_list():
    from spmd_guide.core.display import listed

    assert listed(["a"]) == "a" and listed(("a", "b")) == "a and b"
    assert listed(["a", "b", "c"]) == "a, b and c"
    with pytest.raises(TypeError, match="non-empty list"):
        listed("abc")


def test_jax_prints_and_appends_the_source_of_an_indivisible_device_put(capsys):
    """when_it_goes_wrong.md on JAX 0.12: the IndivisibleError of device_put ends with "This
    error occurs at source: <file:line:col (function)>", and JAX also prints that location
    on a line of its own before raising (a print left in jax/_src/pjit.py)."""
    import jax
    import numpy as np
    from helpers import mesh_of
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    message = " ".join(error_of(
        jax.device_put, np.arange(6.0), NamedSharding(mesh_of(4), P("x"))).split())
    printed = capsys.readouterr().out.strip()
    assert message.startswith("IndivisibleError: One of device_put args was given the sharding")
    assert printed.endswith("(error_of)") and "display.py:" in printed
    assert message.endswith(f"This error occurs at source: {printed}")
