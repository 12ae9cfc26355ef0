"""Execute the book's pages two at a time, before Sphinx reads them, and only those that need it.

myst-nb runs in ``cache`` mode (``execute_notebooks: cache`` in ``_config.yml``): it renders a
page from jupyter-cache when the cache holds an executed notebook with the same code cells, and
otherwise executes the page itself, one page at a time. This extension runs first (Sphinx's
``env-get-outdated`` event) and fills the cache with every page that needs executing, on as many
worker processes as the machine has cores (at most ``SPMD_BUILD_JOBS`` if set). Each page still
runs top to bottom in a fresh kernel, in its own folder, with the timeout and error policy of
the build's configuration; a page that fails is left out of the cache, so myst-nb executes it
again while reading it and fails the build with its traceback.

A page needs executing when the cache has no run of its current code cells, or when the run it
has was made with other *dependencies*: the files of the ``spmd_guide`` modules the page imports,
followed through the package's own imports (``import spmd_guide`` itself brings the package's
``__init__`` and what it imports), the data files beside those modules, and the installed JAX.
The cache records that fingerprint with each run, and pages whose fingerprint changed are handed
back to Sphinx as outdated, so a rebuild never shows the output of old code. A fresh clone (or
``rm -rf _build``) has no cache, so every page runs.

The pages share one persistent compile cache, ``_build/jax_cache`` (``SPMD_COMPILE_CACHE``, set
here for every kernel the build starts unless it is set already; ``off`` turns it off): a page
that runs again loads the programs its last run compiled instead of compiling them anew.
``spmd_guide.core.compile_cache`` says what a loaded program keeps (everything a page shows)
and how the pages that time a compile keep timing a real one.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import nbformat
from sphinx.application import Sphinx
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
PACKAGE = "spmd_guide"
#: The environment variable that turns on the compile cache (spmd_guide.core.compile_cache.ENV;
#: not imported, so that the build's own process does not load JAX).
COMPILE_CACHE_ENV = "SPMD_COMPILE_CACHE"
#: Installed distributions whose version is part of every page's fingerprint.
DISTRIBUTIONS = ("jax", "jaxlib", "numpy", "optax", "orbax-checkpoint")

_IMPORT_LINE = re.compile(r"^\s*(?:from\s+(spmd_guide(?:\.\w+)*)\s+import\s+(.+)|"
                          r"import\s+(spmd_guide(?:\.\w+)*))", re.M)


# ------------------------------------------------------------------- what a page depends on


def package_root() -> Path:
    """The folder of the installed ``spmd_guide`` package (the source tree when editable)."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError("spmd_guide is not installed: pip install -e '.[book]'")
    return Path(spec.origin).parent


def module_file(root: Path, dotted: str) -> Path | None:
    """The file of module ``dotted`` (``spmd_guide.core.hlo``) under ``root``, or None."""
    parts = dotted.split(".")[1:]
    base = root.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def imported_modules(code: str) -> set[str]:
    """Dotted names of the ``spmd_guide`` modules that ``code`` imports (a name imported from a
    package counts when it is itself a module; the caller drops names that are not)."""
    found: set[str] = set()
    for match in _IMPORT_LINE.finditer(code):
        if match.group(3):
            found.add(match.group(3))
            continue
        module = match.group(1)
        found.add(module)
        names = match.group(2).split("#")[0].replace("(", " ").replace(")", " ")
        for name in names.split(","):
            name = name.strip().split(" as ")[0].strip()
            if name.isidentifier():
                found.add(f"{module}.{name}")
    return found


def _module_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(PACKAGE)}
    return found


def dependencies(code: str, root: Path) -> set[Path]:
    """Every package file the code's ``spmd_guide`` imports load: the modules, their parent
    packages' ``__init__``, what those import in turn, and the data files beside each."""
    todo = {m for m in imported_modules(code)}
    seen: set[str] = set()
    files: set[Path] = set()
    while todo:
        dotted = todo.pop()
        if dotted in seen:
            continue
        seen.add(dotted)
        path = module_file(root, dotted)
        if path is None:
            continue
        files.add(path)
        parts = dotted.split(".")
        todo |= {".".join(parts[:i]) for i in range(1, len(parts))}   # parent packages
        todo |= _module_imports(path)
        files |= {p for p in path.parent.iterdir()
                  if p.is_file() and p.suffix not in {".py", ".pyc"}}
    return files


