"""Source formats, one module each, registered in SOURCES by name (the spec's `source.format`).

A format's module has `batches(spec, url)`: the file's declared columns (`spec.source.columns`) streamed as Arrow
record batches, a PipelineError for what is wrong with the file; and `empty_schema(spec, url)`: the column types of
a file with no rows when the format stores them (Parquet), else None; and `spec_problems(spec)`: what the spec asks
that this format cannot do, as (field, problem) pairs, asked by spec.PipelineSpec at load. The read stage
(stages/read.py) adds row ids and lineage around them.

A format whose rows are the files themselves (`files`: one row per file, files.py) has `partition_batches(spec,
urls, cache_root)` instead: the read stage hands it every file of the partition at once, so that a partition of
10,000 small files is a few batches of `source.batch_rows` rows, not 10,000 batches of one.

A new format is one module here, one line below, its name in batch_assets/registries.py (where the spec takes its
choices from: the readers read the spec's sections, so the spec cannot import this table) and a test
(docs/concepts.md, "Plugging in"). Entries are import paths, so that naming a format never imports every reader.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SOURCES: dict[str, str] = {
    "csv": "batch_assets.stages.sources.csv",
    "parquet": "batch_assets.stages.sources.parquet",
    "jsonl": "batch_assets.stages.sources.jsonl",
    "files": "batch_assets.stages.sources.files",
}


def source_module(name: str) -> ModuleType:
    """The reader module of source format `name` (one of SOURCES; the spec refuses any other)."""
    return importlib.import_module(SOURCES[name])
