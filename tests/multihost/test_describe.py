"""describe: what each of two processes (4 CPU devices each) sees; the quick suite's one launch
(``described``, in conftest), and the page's exercise with one process of eight devices."""

from __future__ import annotations

import pytest

from spmd_guide.core.checks import InputError
from spmd_guide.multihost import describe
from spmd_guide.multihost.multihost import LOOPBACK, launch


@pytest.mark.slow
def test_two_processes_share_eight_global_devices(described, nothing_left):
    values = [r.value for r in described]
    assert [v["process_index"] for v in values] == [0, 1]
    assert all(v["process_count"] == 2 and len(v["local_devices"]) == 4 for v in values)
    global_ids = values[0]["global_devices"]
    assert len(global_ids) == 8 and values[1]["global_devices"] == global_ids
    assert sorted(values[0]["local_devices"] + values[1]["local_devices"]) == sorted(global_ids)
    for v in values:
        assert {v["device_process"][str(d)] for d in v["local_devices"]} == {v["process_index"]}
    nothing_left(described)


def test_each_process_holds_only_its_rows_of_the_global_array(described):
    for result in described:
        v, p = result.value, result.process_id
        assert v["global_shape"] == [16] and v["fully_addressable"] is False
        rows = [i for s in v["shards"] for i in s["data"]]
        assert rows == list(range(8 * p, 8 * p + 8))
        assert [s["device"] for s in v["shards"]] == v["local_devices"]
        assert all(s["stop"] - s["start"] == 2 for s in v["shards"])
        assert v["other_devices"] == described[1 - p].value["local_devices"]
        assert v["sum"] == sum(range(16))  # computed by one program over both processes
        assert "non-addressable" in v["fetch_error"]
        assert f"process {p} of 2" in result.stdout
        assert "fully addressable: False" in result.stdout
        assert "[Gloo]" not in result.stdout  # native chatter goes to stderr


def test_the_hybrid_mesh_puts_one_process_per_row(described):
    v = described[0].value
    assert v["hybrid_mesh"] == [described[0].value["local_devices"],
                                described[1].value["local_devices"]]


def test_processes_listen_only_on_loopback(described):
    for result in described:
        listening = result.value["listening"]
        if listening is None:
            pytest.skip("no /proc to read sockets from")
        assert listening, "the gloo and coordinator sockets should be listed"
        assert all(a.rsplit(":", 1)[0] == LOOPBACK for a in listening), listening
    assert len(described[0].value["listening"]) > len(described[1].value["listening"])


@pytest.mark.slow
def test_exercise_one_process_of_eight_devices_is_fully_addressable(nothing_left):
    (result,) = launch(describe.describe_process, num_processes=1, devices_per_process=8,
                       timeout=120)
    v = result.value
    assert v["process_count"] == 1 and len(v["local_devices"]) == 8
    assert v["fully_addressable"] is True and v["fetch_error"] is None
    assert v["other_devices"] == [] and v["sum"] == sum(range(16))
    assert v["global_arrays"]["gather_to_one_error"] is None  # one process: nothing to refuse
    nothing_left([result])


@pytest.mark.parametrize("rows", [0, -1])
def test_bad_rows_per_device_is_refused_before_anything_runs(rows):
    with pytest.raises(InputError, match="rows_per_device"):
        describe.describe_process(rows_per_device=rows)
