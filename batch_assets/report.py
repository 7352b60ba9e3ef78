"""What a stage reports about one partition, and how that becomes Dagster materialization metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import pyarrow as pa


@dataclass
class PartitionReport:
    """One stage's outcome for one partition: rows in and out, time, where it landed, stage-specific extras.

    `extra` holds raw values (int, float, str) or ready-made `dg.MetadataValue`s; `summary_metadata` sums the
    numeric ones across the partitions of a run.
    """

    key: str
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def partition_metadata(report: PartitionReport) -> dict[str, Any]:
    """The metadata of one partition's materialization."""
    md: dict[str, Any] = {
        "rows_in": dg.MetadataValue.int(report.rows_in),
        "rows_out": dg.MetadataValue.int(report.rows_out),
        "duration_s": dg.MetadataValue.float(round(report.seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(report.rows_out / report.seconds, 1) if report.seconds else 0.0),
        "path": dg.MetadataValue.path(report.path),
    }
    for name, value in report.extra.items():
        md[name] = value
    return md


def summary_metadata(reports: list[PartitionReport], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run-level metadata over every partition of the run (one partition: that partition's own metadata)."""
    if len(reports) == 1:
        md = partition_metadata(reports[0])
        md.update(extra or {})
        return md
    rows_in = sum(r.rows_in for r in reports)
    rows_out = sum(r.rows_out for r in reports)
    seconds = sum(r.seconds for r in reports)
    md = {
        "rows_in": dg.MetadataValue.int(rows_in),
        "rows_out": dg.MetadataValue.int(rows_out),
        "duration_s": dg.MetadataValue.float(round(seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(rows_out / seconds, 1) if seconds else 0.0),
        "path": dg.MetadataValue.text(", ".join(r.path for r in reports)),
        "partitions": dg.MetadataValue.json(
            {r.key: {"rows_in": r.rows_in, "rows_out": r.rows_out, "seconds": round(r.seconds, 3), "path": r.path,
                     **{k: v for k, v in r.extra.items() if isinstance(v, (int, float, str))}} for r in reports}
        ),
    }
    md.update(extra or {})
    return md


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return f"[{', '.join(f'{v:.3f}' if isinstance(v, float) else str(v) for v in value[:3])}, … {len(value)} values]"
    text = "" if value is None else str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "…"


def markdown_preview(batches: list[pa.RecordBatch], columns: list[str], rows: int = 5) -> str:
    records = [r for b in batches for r in b.to_pylist()][:rows]
    if not records:
        return "_no rows_"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)
