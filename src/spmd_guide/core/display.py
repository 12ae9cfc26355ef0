"""The book's one presentation layer: tables, HTML snippets, fonts, and caught errors.

Every table on a page is a :class:`Table`: HTML in a notebook, plain text with ``str()``.
The book shows some errors on purpose (a sharding that does not divide, a matmul whose
contracting dimensions disagree); :func:`error_of` runs the failing call and returns the
error as wrapped text, so the page shows the message, never a traceback.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spmd_guide.core import checks

#: Paul Tol's "light" qualitative colour scheme, in his recommended order: told apart under the
#: common colour-vision deficiencies, and light enough for dark text (:data:`TEXT`) on top
#: (contrast above 7:1 for each colour, WCAG AAA).
PALETTE = (
    "#77AADD", "#EE8866", "#EEDD88", "#FFAABB", "#99DDFF",
    "#44BB99", "#BBCC33", "#AAAA00", "#DDDDDD",
)
TEXT = "#1a1a1a"
#: One font stack for HTML and figures: matplotlib draws with its own DejaVu Sans, the first.
FONT_STACK = ("DejaVu Sans", "Verdana", "system-ui", "Segoe UI", "Helvetica", "Arial",
              "sans-serif")
MONO_STACK = ("DejaVu Sans Mono", "ui-monospace", "Menlo", "Consolas", "monospace")
# CSS declarations without quotes: they sit inside single-quoted style attributes.
FONT_CSS = f"font-family:{','.join(FONT_STACK)};"
MONO_CSS = f"font-family:{','.join(MONO_STACK)};"

_ALIGNS = ("left", "right")


@dataclass(frozen=True)
class Html:
    """Rendered HTML with a plain-text twin: notebooks and the book show the HTML."""

    html: str
    text: str

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def side_by_side(*items: object, gap: str = "14px") -> Html:
    """Objects with ``_repr_html_`` next to each other, wrapping onto new lines as needed."""
    for item in items:
        if not hasattr(item, "_repr_html_"):
            raise checks.InputTypeError(
                f"side_by_side shows things that display as HTML (tables, grids), got "
                f"{type(item).__name__}.")
    parts = [item._repr_html_() for item in items]  # type: ignore[attr-defined]
    markup = (
        f"<div style='display:flex;flex-wrap:wrap;gap:{gap};align-items:flex-start'>"
        + "".join(f"<div>{part}</div>" for part in parts)
        + "</div>"
    )
    return Html(html=markup, text="\n\n".join(str(item) for item in items))


class Table:
    """Rows of a table that display as HTML in a notebook and as plain text with ``str()``.

    ``rows`` are mappings with the same keys (the column headers, in the first row's order);
    :meth:`from_tuples` builds one from a header list and row tuples. ``floatfmt`` formats
    float cells (``".4f"``).
    ``align`` maps a header to ``"left"`` or ``"right"`` (default left); ``bold_last`` sets
    the last row in bold (a total). Cells keep their line breaks; short cells never wrap.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], *, title: str = "",
                 align: Mapping[str, str] | None = None, bold_last: bool = False,
                 floatfmt: str | None = None):
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
            raise checks.InputTypeError(
                f"rows must be a list of dicts (one per row), got {type(rows).__name__}.")
        if not rows:
            raise checks.InputError("a table needs at least one row.")
        if not all(isinstance(r, Mapping) for r in rows):
            raise checks.InputTypeError("every row of a table must be a dict of column: value.")
        self.rows = [{k: format(v, floatfmt) if floatfmt and isinstance(v, float) else v
                      for k, v in r.items()} for r in rows]
        self.headers = list(self.rows[0])
        for i, row in enumerate(self.rows):
            if list(row) != self.headers:
                raise checks.InputError(
                    f"row {i} has columns {list(row)}, but the table's columns are "
                    f"{self.headers}: every row needs the same columns in the same order.")
        self.align = dict(align or {})
        for header, side in self.align.items():
            checks.one_of("column", header, self.headers)
            checks.one_of("alignment", side, _ALIGNS)
        self.title = title
        self.bold_last = checks.flag("bold_last", bold_last)

    @classmethod
    def from_tuples(cls, headers: Sequence[str], rows: Sequence[Sequence[Any]],
                    **options: Any) -> Table:
        """A table from column headers and rows given as tuples."""
        headers = list(headers)
        for row in rows:
            if len(row) != len(headers):
                raise checks.InputError(
                    f"a row has {len(row)} cells but the table has {len(headers)} columns.")
        return cls([dict(zip(headers, row, strict=True)) for row in rows], **options)

    def __str__(self) -> str:
        from tabulate import tabulate

        text = tabulate([[r[h] for h in self.headers] for r in self.rows],
                        headers=self.headers, disable_numparse=True,
                        colalign=[self.align.get(h, "left") for h in self.headers])
        return f"{self.title}\n{text}" if self.title else text

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        def cell(tag: str, value: Any, header: str, extra: str = "") -> str:
            lines = str(value).splitlines() or [""]
            keep = "white-space:nowrap;" if max(map(len, lines)) <= 24 else ""
            side = self.align.get(header, "left")
            return (f'<{tag} style="text-align:{side};vertical-align:top;padding:2px 10px;'
                    f'{keep}{extra}">{"<br>".join(map(html.escape, lines))}</{tag}>')

        head = "".join(cell("th", h, h) for h in self.headers)
        body = []
        for i, row in enumerate(self.rows):
            bold = "font-weight:bold;" if self.bold_last and i == len(self.rows) - 1 else ""
            body.append("<tr>" + "".join(
                cell("td", row[h], h, f"{MONO_CSS}{bold}") for h in self.headers)
                + "</tr>")
        caption = (f'<caption style="text-align:left;font-weight:bold">'
                   f"{html.escape(self.title)}</caption>") if self.title else ""
        return (f"<table>{caption}<thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>")


def stack(*parts: Any) -> Html:
    """Several displayable things (tables, HTML, text) one below the other, as one HTML block."""
    out = []
    for part in parts:
        if hasattr(part, "_repr_html_"):
            out.append(part._repr_html_())
        else:
            out.append(f"<p>{html.escape(str(part))}</p>")
    return Html(html="<div>" + "".join(out) + "</div>",
                text="\n\n".join(str(part) for part in parts))


def wrap(text: str, *, width: int = 76) -> str:
    """Fill each line of ``text`` to ``width`` columns (long words such as specs kept whole)."""
    if not isinstance(text, str):
        raise checks.InputTypeError(f"text must be a string, got {type(text).__name__}.")
    width = checks.count("width", width, minimum=10)
    return "\n".join(
        textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False) or line
        for line in text.splitlines()
    )


def listed(items: Sequence[str]) -> str:
    """Items as an English list for prose: ``"a"``, ``"a and b"``, ``"a, b and c"``."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise checks.InputTypeError(f"items must be a non-empty list of words, got {items!r:.60}.")
    words = [str(item) for item in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def error_of(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``"TypeName: message"`` of the exception ``fn(*args, **kwargs)`` raises.

    For showing an error the book means to provoke. If ``fn`` is not callable, or does not
    raise, that is a bug in the example, so this raises rather than return something that
    looks like the example's error.
    """
    checks.function("error_of(fn)", fn)
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the point is to show any error type
        return wrap(f"{type(error).__name__}: {error}")
    raise AssertionError(f"{getattr(fn, '__name__', 'fn')} was expected to raise, but it returned.")
