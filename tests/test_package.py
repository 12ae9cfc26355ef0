"""The package's shape: it mirrors the book (``core`` plus one subpackage per book folder),
arrows point down only (``core`` imports no topic; a topic imports ``core`` and earlier topics
in the book's order), no import cycles, no lazy module attributes, modules of one idea (no
module past ~550 lines)."""

from __future__ import annotations

import ast
import os
import pathlib
import pkgutil
import subprocess
import sys

import spmd_guide

PACKAGE = pathlib.Path(spmd_guide.__file__).parent
ROOT = PACKAGE.parents[1]
#: The topics in the order of the book's table of contents; ``core`` comes first.
ORDER = ["core", "meshes", "automatic", "shard_map", "nn", "rooflines", "profiling", "randomness",
         "multihost", "transformer", "pipeline", "checkpointing", "serving", "flax_nnx",
         "appendix"]
TOPICS = sorted(m.name for m in pkgutil.iter_modules(spmd_guide.__path__) if m.ispkg)
#: Every module as "topic.module" (a subpackage's own __init__ as "topic").
MODULES = sorted(
    [f"{t}.{m.name}" for t in TOPICS for m in pkgutil.iter_modules([str(PACKAGE / t)])]
    + TOPICS)


def _path(name: str) -> pathlib.Path:
    if "." in name:
        topic, module = name.split(".")
        return PACKAGE / topic / f"{module}.py"
    return PACKAGE / name / "__init__.py"


def _imports(name: str) -> set[str]:
    """The package modules ``name`` imports, as "topic.module" (or "topic" for a face)."""
    tree = ast.parse(_path(name).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] != "spmd_guide":
                continue
            if len(parts) == 1:
                found |= {a.name for a in node.names if a.name in TOPICS}
            elif len(parts) == 2:
                found |= {f"{parts[1]}.{a.name}" for a in node.names
                          if f"{parts[1]}.{a.name}" in MODULES} or {parts[1]}
            else:
                found.add(".".join(parts[1:3]))
        elif isinstance(node, ast.Import):
            found |= {".".join(a.name.split(".")[1:3]) for a in node.names
                      if a.name.startswith("spmd_guide.")}
    return found & set(MODULES)


def _topic(name: str) -> str:
    return name.split(".")[0]


def test_every_book_folder_has_a_subpackage_and_a_test_folder_of_its_name():
    folders = sorted(p.name for p in (ROOT / "book").iterdir()
                     if p.is_dir() and not p.name.startswith("_"))
    assert set(folders) <= set(TOPICS), set(folders) - set(TOPICS)
    assert set(TOPICS) - set(folders) == {"core"}
    assert set(TOPICS) <= set(ORDER), set(TOPICS) - set(ORDER)
    for topic in TOPICS:
        modules = [m.name for m in pkgutil.iter_modules([str(PACKAGE / topic)])]
        for module in modules:
            assert (ROOT / "tests" / topic / f"test_{module}.py").exists(), (topic, module)


def test_arrows_point_down_only():
    for name in MODULES:
        rank = ORDER.index(_topic(name))
        for dep in _imports(name):
            assert ORDER.index(_topic(dep)) <= rank, f"{name} imports the later topic {dep}"


def test_no_import_cycles():
    graph = {name: _imports(name) for name in MODULES}

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        for dep in graph[name]:
            visit(dep, (*path, name))

    for name in MODULES:
        visit(name, ())


def test_every_module_imports_on_its_own_and_has_no_lazy_attributes():
    code = "; ".join(f"import spmd_guide.{n}" for n in reversed(MODULES))
    # Only the path to the package under test (a worktree's src/ when PYTHONPATH names one).
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={"JAX_PLATFORMS": "cpu", "PATH": "", **path})
    for name in MODULES:
        module = __import__(f"spmd_guide.{name}", fromlist=["_"])
        assert "__getattr__" not in vars(module), name


def test_modules_stay_small():
    sizes = {name: len(_path(name).read_text().splitlines()) for name in MODULES}
    assert max(sizes.values()) <= 560, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
