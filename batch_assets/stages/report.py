"""What a stage reports about one partition, and how that becomes Dagster materialization metadata.

Every partition's materialization carries its own typed metadata (ints and floats that Dagster plots across
partitions and runs, Dagster's standard `dagster/row_count` and `dagster/column_schema`, a path and a markdown
preview), also when one run materializes a range of partitions: the factory attaches it per partition key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import dagster as dg
import pyarrow as pa

from batch_assets.storage import parquet_schema, read_batches

PREVIEW_ROWS = 5


@dataclass
class PartitionReport:
    """One stage's outcome for one partition.

    `rows_in` is what the stage read (source rows scanned, upstream rows), `rows_out` what it wrote; they differ
    only where the stage filters (a hash shard keeps its share of the source). `schema` is the written file's
    schema (read from the Parquet footer when not given); `extra` holds raw values (int, float, str, bool) or
    ready-made `dg.MetadataValue`s.
    """

    key: str
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    rows_with_errors: int | None = None
    schema: pa.Schema | None = None
    preview: str | None = None


def table_schema(schema: pa.Schema) -> dg.TableSchema:
    """The Arrow schema as Dagster's TableSchema, so the UI lists the output's columns and types."""
    return dg.TableSchema(
        columns=[dg.TableColumn(name=f.name, type=str(f.type),
                                constraints=None if f.nullable else dg.TableColumnConstraints(nullable=False))
                 for f in schema]
    )


def _typed(value: Any) -> Any:
    if isinstance(value, dg.MetadataValue) or isinstance(value, dg.TableSchema):
        return value
    if isinstance(value, bool):
        return dg.MetadataValue.bool(value)
    if isinstance(value, int):
        return dg.MetadataValue.int(value)
    if isinstance(value, float):
        return dg.MetadataValue.float(value)
    return dg.MetadataValue.text(str(value))


def partition_metadata(report: PartitionReport) -> dict[str, Any]:
    """The metadata of one partition's materialization."""
    rate = report.rows_out / report.seconds if report.seconds > 0 else 0.0
    md: dict[str, Any] = {
        "dagster/row_count": dg.MetadataValue.int(report.rows_out),
        "rows_in": dg.MetadataValue.int(report.rows_in),
        "rows_out": dg.MetadataValue.int(report.rows_out),
        "duration_s": dg.MetadataValue.float(round(report.seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(rate, 1)),
        "path": dg.MetadataValue.path(report.path),
    }
    if report.schema is not None:
        md["dagster/column_schema"] = table_schema(report.schema)
    for name, value in report.extra.items():
        md[name] = _typed(value)
    errors = report.rows_with_errors if report.rows_with_errors is not None else report.extra.get("rows_with_errors")
    if errors is not None:
        md["rows_with_errors"] = dg.MetadataValue.int(int(errors))
        md["error_rate"] = dg.MetadataValue.float(round(error_fraction(report), 6))
    if report.preview is not None:
        md["preview"] = dg.MetadataValue.md(report.preview)
    return md


def error_fraction(report: PartitionReport) -> float:
    """The partition's error rate: where the model ran (`model_errors` reported), the rows the model failed on over
    all rows -- the number the blocking `error_rate` check compares with max_error_fraction (rows with an empty
    input are reported as `rows_with_errors`, not counted); elsewhere every row error over all rows."""
    errors = report.rows_with_errors if report.rows_with_errors is not None else report.extra.get("rows_with_errors")
    failed = report.extra.get("model_errors", errors) or 0
    return int(failed) / report.rows_out if report.rows_out else 0.0


def run_totals(reports: list[PartitionReport]) -> dict[str, Any]:
    """Metadata of the run as a whole; only for a run over one partition is it also that partition's metadata.

    In a multi-partition run every partition already has its own metadata (keys here would be merged into each
    partition's event, so they are named so they cannot be mistaken for one partition's values).
    """
    if len(reports) == 1:
        return {}
    keys = [r.key for r in reports]
    totals: dict[str, Any] = {
        "run_partitions": dg.MetadataValue.int(len(reports)),
        # which partitions: the asset's "latest materialization" is one of them, these say it was one of several
        "run_partition_keys": dg.MetadataValue.text(
            ", ".join(keys[:8]) + (f", … ({len(keys)} in all)" if len(keys) > 8 else "")),
        "run_rows_out": dg.MetadataValue.int(sum(r.rows_out for r in reports)),
        "run_duration_s": dg.MetadataValue.float(round(sum(r.seconds for r in reports), 3)),
    }
    folders = {r.path.rsplit("/", 1)[0] for r in reports if r.path}
    if len(folders) == 1:  # every partition's file side by side (hash shards, days): the run's output as a whole
        totals["run_output_folder"] = dg.MetadataValue.path(folders.pop())
    return totals


def counter_delta(after: Any, before: Any) -> dict[str, int]:
    """Per-partition values of a run's running counters (every int field of a dataclass such as InferStats)."""
    return {f.name: getattr(after, f.name) - getattr(before, f.name)
            for f in fields(after) if isinstance(getattr(after, f.name), int)}


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(f'{v:.3f}' if isinstance(v, float) else str(v) for v in value[:3])}, … {len(value)} values]"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    text = "" if value is None else str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "…"


def markdown_preview(batches: list[pa.RecordBatch], columns: list[str], rows: int = PREVIEW_ROWS) -> str:
    records = [r for b in batches for r in b.to_pylist()][:rows]
    if not records:
        return "_no rows_"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def preview_of(url: str, columns: list[str], rows: int = PREVIEW_ROWS) -> str:
    """A markdown table of the first rows of a written Parquet file (reads one small batch, not the file)."""
    present = [c for c in columns if c in parquet_schema(url).names]
    for batch in read_batches(url, columns=present, batch_rows=rows):
        return markdown_preview([batch], present, rows)
    return "_no rows_"
