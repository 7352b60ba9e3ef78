"""Turning what a user's batch method returns into columns, and checking it is one output per input row.

A batch method may return a list, a numpy array, a pandas Series, a pyarrow Array (one output column) or a dict /
DataFrame / Arrow table of those (several output columns). Anything else, or a column whose length differs from
the batch, is an error that names the class: a silent misalignment would attach predictions to the wrong rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Columns = list[Any] | dict[str, list[Any]]


class BatchAlignmentError(ValueError):
    """A batch method returned a different number of outputs than it was given rows."""


class BatchOutputTypeError(TypeError):
    """A batch method returned something that is not one value per row."""


def as_list(values: Any, *, what: str) -> list[Any]:
    """One column of values as a Python list; `what` names the column in errors."""
    if isinstance(values, list):
        return values
    if isinstance(values, (str, bytes)) or values is None or not hasattr(values, "__len__"):
        raise BatchOutputTypeError(
            f"{what} is a {type(values).__name__}, not a column: expected a list, numpy array, pandas Series or "
            "pyarrow Array with one value per row"
        )
    to_pylist = getattr(values, "to_pylist", None)  # pyarrow Array / ChunkedArray
    if callable(to_pylist):
        return to_pylist()
    tolist = getattr(values, "tolist", None)  # numpy arrays, pandas Series, torch tensors
    if callable(tolist):
        out = tolist()
        if not isinstance(out, list):  # a 0-d array's tolist() is a scalar
            raise BatchOutputTypeError(f"{what} is a 0-dimensional {type(values).__name__}, not a column")
        return out
    if isinstance(values, Sequence):
        return list(values)
    raise BatchOutputTypeError(
        f"{what} is a {type(values).__name__}: expected a list, numpy array, pandas Series or pyarrow Array"
    )


def _table_columns(result: Any) -> dict[str, Any] | None:
    """A pandas DataFrame or pyarrow Table / RecordBatch as {column: values}; None for anything else."""
    if hasattr(result, "to_pydict") and hasattr(result, "column_names"):  # pyarrow Table / RecordBatch
        return result.to_pydict()
    if hasattr(result, "columns") and hasattr(result, "iloc") and hasattr(result, "to_dict"):  # pandas DataFrame
        return {str(col): result[col] for col in result.columns}
    return None


def normalize_output(result: Any, *, source: str, rows: int) -> Columns:
    """Check and convert one batch's result. `source` names the user's class in every error."""
    table = result if isinstance(result, Mapping) else _table_columns(result)
    if table is not None:
        if not table:
            raise BatchOutputTypeError(f"{source} returned an empty dict: return at least one output column")
        out: dict[str, list[Any]] = {}
        for name, values in table.items():
            column = as_list(values, what=f"output column {name!r} of {source}")
            _check_length(len(column), rows, source, f" (output column {name!r})")
            out[str(name)] = column
        return out
    try:
        column = as_list(result, what=f"the result of {source}")
    except BatchOutputTypeError as exc:
        raise BatchOutputTypeError(
            f"{exc}; a batch method receives a dict of lists and must return one output per row, or a dict of "
            "output columns"
        ) from None
    _check_length(len(column), rows, source, "")
    return column


def _check_length(got: int, rows: int, source: str, where: str) -> None:
    if got != rows:
        raise BatchAlignmentError(
            f"{source} returned {got} rows for a batch of {rows}: a batch method must return exactly one output "
            f"per input row{where}"
        )


def concat_outputs(parts: list[Columns], *, source: str) -> Columns:
    """Join the per-slice results of one predict() call, which must all have the same shape."""
    if not parts:
        return []
    first = parts[0]
    if isinstance(first, list):
        out: list[Any] = []
        for part in parts:
            if not isinstance(part, list):
                raise BatchOutputTypeError(
                    f"{source} returned a single column for one batch and columns {sorted(part)} for another: "
                    "return the same shape for every batch"
                )
            out.extend(part)
        return out
    names = list(first)
    joined: dict[str, list[Any]] = {name: [] for name in names}
    for part in parts:
        if not isinstance(part, dict) or set(part) != set(names):
            got = sorted(part) if isinstance(part, dict) else "a single column"
            raise BatchOutputTypeError(
                f"{source} returned columns {names} for one batch and {got} for another: return the same output "
                "columns for every batch"
            )
        for name in names:
            joined[name].extend(part[name])
    return joined
