"""Time what CI runs: each chapter's execution, the full forced book build, and the test suite.

Run from the repository root in the environment the README's Quick start sets up:

    python benchmarks/build_times.py            # everything
    python benchmarks/build_times.py --chapters # only the per-chapter execution times

Each chapter is executed on its own, top to bottom in a fresh kernel, as the build does.
Budgets (on the 2-core reference machine): each chapter under 15 s (Part IV 20 s, Part VI
30 s), the test suite under 60 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = {"nn": 20.0, "multihost": 30.0}
DEFAULT_BUDGET_S = 15.0


def chapters() -> list[Path]:
    """The book's pages in table-of-contents order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return [ROOT / "book" / f"{name}.md" for name in files]


def execute(path: Path) -> float:
    """Seconds to run one chapter in a fresh kernel (raises if a cell fails)."""
    import jupytext  # the book extra's; imported here so that reading the pages needs only yaml
    from nbclient import NotebookClient

    notebook = jupytext.read(path)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def timed(command: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", action="store_true", help="only time the chapters")
    args = parser.parse_args()

    rows = []
    for path in chapters():
        name = str(path.relative_to(ROOT / "book"))
        budget = BUDGET_S.get(name.split("/")[0], DEFAULT_BUDGET_S)
        seconds = execute(path)
        rows.append([name, f"{seconds:.1f}", f"{budget:.0f}", "ok" if seconds < budget else "OVER"])
    print(f"Chapter execution on {os.cpu_count()} cores, fresh kernel each:")
    print(tabulate(rows, headers=["chapter", "seconds", "budget", ""]))
    print(f"sum of chapters: {sum(float(r[1]) for r in rows):.1f} s")
    if args.chapters:
        return

    jupyter_book = str(Path(sys.executable).with_name("jupyter-book"))  # same environment as this Python
    build_s, build_rc = timed([jupyter_book, "build", "book/", "-W", "-n", "--keep-going", "--all"])
    test_s, test_rc = timed([sys.executable, "-m", "pytest", "-q"])
    print(tabulate(
        [["full forced strict build", f"{build_s:.1f}", build_rc],
         ["test suite", f"{test_s:.1f}", test_rc]],
        headers=["what", "seconds", "exit code"],
    ))


if __name__ == "__main__":
    main()
