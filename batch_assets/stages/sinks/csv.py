"""CSV output files (no vectors: a list column has no CSV form). Other nested values (a transcript's segments, a
struct or map a source column holds) are written as their JSON text, the JSON the jsonl sink writes for them: a CSV
writer has no form for them either, and the spec cannot know a source column's type when it loads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

import pyarrow as pa
import pyarrow.csv as pacsv

from batch_assets.spec_sections import PipelineSections
from batch_assets.stages.sinks.base import FileSink, Problems
from batch_assets.stages.sinks.jsonl import json_text
from batch_assets.tasks import task_type


def cell_schema(schema: pa.Schema) -> pa.Schema:
    """The schema as written: nested columns as text."""
    return pa.schema([pa.field(f.name, pa.string(), f.nullable) if pa.types.is_nested(f.type) else f for f in schema])


def _cells(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema == schema:
        return batch
    arrays = [pa.array([None if v is None else json_text(v) for v in column.to_pylist()], pa.string())
              if pa.types.is_nested(column.type) else column for column in batch.columns]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class CsvSink(FileSink):
    extension = "csv"

    def write_file(self, f: IO[bytes], batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        rows = 0
        written = cell_schema(schema)
        with pacsv.CSVWriter(f, written) as writer:
            for batch in batches:
                writer.write_batch(_cells(batch, written))
                rows += batch.num_rows
        return rows

    def written_schema(self, url: str, schema: pa.Schema) -> pa.Schema:
        return cell_schema(schema)

    def spec_problems(self, spec: PipelineSections) -> Problems:
        vectors = [("sink.format", "csv cannot hold embedding vectors: use parquet or jsonl")] \
            if task_type(spec).vectors else []
        return vectors + super().spec_problems(spec)


SINK = CsvSink()
