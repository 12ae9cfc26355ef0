"""results: benchmark tables saved with their provenance and read back exactly."""

from __future__ import annotations

import json
import pathlib

import pytest

from spmd_guide.core import results
from spmd_guide.core.checks import InputError, InputTypeError

ROWS = [{"strategy": "dp", "sent/device": "1.0 MiB", "step (median)": "3.1 ms"},
        {"strategy": "tp", "sent/device": "2.0 MiB", "step (median)": "4.2 ms"}]


def test_round_trip_keeps_rows_and_says_where_they_came_from(tmp_path):
    path = results.save(tmp_path / "r" / "x.json", benchmark="strategies",
                        command=["benchmarks/strategies.py", "--runs", "3", "--json", "x.json"],
                        settings={"runs": 3}, rows=ROWS)
    back = results.load(path)
    assert back.rows == ROWS and back.settings == {"runs": 3}
    assert back.settings_text() == "runs 3"
    assert back.command == "python benchmarks/strategies.py --runs 3"
    assert back.script == "benchmarks/strategies.py"
    assert results.load_all(tmp_path / "r", script="benchmarks/strategies.py") == [back]
    text = back.provenance()
    env = back.environment
    assert f"{env.device_count} x {env.device_kind}" in text
    assert f"JAX {env.jax_version}" in text and back.date[:10] in text
    assert ("mock devices" in text) == env.mock_devices
    assert back.table().headers == list(ROWS[0])
    assert back.table(["strategy"]).rows == [{"strategy": "dp"}, {"strategy": "tp"}]


def test_a_multi_process_launch_says_its_processes_not_the_launcher(tmp_path):
    path = results.save(tmp_path / "m.json", benchmark="edges", command=["b.py"], rows=ROWS,
                        settings={"processes": 2, "devices per process": 2})
    back = results.load(path)
    text = back.provenance()
    assert "2 processes x 2 " in text and "devices each" in text
    assert f"{back.environment.device_count} x " not in text
    kept = results.load(pathlib.Path(__file__).parents[2] / "benchmarks" / "results"
                        / "multihost_edges.json")
    assert "2 processes x 2 cpu devices each" in kept.provenance()


def test_the_books_committed_results_load():
    from pathlib import Path
    folder = Path(__file__).parents[2] / "benchmarks" / "results"
    for script in ("benchmarks/strategies.py", "benchmarks/collective_matmuls.py",
                   "benchmarks/transformer_strategies.py"):
        assert all(run.rows for run in results.load_all(folder, script=script))


def test_settings_text_reads_lists_and_big_numbers(tmp_path):
    path = results.save(tmp_path / "s.json", benchmark="b", command=[], rows=ROWS,
                        settings={"layers": [256, 2048, 256], "batch": 1024, "parameters": 9443584,
                                  "dtype": "float32"})
    assert results.load(path).settings_text() == (
        "layers 256, 2,048 and 256, batch 1,024, parameters 9,443,584, dtype float32")
    sizes = results.save(tmp_path / "m.json", benchmark="b", command=[], rows=ROWS,
                         settings={"sizes": [256, 512, 1024]})
    # three square sizes, one after another: not a 256 x 512 x 1,024 shape
    assert results.load(sizes).settings_text() == "sizes 256, 512 and 1,024"


def test_numpy_values_and_a_command_string_are_stored_as_they_read(tmp_path):
    """#27: command='run.py' was stored as 'python r u n . p y' and np.int64 settings were
    refused by json; both now read back as given."""
    import numpy as np

    path = results.save(tmp_path / "n.json", benchmark="b",
                        command="python benchmarks/run.py --runs 3 --json n.json",
                        settings={"runs": np.int64(3), "sizes": np.array([2, 4]),
                                  "rate": np.float32(0.5), "flag": np.bool_(True)},
                        rows=[{"n": np.int32(8), "ms": np.float64(1.25)}])
    back = results.load(path)
    assert back.command == "python benchmarks/run.py --runs 3"
    assert back.script == "benchmarks/run.py"
    assert back.settings == {"runs": 3, "sizes": [2, 4], "rate": 0.5, "flag": True}
    assert back.rows == [{"n": 8, "ms": 1.25}]
    assert type(back.settings["runs"]) is int
    assert results.load(str(path)) == back
    assert back.table("n").rows == [{"n": 8}]  # one column name, whole


