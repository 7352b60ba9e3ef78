"""The prepare stage's column functions (stages/transforms.py) called directly, on the edge cases that would lose or
shift a row: every function returns one value per input row, in order, whatever is null or empty. (The transforms
as a stage, through prepare_batches and Dagster: tests/stages/test_transforms.py.)"""

from __future__ import annotations

import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.stages.transforms import (
    apply_joins,
    apply_transforms,
    html_to_text,
    join_present,
    missing,
    normalize_text,
    render_template,
)
from batch_assets.spec import parse_spec
from tests.conftest import EMBED_SPEC


def _prep(**prepare):
    raw = {**EMBED_SPEC, "source": {**EMBED_SPEC["source"], "path": "/d/{partition}.jsonl",
                                    "columns": ["doc_id", "text", "title", "price"]},
           "prepare": {**EMBED_SPEC["prepare"], **prepare}}
    return parse_spec(raw).prepare


def test_join_keeps_a_row_whose_every_value_is_missing() -> None:
    """pyarrow 26's own null_handling='skip' leaves all-null rows out (a shorter column: every later row shifted)."""
    a = pa.array(["x", None, None, "y"])
    b = pa.array([None, None, "z", "w"])
    c = pa.array([None, None, None, "v"])
    assert join_present([a, b, c], " | ").to_pylist() == ["x", None, "z", "y | w | v"]


def test_joined_columns_leave_blank_parts_out_and_keep_every_row() -> None:
    prep = _prep(text_column="body", join={"body": {"columns": ["title", "text"], "separator": "\n\n"}})
    batch = pa.RecordBatch.from_pylist([{"title": "T", "text": "body"}, {"title": "  ", "text": None},
                                        {"title": None, "text": "only text"}, {"title": None, "text": ""}])
    out = apply_joins(prep, batch)
    assert out.column("body").to_pylist() == ["T\n\nbody", None, "only text", None]


def test_a_template_fills_every_row_with_missing_fields_empty() -> None:
    batch = pa.RecordBatch.from_pylist([{"title": "Mug", "price": 3.5}, {"title": None, "price": None},
                                        {"title": "日本語 {x}", "price": 10.0}])
    assert render_template("{title}: {price}", batch).to_pylist() == ["Mug: 3.5", ": ", "日本語 {x}: 10"]
    assert render_template("no fields", batch).to_pylist() == ["no fields"] * 3


def test_a_field_with_a_format_spec_renders_a_missing_value_empty_too() -> None:
    """'{price:.2f}' on a row without a price once raised a bare ValueError from str.format, failing the partition."""
    batch = pa.RecordBatch.from_pylist([{"title": "Mug", "price": 3.5}, {"title": None, "price": None}])
    assert render_template("{title!r} costs {price:.2f}", batch).to_pylist() == ["'Mug' costs 3.50", " costs "]


def test_a_value_the_format_spec_cannot_take_fails_naming_field_value_row_and_fix() -> None:
    """A CSV column is text unless declared: '{price:.2f}' on the text '3.5' cannot work, and says why."""
    batch = pa.RecordBatch.from_pylist([{"row_id": "r1", "price": "3.5"}])
    with pytest.raises(PipelineError) as info:
        render_template("costs {price:.2f}", batch)
    assert info.value.column == "price" and info.value.row == "r1" and "'3.5'" in str(info.value)
    assert "source.types" in info.value.fix


def test_missing_is_null_empty_or_blank_text_and_only_null_for_other_types() -> None:
    assert missing(pa.array(["a", "", "  \t\n", None, "\u00a0b"])).to_pylist() == [False, True, True, True, False]
    assert missing(pa.array([0, None, 2])).to_pylist() == [False, True, False]


def test_cleaning_keeps_one_value_per_row() -> None:
    values = pa.array(["<p>a</p><p>b</p>", None, "", "no markup", "&amp; only"])
    cleaned = html_to_text(values).to_pylist()
    assert cleaned[0].split() == ["a", "b"] and cleaned[1:] == [None, "", "no markup", "& only"]
    assert normalize_text(pa.array(["  a \u200b\u00a0 b  ", None, "e\u0301"])).to_pylist() == ["a b", None, "é"]


def test_fill_null_on_an_all_null_column_and_an_empty_cell_is_no_value_to_cast() -> None:
    """An empty CSV cell under `cast` is a missing value (null; a row error only where the column is `required`),
    as the read stage has it, not "value '' does not cast" (which made every row with an empty optional cell a row
    error)."""
    prep = _prep(transforms={"title": {"fill_null": "untitled"}, "price": {"cast": "float64", "required": True}})
    batch = pa.RecordBatch.from_pydict({"title": pa.nulls(3), "price": pa.array([" 1.5 ", "", "abc"])})
    out, problems = apply_transforms(prep, batch, pa.nulls(3, pa.string()))
    assert out.schema.names == ["title", "price"]
    assert out.column("title").to_pylist() == ["untitled"] * 3
    assert out.column("price").to_pylist() == [1.5, None, None]
    assert problems[0].as_py() is None
    assert "column 'price' is empty" in problems[1].as_py() and "cast" not in problems[1].as_py()
    assert "value 'abc' does not cast to float64" in problems[2].as_py()


def test_an_empty_cell_of_an_optional_cast_column_is_null_and_no_row_error() -> None:
    prep = _prep(transforms={"price": {"cast": "int64"}})
    batch = pa.RecordBatch.from_pydict({"price": pa.array(["3", "", "  ", None])})
    out, problems = apply_transforms(prep, batch, pa.nulls(4, pa.string()))
    assert out.column("price").to_pylist() == [3, None, None, None] and problems.null_count == 4
