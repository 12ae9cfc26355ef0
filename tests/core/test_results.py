"""results: benchmark tables saved with their provenance and read back exactly."""

from __future__ import annotations

import json

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
        "layers 256 x 2,048 x 256, batch 1,024, parameters 9,443,584, dtype float32")


def test_bad_files_get_clear_errors(tmp_path):
    with pytest.raises(InputError, match="--json"):
        results.load(tmp_path / "missing.json")
    with pytest.raises(InputError, match="no benchmark results from b.py"):
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
