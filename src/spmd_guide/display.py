"""Presenting results on a page: tables that render in HTML and as text, and caught errors.

The book shows some errors on purpose (a sharding that does not divide, a matmul whose
contracting dimensions disagree). :func:`error_of` runs the failing call and returns the
error as one wrapped line of text, so the page shows the message, never a traceback.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any


_MONO = "font-family:ui-monospace,DejaVu Sans Mono,Menlo,Consolas,monospace;"


class Table:
    """Rows of a table that display as HTML in a notebook and as plain text with ``str()``."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]):
        if not rows:
            raise ValueError("a table needs at least one row.")
        self.rows = [dict(r) for r in rows]
        self.headers = list(self.rows[0])

    def __str__(self) -> str:
        from tabulate import tabulate

        return tabulate([[r[h] for h in self.headers] for r in self.rows], headers=self.headers)

    def _repr_html_(self) -> str:
        def cell(value: Any) -> str:
            lines = str(value).splitlines() or [""]
            keep = "white-space:nowrap;" if max(map(len, lines)) <= 20 else ""
            return (f'<td style="text-align:left;vertical-align:top;padding:2px 10px;'
                    f'{keep}{_MONO}">{"<br>".join(map(html.escape, lines))}</td>')

        head = "".join(f'<th style="text-align:left;padding:2px 10px">{html.escape(h)}</th>'
                       for h in self.headers)
        body = "".join("<tr>" + "".join(cell(r[h]) for h in self.headers) + "</tr>"
                       for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def wrap(text: str, *, width: int = 76) -> str:
    """Fill each line of ``text`` to ``width`` columns (long words such as specs kept whole)."""
    return "\n".join(
        textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False) or line
        for line in text.splitlines()
    )


def error_of(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``"TypeName: message"`` of the exception ``fn(*args, **kwargs)`` raises.

    For showing an error the book means to provoke; if ``fn`` does not raise, that is a bug
    in the example, so this raises ``AssertionError`` rather than return something quietly.
    """
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the point is to show any error type
        return wrap(f"{type(error).__name__}: {error}")
    raise AssertionError(f"{getattr(fn, '__name__', 'fn')} was expected to raise, but it returned.")