BAD_INPUT = [
    ("path not .json", lambda p: results.save(p / "x.txt", benchmark="b", command=[],
                                             settings={}, rows=ROWS), InputError, ".json"),
    ("path a number", lambda p: results.save(3, benchmark="b", command=[], settings={},
                                            rows=ROWS), InputTypeError, "path"),
    ("benchmark empty", lambda p: results.save(p / "x.json", benchmark=" ", command=[],
                                              settings={}, rows=ROWS), InputTypeError,
     "benchmark"),
    ("benchmark a number", lambda p: results.save(p / "x.json", benchmark=7, command=[],
                                                 settings={}, rows=ROWS), InputTypeError,
     "benchmark"),
    ("command of numbers", lambda p: results.save(p / "x.json", benchmark="b", command=[1, 2],
                                                 settings={}, rows=ROWS), InputTypeError,
     "command"),
    ("command None", lambda p: results.save(p / "x.json", benchmark="b", command=None,
                                           settings={}, rows=ROWS), InputTypeError, "command"),
    ("settings a list", lambda p: results.save(p / "x.json", benchmark="b", command=[],
                                              settings=[("runs", 3)], rows=ROWS),
     InputTypeError, "settings"),
    ("settings key a number", lambda p: results.save(p / "x.json", benchmark="b", command=[],
                                                    settings={3: "x"}, rows=ROWS),
     InputTypeError, "keys of settings"),
    ("settings value an object", lambda p: results.save(
        p / "x.json", benchmark="b", command=[], settings={"f": object()}, rows=ROWS),
     InputTypeError, r"settings\['f'\]"),
    ("rows a dict", lambda p: results.save(p / "x.json", benchmark="b", command=[],
                                          settings={}, rows=ROWS[0]), InputTypeError,
     "non-empty list"),
    ("rows a string", lambda p: results.save(p / "x.json", benchmark="b", command=[],
                                            settings={}, rows="ab"), InputTypeError,
     "non-empty list"),
    ("rows of unequal columns", lambda p: results.save(
        p / "x.json", benchmark="b", command=[], settings={},
        rows=[{"a": 1}, {"b": 2}]), InputError, "same columns"),
    ("row value a set", lambda p: results.save(p / "x.json", benchmark="b", command=[],
                                              settings={}, rows=[{"a": {1}}]),
     InputTypeError, r"rows\[0\]\['a'\]"),
    ("load a number", lambda p: results.load(3), InputTypeError, "path"),
    ("load_all a list", lambda p: results.load_all([p]), InputTypeError, "folder"),
    ("load_all script a number", lambda p: results.load_all(p, script=3), InputTypeError,
     "script"),
]


@pytest.mark.parametrize("call, error, word", [row[1:] for row in BAD_INPUT],
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_gets_the_packages_clear_error(tmp_path, call, error, word):
    with pytest.raises(error, match=word):
        call(tmp_path)
    assert not list(tmp_path.glob("*"))  # nothing half-written


def test_table_columns_must_be_names(tmp_path):
    path = results.save(tmp_path / "t.json", benchmark="b", command=[], settings={}, rows=ROWS)
    with pytest.raises(InputTypeError, match="list of column names"):
        results.load(path).table(3)
    with pytest.raises(InputTypeError, match="list of column names"):
        results.load(path).table([])


def test_bad_files_get_clear_errors(tmp_path):
    with pytest.raises(InputError, match="--json"):
        results.load(tmp_path / "missing.json")
    with pytest.raises(InputError, match="holds no benchmark results from b.py"):
        results.load_all(tmp_path, script="b.py")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        results.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"rows": [1]}))
    with pytest.raises(InputError, match="lacks benchmark, command"):
        results.load(tmp_path / "other.json")
    with pytest.raises(InputTypeError, match="non-empty list"):
        results.save(tmp_path / "x.json", benchmark="b", command=[], settings={}, rows=[])
    path = results.save(tmp_path / "x.json", benchmark="b", command=[], settings={}, rows=ROWS)
    with pytest.raises(InputError, match="column"):
        results.load(path).table(["nope"])


@pytest.mark.parametrize(("record", "word"), [
    ({"rows": "abc"}, "'rows' is a str"),
    ({"settings": [1]}, "'settings' is a list"),
    ({"rows": [{"a": 1}, {"b": 2}]}, "same columns"),
    ({"rows": [1, 2]}, "same columns"),
])
def test_load_refuses_a_file_save_did_not_write(tmp_path, record, word):
    path = results.save(tmp_path / "r.json", benchmark="b", command="python benchmarks/x.py",
                        settings={"n": 1}, rows=[{"a": 1}])
    data = json.loads(path.read_text()) | record
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=word):
        results.load(path)


def test_table_refuses_repeated_columns(tmp_path):
    path = results.save(tmp_path / "r.json", benchmark="b", command="python benchmarks/x.py --n 1",
                        settings={}, rows=[{"a": 1, "b": 2}])
    with pytest.raises(InputError, match="twice"):
        results.load(path).table(["a", "a"])
    assert results.load(path).table(["b", "a"]) is not None


@pytest.mark.parametrize("command", ["run.py", "benchmarks/run.py --runs 3", ""])
def test_a_command_string_without_the_interpreter_is_refused(tmp_path, command):
    """Bad-input audit C: command='run.py' was stored rewritten, as 'python run.py'."""
    with pytest.raises(InputError, match="command"):
        results.save(tmp_path / "r.json", benchmark="b", command=command, settings={},
                     rows=[{"a": 1}])
    path = results.save(tmp_path / "r.json", benchmark="b", command=["run.py"], settings={},
                        rows=[{"a": 1}])
    assert results.load(path).command == "python run.py"
