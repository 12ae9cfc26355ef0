"""Links from the book to the JAX documentation, checked against the installed JAX.

A Sphinx extension (loaded through ``sphinx.local_extensions`` in ``_config.yml``):

- the role ``{jax}`jax.shard_map``` shows the name as code, linked to its page in the JAX
  documentation; a name that the installed JAX does not have, or that JAX's docs do not
  document, is a build warning (an error in the strict build);
- on every page, the FIRST inline-code mention of each documented JAX name (``jax.shard_map``,
  ``jax.lax.psum``, a call such as ``jax.jit(f)``) becomes the same link, without touching the
  chapters; later mentions stay plain code. Each linked mention is also an entry of the
  book's general index, so the index lists every JAX API and the pages that use it;
- each chapter page offers its executed notebook (``.ipynb``) beside its MyST source in the
  theme's download menu (copied from the build's executed notebooks into ``_sources/``).

Where a name is documented comes from ``jax_api_pages.json`` (made by ``jaxdocs_index.py``
from JAX's own ``docs/*.rst``): an ``autosummary`` entry has its own page
(``_autosummary/jax.shard_map.html``), a class documented on its module's page is an anchor
there (``jax.sharding.html#jax.sharding.NamedSharding``), a module is its page
(``jax.lax.html``). A few names the API reference does not list are linked to the guide that
teaches them (:data:`GUIDE_LINKS`), and aliases to the name they alias (:data:`ALIASES`).
"""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import warnings
from functools import cache
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: The JAX documentation the links point at.
BASE_URL = "https://docs.jax.dev/en/latest/"
#: JAX's guides to what this book teaches.
GUIDES = {
    "Distributed arrays and automatic parallelization": "parallel.html",
    "Explicit sharding mode": (
        "parallel.html#explicit-sharding-mode-makes-sharding-queryable-at-trace-time"),
    "Manual parallelism with shard_map": "notebooks/shard_map.html",
}
#: Names JAX's API reference does not list, linked to the guide section that teaches them.
GUIDE_LINKS = {
    "jax.reshard": "parallel.html#a-sharding-describes-how-array-values-are-laid-out-over-a-mesh",
    "jax.sharding.AxisType": "parallel.html#a-mesh-is-a-grid-of-devices-with-named-axes",
    "jax.sharding.auto_axes": (
        "parallel.html#with-auto-axes-the-compiler-chooses-shardings-within-the-decorated-function"),
    "jax.sharding.explicit_axes": (
        "parallel.html#explicit-sharding-mode-makes-sharding-queryable-at-trace-time"),
}
#: Short names for documented objects: the alias links where the full name does.
ALIASES = {
    "jax.P": "jax.sharding.PartitionSpec",
}
_PAGES_FILE = Path(__file__).with_name("jax_api_pages.json")


@cache
def api_pages() -> dict[str, str]:
    """``{full name: page}`` of every name JAX's API reference documents."""
    return json.loads(_PAGES_FILE.read_text())


def resolve_object(name: str) -> Any:
    """The object ``name`` (``jax.lax.psum``) in the installed JAX; ``LookupError`` if none."""
    parts = name.split(".")
    if parts[0] != "jax":
        raise LookupError(f"{name} is not a JAX name")
    with warnings.catch_warnings():  # a deprecated name resolves quietly (and is no API page)
        warnings.simplefilter("ignore")
        for split in range(len(parts), 0, -1):
            try:
                obj: Any = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
            except AttributeError as error:
                raise LookupError(f"the installed JAX has no {name}") from error
            return obj
    raise LookupError(f"the installed JAX has no {name}")


def exists(name: str) -> bool:
    """Whether ``name`` resolves in the installed JAX."""
    try:
        resolve_object(name)
    except LookupError:
        return False
    return True


