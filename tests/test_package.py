"""The package's shape: two floors (base modules import no Part module), no import cycles,
no lazy module attributes, modules of one idea (no module past ~550 lines)."""

from __future__ import annotations

import ast
import pathlib
import pkgutil
import subprocess
import sys

import spmd_guide

#: The base floor: what every Part may import; these import nothing from a Part.
BASE = {"checks", "devices", "display", "drawing", "hlo", "hlo_text", "results", "timing",
        "traced"}
PACKAGE = pathlib.Path(spmd_guide.__file__).parent
MODULES = sorted(m.name for m in pkgutil.iter_modules(spmd_guide.__path__))


def _imports(name: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "spmd_guide":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("spmd_guide."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("spmd_guide.")}
    return found & set(MODULES)


def test_base_modules_import_only_base_modules():
    for name in BASE & set(MODULES):
        assert _imports(name) <= BASE, (name, _imports(name) - BASE)


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
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    for name in MODULES:
        module = __import__(f"spmd_guide.{name}", fromlist=["_"])
        assert "__getattr__" not in vars(module), name


def test_modules_stay_small():
    sizes = {name: len((PACKAGE / f"{name}.py").read_text().splitlines()) for name in MODULES}
    assert max(sizes.values()) <= 560, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
