"""``{glue:figure}`` honours its ``:alt:`` option for figures glued as HTML.

myst-nb passes ``:alt:`` only to image outputs (PNG, SVG). The book's figures are glued as
HTML (``spmd_guide.drawing`` shows every matplotlib figure as an SVG ``<img>`` with alt
text of its own, so that it scales and stays readable), so the option was silently dropped
and readers of screen readers heard the figure's fallback description. This extension
writes the option into the pasted ``<img>``.
"""

from __future__ import annotations

import html
import re

_ALT = re.compile(r"""\balt=(['"]).*?\1""", re.S)


def with_alt(markup: str, alt: str) -> str:
    """``markup`` with the first ``<img>``'s alt text replaced by ``alt`` (added if none)."""
    value = f"alt='{html.escape(alt, quote=True)}'"
    if _ALT.search(markup):
        return _ALT.sub(lambda _: value, markup, count=1)
    return re.sub(r"<img\b", f"<img {value}", markup, count=1)


def setup(app):
    # Imported here so that with_alt (and its test) needs neither docutils nor myst-nb.
    from docutils import nodes
    from myst_nb.ext.glue.directives import PasteFigureDirective
    from myst_nb.ext.glue.domain import NbGlueDomain

    class AltPasteFigure(PasteFigureDirective):
        """``glue:figure`` whose ``:alt:`` reaches HTML outputs too."""

        def run(self):
            alt = self.options.get("alt")
            result = super().run()
            if alt:
                for tree in result:
                    for raw in list(tree.findall(nodes.raw)):
                        if raw.get("format") == "html" and "<img" in raw.astext():
                            raw.replace_self(nodes.raw("", with_alt(raw.astext(), alt),
                                                       format="html"))
            return result

    NbGlueDomain.directives = {**NbGlueDomain.directives, "figure": AltPasteFigure}
    return {"parallel_read_safe": True, "parallel_write_safe": True}
