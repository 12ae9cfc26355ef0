"""spmd_guide.core.compile_cache: programs kept on disk and loaded by a later process, the same
programs and the same compile counts as without it, and timings that never load."""

from __future__ import annotations

import json
import os
import sys

import pytest
from helpers import ROOT, run_python

from spmd_guide.core import compile_cache, hlo_text
from spmd_guide.core.checks import InputError, InputTypeError

# One child Python: compiles three programs (one of them twice, under `disabled`) and reports
# what JAX's own events say happened.
CHILD = """
import json, os
import jax, jax.numpy as jnp
from spmd_guide import ensure_devices
from spmd_guide.core import compile_cache, hlo_text
from spmd_guide.core.timing import time_fn
ensure_devices(2)
events = {"hits": 0, "compiles": 0}
def listen(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1
def listen_time(event, secs, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        events["compiles"] += 1
jax.monitoring.register_event_listener(listen)
jax.monitoring.register_event_duration_secs_listener(listen_time)
x = jnp.arange(8.0)
texts = [hlo_text.entry_computation(jax.jit(f).lower(x).compile().as_text())
         for f in (jnp.sin, jnp.cos)]
cached = dict(events)
timing = time_fn(jax.jit(jnp.tanh), x, runs=1)   # its first call must compile, not load
print(json.dumps({"folder": str(compile_cache.directory()), "texts": texts,
                  "cached": cached, "all": events}))
"""


def _run(folder: str) -> dict:
    old = os.environ.get(compile_cache.ENV)
    os.environ[compile_cache.ENV] = folder
    try:
        return json.loads(run_python(CHILD).splitlines()[-1])
    finally:
        if old is None:
            del os.environ[compile_cache.ENV]
        else:
            os.environ[compile_cache.ENV] = old


@pytest.mark.slow
def test_a_second_process_loads_the_same_programs_and_counts_the_same_compiles(tmp_path):
    folder = tmp_path / "cache"
    cold, warm = _run(str(folder)), _run(str(folder))
    assert cold["folder"] == warm["folder"] == str(folder.resolve())
    assert cold["cached"]["hits"] == 0 and warm["cached"]["hits"] >= 2
    assert warm["texts"] == cold["texts"]
    # JAX's compile event fires for a program loaded from the cache too: counts stay the same.
    assert warm["all"]["compiles"] == cold["all"]["compiles"] >= 3
    # time_fn's first call compiled tanh afresh in both runs: no hit beyond sin and cos.
    assert warm["all"]["hits"] == warm["cached"]["hits"]
    assert any(p.name.endswith("-cache") for p in folder.iterdir())


def test_a_program_traced_again_from_the_same_lines_is_loaded_not_compiled(tmp_path):
    """In this process: a fresh jit of the same code misses jit's in-memory cache, and the
    persistent cache hands back the program the first compile wrote (JAX's hit event), with
    the same text; under ``disabled`` nothing is loaded. The slow sweep checks the same across
    two processes."""
    import jax
    import jax.numpy as jnp

    hits = []
    listen = lambda event, **kw: hits.append(event)  # noqa: E731
    before = compile_cache.directory()
    jax.monitoring.register_event_listener(listen)
    try:
        compile_cache.enable(tmp_path)
        x = jnp.arange(8.0)
        texts = []
        for _ in range(2):
            texts.append(jax.jit(lambda v: jnp.sin(v) * 3).lower(x).compile().as_text())
        loaded = hits.count("/jax/compilation_cache/cache_hits")
        with compile_cache.disabled():
            jax.jit(lambda v: jnp.sin(v) * 3).lower(x).compile()
        after_disabled = hits.count("/jax/compilation_cache/cache_hits")
    finally:
        jax.monitoring.unregister_event_listener(listen)
        if before is not None:
            compile_cache.enable(before)
        else:   # the tests ran with SPMD_COMPILE_CACHE=off: leave it off
            jax.config.update("jax_enable_compilation_cache", False)
            jax.config.update("jax_hlo_source_file_canonicalization_regex", None)
    assert loaded == 1 and after_disabled == 1
    assert hlo_text.entry_computation(texts[0]) == hlo_text.entry_computation(texts[1])
    assert compile_cache.directory() == before


def test_the_kernels_process_id_is_all_that_leaves_a_cells_file_name():
    import re

    assert re.sub(compile_cache.KERNEL_PID, "", "/tmp/ipykernel_4242/3141592.py") == \
        "/tmp/ipykernel_/3141592.py"
    assert re.sub(compile_cache.KERNEL_PID, "", "/work/src/spmd_guide/core/hlo.py") == \
        "/work/src/spmd_guide/core/hlo.py"


@pytest.mark.parametrize("value", ["", "0", "off", "OFF", " no "])
def test_off_values_leave_it_off(monkeypatch, value):
    monkeypatch.setenv(compile_cache.ENV, value)
    assert compile_cache.from_environment() is None


@pytest.mark.parametrize("folder, error", [("", InputError), ("  ", InputError),
                                           (b"/tmp/x", InputTypeError), (None, InputTypeError),
                                           (3, InputTypeError)])
def test_a_bad_folder_is_refused_by_name(folder, error):
    with pytest.raises(error, match="folder"):
        compile_cache.enable(folder)


def test_disabled_turns_it_off_inside_and_back_on_after(tmp_path):
    import jax
    before = jax.config.jax_enable_compilation_cache
    with compile_cache.disabled():
        assert compile_cache.directory() is None
    assert jax.config.jax_enable_compilation_cache == before


def test_the_build_and_the_tests_use_the_checkouts_build_folder():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import parallel_execute

    assert parallel_execute.COMPILE_CACHE_ENV == compile_cache.ENV
    assert compile_cache.default_directory(ROOT) == ROOT / "_build" / "jax_cache"
