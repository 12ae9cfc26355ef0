"""book/_ext/jaxdocs.py: every JAX name the book links exists in the installed JAX, and links
to the right page of JAX's documentation."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import jaxdocs  # noqa: E402

BASE = "https://docs.jax.dev/en/latest/"
INLINE_CODE = re.compile(r"(?<![`{])`([^`\n]+)`(?!`)")
ROLE = re.compile(r"\{jax\}`([^`]+)`")


def _book_names() -> set[str]:
    """Every name a page of the book mentions as inline code (or with the {jax} role)."""
    names = set()
    for page in (ROOT / "book").rglob("*.md"):
        text = page.read_text()
        names.update(filter(None, map(jaxdocs.name_in, INLINE_CODE.findall(text))))
        names.update(ROLE.findall(text))
    return names


@pytest.mark.parametrize("name, page", [
    ("jax.shard_map", "_autosummary/jax.shard_map.html"),
    ("jax.make_mesh", "_autosummary/jax.make_mesh.html"),
    ("jax.lax.psum", "_autosummary/jax.lax.psum.html"),
    ("jax.lax.with_sharding_constraint", "_autosummary/jax.lax.with_sharding_constraint.html"),
    ("jax.sharding.NamedSharding", "jax.sharding.html#jax.sharding.NamedSharding"),
    ("jax.sharding.PartitionSpec", "jax.sharding.html#jax.sharding.PartitionSpec"),
    ("jax.P", "jax.sharding.html#jax.sharding.PartitionSpec"),
    ("jax.sharding.NamedSharding.spec", "jax.sharding.html#jax.sharding.NamedSharding"),
    ("jax.stages.Compiled.cost_analysis", "jax.stages.html#jax.stages.Compiled.cost_analysis"),
    ("jax.Array", "_autosummary/jax.Array.html"),
    ("jax.Array.sharding", "_autosummary/jax.Array.sharding.html"),
    ("jax.random", "jax.random.html"),
    ("jax.tree.map", "_autosummary/jax.tree.map.html"),
    ("jax.distributed.initialize", "_autosummary/jax.distributed.initialize.html"),
    ("jax.experimental.mesh_utils.create_device_mesh",
     "_autosummary/jax.experimental.mesh_utils.create_device_mesh.html"),
    ("jax.reshard", "parallel.html#a-sharding-describes-how-array-values-are-laid-out-over-a-mesh"),
])
def test_url_scheme_per_module(name, page):
    assert jaxdocs.url(name) == BASE + page


@pytest.mark.parametrize("name", [
    "jax.experimental.shard_map.shard_map",   # removed from JAX
    "jax.sharding.PositionalSharding",        # removed from JAX
    "jax.xla_computation",                    # removed from JAX
    "jax.no_such_function",
    "jax.lib.xla_client",                     # exists, but JAX's docs do not document it
    "numpy.sum",
])
def test_names_that_do_not_resolve_or_are_undocumented_get_no_link(name):
    assert jaxdocs.url(name) is None


@pytest.mark.parametrize("code, name", [
    ("jax.shard_map", "jax.shard_map"),
    ("jax.jit(f)", "jax.jit"),
    ("jax.devices()", "jax.devices"),
    ("jax.random.split(key, 8)", "jax.random.split"),
    ("jax.jit(f).lower(*args).as_text()", None),   # a chain of calls: which API is meant?
    ("with jax.set_mesh(mesh):", None),            # a statement, not a name
    ("jax_num_cpu_devices", None),
    ("jnp.zeros((8, 4))", None),
    ("jax", None),
])
def test_name_in_inline_code(code, name):
    assert jaxdocs.name_in(code) == name


def test_every_name_the_book_links_exists_in_the_installed_jax():
    linked = {name for name in _book_names() if jaxdocs.url(name)}
    assert {"jax.shard_map", "jax.make_mesh", "jax.lax.psum", "jax.device_put"} <= linked
    for name in linked:
        jaxdocs.resolve_object(name)  # raises LookupError if the installed JAX lacks it
        assert jaxdocs.url(name).startswith(BASE)


def test_role_names_in_the_book_all_resolve():
    """A {jax} role whose name does not resolve would fail the strict build; say which here."""
    bad = [name for page in (ROOT / "book").rglob("*.md")
           for name in ROLE.findall(page.read_text()) if jaxdocs.url(name) is None]
    assert bad == []


def test_every_page_in_the_map_is_a_jax_docs_page_or_anchor():
    pages = jaxdocs.api_pages()
    assert len(pages) > 1000
    pattern = re.compile(r"^(_autosummary/[\w.]+\.html|[\w.]+\.html(#[\w.]+)?)$")
    assert all(pattern.match(page) for page in pages.values())
    for name in jaxdocs.ALIASES.values():
        assert name in pages
    for alias, name in jaxdocs.ALIASES.items():
        assert jaxdocs.resolve_object(alias) is jaxdocs.resolve_object(name)
    for name in jaxdocs.GUIDE_LINKS:
        assert jaxdocs.exists(name)