@cache
def url(name: str) -> str | None:
    """The JAX documentation URL for ``name``, or None if the installed JAX lacks it or JAX's
    docs do not document it (a member of a documented class links to the class)."""
    if not exists(name):
        return None
    target = ALIASES.get(name, name)
    if target in GUIDE_LINKS:
        return BASE_URL + GUIDE_LINKS[target]
    pages = api_pages()
    parts = target.split(".")
    for end in range(len(parts), 1, -1):
        prefix = ".".join(parts[:end])
        if prefix in pages:
            if end < len(parts) and pages[prefix].endswith(".html") and "#" not in pages[prefix] \
                    and not pages[prefix].startswith("_autosummary/"):
                return None  # an undocumented name inside a module page: no anchor to go to
            return BASE_URL + pages[prefix]
    return None


def name_in(code: str) -> str | None:
    """The JAX name an inline code span is about: ``jax.lax.psum`` or ``jax.jit(f)`` ->
    the dotted name; anything else (statements, chains of calls, other modules) -> None."""
    code = code.strip()
    if not code.startswith("jax."):
        return None
    try:
        tree = ast.parse(code, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(tree, ast.Call):
        tree = tree.func
    parts = []
    while isinstance(tree, ast.Attribute):
        parts.append(tree.attr)
        tree = tree.value
    if not (isinstance(tree, ast.Name) and tree.id == "jax" and parts):
        return None
    return ".".join(["jax", *reversed(parts)])


def _link(name: str, text: str, target: str) -> nodes.reference:
    reference = nodes.reference("", "", internal=False, refuri=target, classes=["jax-api"],
                                reftitle=f"{name} in the JAX documentation")
    reference["jax-name"] = name
    reference += nodes.literal(text, text)
    return reference


def jax_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any,
             options: dict | None = None, content: list | None = None):
    """``{jax}`jax.shard_map``` -> the name as code, linked to JAX's documentation."""
    api = text.strip()
    target = url(api)
    if target is None:
        message = inliner.reporter.warning(
            f"{{jax}}`{api}`: not a documented name of the installed JAX", line=lineno)
        return [nodes.literal(rawtext, api)], [message]
    return _indexed(inliner.document, api, _link(api, api, target)), []


class LinkFirstMentions(SphinxTransform):
    """Link the first inline-code mention on a page of each documented JAX name."""

    default_priority = 800

    def apply(self, **kwargs: Any) -> None:
        linked: set[str] = set()
        for node in list(self.document.findall(
                lambda n: isinstance(n, (nodes.literal, nodes.reference)))):
            if isinstance(node, nodes.reference):
                if "jax-name" in node:
                    linked.add(node["jax-name"])
                continue
            if isinstance(node.parent, nodes.reference) or _inside(node, nodes.title):
                continue
            name = name_in(node.astext())
            if name is None or name in linked:
                continue
            target = url(name)
            if target is None:
                continue
            linked.add(name)
            link = _link(name, node.astext(), target)
            link.children = [node.deepcopy()]
            node.replace_self(_indexed(self.document, name, link))


def _indexed(document: nodes.document, name: str, link: nodes.reference) -> list[nodes.Node]:
    """``link`` preceded by a general-index entry for ``name`` and the target it points to."""
    target = nodes.target("", "")
    target_id = document.set_id(target, suggested_prefix="jax-api")
    index = addnodes.index(entries=[("single", f"{name} (JAX API)", target_id, "", None)])
    return [index, target, link]


def _inside(node: nodes.Node, kind: type) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, kind):
            return True
        parent = parent.parent
    return False


def offer_notebook(app: Sphinx, pagename: str, templatename: str, context: dict,
                   doctree: Any) -> None:
    """Put the executed notebook of a chapter in ``_sources/`` and the download menu."""
    if doctree is None or "kernelspec" not in app.env.metadata.get(pagename, {}):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():
        return
    destination = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, destination)
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_role("jax", jax_role)
    app.add_transform(LinkFirstMentions)
    # Before the theme builds its download menu (priority 501).
    app.connect("html-page-context", offer_notebook, priority=400)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
