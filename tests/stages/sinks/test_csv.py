"""The CSV sink (stages/sinks/csv.py): a header and one record per row that CSV readers (Python's csv module,
pyarrow, spreadsheets) read back value for value, whatever the text holds; nested outputs (a transcript's segments)
as JSON text in their cell; vectors refused when the spec loads."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from batch_assets.spec import SpecError
from batch_assets.stages.sinks import sink_for
from tests.conftest import EMBED_SPEC, GENERATE_SPEC, make_spec

TRANSCRIBE = {  # tests/stages/test_transcribe_pipeline.py's pipeline
    "name": "calls",
    "source": {"format": "jsonl", "path": "PLACEHOLDER/{partition}.jsonl", "columns": ["call_id", "file_path"]},
    "partitioning": {"kind": "static", "keys": ["a", "b"]},
    "prepare": {"id_column": "call_id", "input_columns": ["file_path"]},
    "task": {"kind": "transcribe"},
    "model": {"provider": "faster_whisper", "config": {"batch_size": 8}},
}


def _write(tmp_path: Path, batches: list[pa.RecordBatch], schema: pa.Schema, base: dict | None = None) -> tuple[int, Path]:
    spec = make_spec(base or GENERATE_SPEC, tmp_path, sink={"format": "csv", "path": str(tmp_path / "out")})
    sink = sink_for("csv")
    url = sink.partition_url(str(tmp_path / "out"), spec, "p0")
    return sink.write(spec, url, iter(batches), schema), Path(url)


def test_text_with_commas_quotes_line_breaks_and_any_script_reads_back_as_written(tmp_path: Path) -> None:
    rows = [{"customer_id": "c1", "company": 'Acme, Inc. "the best"', "industry": "Other"},
            {"customer_id": "c2", "company": "line one\nline two\r\nline three", "industry": "Law Firm"},
            {"customer_id": "c3", "company": "café 日本語 مرحبا 🙂", "industry": None},
            {"customer_id": "c4", "company": "", "industry": "Technology"}]
    table = pa.Table.from_pylist(rows)
    written, path = _write(tmp_path, table.to_batches(max_chunksize=3), table.schema)
    assert written == 4
    with path.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert [r["company"] for r in back] == [r["company"] for r in rows]
    assert [r["customer_id"] for r in back] == ["c1", "c2", "c3", "c4"]
    # a null and an empty text stay apart for a reader that tells them apart
    read = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(newlines_in_values=True),
                          convert_options=pacsv.ConvertOptions(strings_can_be_null=True,
                                                               quoted_strings_can_be_null=False))
    assert read.to_pylist() == rows


def test_an_empty_partition_still_has_its_header(tmp_path: Path) -> None:
    schema = pa.schema([("customer_id", pa.string()), ("industry", pa.string()), ("error", pa.string())])
    written, path = _write(tmp_path, [], schema)
    assert written == 0
    assert path.read_text().splitlines() == ['"customer_id","industry","error"']


def test_a_transcript_s_segments_are_written_as_json_text_in_their_cell(tmp_path: Path) -> None:
    """The spec accepts a csv sink for transcribe, whose `segments` column is a list of structs: the partition must
    publish (it once failed at the write, after the model had run), each cell the JSON the jsonl sink writes."""
    make_spec(TRANSCRIBE, tmp_path, sink={"format": "csv"})  # accepted when the spec loads
    segment = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])
    schema = pa.schema([("call_id", pa.string()), ("text", pa.string()), ("segments", pa.list_(segment)),
                        ("meta", pa.map_(pa.string(), pa.int64())), ("error", pa.string())])
    rows = [{"call_id": "k1", "text": "hello, there", "error": None, "meta": [("words", 2)],
             "segments": [{"start": 0.0, "end": 1.5, "text": "hello,"}, {"start": 1.5, "end": 2.0, "text": "there"}]},
            {"call_id": "k2", "text": None, "segments": None, "meta": None, "error": "k2.wav: no such file"},
            {"call_id": "k3", "text": "", "segments": [], "meta": [], "error": None}]
    written, path = _write(tmp_path, [pa.RecordBatch.from_pylist(rows, schema)], schema,
                           base=TRANSCRIBE)
    assert written == 3
    with path.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert [json.loads(r["segments"]) if r["segments"] else None for r in back] == [rows[0]["segments"], None, []]
    assert [r["meta"] for r in back] == ['[["words", 2]]', "", "[]"]
    assert [r["text"] for r in back] == ["hello, there", "", ""] and back[1]["error"] == "k2.wav: no such file"


def test_vectors_are_refused_when_the_spec_loads(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="csv cannot hold embedding vectors"):
        make_spec(EMBED_SPEC, tmp_path, sink={"format": "csv"})
