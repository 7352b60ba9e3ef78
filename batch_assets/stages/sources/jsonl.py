"""JSON lines source files: one object per line, parsed in blocks (pyarrow's own streaming reader reads ahead
without bound)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.json as pajson

from batch_assets.errors import PipelineError
from batch_assets.spec import PipelineSpec
from batch_assets.stages.sources.common import BLOCK, first_bad_utf8_row, missing_columns
from batch_assets.storage import filesystem_for


def batches(spec: PipelineSpec, url: str) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    encoding = spec.source.encoding.lower().replace("_", "-")
    schema: pa.Schema | None = None
    with fs.open(path, "rb") as raw:
        try:
            for block in line_blocks(raw):
                if encoding not in ("utf-8", "utf8"):
                    block = block.decode(spec.source.encoding).encode("utf-8")
                # the first block fixes the column types, as pyarrow's own streaming reader does
                parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore") if schema \
                    else pajson.ParseOptions()
                table = pajson.read_json(pa.BufferReader(block), read_options=pajson.ReadOptions(use_threads=False),
                                         parse_options=parse)
                if schema is None:
                    missing_columns(spec, table.schema.names)
                    schema = table.schema
                for batch in table.select(spec.source.columns).to_batches(max_chunksize=spec.source.batch_rows):
                    check_utf8(spec, url, batch)
                    yield batch
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            message = str(exc)
            if isinstance(exc, UnicodeDecodeError) or "UTF8" in message or "encoding" in message.lower():
                raise PipelineError(
                    f"the file is not valid {spec.source.encoding}",
                    row=first_bad_utf8_row(url),
                    fix="re-encode the file as UTF-8, or set source.encoding in the spec",
                ) from None
            raise PipelineError(f"the JSON lines file could not be parsed: {message}",
                                fix="each line must be one JSON object") from None


def empty_schema(spec: PipelineSpec, url: str) -> pa.Schema | None:
    """A JSON lines file with no rows has no types either."""
    return None


def line_blocks(f, size: int = BLOCK) -> Iterator[bytes]:
    """The file in blocks of about `size` bytes, each ending at a line end: one block in memory at a time.

    pyarrow's streaming JSON reader reads ahead without bound (a 30 MB file was held whole), so we feed it blocks."""
    rest = b""
    while True:
        chunk = f.read(size)
        if not chunk:
            break
        data = rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        yield data[: cut + 1]
        rest = data[cut + 1 :]
    if rest.strip():
        yield rest


def check_utf8(spec: PipelineSpec, url: str, batch: pa.RecordBatch) -> None:
    """pyarrow's JSON reader passes invalid UTF-8 through into string columns; catch it here, by column and row,
    before a later stage trips over it."""
    for name in batch.schema.names:
        try:
            batch.column(name).validate(full=True)
        except pa.ArrowInvalid:
            line = first_bad_utf8_row(url)
            raise PipelineError(
                f"the file is not valid {spec.source.encoding}", column=name,
                row=None if line is None else line + 1,  # no header line in JSON lines
                fix="re-encode the file as UTF-8, or set source.encoding (e.g. latin-1, cp1252) in the spec",
            ) from None
