"""Parquet source files: the declared columns, row group by row group, with the file's own types."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from batch_assets.errors import PipelineError, transient_failure
from batch_assets.spec_sections import PipelineSections
from batch_assets.stages.sources.common import Problems, option_problems, missing_columns
from batch_assets.storage import filesystem_for


# The source fields of common.FORMAT_OPTIONS this format reads (a spec setting another is refused).
OPTIONS = frozenset({"types", "sample"})


def spec_problems(spec: PipelineSections) -> Problems:
    """What the spec asks that this format cannot do (its footers hold the row counts by_size asks for)."""
    return option_problems(spec, OPTIONS, "a Parquet file holds its own encoding and row groups")


def batches(spec: PipelineSections, url: str) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        try:
            pf = pq.ParquetFile(f, pre_buffer=False)  # else every row group is fetched up front
        except pa.ArrowInvalid as exc:
            raise PipelineError(f"the file is not a readable Parquet file: {exc}",
                                fix="check source.format") from None
        missing_columns(spec, pf.schema_arrow.names)
        try:
            yield from pf.iter_batches(batch_size=spec.source.batch_rows, columns=spec.source.columns)
        except (pa.ArrowInvalid, OSError) as exc:
            # Arrow reports damaged pages as a plain OSError ("Couldn't deserialize thrift"); an outage of the store
            # (a dropped connection, a timeout) is raised as it is, for the step's retry policy.
            if type(exc) not in (OSError, pa.ArrowInvalid) or transient_failure(exc):
                raise
            raise PipelineError(f"the Parquet file is damaged: {str(exc).strip().splitlines()[0]}",
                                fix="re-export or copy the file again (its footer reads, a row group does not)") from None


def empty_schema(spec: PipelineSections, url: str) -> pa.Schema | None:
    """The file's own column types, from its footer (a file with no rows still has them)."""
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f, pre_buffer=False).schema_arrow
