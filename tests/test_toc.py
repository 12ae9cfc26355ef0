"""One table of contents: ``_toc.yml`` at the top, which the build reads through the link
``book/_toc.yml`` and the scripts in ``benchmarks/`` read directly; every page it names
exists and every page of the book is in it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _entries(toc: dict) -> list[str]:
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return files


def test_the_build_reads_the_top_level_table_of_contents_through_a_link():
    link = ROOT / "book" / "_toc.yml"
    assert link.is_symlink(), "book/_toc.yml must point at ../_toc.yml, not be a copy"
    assert link.resolve() == (ROOT / "_toc.yml").resolve()


def test_the_build_time_script_reads_the_same_pages():
    spec = importlib.util.spec_from_file_location("build_times",
                                                  ROOT / "benchmarks" / "build_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    assert module.chapters() == [ROOT / "book" / f"{name}.md" for name in _entries(toc)]


def test_every_page_is_in_the_table_of_contents_and_exists():
    entries = _entries(yaml.safe_load((ROOT / "_toc.yml").read_text()))
    assert len(entries) == len(set(entries))
    for name in entries:
        assert (ROOT / "book" / f"{name}.md").exists(), name
    pages = {str(p.relative_to(ROOT / "book").with_suffix(""))
             for p in (ROOT / "book").rglob("*.md") if "_build" not in p.parts}
    assert pages == set(entries), pages ^ set(entries)


def _object_lines(source: str, dotted: str) -> int:
    """Lines of ``dotted`` (a function, class or Class.method) as literalinclude's pyobject
    shows it: from its first decorator to its last line."""
    import ast
    nodes = ast.parse(source).body
    for name in dotted.split("."):
        node = next(n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                    and n.name == name)
        nodes = node.body
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return node.end_lineno - start + 1


def test_code_dropdowns_state_the_length_of_the_code_they_show():
    """A dropdown titled "The code: `f` (N lines)" must show N lines: the count is typed in
    the page, so it drifts when the function changes."""
    import re
    pattern = re.compile(r"The code: `[\w.]+` \((\d+) lines\)\n```\{literalinclude\} (\S+)\n"
                         r":pyobject: ([\w.]+)")
    found = []
    for page in sorted((ROOT / "book").rglob("*.md")):
        for stated, path, obj in pattern.findall(page.read_text()):
            real = _object_lines((page.parent / path).resolve().read_text(), obj)
            found.append((page.relative_to(ROOT), obj, int(stated), real))
    assert found, "no code dropdowns found: the pattern no longer matches the pages"
    assert [f for f in found if f[2] != f[3]] == []
