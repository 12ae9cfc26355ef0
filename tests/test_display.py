"""display: tables that render as HTML and text, and errors shown as wrapped text."""

import pytest

from spmd_guide.display import Table, error_of, wrap


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
