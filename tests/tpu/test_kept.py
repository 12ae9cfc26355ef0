"""kept: computed rows where XLA:TPU is available, the last kept rows (with provenance) where
it is not; the kept files exist for every table."""

import pathlib

import pytest

from spmd_guide.core import checks
from spmd_guide.tpu import kept

RESULTS = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"


def test_computed_where_available():
    rows, note = kept.rows("fit", lambda: [{"a": 1}], folder=RESULTS)
    assert rows == [{"a": 1}] and note == ""


@pytest.mark.parametrize("table", sorted(kept.FILES))
def test_kept_rows_and_their_provenance_without_libtpu(monkeypatch, table):
    monkeypatch.setattr(kept, "unavailable", lambda: "the TPU compiler is not available "
                        "on this platform (Darwin on arm64): libtpu is published for Linux.")
    rows, note = kept.rows(table, lambda: pytest.fail("must not compile"), folder=RESULTS)
    assert rows and all(isinstance(r, dict) for r in rows)
    assert note.startswith("Not compiled here: the TPU compiler is not available")
    assert "benchmarks/tpu_programs.py" in note and "JAX 0.12" in note


def test_bad_arguments_without_libtpu():
    with pytest.raises(checks.InputError):
        kept.rows("speed", list, folder=RESULTS)
    with pytest.raises(checks.InputError):
        kept.rows("fit", 3, folder=RESULTS)


def test_the_default_folder_is_the_checkouts_kept_results_without_libtpu():
    assert all((kept.FOLDER / name).is_file() for name in kept.FILES.values())
