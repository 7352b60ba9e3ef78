"""CSV output files (no vectors: a list column has no CSV form)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

import pyarrow as pa
import pyarrow.csv as pacsv

from batch_assets.spec_sections import PipelineSections
from batch_assets.stages.sinks.base import FileSink, Problems
from batch_assets.tasks import task_type


class CsvSink(FileSink):
    extension = "csv"

    def write_file(self, f: IO[bytes], batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        rows = 0
        with pacsv.CSVWriter(f, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        return rows

    def spec_problems(self, spec: PipelineSections) -> Problems:
        vectors = [("sink.format", "csv cannot hold embedding vectors: use parquet or jsonl")] \
            if task_type(spec).vectors else []
        return vectors + super().spec_problems(spec)


SINK = CsvSink()
