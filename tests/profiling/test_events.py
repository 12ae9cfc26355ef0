"""spmd_guide.profiling.events: reading what jax.profiler.trace wrote. Every path argument
refuses '', Path(''), a foreign folder and a file; a damaged trace file is named; events that
are not TraceEvents are refused."""

import gzip
import pathlib

import pytest

from spmd_guide.core import checks
from spmd_guide.profiling import events, tracing


def _trace_folder(root: pathlib.Path) -> pathlib.Path:
    run = root / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    return run


@pytest.mark.parametrize("fn", [events.trace_files, events.read_events])
def test_every_path_argument_refuses_empty_foreign_and_file_paths(fn, tmp_path):
    (tmp_path / "notes.txt").write_text("not a trace")
    for value in ("", "  ", pathlib.Path(""), ".", b"folder", 3, None):
        with pytest.raises(checks.InputError, match="folder"):
            fn(value)
    with pytest.raises(checks.InputError, match="plugins/profile"):
        fn(tmp_path)  # a foreign folder, never listed or read
    with pytest.raises(checks.InputError, match="is a file"):
        fn(tmp_path / "notes.txt")
    with pytest.raises(checks.InputError, match="not a folder"):
        fn(tmp_path / "missing")


def test_a_trace_folder_is_listed_and_read(tmp_path):
    run = _trace_folder(tmp_path)
    (run / "host.trace.json.gz").write_bytes(
        gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "f", "ts": 1, "dur": 2}]}'))
    (run / "host.xplane.pb").write_bytes(b"xx")
    assert events.trace_files(tmp_path) == [
        ("plugins/profile/2026_01_01/host.trace.json.gz", (run / "host.trace.json.gz").stat().st_size),
        ("plugins/profile/2026_01_01/host.xplane.pb", 2)]
    assert events.read_events(str(tmp_path)) == [{"ph": "X", "name": "f", "ts": 1, "dur": 2}]
    assert tracing.read_events is events.read_events  # the face the pages use


# mtime=0: the bytes (and so the test ids) must not depend on the second each pytest worker
# collects in, or xdist refuses the run ("Different tests were collected between gw0 and gw1").
@pytest.mark.parametrize("content, match", [
    (b"not gzip at all", "damaged"),
    (gzip.compress(b"{not json", mtime=0), "damaged"),
    (gzip.compress(b'{"displayTimeUnit": "ns"}', mtime=0), "traceEvents"),
    (gzip.compress(b'{"traceEvents": [1, 2]}', mtime=0), "traceEvents"),
    (gzip.compress(b"[]", mtime=0), "traceEvents"),
])
def test_a_damaged_trace_file_is_named(tmp_path, content, match):
    path = _trace_folder(tmp_path) / "host.trace.json.gz"
    path.write_bytes(content)
    with pytest.raises(events.TraceInputError, match=match) as error:
        events.read_events(tmp_path)
    assert "host.trace.json.gz" in str(error.value)
    assert isinstance(error.value, checks.InputError)


def test_event_checks_name_the_event():
    assert events.check_events([]) == []
    for bad, match in [("events", "events must be a list"), ({"a": 1}, "events must be a list"),
                       ([{"ph": "X"}, 3], r"events\[1\]")]:
        with pytest.raises(checks.InputError, match=match):
            events.check_events(bad)
    assert events.event_time({"ts": "2.5"}, "ts", 0) == 2.5
    for event, key in [({"ts": "soon"}, "ts"), ({}, "ts"), ({"dur": -1}, "dur"),
                       ({"ts": float("nan")}, "ts"), ({"dur": float("inf")}, "dur")]:
        with pytest.raises(events.TraceInputError, match=rf"events\[4\].*{key}="):
            events.event_time(event, key, 4)
