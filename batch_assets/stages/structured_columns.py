"""Structured generation output as Arrow columns: validated values, or row errors that keep the raw text."""

from __future__ import annotations

import pyarrow as pa

from batch_assets.spec import PipelineSpec
from resources.structured import build_columns, validate_output


def structured_columns(
    spec: PipelineSpec, texts: list[str | None], errors: list[str | None]
) -> tuple[list[str], list[pa.Array]]:
    """Validate each row's text against `task.structured`; failures become row errors (text stays in the
    output column), successes become a struct/string column or, with `unnest`, one column per property."""
    structured = spec.task.structured
    assert structured is not None
    values = []
    for i, text in enumerate(texts):
        if errors[i] is not None:
            values.append(None)
            continue
        value, problem = validate_output(text, structured)
        if problem is not None:
            errors[i] = problem
        values.append(value)
    return build_columns(values, structured, spec.task.structured_column)
