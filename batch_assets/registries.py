"""The names a pipeline spec chooses from, one tuple per kind of plug-in: the bottom of the package (imports nothing).

The spec's schema (spec_sections.py) takes its choices from here. The tables that load each plug-in by name sit
above the schema, because the plug-ins read the spec's sections (stages/sources `SOURCES`, stages/sinks `SINKS`,
partitions `KINDS`, sample_data `GENERATORS`); they hold the same names, in the same order,
and tests/test_registries.py keeps them equal, so no name is accepted by the spec and unknown to the stage that runs
it, or the other way round. Task kinds and providers need no list here: their tables (tasks.TASKS,
resources.registry.PROVIDERS) import nothing of the spec, so the schema reads them directly.
"""

SOURCE_FORMATS = ("csv", "parquet", "jsonl", "files")
SINK_FORMATS = ("parquet", "jsonl", "csv", "lancedb")
PARTITION_KINDS = ("static", "hash", "daily", "dynamic", "multi")
DIMENSION_KINDS = ("daily", "static", "dynamic")  # the kinds one dimension of `multi` may have
SAMPLE_DATASETS = ("customers", "documents", "reviews", "quotes")
# The columns of a `files` source (one row per file); stages/sources/files.py's SCHEMA gives their types.
FILE_COLUMNS = ("file_path", "file_size", "file_mtime", "file_version")
