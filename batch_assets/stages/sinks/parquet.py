"""Parquet output files: row group by row group, with the footer metadata every stage's files carry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

import pyarrow as pa

from batch_assets.stages.sinks.base import FileSink
from batch_assets.storage import ParquetPartitionWriter


class ParquetSink(FileSink):
    extension = "parquet"

    def write_file(self, f: IO[bytes], batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        writer = ParquetPartitionWriter(f, schema)
        try:
            for batch in batches:
                writer.write(batch)
        except BaseException:
            writer.abort()
            raise
        writer.close(schema)
        return writer.rows


SINK = ParquetSink()