def fingerprint(files: set[Path], root: Path) -> str:
    """One hash of the files' contents and the installed versions of JAX and friends."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for name in DISTRIBUTIONS:
        try:
            digest.update(f"{name}=={importlib.metadata.version(name)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{name} absent".encode())
    return digest.hexdigest()


# ------------------------------------------------------------------------------ execution


def _execute(payload: tuple[str, str, int | None, bool]) -> tuple[str, float, str | None]:
    """Run one notebook (as JSON) in a fresh kernel in ``cwd``: (executed JSON, s, error)."""
    from jupyter_cache.executors.utils import single_nb_execution

    text, cwd, timeout, allow_errors = payload
    notebook = nbformat.reads(text, as_version=4)
    result = single_nb_execution(notebook, cwd=cwd, timeout=timeout, allow_errors=allow_errors,
                                 meta_override=True)
    error = result.exc_string if result.err is not None else None
    return nbformat.writes(notebook), result.time, error


def compile_cache_folder(app: Sphinx) -> Path:
    """``_build/jax_cache``: beside the site (``_build/html``) and the execution cache, so that
    ``rm -rf _build`` clears it."""
    return Path(app.outdir).resolve().parent / "jax_cache"


def jobs() -> int:
    """Worker processes: ``SPMD_BUILD_JOBS`` if set, else the machine's cores."""
    value = os.environ.get("SPMD_BUILD_JOBS", "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"SPMD_BUILD_JOBS must be a positive whole number, not {value!r}")
        return int(value)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


def _read_notebook(app: Sphinx, docname: str) -> tuple[Any, dict | None] | None:
    """The page as myst-nb reads it (so its hash is the one myst-nb looks up) and the reader's
    format for jupyter-cache, or None for a page that is not a notebook or has no code."""
    from myst_nb.core.read import create_nb_reader

    env = app.env
    path = env.doc2path(docname)
    text = Path(path).read_text(encoding="utf-8")
    reader = create_nb_reader(str(path), env.myst_config, env.mystnb_config, text)
    if reader is None:
        return None
    notebook = reader.read(text)
    if not any(cell.cell_type == "code" for cell in notebook.cells):
        return None
    return notebook, reader.read_fmt


def execute_outdated(app: Sphinx, env: Any, added: set[str], changed: set[str],
                     removed: set[str]) -> list[str]:
    """Fill the cache with every page that needs executing; return the pages Sphinx must read
    again because their dependencies changed."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    config = env.mystnb_config
    if config.execution_mode != "cache":
        return []
    cache = get_cache(config.execution_cache_path)
    root = package_root()
    previous = {r.uri: r.data.get("execution_seconds", 0.0) for r in cache.list_cache_records()}
    todo = []   # (docname, notebook, fingerprint)
    formats = {}
    for docname in sorted(env.found_docs):
        read = _read_notebook(app, docname)
        if read is None:
            continue
        notebook, formats[docname] = read
        code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        stamp = fingerprint(dependencies(code, root), root)
        try:
            record = cache.match_cache_notebook(notebook)
        except KeyError:
            record = None
        if record is None or record.data.get("dependencies") != stamp:
            todo.append((docname, notebook, stamp))
            if record is not None:
                # A run of old code: never render it, even if this run fails.
                cache.remove_cache(record.pk)
    if not todo:
        return []
    # Longest first (by the last run's time), so two workers finish together.
    todo.sort(key=lambda item: -previous.get(str(env.doc2path(item[0])), 1e9))
    workers = min(jobs(), len(todo))
    # Kernels inherit the environment: every page (and myst-nb's own run of a failed one)
    # compiles into, and loads from, the build's compile cache.
    os.environ.setdefault(COMPILE_CACHE_ENV, str(compile_cache_folder(app)))
    LOGGER.info(f"parallel_execute: executing {len(todo)} page(s) on {workers} worker(s)")
    payloads = [(nbformat.writes(nb), str(Path(env.doc2path(doc)).parent),
                 config.execution_timeout, config.execution_allow_errors)
                for doc, nb, _ in todo]
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        for (docname, _, stamp), (text, seconds, error) in zip(
                todo, pool.map(_execute, payloads), strict=True):
            path = str(env.doc2path(docname))
            if error is not None:
                # Not cached (and any older run removed above): myst-nb executes the page
                # again as it reads it and fails the build with the traceback.
                LOGGER.info(f"parallel_execute: {docname} failed ({seconds:.1f} s)")
                continue
            stage = (cache.add_nb_to_project(path, read_data=formats[docname])
                     if formats[docname] else cache.add_nb_to_project(path))
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(text, as_version=4), stage.uri,
                              data={"execution_seconds": seconds, "dependencies": stamp}),
                check_validity=False, overwrite=True)
            LOGGER.info(f"parallel_execute: {docname} executed in {seconds:.1f} s")
    LOGGER.info(f"parallel_execute: {len(todo)} page(s) in {time.perf_counter() - start:.1f} s")
    return [docname for docname, _, _ in todo if docname not in added | changed]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("env-get-outdated", execute_outdated)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
