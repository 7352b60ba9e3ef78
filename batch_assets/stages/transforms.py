"""The prepare stage's column work on one Arrow record batch: the spec's per-column transforms (cast, strip_html,
normalize, fill_null, required), joined columns, the user function hook and the template filled in, vectorised with
pyarrow compute (HTML alone goes through selectolax's lexbor parser, one call per value that holds markup).

A row these steps cannot make an input of is never dropped: its reason goes into a problems array (null where the
row is fine), which the prepare stage turns into `_input_empty` / `_input_problem`; the infer stage then skips the
row and records the reason as its row error, and the write stage keeps it in the dead letters.
"""

from __future__ import annotations

import string
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.errors import PipelineError
from batch_assets.resources.custom.loading import import_object

ROW_ERROR_COLUMN = "_row_error"  # a user function's per-row error reasons (string, null where the row is fine)
_STRINGS = (pa.string(), pa.large_string())
# Block elements: a line break goes before each, so '<li>a</li><li>b</li>' reads 'a' / 'b', not 'ab'.
_BLOCK_TAG = (r"(?i)<(/?(?:p|div|br|li|ul|ol|dl|dt|dd|h[1-6]|tr|td|th|table|thead|tbody|section|article|header|"
              r"footer|blockquote|pre|hr|address|figure|figcaption|nav|aside|main))\b")
_WHITESPACE = r"[\s\p{Z}\x{85}\x{feff}\x{200b}]+"


def as_text(array: pa.Array) -> pa.Array:
    if array.type in _STRINGS:
        return array
    return pc.cast(array, pa.string())


def missing(array: pa.Array) -> pa.Array:
    """True where a value is null, or text that is empty or only whitespace."""
    nulls = pc.is_null(array)
    if array.type not in _STRINGS:
        return nulls
    return pc.fill_null(pc.or_(nulls, pc.equal(pc.utf8_trim_whitespace(array), "")), True)


def html_to_text(array: pa.Array) -> pa.Array:
    """Plain text of each value, its ends trimmed; only values that hold markup ("<" or "&") are parsed."""
    from selectolax.lexbor import LexborHTMLParser  # the HTML parser: imported only by specs that strip HTML

    text = as_text(array)
    marked = pc.fill_null(pc.match_substring_regex(text, "[<&]"), False)
    if not pc.any(marked).as_py():
        return text
    spaced = pc.replace_substring_regex(text, _BLOCK_TAG, "\n<\\1")
    values = spaced.to_pylist()
    flags = marked.to_pylist()
    out: list[str | None] = []
    for value, flag in zip(values, flags):
        if not flag:
            out.append(value)
            continue
        tree = LexborHTMLParser(value)
        for node in tree.css("script, style, noscript, template"):
            node.decompose()
        root = tree.body or tree.root
        out.append(root.text(separator="") if root is not None else "")
    return pc.utf8_trim_whitespace(pa.array(out, pa.string()))  # the line breaks put before the first/after the last block


def normalize_text(array: pa.Array) -> pa.Array:
    text = pc.utf8_normalize(as_text(array), form="NFC")
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(text, _WHITESPACE, " "))


def _cast(name: str, array: pa.Array, alias: str, problems: pa.Array) -> tuple[pa.Array, pa.Array]:
    target = pa.type_for_alias(alias)
    source = pc.utf8_trim_whitespace(array) if array.type in _STRINGS else array
    if array.type in _STRINGS and target not in _STRINGS:
        # "" (an empty CSV cell) is no value, as the read stage has it (sources/types.py): null, not a row error;
        # `required` is what makes a missing value a row error
        source = pc.if_else(pc.equal(source, ""), pa.scalar(None, source.type), source)
    try:
        return pc.cast(source, target), problems
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # Some value does not cast: value by value, so only its row becomes a row error (the rest keep their value)
    values, reasons = [], []
    for i in range(len(source)):
        try:
            values.append(pc.cast(source.slice(i, 1), target)[0].as_py())
            reasons.append(None)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            shown = repr(array[i].as_py())
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            values.append(None)
            reasons.append(f"column {name!r}: value {shown} does not cast to {alias} (prepare.transforms.{name}.cast)")
    return pa.array(values, target), pc.coalesce(problems, pa.array(reasons, pa.string()))


