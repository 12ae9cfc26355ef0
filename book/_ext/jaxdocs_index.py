"""Make ``jax_api_pages.json``: where each public JAX name is documented in JAX's own docs.

JAX documents its API in ``docs/*.rst``. A name listed under ``.. autosummary::`` with
``:toctree: _autosummary`` gets its own page, ``_autosummary/<full name>.html``; a name
documented with ``.. autoclass::``/``.. autofunction::``/... lives on its module's page as an
anchor, e.g. ``jax.sharding.html#jax.sharding.NamedSharding``; a module has its own page,
``<module>.html``. This script reads those files from a JAX checkout (the tag of the JAX the
book is built with) and writes the map the ``jaxdocs`` extension links with::

    git -C jax show jax-v0.10.2:docs/jax.sharding.rst ...   # or a checkout of that tag
    python book/_ext/jaxdocs_index.py /path/to/jax/docs > book/_ext/jax_api_pages.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_DIRECTIVE = re.compile(r"^\.\. (auto\w+|currentmodule|module)::\s*(\S*)")
_DOC_DIRECTIVES = ("autoclass", "autofunction", "autodata", "autoattribute", "automethod",
                   "autoexception")


def _full(name: str, module: str) -> str:
    return name if name.startswith("jax.") or name == "jax" else f"{module}.{name}"


def pages(docs: Path) -> dict[str, str]:
    """``{full name: page (and #anchor)}`` for every name the rst files of ``docs`` document."""
    found: dict[str, str] = {}
    for rst in sorted([docs / "jax.rst", *docs.glob("jax.*.rst")]):
        doc = rst.stem
        if doc != "jax":
            found.setdefault(doc, f"{doc}.html")
        module = doc if doc != "jax" else "jax"
        lines = rst.read_text().splitlines()
        i = 0
        while i < len(lines):
            match = _DIRECTIVE.match(lines[i])
            i += 1
            if not match:
                continue
            kind, arg = match.groups()
            if kind in ("currentmodule", "module"):
                module = arg
            elif kind == "automodule":
                module = arg
                found.setdefault(arg, f"{doc}.html")
            elif kind == "autosummary":
                toctree, names = False, []
                while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
                    item = lines[i].strip()
                    i += 1
                    if item.startswith(":toctree:"):
                        toctree = True
                    elif item and not item.startswith(":") and not item.startswith(".."):
                        names.append(item.split()[0])
                if toctree:
                    for name in names:
                        full = _full(name, module)
                        found.setdefault(full, f"_autosummary/{full}.html")
            elif kind in _DOC_DIRECTIVES:
                full = _full(arg, module)
                found.setdefault(full, f"{doc}.html#{full}")
                members = []
                while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
                    option = lines[i].strip()
                    i += 1
                    if option.startswith(":members:"):
                        members = [m.strip() for m in option[len(":members:"):].split(",")]
                for member in filter(None, members):
                    found.setdefault(f"{full}.{member}", f"{doc}.html#{full}.{member}")
    return dict(sorted(found.items()))


if __name__ == "__main__":
    json.dump(pages(Path(sys.argv[1])), sys.stdout, indent=0)
    sys.stdout.write("\n")
