"""The prepare stage's declarative parts of a spec: per-column transforms, joined columns, the user function hook and
the trial settings (limit / sample). PrepareSpec (batch_assets/spec.py) holds them; batch_assets/stages/transforms.py
applies them, docs/transforms.md explains them.

Kept apart from spec.py so that module stays about the cross-field checks; these models check only themselves.
"""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from batch_assets.resources.custom.loading import ImportPathError, import_object


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ColumnTransform(_Strict):
    """What the prepare stage does to one source column, always in this order: cast, strip_html, normalize,
    fill_null, then the `required` check. A value that is null, or text that is empty or only whitespace once the
    transforms ran, is *missing*."""

    cast: str | None = Field(
        default=None,
        description="An Arrow type (aliases such as string, int64, float64, bool, date32, timestamp[s]). A value "
        "that does not cast (e.g. '12,99' to float64) makes its row a row error naming the column and the value; "
        "the row is not sent to the model and is kept in the dead letters.",
    )
    strip_html: bool = Field(
        default=False,
        description="HTML to plain text (selectolax/lexbor): tags, <script> and <style> removed, entities decoded, "
        "a line break at each block element (p, div, br, li, h1-h6, tr, ...).",
    )
    normalize: bool = Field(
        default=False,
        description="Unicode NFC, then every run of whitespace (line breaks, tabs and Unicode spaces included) "
        "becomes one space, and the ends are trimmed.",
    )
    fill_null: str | int | float | bool | None = Field(
        default=None, description="A missing value becomes this value (in the column's type)."
    )
    required: bool | None = Field(
        default=None,
        description="true: a row whose value is missing is a row error ('column X is empty'), kept in the dead "
        "letters and never sent. false: the column is optional: a missing value renders as empty text in "
        "prepare.template and never makes the row an empty input on its own. Unset: the task's own rule (generate: "
        "every template field is required; embed / classify: a row is empty only when every field is).",
    )

    @model_validator(mode="after")
    def _fill_or_require(self) -> "ColumnTransform":
        if self.fill_null is not None and self.required:
            raise ValueError("fill_null gives every row a value, so required: true has nothing to check: keep one")
        if self.cast is not None:
            try:
                pa.type_for_alias(self.cast)
            except ValueError:
                raise ValueError(f"cast: unknown Arrow type {self.cast!r} (e.g. string, int64, float64, bool, "
                                 "date32, timestamp[s])") from None
        return self


class JoinSpec(_Strict):
    """A new column made by joining source columns (after their transforms) with a separator; missing values are
    skipped, so no separator is left dangling. A row whose every column is missing gets a missing value."""

    columns: list[str] = Field(min_length=2, description="Source columns to join, in order.")
    separator: str = Field(default=" ", description="Put between the non-missing values.")


class DocumentSpec(_Strict):
    """A new text column made from each row's document file (PDF, HTML, Markdown or plain text), read by the path or
    URL in `column` and extracted in the prepare stage (batch_assets/stages/documents.py): PDF through pypdf (the
    `documents` extra), HTML through selectolax (core), Markdown and text as they are. A file that is missing,
    encrypted, damaged or holds no text is that row's error, naming the file; the row is never sent."""

    column: str = Field(description="The column holding each row's file: a local path or s3:// URL (a files "
                        "source's `file_path`, or a table's column of paths).")
    format: Literal["auto", "pdf", "html", "markdown", "text"] = Field(
        default="auto",
        description="auto: by the file's extension (.pdf, .html/.htm, .md/.markdown, else text), and a file that "
        "starts with %PDF- is a PDF whatever its name. Or one format for every file.")


class TrialSpec(_Strict):
    """Run on a few rows first. A trial partition is marked `trial: true` everywhere (metadata, lineage record,
    output location) and is never taken for the partition's full output: a later run without `trial` redoes it."""

    limit: PositiveInt | None = Field(
        default=None, description="Keep the first N rows of the partition (after `sample`), in read order."
    )
    sample: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="Keep about this fraction of the rows, chosen by a hash of the row id and `seed`: the same "
        "rows on every run, whatever the batch size or executor.",
    )
    seed: int = Field(default=0, description="Seed of the sample's hash: another seed picks other rows.")

    @model_validator(mode="after")
    def _something(self) -> "TrialSpec":
        if self.limit is None and self.sample is None:
            raise ValueError("a trial needs limit, sample or both")
        return self


def join_output_problems(joins: dict[str, JoinSpec], columns: set[str]) -> list[tuple[str, str]]:
    """Joined columns read source columns and may not replace one."""
    problems = []
    for name, join in joins.items():
        if name in columns:
            problems.append((f"prepare.join.{name}", f"{name!r} is a source column: name the joined column anew"))
        for col in join.columns:
            if col not in columns:
                problems.append((f"prepare.join.{name}", f"column {col!r} is not in source.columns"))
    return problems


def function_problem(path: str) -> str | None:
    """Why `prepare.function` cannot be used, or None: it must import and be callable (checked at definition
    load, like structured.pydantic_model, so `dg check defs` catches a typo)."""
    try:
        fn: Any = import_object(path, "prepare.function")
    except ImportPathError as exc:
        return str(exc)
    if not callable(fn):
        return f"{path!r} is not a function (it is a {type(fn).__name__})"
    return None
