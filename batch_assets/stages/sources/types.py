"""Column types at read: every batch of a file conformed to one schema, a value that does not convert a row error.

The target type of a column is the one declared in `source.types`, else the type the file's first batch has (csv:
text; parquet: the file's; jsonl: the first block's). A batch whose column has another type is cast with pyarrow
compute; where that fails, the values are cast one by one (error path only) and each value that does not convert
becomes null plus a row error in READ_ERROR_COLUMN naming column, value, type, file and row. A row error never
fails the read by itself: the prepare stage turns it into a flagged input (never sent to a model, kept in the dead
letters with its reason), and the read stage fails only when such rows pass `runtime.max_error_fraction`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.spec_sections import PipelineSections

READ_ERROR_COLUMN = "_read_error"
BAD_VALUE = "bad value"  # how every row error of the read starts (dead_letters.py classifies it as an input error)


def declared_types(spec: PipelineSections) -> dict[str, pa.DataType]:
    return {name: pa.type_for_alias(alias) for name, alias in spec.source.types.items()}


def target_schema(spec: PipelineSections, first: pa.Schema) -> pa.Schema:
    """The schema every batch of one file is cast to: declared types, else those of the file's first batch (a
    column with no value at all there, type null, becomes text so that a later value has somewhere to go)."""
    declared = declared_types(spec)
    fields = []
    for name in spec.source.columns:
        kind = declared.get(name) or first.field(name).type
        fields.append(pa.field(name, pa.string() if pa.types.is_null(kind) else kind))
    return pa.schema(fields)


def conform(batch: pa.RecordBatch, schema: pa.Schema, url: str, first_row: int
            ) -> tuple[list[pa.Array], list[str | None]]:
    """The batch's columns cast to `schema`, and one row error (or None) per row."""
    errors: list[str | None] = [None] * batch.num_rows
    columns = []
    for field in schema:
        values = batch.column(field.name)
        if values.type != field.type:
            values = _cast(values, field, url, first_row, errors)
        columns.append(values)
    return columns, errors


def _cast(values: pa.Array, field: pa.Field, url: str, first_row: int, errors: list[str | None]) -> pa.Array:
    source = values
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            # " 12.5 " is 12.5 and "" is no value, as CSV readers and people read them
            values = pc.utf8_trim_whitespace(values)
            values = pc.if_else(pc.equal(values, ""), pa.scalar(None, values.type), values)
    try:
        return pc.cast(values, field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    out = []
    for i in range(len(values)):
        one = values.slice(i, 1)
        try:
            out.append(pc.cast(one, field.type)[0])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            out.append(pa.scalar(None, field.type))
            shown = _shown(source[i].as_py())
            problem = (f"{BAD_VALUE}: column {field.name!r} holds {shown}, not {field.type} [file {url!r}, row "
                       f"{first_row + i}]. What to do: correct the value in the source, or declare the column "
                       f"with a type that holds it in source.types (string holds any value)")
            errors[i] = problem if errors[i] is None else f"{errors[i]}; {problem}"
    return pa.array([s.as_py() for s in out], field.type)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def with_errors(errors: list[str | None]) -> pa.Array:
    return pa.array(errors, pa.string())
