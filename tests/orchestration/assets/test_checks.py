"""The blocking checks that guard publishing (batch_assets/orchestration/assets/checks.py), on files a real run
wrote and then damaged as a bug or a bad model would: a row lost, a row twice, a foreign row id, an error rate over
the spec's limit, an output column missing, of the wrong type or with no type. Each is caught, says what is wrong
in the user's terms (counts, the column, a sample error) and names the failing partition; an intact output passes,
also where the source repeats ids that `prepare.duplicate_ids: keep_first` drops."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batch_assets.orchestration.assets.checks import (ERROR_CHECK, ROWS_CHECK, SCHEMA_CHECK, blocking_check_results,
                                                      error_problem, rows_problem, schema_problem)
from batch_assets.spec import parse_spec
from batch_assets.stages.report import PartitionReport
from batch_assets.storage import ArrowStorage
from tests.conftest import run_pipeline
from tests.daemon_helpers import daily_spec, write_day

DAY, DAY2 = "2026-11-01", "2026-11-02"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Inferred files of real runs: a pipeline with declared output types and one whose model names its columns,
    and one whose source repeats an id (keep_first)."""
    tmp = tmp_path_factory.mktemp("checks")
    write_day(tmp / "days", DAY, rows=5)
    write_day(tmp / "days", DAY2, rows=5)
    (tmp / "dup").mkdir()
    (tmp / "dup" / f"{DAY}.jsonl").write_text("".join(
        json.dumps({"doc_id": doc, "text": text}) + "\n"
        for doc, text in (("a", "first"), ("b", "bee"), ("a", "again"), ("c", "sea"))))
    out = {}
    for name, data, sections in (
            ("typed", "days", {"task": {"kind": "predict", "output_types": {"prediction": "int64"}}}),
            ("untyped", "days", {}),
            ("dup", "dup", {"prepare": {"id_column": "doc_id", "input_columns": ["text"],
                                        "duplicate_ids": "keep_first"}})):
        raw = daily_spec(tmp / data, tmp / f"{name}.log", **sections)
        raw["name"] = f"checks_{name}"
        spec, store = parse_spec(raw), tmp / f"store-{name}"
        assert run_pipeline(spec, store, [DAY, DAY2] if name == "typed" else [DAY]).success
        out[name] = (spec, ArrowStorage(root=str(store)).stage_url(spec.name, "inferred", DAY))
        if name == "typed":
            out["typed2"] = (spec, ArrowStorage(root=str(store)).stage_url(spec.name, "inferred", DAY2))
    return out


def _damaged(made: dict, which: str, tmp_path: Path, change) -> tuple:
    spec, url = made[which]
    copy = tmp_path / "inferred.parquet"
    shutil.copyfile(url, copy)
    pq.write_table(change(pq.read_table(copy)), copy)
    return spec, str(copy)


def test_an_intact_output_passes_the_row_check_with_the_counts(made: dict) -> None:
    spec, url = made["typed"]
    assert rows_problem(spec, DAY, url) == (None, {"source_rows": 5, "inferred_rows": 5})


def test_a_lost_row_a_repeated_row_and_a_foreign_row_are_each_caught(made: dict, tmp_path: Path) -> None:
    spec, url = _damaged(made, "typed", tmp_path, lambda t: t.slice(0, 4))
    assert rows_problem(spec, DAY, url)[0] == "4 rows for 5 source rows"
    spec, url = _damaged(made, "typed", tmp_path, lambda t: pa.concat_tables([t, t.slice(2, 1)]))
    assert rows_problem(spec, DAY, url)[0] == "6 rows for 5 source rows"
    # as many rows as the source, but one row twice and another missing: counts alone would pass it
    spec, url = _damaged(made, "typed", tmp_path, lambda t: pa.concat_tables([t.slice(0, 4), t.slice(0, 1)]))
    problem, facts = rows_problem(spec, DAY, url)
    assert problem.startswith("as many rows as the source, but not the same row ids"), problem
    assert facts == {"source_rows": 5, "inferred_rows": 5}

    def foreign(t: pa.Table) -> pa.Table:
        ids = t.column("row_id").to_pylist()
        return t.set_column(t.schema.get_field_index("row_id"), "row_id", pa.array(ids[:-1] + ["not-a-source-row"]))

    spec, url = _damaged(made, "typed", tmp_path, foreign)
    assert rows_problem(spec, DAY, url)[0].startswith("as many rows as the source, but not the same row ids")


