"""What every sink provides, and the shared part of the one-file-per-partition formats (parquet, jsonl, csv)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Protocol

import pyarrow as pa

from batch_assets.errors import Problems
from batch_assets.spec_sections import PipelineSections
from batch_assets.storage import atomic_output, filesystem_for, join, partition_file_name

# The `sink` fields only some formats read; each sink lists those it reads in its `options`. A sink that sets one its
# format does not read is refused at load: ignored, `table: docs` on a parquet sink would change nothing, unsaid.
SINK_OPTIONS = ("table",)


def option_problems(spec: PipelineSections, options: frozenset[str], why: str | None = None) -> Problems:
    """A sink field of SINK_OPTIONS that this format does not read, set to anything but its default, as a problem
    naming the field and the format. `why`: what the format does instead."""
    sink, fields = spec.sink, type(spec.sink).model_fields
    because = f" ({why})" if why else ""
    return [(f"sink.{name}", f"does not apply to a {sink.format} sink{because}: remove it")
            for name in SINK_OPTIONS
            if name not in options and getattr(sink, name) != fields[name].get_default(call_default_factory=True)]


class Sink(Protocol):
    # False: the write stage hands the sink only the rows that succeeded (the failed ones are in the dead letters);
    # for a store that cannot hold a failed row's empty output (a vector store and its null vector).
    keeps_failed_rows: bool
    options: frozenset[str]  # the fields of SINK_OPTIONS this format reads (a spec setting another is refused)

    def partition_url(self, base: str, spec: PipelineSections, partition: str) -> str:
        """Where `partition` is published, under the sink's base folder or database (`sink.path` or the default)."""

    def write(self, spec: PipelineSections, url: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        """Stream `batches` into `url`; returns rows written. Visible only when complete (one commit)."""

    def written_schema(self, url: str, schema: pa.Schema) -> pa.Schema:
        """The schema as published (a table may add its own columns)."""

    def spec_problems(self, spec: PipelineSections) -> Problems:
        """(field, problem) for what the spec asks that this sink cannot do, its unread options included; checked
        at load."""


class FileSink:
    """One file per partition, `<base>/<partition>.<extension>`, written beside its target and swapped in."""

    extension = ""
    keeps_failed_rows = True  # a file keeps every row, failed ones with their `error`
    options: frozenset[str] = frozenset()

    def partition_url(self, base: str, spec: PipelineSections, partition: str) -> str:
        return join(base, partition_file_name(partition, self.extension))

    def write(self, spec: PipelineSections, url: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        fs, path = filesystem_for(url)
        with atomic_output(fs, path) as f:
            return self.write_file(f, batches, schema)

    def write_file(self, f: IO[bytes], batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        raise NotImplementedError

    def written_schema(self, url: str, schema: pa.Schema) -> pa.Schema:
        return schema

    def spec_problems(self, spec: PipelineSections) -> Problems:
        return option_problems(spec, self.options, f"one {self.extension} file per partition under sink.path; "
                                                   "a table is named by a lancedb sink")
