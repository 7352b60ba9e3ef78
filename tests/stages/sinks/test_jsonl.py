"""The JSON lines sink (stages/sinks/jsonl.py): one valid JSON object per row and line, whatever the values hold
(line breaks, any script, bytes, dates, times, decimals, non-finite floats), so that any JSON reader reads it back."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pytest

from batch_assets.stages.sinks import sink_for
from tests.conftest import EMBED_SPEC, make_spec


def _strict(line: str) -> dict:
    """JSON as the standard has it (RFC 8259): NaN and Infinity are not JSON, and jq, JavaScript and Arrow refuse
    them."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


def _write(tmp_path: Path, batches: list[pa.RecordBatch], schema: pa.Schema) -> tuple[int, Path]:
    spec = make_spec(EMBED_SPEC, tmp_path, sink={"format": "jsonl", "path": str(tmp_path / "out")})
    sink = sink_for("jsonl")
    url = sink.partition_url(str(tmp_path / "out"), spec, "a")
    return sink.write(spec, url, iter(batches), schema), Path(url)


def test_one_object_per_row_and_line_with_text_as_it_is(tmp_path: Path) -> None:
    rows = [{"doc_id": "d1", "text": "line one\nline two\r\n\ttab \"quoted\" \\ back", "n": 1},
            {"doc_id": "d2", "text": "café 日本語 مرحبا 🙂 \u2028 \x00", "n": None},
            {"doc_id": "d3", "text": None, "n": 2**62}]
    table = pa.Table.from_pylist(rows)
    written, path = _write(tmp_path, table.to_batches(max_chunksize=2), table.schema)
    lines = path.read_text(encoding="utf-8").split("\n")
    assert written == 3 and lines[-1] == "" and len(lines) == 4  # one line per row, each ended by a newline
    assert [_strict(line) for line in lines[:-1]] == rows
    assert "日本語" in lines[1]  # written as UTF-8, not \u escapes
    assert pajson.read_json(path).to_pylist() == rows  # and a JSON reader that is not Python's reads it too


def test_bytes_dates_times_and_decimals_have_a_json_form(tmp_path: Path) -> None:
    schema = pa.schema([("raw", pa.binary()), ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")),
                        ("at_ns", pa.timestamp("ns")), ("clock", pa.time64("us")), ("took", pa.duration("ms")),
                        ("price", pa.decimal128(10, 2))])
    row = {"raw": b"\x00\xffpng", "day": dt.date(2026, 11, 26),
           "at": dt.datetime(2026, 11, 26, 13, 5, 1, 250000, tzinfo=dt.timezone.utc),
           "at_ns": dt.datetime(2026, 11, 26, 13, 5, 1), "clock": dt.time(13, 5, 1, 500000),
           "took": dt.timedelta(seconds=90, milliseconds=500), "price": Decimal("12.50")}
    written, path = _write(tmp_path, [pa.RecordBatch.from_pylist([row, dict.fromkeys(row)], schema)], schema)
    got = [_strict(line) for line in path.read_text().splitlines()]
    assert written == 2
    assert got[0] == {"raw": base64.b64encode(b"\x00\xffpng").decode(), "day": "2026-11-26",
                      "at": "2026-11-26T13:05:01.250000+00:00", "at_ns": "2026-11-26T13:05:01",
                      "clock": "13:05:01.500000", "took": "PT90.5S", "price": "12.50"}
    assert got[1] == dict.fromkeys(row)


def test_nan_and_infinity_are_written_as_null_so_the_file_stays_json(tmp_path: Path) -> None:
    """A float column from a pandas-written source holds NaN for a missing value; a model can answer inf. JSON has no
    form for either: null (as pandas' to_json and JavaScript's JSON.stringify write them), never `NaN`, which no
    strict JSON reader accepts."""
    schema = pa.schema([("id", pa.string()), ("score", pa.float64()), ("embedding", pa.list_(pa.float32()))])
    rows = [{"id": "a", "score": math.nan, "embedding": [1.0, math.nan]},
            {"id": "b", "score": math.inf, "embedding": [-math.inf, 2.0]},
            {"id": "c", "score": 0.5, "embedding": [0.25, 2.0]}]
    written, path = _write(tmp_path, [pa.RecordBatch.from_pylist(rows, schema)], schema)
    got = [_strict(line) for line in path.read_text().splitlines()]
    assert written == 3
    assert got == [{"id": "a", "score": None, "embedding": [1.0, None]},
                   {"id": "b", "score": None, "embedding": [None, 2.0]},
                   {"id": "c", "score": 0.5, "embedding": [0.25, 2.0]}]


def test_nested_values_are_json_objects_and_arrays(tmp_path: Path) -> None:
    segment = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])
    schema = pa.schema([("id", pa.string()), ("segments", pa.list_(segment))])
    rows = [{"id": "a", "segments": [{"start": 0.0, "end": 1.5, "text": "hello"}]}, {"id": "b", "segments": []},
            {"id": "c", "segments": None}]
    written, path = _write(tmp_path, [pa.RecordBatch.from_pylist(rows, schema)], schema)
    assert [_strict(line) for line in path.read_text().splitlines()] == rows


@pytest.mark.parametrize("batches", [0, 1])
def test_an_empty_partition_is_an_empty_file(tmp_path: Path, batches: int) -> None:
    schema = pa.schema([("id", pa.string())])
    written, path = _write(tmp_path, [pa.RecordBatch.from_pylist([], schema)] * batches, schema)
    assert written == 0 and path.read_bytes() == b""
