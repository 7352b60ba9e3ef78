"""JSON lines output files: one object per row (bytes as base64, dates as ISO 8601, decimals as strings)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import IO, Any

import pyarrow as pa

from batch_assets.stages.sinks.base import FileSink


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


class JsonlSink(FileSink):
    extension = "jsonl"

    def write_file(self, f: IO[bytes], batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        rows = 0
        for batch in batches:
            lines = "".join(json.dumps(r, default=_json_default, ensure_ascii=False) + "\n" for r in batch.to_pylist())
            f.write(lines.encode("utf-8"))
            rows += batch.num_rows
        return rows


SINK = JsonlSink()
