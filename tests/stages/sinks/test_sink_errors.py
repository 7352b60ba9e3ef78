"""Sinks and failed rows: a row whose input is empty never reaches LanceDB as a null vector (it is in the dead
letters), a partition whose rows all failed publishes in every sink, and a sink error that a retry would repeat
fails at once instead of being retried."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_assets.errors import transient_failure
from batch_assets.reliability.dead_letters import dead_letter_url
from batch_assets.spec import parse_spec
from batch_assets.stages.infer import InferStats, run_infer
from batch_assets.stages.prepare import run_prepare
from batch_assets.stages.read import run_read
from batch_assets.stages.sinks import lancedb as lance_sink
from batch_assets.stages.write import run_write, sink_url
from batch_assets.storage import ArrowStorage
from tests.conftest import EMBED_SPEC, make_spec, run_pipeline, write_jsonl


@pytest.fixture(scope="module")
def embedder():
    from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(device="cpu").load_for_tests()


def _stages(spec, storage: ArrowStorage, key: str, embedder) -> None:
    run_read(spec, storage, key)
    run_prepare(spec, storage, key)
    run_infer(spec, storage, key, embedder, InferStats())
    run_write(spec, storage, key)


def test_failed_rows_stay_out_of_lancedb_and_an_all_error_partition_publishes(tmp_path: Path, embedder) -> None:
    data, db = tmp_path / "data", tmp_path / "vectors"
    write_jsonl(data / "a.jsonl", [{"doc_id": "a1", "text": "the moon"}, {"doc_id": "a2", "text": None},
                                   {"doc_id": "a3", "text": "  "}, {"doc_id": "a4", "text": "pasta water"}])
    write_jsonl(data / "b.jsonl", [{"doc_id": "b1", "text": ""}, {"doc_id": "b2", "text": None}])
    storage = ArrowStorage(root=str(tmp_path / "store"))
    lance = make_spec(EMBED_SPEC, data, sink={"format": "lancedb", "path": str(db), "table": "docs_vectors"})
    for key in ("a", "b"):
        _stages(lance, storage, key, embedder)
    table = lance_sink.connect(str(db)).open_table("docs_vectors").to_arrow()
    assert table.column("doc_id").to_pylist() == ["a1", "a4"]
    assert all(len(v) == 384 for v in table.column("embedding").to_pylist())
    for key, failed in (("a", ["a2", "a3"]), ("b", ["b1", "b2"])):
        dead = pq.read_table(dead_letter_url(storage, lance.name, key)).to_pylist()
        assert [r["row_id"] for r in dead] == failed
        assert all(r["error"].startswith("empty input") and r["error_class"] == "input" for r in dead)

    parquet = make_spec(EMBED_SPEC, data)  # the file sinks keep every row, the failed ones with their error
    _stages(parquet, ArrowStorage(root=str(tmp_path / "store-pq")), "b", embedder)
    out = pq.read_table(sink_url(parquet, ArrowStorage(root=str(tmp_path / "store-pq")), "b"))
    assert out.column("doc_id").to_pylist() == ["b1", "b2"] and out.column("embedding").null_count == 2
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 384)


def test_sink_errors_are_classified(tmp_path: Path) -> None:
    """LanceDB's own refusal of a null vector never changes on a retry; a store that cannot be reached may."""
    import pyarrow.fs as pafs

    schema = pa.schema([("row_id", pa.string()), ("embedding", pa.list_(pa.float32(), 2)),
                        ("partition_key", pa.string(), False)])
    table = lance_sink.connect(str(tmp_path / "db")).create_table("t", schema=schema)
    batch = pa.RecordBatch.from_pylist([{"row_id": "1", "embedding": None, "partition_key": "a"}], schema=schema)
    with pytest.raises(Exception) as vector_error:
        table.merge_insert(["partition_key", "row_id"]).when_not_matched_insert_all().execute(
            pa.RecordBatchReader.from_batches(schema, iter([batch])))
    assert "on_bad_vectors" in str(vector_error.value)
    assert transient_failure(vector_error.value) is False

    s3 = pafs.S3FileSystem(endpoint_override="http://127.0.0.1:9", scheme="http", access_key="k", secret_key="s",
                           region="us-east-1", connect_timeout=1, request_timeout=1, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    with pytest.raises(OSError) as outage:
        s3.get_file_info("bucket/key")
    assert transient_failure(outage.value) is True, str(outage.value)


def test_a_sink_error_a_retry_would_repeat_fails_at_once(tmp_path: Path, s3_bucket: str) -> None:
    """A sink path in a bucket that does not exist (a typo in sink.path): the write step fails with the sink and the
    cause named, and the step's RetryPolicy (two retries here) does not run it again. (This test once wrote a list
    column to CSV, which the CSV sink now writes as JSON text: tests/stages/sinks/test_csv.py.)"""
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"doc_id": ["1", "2"], "text": ["ab", "abc"], "tags": [["x"], ["y", "z"]]}),
                   data / "a.parquet")
    spec = parse_spec({
        "name": "lengths",
        "source": {"format": "parquet", "path": f"{data}/{{partition}}.parquet", "columns": ["doc_id", "text", "tags"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict", "output_column": "length"},
        "model": {"provider": "custom", "config": {"class_path": "tests.reliability_models:TextLength"}},
        "sink": {"format": "csv", "path": f"{s3_bucket}-no-such-bucket/out"},
        "retries": {"max_retries": 2, "delay_seconds": 0},
    })
    result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    events = [e.event_type_value for e in result.all_events]
    assert "STEP_UP_FOR_RETRY" not in events and "STEP_RESTARTED" not in events, events
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.event_specific_data.error
    message = error.cause.message if error.cause else error.message
    assert "the csv sink refused the partition's rows: The specified bucket does not exist" in message, message
    assert "partition 'a'" in message and "was not retried" in message
