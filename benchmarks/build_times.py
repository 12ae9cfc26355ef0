"""Time what readers and CI run: each page, the pages as plain scripts, the book build from
nothing, rebuilds after an edit, and the test suite.

Run from the repository root in the environment the README's Quick start sets up:

    python benchmarks/build_times.py                      # everything (about 12 minutes)
    python benchmarks/build_times.py --chapters           # only the per-page execution times
    python benchmarks/build_times.py --json benchmarks/results/build_times.json

The pages are the ones the build reads (``_toc.yml``). Measured, one after another:

- **pages**: each page executed on its own, top to bottom in a fresh kernel, as the build does;
- **plain scripts**: the same pages converted with jupytext and run as ``python page.py`` one
  after another (the floor the build is compared with);
- **build from nothing**: ``_build`` (the site and the execution cache) removed, then the
  README's build command
  (strict, ``-W -n --keep-going``): every page executed;
- **rebuild, nothing changed**; **rebuild after editing one page** (a code cell appended to
  the first page, then taken out again); **rebuild after editing a package module** (a comment
  appended to ``--module``, ``core/devices.py`` unless told: every page imports it, so every
  page runs again, loading its programs from the build's compile cache): the pages it
  re-executed against the pages that import the module, and its time against the build from
  nothing;
- **tests, first run**: the README's test command (``pytest``) as in a fresh clone after the
  build: the compile cache (``_build/jax_cache``) holds only what the build put there, and the
  tests' bytecode caches are removed; **tests, second run**: the same command again (warm).

The pages and the plain scripts run without the compile cache (``SPMD_COMPILE_CACHE`` is
removed from their environment): they are what a reader's first run costs.

Budgets (2-core reference machine, issue "Fast as it grows"): each page under 15 s, the build
at most 0.80 x the plain scripts, a one-page rebuild at most 30 s, a rebuild after editing a
``core`` module at most 0.5 x the build from nothing, the tests' first run at most 60 s and
their second at most 30 s.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGE_BUDGET_S = 15.0
BUILD_RATIO_BUDGET = 0.80
REBUILD_BUDGET_S = 30.0
CORE_REBUILD_RATIO_BUDGET = 0.5
TEST_BUDGET_S = 60.0
TEST_AGAIN_BUDGET_S = 30.0
#: The environment variable that turns on the compile cache (spmd_guide.core.compile_cache).
COMPILE_CACHE_ENV = "SPMD_COMPILE_CACHE"


def chapters() -> list[Path]:
    """The book's pages in table-of-contents order (the file the build reads)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return [ROOT / "book" / f"{name}.md" for name in files]


def has_code(path: Path) -> bool:
    return "```{code-cell}" in path.read_text(encoding="utf-8")


