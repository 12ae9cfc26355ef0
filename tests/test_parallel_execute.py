"""book/_ext/parallel_execute.py: which package files a page depends on, the fingerprint that
decides re-execution, and (slow) a small book built, rebuilt and rebuilt after a module edit,
its kernels sharing the build's compile cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from parallel_execute import (  # noqa: E402
    dependencies,
    fingerprint,
    imported_modules,
    jobs,
    package_root,
)

PACKAGE = package_root()


def test_imported_modules_reads_every_spelling():
    code = ("from spmd_guide import ensure_devices\n"
            "from spmd_guide.core import checks, hlo as h  # comment\n"
            "import spmd_guide.transformer.lm\n"
            "from spmd_guide.pipeline.moe import (\n    init_moe,\n)\n"
            "%config InlineBackend.figure_formats = ['svg']\n"
            "x = 'from spmd_guide.serving import nothing'  # in a string: still read, harmless\n")
    found = imported_modules(code)
    assert {"spmd_guide", "spmd_guide.core", "spmd_guide.core.checks", "spmd_guide.core.hlo",
            "spmd_guide.transformer.lm", "spmd_guide.pipeline.moe"} <= found


def test_dependencies_follow_the_package_imports_and_stop_there():
    files = {p.relative_to(PACKAGE).as_posix()
             for p in dependencies("from spmd_guide.transformer import lm", PACKAGE)}
    # lm itself, its package and the package's face, what they import, down to core.
    assert {"transformer/lm.py", "transformer/__init__.py", "__init__.py",
            "core/checks.py", "core/devices.py", "transformer/attention.py"} <= files
    # Nothing lm does not load: not the pipeline, not the rooflines.
    assert not any(f.startswith(("pipeline/", "rooflines/", "nn/")) for f in files), files


def test_data_files_beside_a_module_are_dependencies():
    files = dependencies("from spmd_guide.rooflines import roofline", PACKAGE)
    assert PACKAGE / "rooflines" / "chips.toml" in files


def test_a_page_without_package_imports_depends_on_nothing():
    assert dependencies("import jax\nprint(1)", PACKAGE) == set()


def test_the_fingerprint_changes_with_a_files_content_and_only_then(tmp_path):
    (tmp_path / "a.py").write_text("X = 1\n")
    (tmp_path / "b.py").write_text("Y = 1\n")
    files = {tmp_path / "a.py", tmp_path / "b.py"}
    first = fingerprint(files, tmp_path)
    assert fingerprint(files, tmp_path) == first
    os.utime(tmp_path / "a.py", (0, 0))            # a touch alone changes nothing
    assert fingerprint(files, tmp_path) == first
    (tmp_path / "a.py").write_text("X = 2\n")
    assert fingerprint(files, tmp_path) != first


def test_jobs_reads_the_environment(monkeypatch):
    monkeypatch.setenv("SPMD_BUILD_JOBS", "3")
    assert jobs() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("SPMD_BUILD_JOBS", bad)
        with pytest.raises(ValueError, match="SPMD_BUILD_JOBS"):
            jobs()
    monkeypatch.delenv("SPMD_BUILD_JOBS")
    assert jobs() >= 1


HEADER = ("---\njupytext:\n  text_representation:\n    format_name: myst\nkernelspec:\n"
          "  display_name: Python 3\n  language: python\n  name: python3\n---\n")


def _page(title: str, code: str) -> str:
    return f"{HEADER}# {title}\n\n```{{code-cell}} ipython3\n{code}\n```\n"


@pytest.mark.slow
def test_a_rebuild_executes_exactly_what_changed(tmp_path):
    """Three pages; the first build runs all, the second none, an edited page alone, and a
    changed module the page that imports it (through the package) and not the others."""
    pytest.importorskip("jupyter_book")
    book = tmp_path / "book"
    (book / "a").mkdir(parents=True)
    shutil.copy(ROOT / "book" / "_ext" / "parallel_execute.py", book)
    (tmp_path / "_config.yml").write_text(
        "title: t\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: cache\n"
        "sphinx:\n  local_extensions:\n    parallel_execute: book\n"
        "  config:\n    nb_execution_raise_on_error: true\n")
    (book / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: a/one\n  - file: a/two\n")
    probe = tmp_path / "probe_pkg"
    (probe / "spmd_guide").mkdir(parents=True)
    # A stand-in package: the extension follows whatever spmd_guide the kernel would import.
    (probe / "spmd_guide" / "__init__.py").write_text("")
    (probe / "spmd_guide" / "base.py").write_text("VALUE = 1\n")
    (probe / "spmd_guide" / "top.py").write_text("from spmd_guide.base import VALUE\n")
    (book / "intro.md").write_text(_page(
        "Intro", "import os\nprint('intro', os.environ.get('SPMD_COMPILE_CACHE'))"))
    (book / "a" / "one.md").write_text(_page("One", "from spmd_guide.top import VALUE\nprint(VALUE)"))
    (book / "a" / "two.md").write_text(_page("Two", "print('two')"))
    env = dict(os.environ, PYTHONPATH=str(probe), SPMD_BUILD_JOBS="2")
    env.pop("SPMD_COMPILE_CACHE", None)   # the tests' own: the build must set its own
    jupyter_book = str(Path(sys.executable).with_name("jupyter-book"))

    def build() -> set[str]:
        proc = subprocess.run([jupyter_book, "build", "book/"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return {line.split()[1] for line in proc.stdout.splitlines()
                if line.startswith("parallel_execute:") and "executed in" in line}

    assert build() == {"intro", "a/one", "a/two"}
    # Every kernel the build starts shares the build's compile cache, in _build/.
    intro = (tmp_path / "_build" / "html" / "intro.html").read_text()
    assert str(tmp_path.resolve() / "_build" / "jax_cache") in intro
    assert build() == set()
    (book / "a" / "two.md").write_text(_page("Two", "print('two, edited')"))
    assert build() == {"a/two"}
    (probe / "spmd_guide" / "base.py").write_text("VALUE = 2\n")
    assert build() == {"a/one"}
    html = (tmp_path / "_build" / "html" / "a" / "one.html").read_text()
    assert ">2\n<" in html or ">2<" in html or "\n2\n" in html
