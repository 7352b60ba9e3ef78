"""Helpers for the task tests: a parsed spec of one task kind, and a chunk of prepared rows as the prepare stage
writes them (the source columns, then `_input_empty` / `_input_problem` for rows that cannot be an input)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batch_assets.resources.protocols import supports
from batch_assets.resources.registry import PROVIDERS, provider_class
from batch_assets.spec import parse_spec


def spec_for(task: dict[str, Any], prepare: dict[str, Any], columns: list[str], provider: str | None = None,
             **sections: Any) -> Any:
    provider = provider or next(name for name in sorted(PROVIDERS) if supports(provider_class(name), task["kind"]))
    return parse_spec({
        "name": "p", "source": {"format": "jsonl", "path": "x/{partition}.jsonl", "columns": columns},
        "partitioning": {"kind": "static", "keys": ["a"]}, "prepare": prepare, "task": task,
        "model": {"provider": provider, "config": {}}, **sections,
    })


def prepared(columns: dict[str, list[Any]], problems: list[str | None] | None = None) -> pa.RecordBatch:
    """A prepared chunk: row ids r0.., the given columns, and a row flagged wherever `problems` has a reason."""
    n = len(next(iter(columns.values())))
    problems = problems or [None] * n
    data = {"row_id": [f"r{i}" for i in range(n)], **columns,
            "_input_empty": [p is not None for p in problems], "_input_problem": pa.array(problems, pa.string())}
    return pa.RecordBatch.from_pydict(data)
