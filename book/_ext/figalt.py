"""``{glue:figure}`` honours its ``:alt:`` option for figures glued as HTML.

myst-nb passes ``:alt:`` only to image outputs (PNG, SVG). The book's figures are glued as
HTML (``spmd_guide.core.drawing`` shows every matplotlib figure as an SVG ``<img>`` with alt
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
        """``glue:figure`` that remembers its ``:alt:`` on the figure node."""

        def run(self):
            result = super().run()
            for node in result:
                if isinstance(node, nodes.figure) and self.options.get("alt"):
                    node["spmd_alt"] = self.options["alt"]
            return result

    def apply_alt(app, doctree, docname):
        # myst-nb picks each output's mime type in a post-transform, after the directive
        # ran: only now is the glued figure the raw HTML <img> whose alt text we replace.
        for figure in doctree.findall(nodes.figure):
            alt = figure.get("spmd_alt")
            if not alt:
                continue
            for raw in list(figure.findall(nodes.raw)):
                if raw.get("format") == "html" and "<img" in raw.astext():
                    raw.replace_self(nodes.raw("", with_alt(raw.astext(), alt), format="html"))

    app.add_directive_to_domain(NbGlueDomain.name, "figure", AltPasteFigure, override=True)
    app.connect("doctree-resolved", apply_alt)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
