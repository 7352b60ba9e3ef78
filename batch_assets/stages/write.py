"""The write stage's sink: the pipeline's published output, one file per partition, committed atomically."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from batch_assets.errors import PipelineError
from batch_assets.reliability.row_ids import FINGERPRINT_KEY, RowIdFingerprint, name_differences
from batch_assets.spec import PipelineSpec
from batch_assets.stages.report import PartitionReport, markdown_preview
from batch_assets.stages.sinks import lancedb as lance_sink
from batch_assets.storage import (
    ArrowStorage,
    ParquetPartitionWriter,
    atomic_output,
    filesystem_for,
    join,
    parquet_footer_metadata,
    parquet_schema,
    partition_file_name,
    read_batches,
    upstream_url,
)

EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}


def run_write(spec: PipelineSpec, storage: ArrowStorage, key: str) -> PartitionReport:
    """The write stage for one partition: publish the sink columns of `inferred` and the partition's dead letters
    (rows that failed), each committed atomically, only if every source row id appears exactly once."""
    import time

    from batch_assets.reliability.dead_letters import DeadLetterWriter, dead_letter_url

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
    expected = source_fingerprint(raw_url)
    published = RowIdFingerprint()  # O(1) memory, whatever the partition size
    head: list[pa.RecordBatch] = []
    counts = {"rows_in": 0, "errors": 0, "model_errors": 0}
    url = sink_url(spec, storage, key)
    dl_url = dead_letter_url(storage, spec.name, key)

    with DeadLetterWriter(spec, dl_url) as dead:
        def batches() -> Iterator[pa.RecordBatch]:
            for batch in read_batches(src, batch_rows=spec.source.batch_rows):
                counts["rows_in"] += batch.num_rows
                if "error" in batch.schema.names:
                    counts["errors"] += batch.num_rows - batch.column("error").null_count
                    failed = pc.is_valid(batch.column("error"))
                    if "_input_empty" in batch.schema.names:  # an empty input is a row error, not the model's
                        failed = pc.and_(failed, pc.invert(batch.column("_input_empty")))
                    counts["model_errors"] += pc.sum(failed).as_py() or 0
                published.add(batch)
                dead.add(batch)
                out = batch.select(columns)
                if sum(b.num_rows for b in head) < 5:
                    head.append(out.slice(0, 5))
                yield out
            # still inside the atomic write: a mismatch aborts it and nothing is committed
            verify_exactly_once(spec, key, expected, published, raw_url, src)

        rows = write_sink(spec, url, batches(), out_schema)
    from batch_assets.reliability.checkpoint import remove_partition_checkpoints

    remove_partition_checkpoints(storage, spec.name, key)  # published: a rerun must not resume from stale chunks
    # An empty partition (a quiet day, a hash shard no row hashes to) is published all the same: a file with the
    # sink's typed columns and no rows, so readers of every partition see one schema.
    empty = {"empty_partition": True} if expected.count == 0 else {}
    return PartitionReport(key, counts["rows_in"], rows, time.perf_counter() - start, url,
                           {"rows_in_source": expected.count, "dead_letters": dead.rows,
                            "model_errors": counts["model_errors"], **empty,
                            "dead_letters_path": dl_url},
                           rows_with_errors=counts["errors"], schema=_written_schema(spec, url, out_schema),
                           preview=markdown_preview(head, columns))


def _written_schema(spec: PipelineSpec, url: str, out_schema: pa.Schema) -> pa.Schema:
    """The schema as written: the vector-store table's own (with its partition column), else the sink columns."""
    if spec.sink.format != "lancedb":
        return out_schema
    database, table, _ = lance_sink.parse_partition_url(url)
    return lance_sink.connect(database).open_table(table).schema


def source_fingerprint(raw_url: str) -> RowIdFingerprint:
    """The fingerprint the read stage took of the source rows (a raw file from before it existed: recomputed)."""
    stored = parquet_footer_metadata(raw_url).get(FINGERPRINT_KEY)
    fp = RowIdFingerprint.from_json(stored) if stored else None
    if fp is not None:
        return fp
    fp = RowIdFingerprint()
    for batch in read_batches(raw_url, columns=["row_id"]):
        fp.add(batch)
    return fp


def verify_exactly_once(spec: PipelineSpec, key: str, expected: RowIdFingerprint, published: RowIdFingerprint,
                        raw_url: str, out_url: str) -> None:
    """Fail unless the published ids are the source ids, each once (prepare proved the source ids unique)."""
    if published == expected:
        return
    diff = name_differences(lambda: read_batches(raw_url, columns=["row_id"]),
                            lambda: read_batches(out_url, columns=["row_id"]))
    raise PipelineError(
        f"output would not hold every source row exactly once: {expected.count} source rows, {published.count} "
        f"output rows; {diff.missing_count} missing (e.g. {diff.missing}), {diff.repeated_count} repeated "
        f"(e.g. {diff.repeated}), {diff.unexpected_count} not in the source (e.g. {diff.unexpected})",
        pipeline=spec.name, partition=key,
        fix="re-materialize the upstream assets of this partition; if it persists, report a bug",
    )


def sink_url(spec: PipelineSpec, storage: ArrowStorage, partition: str) -> str:
    base = spec.sink.path or storage.default_sink(spec.name)
    if "://" not in base:
        from batch_assets.storage import resolve_local

        base = resolve_local(base)
    if spec.sink.format == "lancedb":
        return lance_sink.partition_url(base, spec.sink.table or spec.name, partition)
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
    if spec.sink.format == "lancedb":
        return lance_sink.write_partition(url, batches, schema, spec.prepare.id_column)
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
