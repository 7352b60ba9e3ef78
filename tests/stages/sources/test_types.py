"""Column types at read (stages/sources/types.py): every batch of a file conformed to one schema; a value that does
not convert is null plus a row error naming column, value, type, file and row, never a wrapped-around number, a
truncated float or a lost row."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa

from batch_assets.stages.sources.types import BAD_VALUE, conform, target_schema
from tests.conftest import EMBED_SPEC, make_spec

URL = "s3://bucket/in/a.csv"


def _spec(tmp_path: Path, columns: list[str], types: dict[str, str]):
    return make_spec(EMBED_SPEC, tmp_path, source={"format": "csv", "path": str(tmp_path / "{partition}.csv"),
                                                  "columns": ["doc_id", "text", *columns], "types": types})


def test_declared_types_else_the_first_batch_s_and_text_where_it_held_no_value(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ["price", "n", "empty"], {"price": "float64"})
    first = pa.schema([("doc_id", pa.string()), ("text", pa.string()), ("price", pa.string()), ("n", pa.int32()),
                       ("empty", pa.null())])
    schema = target_schema(spec, first)
    assert [(f.name, f.type) for f in schema] == [("doc_id", pa.string()), ("text", pa.string()),
                                                  ("price", pa.float64()), ("n", pa.int32()), ("empty", pa.string())]


def test_values_convert_as_people_write_them_and_each_bad_one_is_its_row_s_error(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ["price", "qty", "day", "ok"],
                 {"price": "float64", "qty": "int32", "day": "date32", "ok": "bool"})
    batch = pa.RecordBatch.from_pylist([
        {"doc_id": "a", "text": "t", "price": " 12.5 ", "qty": "3", "day": "2026-11-26", "ok": "true"},
        {"doc_id": "b", "text": "t", "price": "", "qty": None, "day": "", "ok": "false"},
        {"doc_id": "c", "text": "t", "price": "12,99", "qty": "3.7", "day": "26/11/2026", "ok": "1"},
        {"doc_id": "d", "text": "t", "price": "1e3", "qty": str(2**40), "day": "2026-02-28", "ok": "maybe"},
    ], schema=pa.schema([(c, pa.string()) for c in ("doc_id", "text", "price", "qty", "day", "ok")]))
    schema = target_schema(spec, batch.schema)
    columns, errors = conform(batch, schema, URL, first_row=41)
    out = pa.RecordBatch.from_arrays(columns, schema=schema).to_pylist()
    assert [r["price"] for r in out] == [12.5, None, None, 1000.0]
    assert [r["qty"] for r in out] == [3, None, None, None]  # never 3 from "3.7", never a wrapped-around 2**40
    assert [r["day"] for r in out] == [dt.date(2026, 11, 26), None, None, dt.date(2026, 2, 28)]
    assert [r["ok"] for r in out] == [True, False, True, None]
    assert errors[0] is None and errors[1] is None  # "" is no value, not a bad one
    assert errors[2].startswith(BAD_VALUE) and errors[2].count(BAD_VALUE) == 3  # every bad value of the row named
    assert "column 'price' holds '12,99', not double [file 's3://bucket/in/a.csv', row 43]" in errors[2]
    assert "column 'qty' holds '3.7', not int32" in errors[2] and "column 'day' holds '26/11/2026'" in errors[2]
    assert f"column 'qty' holds '{2**40}', not int32 [file '{URL}', row 44]" in errors[3]
    assert "column 'ok' holds 'maybe', not bool" in errors[3]
    assert "What to do: correct the value in the source" in errors[3]


def test_a_later_batch_of_another_type_is_cast_to_the_first_s(tmp_path: Path) -> None:
    """jsonl: `score` was int64 in the first block and is float64 later: 2.0 casts, 2.5 is a row error."""
    spec = _spec(tmp_path, ["score"], {})
    first = pa.schema([("doc_id", pa.string()), ("text", pa.string()), ("score", pa.int64())])
    later = pa.RecordBatch.from_pylist([{"doc_id": "a", "text": "t", "score": 2.0},
                                        {"doc_id": "b", "text": "t", "score": 2.5},
                                        {"doc_id": "c", "text": "t", "score": None}])
    schema = target_schema(spec, first)
    columns, errors = conform(later, schema, URL, first_row=1)
    assert columns[2].type == pa.int64() and columns[2].to_pylist() == [2, None, None]
    assert errors[0] is None and errors[2] is None and "column 'score' holds 2.5, not int64" in errors[1]


def test_a_long_bad_value_is_shortened_in_the_message(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ["price"], {"price": "float64"})
    batch = pa.RecordBatch.from_pylist([{"doc_id": "a", "text": "t", "price": "x" * 500}])
    _, errors = conform(batch, target_schema(spec, batch.schema), URL, first_row=1)
    assert "..." in errors[0] and len(errors[0]) < 400
