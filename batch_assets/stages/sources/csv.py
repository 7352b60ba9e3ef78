"""CSV source files: the declared columns read as text, streamed block by block."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv

from batch_assets.errors import PipelineError
from batch_assets.spec import PipelineSpec
from batch_assets.stages.sources.common import BLOCK, first_bad_utf8_row, missing_columns
from batch_assets.storage import filesystem_for


def batches(spec: PipelineSpec, url: str) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    read_opts = pacsv.ReadOptions(encoding=spec.source.encoding, block_size=BLOCK)
    with fs.open(path, "rb") as f:
        try:
            header = pacsv.open_csv(f, read_options=read_opts).schema.names
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            raise csv_error(spec, url, exc, []) from None
    missing_columns(spec, header)
    # Declared columns are read as text: a streamed CSV infers types from its first block, and a later block
    # that disagrees would fail half-way. Templates and ids are text anyway.
    convert = pacsv.ConvertOptions(
        include_columns=spec.source.columns, column_types={c: pa.string() for c in spec.source.columns}
    )
    with fs.open(path, "rb") as f:
        try:
            reader = pacsv.open_csv(f, read_options=read_opts, convert_options=convert)
            for batch in reader:
                yield batch
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            raise csv_error(spec, url, exc, header) from None


def empty_schema(spec: PipelineSpec, url: str) -> pa.Schema | None:
    """A CSV file stores no types: the declared columns are read as text."""
    return None


def csv_error(spec: PipelineSpec, url: str, exc: Exception, header: list[str]) -> PipelineError:
    message = str(exc)
    if "UTF8" in message or "utf-8" in message.lower() or isinstance(exc, UnicodeDecodeError):
        row = first_bad_utf8_row(url)
        m = re.search(r"column #(\d+)", message)
        column = header[int(m.group(1))] if m and header and int(m.group(1)) < len(header) else None
        return PipelineError(
            f"the file is not valid {spec.source.encoding}",
            column=column,
            row=row,
            fix="re-encode the file as UTF-8, or set source.encoding (e.g. latin-1, cp1252) in the spec",
        )
    if "Empty CSV file" in message:
        return PipelineError("the CSV file is empty", fix="remove it or add its header and rows")
    return PipelineError(f"the CSV file could not be parsed: {message}", fix="check quoting and the column count")
