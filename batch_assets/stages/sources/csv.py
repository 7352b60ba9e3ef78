"""CSV source files: the declared columns read as text, streamed block by block."""

from __future__ import annotations

import codecs
import csv
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv

from batch_assets.errors import PipelineError
from batch_assets.spec_sections import PipelineSections
from batch_assets.stages.sources.common import Problems, option_problems, first_bad_utf8_row, missing_columns, no_row_count_problems
from batch_assets.storage import filesystem_for


# The source fields of common.FORMAT_OPTIONS this format reads (a spec setting another is refused).
OPTIONS = frozenset({"encoding", "block_size", "types", "sample"})


def spec_problems(spec: PipelineSections) -> Problems:
    """What the spec asks that this format cannot do (spec.PipelineSpec asks at load)."""
    return option_problems(spec, OPTIONS) + no_row_count_problems(spec)


def batches(spec: PipelineSections, url: str) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    block = spec.source.block_size
    while True:  # the first block must hold the header and the first row
        with fs.open(path, "rb") as f:
            try:
                header = pacsv.open_csv(f, read_options=_read_options(spec, block),
                                         parse_options=PARSE_OPTIONS).schema.names
                break
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                if _grow(exc, fs.size(path), block):
                    block = _grow(exc, fs.size(path), block)
                    continue
                raise csv_error(spec, url, exc, []) from None
    missing_columns(spec, header)
    # Declared columns are read as text: a streamed CSV infers types from its first block, and a later block
    # that disagrees would fail half-way. The read stage casts the columns declared in source.types, row by row.
    convert = pacsv.ConvertOptions(
        include_columns=spec.source.columns, column_types={c: pa.string() for c in spec.source.columns}
    )
    done = 0  # rows already yielded: a read again with a larger block skips them
    while True:
        with fs.open(path, "rb") as raw:
            f = _QuoteCounter(raw)
            try:
                skip = done
                for batch in pacsv.open_csv(f, read_options=_read_options(spec, block), parse_options=PARSE_OPTIONS,
                                             convert_options=convert):
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    batch, skip = batch.slice(skip), 0
                    done += batch.num_rows
                    yield batch
                if f.quotes % 2:  # the read stage commits only when this generator ends without an error
                    _check_quotes_closed(spec, url)
                return
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                if _grow(exc, fs.size(path), block):
                    block = _grow(exc, fs.size(path), block)
                    continue
                raise csv_error(spec, url, exc, header) from None


class _QuoteCounter:
    """The source file as pyarrow reads it, counting quote characters on the way (bytes.count: no second read).
    Quotes come in pairs in well-formed CSV (open, close, doubled inside); an odd count is the one cheap sign of a
    quoted value never closed, which pyarrow (and Python's csv unless strict) reads silently to the end of the file,
    swallowing every row after it into one value."""

    def __init__(self, f):
        self._f, self.quotes, self.closed = f, 0, False

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self.quotes += data.count(b'"')
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _check_quotes_closed(spec: PipelineSections, url: str) -> None:
    """Error path only (an odd quote count: a value never closed, or a stray quote inside an unquoted value, which
    is fine): Python's csv module in strict mode tells them apart, and names the row the open quote is in."""
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as raw:
        text = codecs.getreader(spec.source.encoding)(raw, errors="replace")
        reader = csv.reader((line.removeprefix("\ufeff") for line in text), strict=True)
        rows = -1  # the header is not a data row
        try:
            for fields in reader:
                rows += 1 if fields else 0
        except csv.Error as exc:
            if "unexpected end of data" not in str(exc):
                return  # another irregularity pyarrow reads its own way: not ours to refuse here
            raise PipelineError(
                f"the CSV file ends inside a quoted value opened in data row {rows + 1}: every line after that quote "
                "would be read as part of that one value, and the rows there lost", row=rows + 1,
                fix="the file was cut off, or a quote in that row is not closed: re-export or copy the file again, "
                "or close the quote (a quote inside a quoted value is written twice: \"\")") from None


def _grow(exc: Exception, size: int, block: int) -> int | None:
    """A larger block when a row did not fit in one (a 4 MB description): the read goes on with a block that holds
    it, found by growing fourfold (at most the file's size)."""
    if "straddl" in str(exc) and block <= size:
        return min(block * 4, size + 1)
    return None


def _read_options(spec: PipelineSections, block: int) -> pacsv.ReadOptions:
    return pacsv.ReadOptions(encoding=spec.source.encoding, block_size=block)


# Line breaks inside quoted values are CSV as Python, Excel and most exporters write it. Without this pyarrow cuts
# blocks at line ends, and a value whose break fell on a block boundary failed the read ("CSV parser got out of
# sync with chunker"): only files over one block, so small test files never showed it.
PARSE_OPTIONS = pacsv.ParseOptions(newlines_in_values=True)


def empty_schema(spec: PipelineSections, url: str) -> pa.Schema | None:
    """A CSV file stores no types: the declared columns are read as text."""
    return None


def csv_error(spec: PipelineSections, url: str, exc: Exception, header: list[str]) -> PipelineError:
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
    return PipelineError(f"the CSV file could not be parsed: {message}", row=first_ragged_row(spec, url),
                         fix="check quoting and the column count")


def first_ragged_row(spec: PipelineSections, url: str) -> int | None:
    """Error path only: the data row (1-based, after the header) whose field count differs from the header's, which
    pyarrow's streaming reader does not number (a file cut off mid-row, a stray delimiter). Python's csv module
    reads quoted line breaks as pyarrow does, so the count is in records, not lines."""
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as raw:
        text = codecs.getreader(spec.source.encoding)(raw, errors="replace")
        reader = csv.reader((line.removeprefix("\ufeff") if i == 0 else line for i, line in enumerate(text)))
        try:
            width, row = len(next(reader)), 0
            for fields in reader:
                if not fields:  # a blank line is no row, to pyarrow either
                    continue
                row += 1
                if len(fields) != width:
                    return row
        except (StopIteration, csv.Error):
            return None
    return None
