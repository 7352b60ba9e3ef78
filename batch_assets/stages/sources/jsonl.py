"""JSON lines source files: one object per line, parsed in blocks (pyarrow's own streaming reader reads ahead
without bound).

Only the declared columns are parsed: after the first block, pyarrow gets them as an explicit schema and ignores
every other field, so an unused field whose JSON kind changes from line to line never fails the read. A block that
pyarrow refuses (a declared column whose kind changes, a line it cannot parse) is parsed again line by line with
the standard library: values of the wrong kind come out as text (the read stage then casts them and makes each
value that does not convert a row error), and a line that is not a JSON object fails the read naming the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.json as pajson

from batch_assets.errors import PipelineError
from batch_assets.spec_sections import PipelineSections
from batch_assets.stages.sources.common import Problems, option_problems, first_bad_utf8_row, missing_columns, no_row_count_problems
from batch_assets.stages.sources.types import declared_types
from batch_assets.storage import filesystem_for

BOM = b"\xef\xbb\xbf"


# The source fields of common.FORMAT_OPTIONS this format reads (a spec setting another is refused).
OPTIONS = frozenset({"encoding", "block_size", "types", "sample"})


def spec_problems(spec: PipelineSections) -> Problems:
    """What the spec asks that this format cannot do (spec.PipelineSpec asks at load)."""
    return option_problems(spec, OPTIONS) + no_row_count_problems(spec)


def batches(spec: PipelineSections, url: str) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    encoding = spec.source.encoding.lower().replace("_", "-")
    declared = declared_types(spec)
    parse_schema: pa.Schema | None = None  # the wanted columns' types, fixed by the first block
    line = 1  # the first line of the block, for messages
    # Declared columns no line of the first block has: a field many writers leave out when it is null (and an export
    # sorted by date has no `title` until the records that got one) may first appear after a block or many; such a
    # column is null until it does, and only a column that no line of the file names fails the read, at its end
    # (the read stage commits nothing then). "Names" is the key's JSON text in the block: cheap, and a value that
    # happens to equal the key's text only means the file is not refused for it.
    unseen: list[str] = []
    first_names: list[str] = []
    with fs.open(path, "rb") as raw:
        try:
            for block in line_blocks(raw, spec.source.block_size):
                if encoding not in ("utf-8", "utf8"):
                    block = block.decode(spec.source.encoding).encode("utf-8")
                table = _parse(block, parse_schema)
                if table is None:
                    table = _parse_lines(spec, block, parse_schema, declared, line)
                if parse_schema is None:
                    first_names = table.schema.names
                    unseen = [c for c in spec.source.columns if c not in first_names]
                    for c in unseen:
                        kind = declared.get(c) or pa.string()
                        table = table.append_column(pa.field(c, kind), pa.nulls(table.num_rows, kind))
                    text = set(spec.prepare.template_fields()) | {spec.prepare.text_column}
                    parse_schema = pa.schema([_parse_field(table.schema.field(c), declared.get(c), c in text)
                                              for c in spec.source.columns])
                elif unseen:
                    unseen = [c for c in unseen if json.dumps(c).encode() not in block]
                line += block.count(b"\n")
                table = table.select(spec.source.columns)
                for i, field in enumerate(parse_schema):  # text columns of the first block as text, as later blocks
                    found = table.schema.field(i).type
                    if pa.types.is_string(field.type) and not pa.types.is_string(found) \
                            and not (pa.types.is_nested(found) or pa.types.is_binary(found)):
                        table = table.set_column(i, field, table.column(i).cast(pa.string()))
                for batch in table.to_batches(max_chunksize=spec.source.batch_rows):
                    check_utf8(spec, url, batch)
                    yield batch
            if unseen:
                missing_columns(spec, first_names)
        except UnicodeDecodeError:
            raise _not_utf8(spec, url) from None
        except pa.ArrowInvalid as exc:
            if "UTF8" in str(exc) or "encoding" in str(exc).lower():
                raise _not_utf8(spec, url) from None
            raise PipelineError(f"the JSON lines file could not be parsed: {exc}",
                                fix="each line must be one JSON object") from None


def _not_utf8(spec: PipelineSections, url: str) -> PipelineError:
    index = first_bad_utf8_row(url, spec.source.encoding)  # 0-based here: no header line in JSON lines
    return PipelineError(f"the file is not valid {spec.source.encoding}", row=None if index is None else index + 1,
                         fix="re-encode the file as UTF-8, or set source.encoding in the spec")


def _parse_field(found: pa.Field, declared: pa.DataType | None, text: bool) -> pa.Field:
    """The type a wanted column is parsed as after the first block: the declared one; else, for a column the model
    reads as text (text_column, a template field), text, so that `42` in the first lines and `"Pan"` later are both
    text (a number is kept as its JSON text); else the first block's (no value at all there: text)."""
    kind = declared or found.type
    if declared is None and text and not (pa.types.is_nested(kind) or pa.types.is_binary(kind)):
        kind = pa.string()
    return pa.field(found.name, pa.string() if pa.types.is_null(kind) else kind)


