"""JAX's persistent compilation cache for the book's build and tests: off unless asked for.

XLA compiles the same small programs again and again: in a page and in its rebuild, in the
tests and in their second run. JAX can keep every compiled program on disk and load it instead
of compiling (``jax_compilation_cache_dir``; on XLA:CPU too in JAX 0.12). The book's build and
the tests turn it on in ``_build/jax_cache/`` of the checkout (so ``rm -rf _build`` clears it
and a fresh clone starts cold); a reader running a chapter gets it only by setting
``SPMD_COMPILE_CACHE`` to a folder before starting Python (:func:`from_environment`, which
:func:`spmd_guide.ensure_devices` calls).

The settings, each checked against JAX 0.12's ``jax/_src/compilation_cache.py``, ``compiler.py``,
``cache_key.py`` and ``lru_cache.py``:

- every program is kept, however small or fast to compile (``min_compile_time_secs`` and
  ``min_entry_size_bytes`` 0; JAX's defaults keep only compiles over a second);
- the key includes the program's source locations (``include_metadata_in_key``): a program
  loaded from the cache carries the file names, lines and ``op_name`` s of the run that wrote
  it, and the book reads them (``transformer.breakdown``, ``nn.remat``), so a program traced
  from other lines (an edited module, another caller) is compiled anew, never shown stale;
- a notebook cell's file name without the kernel's process id
  (``hlo_source_file_canonicalization_regex``): IPython names a cell's code
  ``/tmp/ipykernel_<pid>/<hash of the code>.py``, so without it every program a page traces
  would have a new key in every kernel, and a rebuild would load nothing. Only that number
  goes; the name of the cell's file, which a page could show, stays;
- a size bound (``max_size``), which makes JAX take a file lock around every read and write:
  without it, a process can read an entry another process is still writing (both pytest
  workers and two pages at once share the folder). The lock is the ``filelock`` package.

What a cache hit does not change: the compiled program (its instructions, shardings,
collectives, cost and memory analyses; only the source tables at the top of its text come back
numbered in another order, naming the same frames, and the cost analysis's keys in another
order), JAX's compile event and the "Finished XLA compilation" message of ``jax_log_compiles``
(both wrap the cache lookup, so compile counts are the same; that flag also logs each hit, as
"Persistent compilation cache hit"), and jit's in-memory caches. What it changes is the time of a first call, so every
function that times a compile runs it under :func:`disabled`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

from spmd_guide.core import checks

__all__ = ["ENV", "KERNEL_PID", "MAX_BYTES", "default_directory", "directory", "disabled", "enable",
           "from_environment"]

#: The environment variable that turns the cache on: the folder to keep programs in. Empty,
#: ``0`` or ``off`` leaves it off.
ENV = "SPMD_COMPILE_CACHE"
#: The cache's size bound (JAX drops the least recently used programs past it): 2 GiB, far
#: above what one run writes (the quick suite: about 1,200 programs, 16 MB).
MAX_BYTES = 2 * 1024**3
_OFF = {"", "0", "off", "false", "no"}
#: The kernel's process id in IPython's file name for a cell (ipykernel's ``get_file_name``).
KERNEL_PID = r"(?<=/ipykernel_)[0-9]+(?=/)"


def default_directory(root: str | os.PathLike[str]) -> Path:
    """Where the build and the tests keep compiled programs: ``_build/jax_cache`` of the
    checkout ``root`` (beside the build's execution cache, cleared with it)."""
    return Path(root) / "_build" / "jax_cache"


def enable(folder: str | os.PathLike[str]) -> Path:
    """Keep every program JAX compiles in ``folder`` (made if missing) and load it from there
    in later runs. Returns the absolute folder."""
    folder = checks.path("folder", folder)
    try:
        import filelock  # noqa: F401  (JAX's lock for a shared folder; see the module docstring)
    except ImportError as err:
        raise RuntimeError("the compile cache needs the filelock package: pip install "
                           "filelock") from err
    path = Path(folder).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    settings = {"jax_compilation_cache_dir": str(path),
                "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": 0,
                "jax_compilation_cache_include_metadata_in_key": True,
                "jax_hlo_source_file_canonicalization_regex": KERNEL_PID,
                "jax_compilation_cache_max_size": MAX_BYTES,
                "jax_enable_compilation_cache": True}
    if all(getattr(jax.config, name) == value for name, value in settings.items()):
        return path   # already on here (ensure_devices runs once per page, often per test)
    for name, value in settings.items():
        jax.config.update(name, value)
    _jax_cache.reset_cache()   # the next compile opens the cache with these settings
    return path


def from_environment() -> Path | None:
    """Turn the cache on if ``SPMD_COMPILE_CACHE`` names a folder; the folder, or None."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    return enable(value)


def directory() -> Path | None:
    """The folder the cache keeps programs in, or None when it is off."""
    folder = jax.config.jax_compilation_cache_dir
    if not folder or not jax.config.jax_enable_compilation_cache:
        return None
    return Path(folder)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Compile without the persistent cache inside the block, as a reader's first run does:
    nothing read from it, nothing written. For measuring what compiling costs."""
    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    _jax_cache.reset_cache()   # JAX decides whether to use the cache once, at the next compile
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        _jax_cache.reset_cache()
