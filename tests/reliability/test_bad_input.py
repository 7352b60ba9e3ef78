"""Bad input fails with a clear error naming pipeline, partition, file and column, and leaves no partial output."""

from __future__ import annotations

from pathlib import Path

from batch_assets.errors import PipelineError
from batch_assets.storage import ArrowStorage, exists
from tests.bad_input_helpers import assert_nothing_published, failure_message
from tests.conftest import EMBED_SPEC, make_spec, run_pipeline, write_csv, write_jsonl

CSV_EMBED = {**EMBED_SPEC, "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["doc_id", "text"]}}


def test_missing_input_column(tmp_path: Path) -> None:
    write_csv(tmp_path / "d" / "a.csv", ["doc_id", "body"], [["1", "hello"]])
    spec = make_spec(CSV_EMBED, tmp_path / "d")
    msg = failure_message(spec, tmp_path / "store", "a")
    assert "'text' not found" in msg and "doc_id, body" in msg
    assert "pipeline 'docs'" in msg and "partition 'a'" in msg and "a.csv" in msg and "column 'text'" in msg
    assert "What to do" in msg
    assert_nothing_published(spec, tmp_path / "store", "a")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_bytes(b"")
    spec = make_spec(CSV_EMBED, tmp_path / "d")
    msg = failure_message(spec, tmp_path / "store", "a")
    assert "empty" in msg and "partition 'a'" in msg and "a.csv" in msg and "pipeline 'docs'" in msg
    assert_nothing_published(spec, tmp_path / "store", "a")


def test_path_that_does_not_exist(tmp_path: Path) -> None:
    spec = make_spec(CSV_EMBED, tmp_path / "nowhere")
    msg = failure_message(spec, tmp_path / "store", "a")
    assert "does not exist" in msg and "nowhere/a.csv" in msg and "partition 'a'" in msg
    assert_nothing_published(spec, tmp_path / "store", "a")


def test_non_utf8_csv_names_row_and_column(tmp_path: Path) -> None:
    rows = [[str(i), f"plain row {i}"] for i in range(1, 40)]
    rows[16][1] = "Caf\u00e9 cr\u00e8me"  # row 17 written as latin-1 below: invalid UTF-8
    write_csv(tmp_path / "d" / "a.csv", ["doc_id", "text"], rows, encoding="latin-1")
    spec = make_spec(CSV_EMBED, tmp_path / "d")
    msg = failure_message(spec, tmp_path / "store", "a")
    assert "not valid utf-8" in msg and "row 17" in msg and "column 'text'" in msg and "a.csv" in msg
    assert "source.encoding" in msg
    assert_nothing_published(spec, tmp_path / "store", "a")
    # and the suggested fix works
    fixed = make_spec(CSV_EMBED, tmp_path / "d", source={"encoding": "latin-1"})
    assert run_pipeline(fixed, tmp_path / "store2", ["a"]).success


def test_failure_in_a_later_partition_keeps_earlier_ones_whole(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"doc_id": "1", "text": "fine"}])
    write_jsonl(tmp_path / "d" / "b.jsonl", [{"doc_id": "2", "txt": "wrong column"}])
    spec = make_spec(EMBED_SPEC, tmp_path / "d")
    result = run_pipeline(spec, tmp_path / "store", ["a", "b"], raise_on_error=False)
    assert not result.success
    storage = ArrowStorage(root=str(tmp_path / "store"))
    assert exists(storage.stage_url("docs", "raw", "a"))  # a complete partition is kept
    assert not exists(storage.stage_url("docs", "raw", "b"))  # the failed one is not half-written


def test_duplicate_and_blank_row_ids(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"doc_id": "1", "text": "x"}, {"doc_id": "1", "text": "y"}])
    spec = make_spec(EMBED_SPEC, tmp_path / "d")
    msg = failure_message(spec, tmp_path / "store", "a")
    assert "row id '1' appears more than once" in msg and "row 2" in msg and "a.jsonl" in msg
    write_jsonl(tmp_path / "e" / "a.jsonl", [{"doc_id": "1", "text": "x"}, {"doc_id": "", "text": "y"}])
    msg = failure_message(make_spec(EMBED_SPEC, tmp_path / "e"), tmp_path / "store2", "a")
    assert "row id is empty" in msg and "row 2" in msg and "column 'doc_id'" in msg


def test_pipeline_error_renders_every_location_field() -> None:
    err = PipelineError("bad", pipeline="p", partition="k", file="f.csv", column="c", row=3, fix="do x")
    assert str(err) == "bad [pipeline 'p', partition 'k', file 'f.csv', column 'c', row 3]. What to do: do x"
    # A stage raises with what it knows; the asset adds pipeline and partition, never overwriting a field.
    inner = PipelineError("bad", column="c", row=3, fix="do x", retryable=True)
    outer = inner.located(pipeline="p", partition="k", column="other")
    assert str(outer) == "bad [pipeline 'p', partition 'k', column 'c', row 3]. What to do: do x"
    assert outer.retryable and str(inner) == "bad [column 'c', row 3]. What to do: do x"
