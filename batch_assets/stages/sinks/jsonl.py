"""JSON lines output files: one object per row (bytes as base64, dates and times as ISO 8601, durations as ISO 8601
durations, decimals as strings, NaN and infinities as null)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import IO, Any

import pyarrow as pa

from batch_assets.stages.sinks.base import FileSink


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        # ISO 8601 duration in seconds (microseconds: what Python's timedelta holds), e.g. PT90.5S
        seconds = f"{abs(value.total_seconds()):.6f}".rstrip("0").rstrip(".")
        return f"{'-' if value < timedelta(0) else ''}PT{seconds}S"
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _finite(value: Any) -> Any:
    """NaN and infinities have no JSON form (Python would write `NaN`, which jq, JavaScript and Arrow refuse): null,
    as pandas' to_json and JavaScript's JSON.stringify write them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """One value (a row, a list, a struct) as strict JSON text, UTF-8 kept as it is."""
    try:
        return json.dumps(value, default=_json_default, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere in it (rare: the walk costs only then)
        return json.dumps(_finite(value), default=_json_default, ensure_ascii=False, allow_nan=False)


class JsonlSink(FileSink):
    extension = "jsonl"

    def write_file(self, f: IO[bytes], batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        rows = 0
        for batch in batches:
            lines = "".join(json_text(r) + "\n" for r in batch.to_pylist())
            f.write(lines.encode("utf-8"))
            rows += batch.num_rows
        return rows


SINK = JsonlSink()