def execute(path: Path) -> float:
    """Seconds to run one page in a fresh kernel (raises if a cell fails)."""
    import jupytext  # the book extra's; imported here so that reading the pages needs only yaml
    from nbclient import NotebookClient

    notebook = jupytext.read(path)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def run_as_scripts(pages: list[Path]) -> float:
    """Seconds to run every page as a plain Python script, one after another (IPython magics,
    which a script cannot run, are left out by jupytext's conversion; IPython's ``display``
    is imported)."""
    import jupytext

    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for page in pages:
            script = Path(tmp) / f"{page.parent.name}__{page.stem}.py"
            jupytext.write(jupytext.read(page), script, fmt="py:percent")
            # IPython's builtin `display`, which the pages call, as a script imports it.
            script.write_text("from IPython.display import display  # noqa\n"
                              + script.read_text())
            start = time.perf_counter()
            subprocess.run([sys.executable, str(script)], cwd=page.parent, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            total += time.perf_counter() - start
    return total


def timed(command: list[str]) -> tuple[float, str]:
    """Seconds and output of a command run from the repository root; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def executed_pages(build_output: str) -> set[str]:
    """The pages the execution extension ran, read from the build's log."""
    return set(re.findall(r"parallel_execute: (\S+) executed in", build_output))


def pages_importing(module: Path) -> set[str]:
    """The pages whose code loads ``module`` (through the package), by the extension's rule."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import jupytext
    from parallel_execute import dependencies, package_root

    root = package_root()
    found = set()
    for page in chapters():
        notebook = jupytext.read(page)
        code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        if module.resolve() in {p.resolve() for p in dependencies(code, root)}:
            found.add(str(page.relative_to(ROOT / "book").with_suffix("")))
    return found


def with_edit(path: Path, addition: str, action):
    """Run ``action()`` with ``addition`` appended to ``path``; the file is restored after."""
    original = path.read_text(encoding="utf-8")
    path.write_text(original + addition, encoding="utf-8")
    try:
        return action()
    finally:
        path.write_text(original, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", action="store_true", help="only time the pages")
    parser.add_argument("--module", default="src/spmd_guide/core/devices.py",
                        help="the package module edited for the rebuild measurement")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also save the table and its provenance (spmd_guide.core.results)")
    args = parser.parse_args()
    from tabulate import tabulate

    from spmd_guide import ensure_devices

    # Pages and scripts time a reader's first run: no compile cache in their kernels. The
    # build sets it for its own kernels (book/_ext/parallel_execute.py), the tests for theirs.
    os.environ.pop(COMPILE_CACHE_ENV, None)
    ensure_devices(8)   # the environment recorded with --json is the pages' own
    pages = [p for p in chapters() if has_code(p)]
    rows = []
    for path in pages:
        seconds = execute(path)
        name = str(path.relative_to(ROOT / "book").with_suffix(""))
        rows.append({"what": f"page {name}", "seconds": round(seconds, 1),
                     "budget": f"< {PAGE_BUDGET_S:.0f} s",
                     "ok": "yes" if seconds < PAGE_BUDGET_S else "NO"})
    pages_s = sum(r["seconds"] for r in rows)
    print(f"Page execution on {os.cpu_count()} cores, fresh kernel each:")
    print(tabulate(rows, headers="keys"))
    print(f"sum of pages: {pages_s:.1f} s")
    if args.chapters:
        return

    scripts_s = run_as_scripts(pages)
    jupyter_book = str(Path(sys.executable).with_name("jupyter-book"))
    build = [jupyter_book, "build", "book/", "-W", "-n", "--keep-going"]
    shutil.rmtree(ROOT / "_build", ignore_errors=True)   # the site and the execution cache
    build_s, build_log = timed(build)
    nothing_s, nothing_log = timed(build)
    first = pages[0]
    one_s, one_log = with_edit(first, "\n```{code-cell} ipython3\nprint('edited')\n```\n",
                               lambda: timed(build))
    timed(build)   # back to the page as it is
    module = ROOT / args.module
    module_s, module_log = with_edit(module, "\n# edited by build_times.py\n", lambda: timed(build))
    timed(build)
    expected = pages_importing(module)
    rerun = executed_pages(module_log)
    for cache in ROOT.glob("tests/**/__pycache__"):   # a fresh clone has none
        shutil.rmtree(cache)
    test_s, _ = timed([sys.executable, "-m", "pytest", "-q"])
    again_s, _ = timed([sys.executable, "-m", "pytest", "-q"])

    first_name = str(first.relative_to(ROOT / "book").with_suffix(""))
    summary = [
        {"what": "pages as plain scripts, one after another", "seconds": round(scripts_s, 1),
         "budget": "", "ok": ""},
        {"what": f"build from nothing (README's command, strict; "
                 f"{len(executed_pages(build_log))} pages executed)",
         "seconds": round(build_s, 1), "budget": f"<= {BUILD_RATIO_BUDGET} x scripts",
         "ok": "yes" if build_s <= BUILD_RATIO_BUDGET * scripts_s
         and len(executed_pages(build_log)) == len(pages) else "NO"},
        {"what": "rebuild, nothing changed", "seconds": round(nothing_s, 1),
         "budget": "", "ok": "yes" if not executed_pages(nothing_log) else "NO"},
        {"what": f"rebuild after editing {first_name}", "seconds": round(one_s, 1),
         "budget": f"<= {REBUILD_BUDGET_S:.0f} s",
         "ok": "yes" if one_s <= REBUILD_BUDGET_S and executed_pages(one_log) == {first_name}
         else "NO"},
        {"what": f"rebuild after editing {args.module} ({len(rerun)} of the "
                 f"{len(expected)} pages that import it re-executed)",
         "seconds": round(module_s, 1),
         "budget": f"every importing page; <= {CORE_REBUILD_RATIO_BUDGET} x build",
         "ok": "yes" if rerun == expected
         and module_s <= CORE_REBUILD_RATIO_BUDGET * build_s else "NO"},
        {"what": "tests (pytest), first run after the build", "seconds": round(test_s, 1),
         "budget": f"<= {TEST_BUDGET_S:.0f} s", "ok": "yes" if test_s <= TEST_BUDGET_S else "NO"},
        {"what": "tests (pytest), second run", "seconds": round(again_s, 1),
         "budget": f"<= {TEST_AGAIN_BUDGET_S:.0f} s",
         "ok": "yes" if again_s <= TEST_AGAIN_BUDGET_S else "NO"},
    ]
    print(tabulate(summary, headers="keys"))
    if args.json:
        from spmd_guide.core import results

        results.save(args.json, benchmark="Build and test times", command=sys.argv,
                     settings={"pages": len(pages), "module edited": args.module},
                     rows=summary + rows)
        print(f"saved {args.json}")


if __name__ == "__main__":
    main()
