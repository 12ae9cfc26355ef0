"""Math without a network: MathJax served from the book's own site.

Sphinx loads MathJax from a CDN by default, which fails offline (a reader's laptop on a
plane, this book's CI) and shows raw TeX. This extension copies MathJax's self-contained
SVG build (``es5/tex-svg.js``: no fonts to fetch) from the installed
``django-static-mathjax`` package (plain static files, no Django needed; a ``book`` extra)
into the site's ``_static/`` and points ``mathjax_path`` at it.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config

SCRIPT = "tex-svg.js"


def _source() -> Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the book needs MathJax from the django-static-mathjax package: "
                           'pip install -e ".[book]"')
    path = Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax" / "es5" / SCRIPT
    if not path.exists():
        raise RuntimeError(f"MathJax's {SCRIPT} is missing from {path.parent}")
    return path


def _use_local_mathjax(app: Sphinx, config: Config) -> None:
    folder = Path(tempfile.mkdtemp(prefix="spmd-mathjax-"))
    (folder / "mathjax").mkdir()
    shutil.copy(_source(), folder / "mathjax" / SCRIPT)
    config.html_static_path = [*config.html_static_path, str(folder)]
    config.mathjax_path = f"mathjax/{SCRIPT}"


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("config-inited", _use_local_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