def _parse(block: bytes, schema: pa.Schema | None) -> pa.Table | None:
    """The block parsed by pyarrow, or None when pyarrow refuses it (a kind that changes, a bad line)."""
    parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore") if schema \
        else pajson.ParseOptions()
    # the whole block is one parse block: a line of any size reads (a block always ends at a line end)
    options = pajson.ReadOptions(use_threads=False, block_size=len(block) + 1)
    try:
        return pajson.read_json(pa.BufferReader(block), read_options=options, parse_options=parse)
    except pa.ArrowInvalid as exc:
        if "UTF8" in str(exc):
            raise
        return None


def _parse_lines(spec: PipelineSections, block: bytes, schema: pa.Schema | None,
                 declared: dict[str, pa.DataType], first_line: int) -> pa.Table:
    """The wanted columns of the block, line by line (error path only): a column whose values do not fit one type
    comes out as text (JSON text for objects and lists)."""
    wanted = spec.source.columns
    values: dict[str, list] = {c: [] for c in wanted}
    seen: set[str] = set()
    for offset, text in enumerate(block.split(b"\n")):
        if first_line + offset == 1 and text.startswith(BOM):
            text = text[len(BOM):]
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PipelineError(f"the JSON lines file could not be parsed: line {first_line + offset} is not valid JSON ({exc.msg}, at character {exc.pos + 1})",
                                row=first_line + offset, fix="each line must be one JSON object: fix or remove "
                                "that line") from None
        if not isinstance(obj, dict):
            raise PipelineError(f"the JSON lines file could not be parsed: line {first_line + offset} holds a JSON {type(obj).__name__}, not an object",
                                row=first_line + offset, fix="each line must be one JSON object: fix or remove "
                                "that line")
        seen.update(obj)
        for c in wanted:
            values[c].append(obj.get(c))
    names = [c for c in wanted if schema is not None or c in seen]
    kinds = {c: (schema.field(c).type if schema is not None else declared.get(c)) for c in names}
    return pa.table([_column(values[c], kinds[c]) for c in names], names=names)


def _column(values: list, kind: pa.DataType | None) -> pa.Array:
    try:
        return pa.array(values, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return pa.array([v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                         for v in values], pa.string())


def empty_schema(spec: PipelineSections, url: str) -> pa.Schema | None:
    """A JSON lines file with no rows has no types either."""
    return None


def line_blocks(f, size: int) -> Iterator[bytes]:
    """The file in blocks of about `size` bytes, each ending at a line end: one block in memory at a time (a block
    grows to hold a line longer than `size`).

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


def check_utf8(spec: PipelineSections, url: str, batch: pa.RecordBatch) -> None:
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
