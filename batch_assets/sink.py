"""The write stage's sink: the pipeline's published output, one file per partition, committed atomically."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from batch_assets.spec import PipelineSpec
from batch_assets.storage import ArrowStorage, ParquetPartitionWriter, atomic_output, filesystem_for, join, partition_file_name

EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}


def sink_url(spec: PipelineSpec, storage: ArrowStorage, partition: str) -> str:
    base = spec.sink.path or storage.default_sink(spec.name)
    if "://" not in base:
        from batch_assets.storage import resolve_local

        base = resolve_local(base)
    return join(base, partition_file_name(partition, EXTENSIONS[spec.sink.format]))


def sink_columns(spec: PipelineSpec, available: list[str]) -> list[str]:
    """The spec's columns, or every column except internal ones (leading underscore)."""
    if spec.sink.columns:
        return list(spec.sink.columns)
    return [c for c in available if not c.startswith("_")]


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def write_sink(spec: PipelineSpec, url: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
    """Stream `batches` into `url` in the sink format; returns rows written. Visible only when complete."""
    fs, path = filesystem_for(url)
    rows = 0
    with atomic_output(fs, path) as f:
        if spec.sink.format == "parquet":
            writer = ParquetPartitionWriter(f, schema)
            try:
                for batch in batches:
                    writer.write(batch)
            except BaseException:
                writer.abort()
                raise
            writer.close(schema)
            return writer.rows
        if spec.sink.format == "csv":
            with pacsv.CSVWriter(f, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
                    rows += batch.num_rows
            return rows
        for batch in batches:
            lines = "".join(json.dumps(r, default=_json_default, ensure_ascii=False) + "\n" for r in batch.to_pylist())
            f.write(lines.encode("utf-8"))
            rows += batch.num_rows
    return rows