def apply_transforms(prep: Any, batch: pa.RecordBatch, problems: pa.Array) -> tuple[pa.RecordBatch, pa.Array]:
    """The batch with each transformed column replaced in place (same position, same name), and the problems with
    the rows a cast or a `required` column could not make an input of."""
    arrays = list(batch.columns)
    for name, rule in prep.transforms.items():
        at = batch.schema.get_field_index(name)
        array = arrays[at]
        if rule.cast is not None:
            array, problems = _cast(name, array, rule.cast, problems)
        if rule.strip_html:
            array = html_to_text(array)
        if rule.normalize:
            array = normalize_text(array)
        if rule.fill_null is not None:
            fill = pa.scalar(rule.fill_null).cast(array.type if array.type != pa.null() else pa.string())
            array = pc.if_else(missing(array), fill, array if array.type != pa.null() else pa.nulls(len(array), fill.type))
        if rule.required:
            reason = pa.scalar(f"column {name!r} is empty (prepare.transforms.{name}.required)")
            problems = pc.coalesce(problems, pc.if_else(missing(array), reason, pa.scalar(None, pa.string())))
        arrays[at] = array
    names = batch.schema.names
    return pa.RecordBatch.from_arrays(arrays, names=names), problems


def join_present(arrays: list[pa.Array], separator: str) -> pa.Array:
    """The non-null values of each row joined by `separator`; null where every value is. (Not Arrow's own
    `null_handling="skip"`: in pyarrow 26.0.1 it leaves all-null rows out of its result, a shorter array.)"""
    out = arrays[0]
    for array in arrays[1:]:
        out = pc.coalesce(pc.binary_join_element_wise(out, array, separator), out, array)
    return out


def apply_joins(prep: Any, batch: pa.RecordBatch) -> pa.RecordBatch:
    for name, join in prep.join.items():
        parts = []
        for col in join.columns:
            array = as_text(batch.column(col))
            parts.append(pc.if_else(missing(array), pa.scalar(None, pa.string()), array))
        batch = batch.append_column(name, join_present(parts, join.separator))
    return batch


class UserFunction:
    """`prepare.function`, imported once per prepare step and checked on every batch it returns."""

    def __init__(self, spec: Any, key: str):
        self.spec, self.key, self.path = spec, key, spec.prepare.function
        self.fn: Callable[[pa.RecordBatch], Any] = import_object(self.path, "prepare.function")
        self.schema: pa.Schema | None = None  # of the first batch returned: every later one must cast to it

    def _error(self, what: str, batch: pa.RecordBatch, fix: str) -> PipelineError:
        ids = batch.column("row_id")
        rows = f"rows {ids[0].as_py()!r} .. {ids[-1].as_py()!r}" if len(ids) else "an empty batch"
        return PipelineError(f"prepare.function {self.path!r} {what} ({rows}, {batch.num_rows} rows)",
                             pipeline=self.spec.name, partition=self.key, fix=fix)

    def __call__(self, batch: pa.RecordBatch, problems: pa.Array) -> tuple[pa.RecordBatch, pa.Array]:
        try:
            out = self.fn(batch)
        except Exception as exc:
            raise self._error(f"raised {type(exc).__name__}: {exc}", batch,
                              "fix the function; to keep going past a bad row, return a string column "
                              f"{ROW_ERROR_COLUMN!r} with the reason for that row instead of raising") from exc
        if isinstance(out, pa.Table):
            out = out.combine_chunks().to_batches()[0] if out.num_rows else pa.RecordBatch.from_pylist([], out.schema)
        if not isinstance(out, pa.RecordBatch):
            raise self._error(f"returned {type(out).__name__}, not a pyarrow RecordBatch", batch,
                              "return the batch (batch.append_column / set_column / pa.RecordBatch.from_arrays)")
        if out.num_rows != batch.num_rows:
            raise self._error(f"returned {out.num_rows} rows for {batch.num_rows}", batch,
                              f"return one row per input row, in order; to leave a row out, set its "
                              f"{ROW_ERROR_COLUMN!r} (it becomes a row error kept in the dead letters)")
        if "row_id" not in out.schema.names or not out.column("row_id").equals(batch.column("row_id")):
            raise self._error("dropped, changed or reordered the row_id column", batch,
                              "keep every input column you do not mean to change, row_id untouched and in order")
        lost = [c for c in batch.schema.names if c not in out.schema.names]
        if lost:
            raise self._error(f"dropped column(s) {lost}", batch, "keep every input column; add new ones beside them")
        absent = [c for c in self.spec.prepare.function_columns if c not in out.schema.names]
        if absent:
            raise self._error(f"did not add {absent} (prepare.function_columns)", batch,
                              "add them to the batch it returns, or fix prepare.function_columns")
        if ROW_ERROR_COLUMN in out.schema.names:
            reasons = as_text(out.column(ROW_ERROR_COLUMN))
            reasons = pc.if_else(pc.is_null(reasons), reasons,
                                 pc.binary_join_element_wise(f"prepare.function {self.path}: ", reasons, ""))
            problems = pc.coalesce(problems, reasons)
            out = out.drop_columns([ROW_ERROR_COLUMN])
        if self.schema is None:
            self.schema = out.schema
        elif out.schema != self.schema:
            try:
                out = out.select(self.schema.names).cast(self.schema)
            except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise self._error(f"returned columns or types that differ from its first batch's ({exc})", batch,
                                  "return the same columns with the same types for every batch (cast explicitly, "
                                  "e.g. pa.array(values, pa.float64()), so an all-null batch keeps its type)") from None
        return out, problems


