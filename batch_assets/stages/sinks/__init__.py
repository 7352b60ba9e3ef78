"""Sink formats, one module each, registered in SINKS by name (the spec's `sink.format`).

A format's module has `SINK`, an object with (stages/sinks/base.py `Sink`): `partition_url(base, spec, partition)`
(where a partition is published), `write(spec, url, batches, schema)` (publish it atomically, return the rows
written), `written_schema(url, schema)` and `spec_problems(spec)` (what the spec asks that this format cannot do,
checked when the spec loads). The write stage (stages/write.py) checks exactly-once around it.

A new format is one module here, one line below, its name in batch_assets/registries.py (where the spec's schema
takes its choices from) and a test (docs/concepts.md, "Plugging in"). Entries are import paths, so that asking a
format for its `spec_problems` (spec.PipelineSpec, at load) never imports every writer (nor LanceDB).
"""

from __future__ import annotations

import importlib
from typing import Any

SINKS: dict[str, str] = {
    "parquet": "batch_assets.stages.sinks.parquet",
    "jsonl": "batch_assets.stages.sinks.jsonl",
    "csv": "batch_assets.stages.sinks.csv",
    "lancedb": "batch_assets.stages.sinks.lancedb",
}


def sink_for(name: str) -> Any:
    """The `SINK` of sink format `name` (one of SINKS; the spec refuses any other)."""
    return importlib.import_module(SINKS[name]).SINK