def test_keep_first_expects_each_distinct_source_id_once(made: dict, tmp_path: Path) -> None:
    spec, url = made["dup"]
    assert rows_problem(spec, DAY, url) == (None, {"source_rows": 3, "inferred_rows": 3})
    spec, url = _damaged(made, "dup", tmp_path, lambda t: pa.concat_tables([t, t.slice(0, 1)]))
    assert rows_problem(spec, DAY, url)[0] == "4 rows for 3 source rows"


def _report(rows: int, model_errors: int, rows_with_errors: int, samples: str | None = None) -> PartitionReport:
    extra = {"model_errors": model_errors, "rows_with_errors": rows_with_errors}
    if samples is not None:
        extra["error_samples"] = dg.MetadataValue.md(samples)
    return PartitionReport(DAY, rows, rows, 1.0, "unused", extra)


def test_an_error_rate_over_the_limit_names_the_counts_and_a_model_error(made: dict) -> None:
    spec, _ = made["typed"]  # max_error_fraction: the default 0.01
    samples = "- empty input: row doc-3 (every field blank)\n- row doc-7: ConnectionError: endpoint unavailable"
    problem, facts = error_problem(spec, _report(100, 2, 5, samples))
    assert problem == ("2 of 100 rows failed in the model (2.0%), more than max_error_fraction=0.01; "
                       "e.g. row doc-7: ConnectionError: endpoint unavailable")
    assert facts["input_problems"] == 3 and facts["model_errors"] == 2 and facts["error_fraction"] == 0.02


def test_rows_with_empty_input_are_reported_not_counted_against_the_limit(made: dict) -> None:
    spec, _ = made["typed"]
    assert error_problem(spec, _report(100, 1, 60))[0] is None, "1% failed in the model: at the limit, passes"
    assert error_problem(spec, _report(0, 0, 0))[0] is None, "an empty partition has no error rate"


def test_an_output_column_missing_or_of_another_type_than_declared_fails_the_schema_check(
        made: dict, tmp_path: Path) -> None:
    spec, url = made["typed"]
    report = _report(5, 0, 0)
    assert schema_problem(spec, None, report, url) == (None, {"prediction": "int64"})
    spec, url = _damaged(made, "typed", tmp_path, lambda t: t.drop_columns(["prediction"]))
    assert schema_problem(spec, None, report, url)[0] == "column 'prediction' is missing"
    spec, url = _damaged(made, "typed", tmp_path, lambda t: t.set_column(
        t.schema.get_field_index("prediction"), "prediction", pc.cast(t.column("prediction"), pa.string())))
    assert schema_problem(spec, None, report, url)[0] == "column 'prediction' is string, declared int64"
    spec, url = _damaged(made, "typed", tmp_path, lambda t: t.drop_columns(["error"]))
    assert schema_problem(spec, None, report, url)[0] == "column 'error' is missing"


def test_a_column_the_model_named_with_no_type_although_rows_succeeded_fails(made: dict, tmp_path: Path) -> None:
    spec, url = made["untyped"]
    assert schema_problem(spec, None, _report(5, 0, 0), url)[0] is None
    spec, url = _damaged(made, "untyped", tmp_path, lambda t: t.set_column(
        t.schema.get_field_index("prediction"), "prediction", pa.nulls(len(t))))
    assert schema_problem(spec, None, _report(5, 0, 0), url)[0] == \
        "column 'prediction' has no type although rows succeeded (every value null)"
    assert schema_problem(spec, None, _report(5, 5, 5), url)[0] is None, "every row failed: no value to type"


def test_the_check_results_name_each_failing_partition_and_pass_the_others(made: dict, tmp_path: Path) -> None:
    spec, url = made["typed"]
    _, short = _damaged(made, "typed2", tmp_path, lambda t: t.slice(0, 3))
    good = PartitionReport(DAY, 5, 5, 1.0, url, {"model_errors": 0, "rows_with_errors": 0})
    bad = PartitionReport(DAY2, 3, 3, 1.0, short, {"model_errors": 0, "rows_with_errors": 0})
    results = {r.check_name: r for r in blocking_check_results(spec, None, [good])}
    assert set(results) == {ROWS_CHECK, ERROR_CHECK, SCHEMA_CHECK}
    assert all(r.passed and r.description == "passed" for r in results.values())
    assert all(r.severity == dg.AssetCheckSeverity.ERROR for r in results.values())
    results = {r.check_name: r for r in blocking_check_results(spec, None, [good, bad])}
    assert not results[ROWS_CHECK].passed
    assert results[ROWS_CHECK].description == f"partition '{DAY2}': 3 rows for 5 source rows"
    assert results[ROWS_CHECK].metadata["partitions"].value[DAY] == {"source_rows": 5, "inferred_rows": 5}
    assert results[ERROR_CHECK].passed and results[SCHEMA_CHECK].passed