class _MissingAsEmpty(string.Formatter):
    """str.format, with a missing value rendered as empty text whatever its field's format spec ('{price:.2f}' on a
    null would otherwise raise)."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        return None if value is None else super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> str:
        return "" if value is None else super().format_field(value, format_spec)


_MISSING_AS_EMPTY = _MissingAsEmpty()


def _format_error(template: str, batch: pa.RecordBatch, i: int, values: dict[str, Any], exc: Exception
                  ) -> PipelineError:
    """The field whose value its format spec cannot take (a text '3.5' under '{price:.2f}'), by trying each alone."""
    column, shown = None, ""
    for _, field, spec, conv in string.Formatter().parse(template):
        if field and values.get(field) is not None:
            try:
                _MISSING_AS_EMPTY.vformat("{0" + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}",
                                          (values[field],), {})
            except (ValueError, TypeError):
                column, shown = field, f" value {values[field]!r} ({type(values[field]).__name__})"
                break
    row = batch.column("row_id")[i].as_py() if "row_id" in batch.schema.names else None
    return PipelineError(f"prepare.template {template!r} cannot format{shown}: {exc}", column=column, row=row,
                         fix="declare the column's type in source.types (a CSV column is text unless declared), or "
                         "cast it with prepare.transforms.<column>.cast, or drop the format spec from the template")


def render_template(template: str, batch: pa.RecordBatch) -> pa.Array:
    """The template filled in for every row, missing fields as empty text: one vectorised join of the template's
    literal parts and its fields' text. A field with a format spec or conversion ('{price:.2f}', '{x!r}') is
    filled in by Python's str.format, row by row, as before."""
    parsed = list(string.Formatter().parse(template))
    if any(spec or conv for _, field, spec, conv in parsed if field):
        cols = {f: batch.column(f).to_pylist() for _, f, _, _ in parsed if f}
        rows = []
        for i in range(batch.num_rows):
            values = {f: v[i] for f, v in cols.items()}
            try:
                rows.append(_MISSING_AS_EMPTY.vformat(template, (), values))
            except (ValueError, TypeError) as exc:
                raise _format_error(template, batch, i, values, exc) from None
        return pa.array(rows, pa.string())
    n = batch.num_rows
    parts: list[Any] = []
    for literal, field, _, _ in parsed:
        if literal:
            parts.append(pa.scalar(literal, pa.string()))
        if field:
            parts.append(pc.fill_null(as_text(batch.column(field)), ""))
    if not parts:
        return pa.array([""] * n, pa.string())
    arrays = [p if isinstance(p, (pa.Array, pa.ChunkedArray)) else pa.array([p.as_py()] * n, pa.string())
              for p in parts]
    return pc.binary_join_element_wise(*arrays, "")
