"""The write stage's sink: the pipeline's published output, one file per partition, committed atomically."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.csv as pacsv

from batch_assets.errors import PipelineError
from batch_assets.partitions import stable_hash64
from batch_assets.report import PartitionReport, markdown_preview
from batch_assets.spec import PipelineSpec
from batch_assets.storage import (
    ArrowStorage,
    ParquetPartitionWriter,
    atomic_output,
    filesystem_for,
    join,
    parquet_schema,
    partition_file_name,
    read_batches,
    upstream_url,
)

EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}


def run_write(spec: PipelineSpec, storage: ArrowStorage, key: str) -> PartitionReport:
    """The write stage for one partition: publish the sink columns of `inferred`, committed atomically, only if
    every source row id appears exactly once."""
    import time

    start = time.perf_counter()
    src = upstream_url(storage, spec.name, "inferred", key)
    raw_url = upstream_url(storage, spec.name, "raw", key)
    schema = parquet_schema(src)
    columns = sink_columns(spec, schema.names)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise PipelineError(f"sink columns {missing} are not produced; available: {schema.names}",
                            column=missing[0], fix="fix sink.columns in the spec")
    out_schema = pa.schema([schema.field(c) for c in columns])
    seen: set[int] = set()
    dupes: list[str] = []
    head: list[pa.RecordBatch] = []

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in read_batches(src, batch_rows=spec.source.batch_rows):
            ids = batch.column("row_id").to_pylist()
            for rid, h in zip(ids, stable_hash64(ids).tolist()):
                if h in seen:
                    dupes.append(rid)
                seen.add(h)
            out = batch.select(columns)
            if sum(b.num_rows for b in head) < 5:
                head.append(out.slice(0, 5))
            yield out

    url = sink_url(spec, storage, key)
    expected = {h for b in read_batches(raw_url, columns=["row_id"])
                for h in stable_hash64(b.column(0).to_pylist()).tolist()}
    rows = write_sink(spec, url, _verified(batches(), seen, dupes, expected, spec, key), out_schema)
    from batch_assets.checkpoint import remove_partition_checkpoints

    remove_partition_checkpoints(storage, spec.name, key)  # published: a rerun must not resume from stale chunks
    return PartitionReport(key, rows, rows, time.perf_counter() - start, url,
                           {"rows_in_source": len(expected), "preview": dg.MetadataValue.md(markdown_preview(head, columns))})


def _verified(batches: Iterator[pa.RecordBatch], seen: set[int], dupes: list[str], expected: set[int],
              spec: PipelineSpec, key: str) -> Iterator[pa.RecordBatch]:
    """Pass batches through; after the last one, fail (inside the atomic write, so nothing is committed) if any
    source row is missing or repeated."""
    yield from batches
    missing = len(expected - seen)
    if dupes or missing or len(seen) != len(expected):
        raise PipelineError(
            f"output would not hold every source row exactly once: {missing} missing, {len(dupes)} repeated "
            f"(e.g. {dupes[:3]})",
            pipeline=spec.name, partition=key,
            fix="re-materialize the upstream assets of this partition; if it persists, report a bug",
        )


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
