"""The Parquet sink (stages/sinks/parquet.py): every row and value as the write stage hands it over, in order, with
the declared schema, also for an empty partition and for a chunk whose column came out all-null."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batch_assets.stages.sinks import sink_for
from tests.conftest import EMBED_SPEC, make_spec

SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("text", pa.string()), ("embedding", pa.list_(pa.float32(), 3)),
    ("score", pa.float64()), ("ok", pa.bool_()), ("day", pa.date32()), ("error", pa.string()),
])
ROWS = [
    {"doc_id": "d1", "text": "café 日本語 🙂", "embedding": [0.5, -1.0, 2.0], "score": 0.25, "ok": True,
     "day": dt.date(2026, 11, 26), "error": None},
    {"doc_id": "d2", "text": "", "embedding": None, "score": None, "ok": None, "day": None,
     "error": "empty input: column 'text' is empty"},
    {"doc_id": "d3", "text": "line one\nline two, \"quoted\"", "embedding": [0.0, 0.0, 1.0], "score": float("inf"),
     "ok": False, "day": dt.date(1970, 1, 1), "error": None},
]


def _sink(tmp_path: Path):
    spec = make_spec(EMBED_SPEC, tmp_path, sink={"format": "parquet", "path": str(tmp_path / "out")})
    sink = sink_for("parquet")
    return spec, sink, sink.partition_url(str(tmp_path / "out"), spec, "a")


def test_every_row_and_value_is_written_in_order_with_the_declared_types(tmp_path: Path) -> None:
    spec, sink, url = _sink(tmp_path)
    batches = [pa.RecordBatch.from_pylist(ROWS[i:i + 1], SCHEMA) for i in range(3)] * 2  # several batches
    assert sink.write(spec, url, iter(batches), SCHEMA) == 6
    table = pq.read_table(url)
    assert table.schema == SCHEMA.with_metadata(table.schema.metadata)
    assert table.to_pylist() == ROWS * 2


def test_an_empty_partition_is_a_file_with_the_typed_columns_and_no_rows(tmp_path: Path) -> None:
    spec, sink, url = _sink(tmp_path)
    assert sink.write(spec, url, iter([]), SCHEMA) == 0
    table = pq.read_table(url)
    assert table.num_rows == 0 and table.schema.names == SCHEMA.names
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 3)


def test_a_chunk_whose_column_is_all_null_is_written_with_the_declared_type(tmp_path: Path) -> None:
    """A chunk where every row failed has a null-typed output column; the file keeps the declared type."""
    spec, sink, url = _sink(tmp_path)
    failed = pa.RecordBatch.from_pylist([{**ROWS[1], "doc_id": "d0"}])  # every column inferred, `score` as null
    assert failed.schema.field("score").type == pa.null()
    good = pa.RecordBatch.from_pylist([ROWS[0]], SCHEMA)
    assert sink.write(spec, url, iter([failed.select(SCHEMA.names), good]), SCHEMA) == 2
    table = pq.read_table(url)
    assert table.schema.field("score").type == pa.float64()
    assert table.column("doc_id").to_pylist() == ["d0", "d1"] and table.column("score").to_pylist() == [None, 0.25]
