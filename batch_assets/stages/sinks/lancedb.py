"""The LanceDB sink: an embedded vector store (a local folder, or s3:// in production) that embedding pipelines
can publish to instead of Parquet files, so the output can be searched by nearest neighbour straight away.

One table per pipeline; every row carries `partition_key`. Writing a partition is ONE Lance transaction
(`merge_insert` on (partition_key, id) that updates matching rows, inserts new ones and deletes the partition's
rows that are no longer in the data): Lance writes new data files, then commits a new table version by writing a
new manifest. Readers see the previous version or the new one, never half a partition; a write that fails before
the commit (a model error, the exactly-once check raising after the last batch, a crash) leaves only unreferenced
data files, which `table.optimize()` / `cleanup_old_versions` later removes. Re-materializing a partition therefore
replaces its rows instead of adding them. Two runs writing different partitions of one table at once are
serialised by Lance's optimistic commit (a conflicting commit is retried); on S3 that relies on S3's conditional
writes, see docs/storage.md.

We use `lancedb` (Lance's embedded Python API) rather than writing Lance files by hand: it owns the commit
protocol, versioning, vector search and indexes.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.spec_sections import NAME_RE, PipelineSections
from batch_assets.stages.sinks.base import Problems, option_problems
from batch_assets.storage import join, resolve_local

PARTITION_COLUMN = "partition_key"
_MARK = ".lance#partition="


def partition_url(database: str, table: str, partition: str) -> str:
    """Where a partition lives: the table's folder plus the partition, readable in the UI's `path` metadata."""
    if "://" not in database:
        database = resolve_local(database)
    return join(database, table) + _MARK + urllib.parse.quote(partition, safe="")


def parse_partition_url(url: str) -> tuple[str, str, str]:
    """(database URI, table name, partition key) from `partition_url`'s result."""
    table_path, _, quoted = url.rpartition(_MARK)
    database, _, table = table_path.rpartition("/")
    return database, table, urllib.parse.unquote(quoted)


def storage_options(database: str) -> dict[str, str]:
    """Lance's object-store options for s3:// from the environment at run time (never from the spec)."""
    if not database.startswith("s3://"):
        return {}
    options: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["allow_http"] = "true"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return options


def connect(database: str) -> Any:
    try:
        import lancedb
    except ImportError as exc:  # the `lancedb` extra
        raise PipelineError("the lancedb sink needs the `lancedb` package, which is not installed",
                            fix='pip install "batch-assets[lancedb]"') from exc
    if "://" not in database:
        os.makedirs(database, exist_ok=True)
    return lancedb.connect(database, storage_options=storage_options(database) or None)


def key_columns(schema: pa.Schema, id_column: str | None) -> list[str]:
    """The columns that identify a row within a partition: the row id, else the spec's id column."""
    for name in ("row_id", id_column):
        if name and name in schema.names:
            return [PARTITION_COLUMN, name]
    raise PipelineError(
        f"the lancedb sink needs a row identifier among the sink columns {schema.names}",
        column="row_id", fix="add row_id (or prepare.id_column) to sink.columns",
    )


def write_partition(url: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema, id_column: str | None) -> int:
    """Replace the partition's rows in the table with `batches`, in one commit; returns rows written."""
    database, table_name, partition = parse_partition_url(url)
    # Parquet-derived schemas carry file metadata that Lance does not keep; compare and store names and types.
    schema = pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])
    table_schema = schema.append(pa.field(PARTITION_COLUMN, pa.string(), nullable=False))
    keys = key_columns(table_schema, id_column)
    rows = 0
    raised: list[BaseException] = []

    def tagged() -> Iterator[pa.RecordBatch]:
        nonlocal rows
        try:
            for batch in batches:
                rows += batch.num_rows
                column = pa.array([partition] * batch.num_rows, pa.string())
                yield pa.RecordBatch.from_arrays([*batch.select(schema.names).columns, column], schema=table_schema)
        except BaseException as exc:
            raised.append(exc)
            raise

    db = connect(database)
    try:
        table = db.open_table(table_name)
    except ValueError:  # lancedb's "table not found"; a concurrent creator makes exist_ok return theirs
        table = db.create_table(table_name, schema=table_schema, exist_ok=True)
    found = [(f.name, f.type) for f in table.schema]
    if found != [(f.name, f.type) for f in table_schema]:
        raise PipelineError(
            f"lancedb table {table_name!r} in {database} has columns {found} but this pipeline writes "
            f"{[(f.name, f.type) for f in table_schema]}",
            fix="write to a new table (sink.table) or drop the old one: lancedb.connect(db).drop_table(name)",
        )
    reader = pa.RecordBatchReader.from_batches(table_schema, tagged())
    quoted = partition.replace("'", "''")
    try:
        (
            table.merge_insert(keys)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(f"{PARTITION_COLUMN} = '{quoted}'")
            .execute(reader)
        )
    except Exception:
        # Lance wraps an error raised while it pulls our batches (the exactly-once check, a bad row) in an
        # Arrow error string; nothing was committed, so hand the caller the original, located error.
        if raised:
            raise raised[0] from None
        raise
    return rows


def partition_rows(url: str) -> int:
    """Rows the table holds for the partition (for checks and tests)."""
    database, table_name, partition = parse_partition_url(url)
    table = connect(database).open_table(table_name)
    return table.count_rows(f"{PARTITION_COLUMN} = '{partition.replace(chr(39), chr(39) * 2)}'")


class LanceSink:
    """One table per pipeline (`sink.table`, default the pipeline's name) in the database at the sink's path.

    Failed rows (an empty input, a model error) are not written: they have no vector, and LanceDB refuses a null
    vector ("variable length vectors ... on_bad_vectors"); they are in the partition's dead letters."""

    keeps_failed_rows = False
    options = frozenset({"table"})

    def partition_url(self, base: str, spec: PipelineSections, partition: str) -> str:
        return partition_url(base, spec.sink.table or spec.name, partition)

    def write(self, spec: PipelineSections, url: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        return write_partition(url, batches, schema, spec.prepare.id_column)

    def written_schema(self, url: str, schema: pa.Schema) -> pa.Schema:
        """The table's own schema, with its partition column."""
        database, table, _ = parse_partition_url(url)
        return connect(database).open_table(table).schema

    def spec_problems(self, spec: PipelineSections) -> Problems:
        sink, problems = spec.sink, option_problems(spec, self.options)
        if PARTITION_COLUMN in spec.source.columns or PARTITION_COLUMN in (sink.columns or []):
            problems.append(("sink.columns", "the lancedb sink adds column 'partition_key' itself: rename yours"))
        if sink.columns is not None and not {"row_id", spec.prepare.id_column} & set(sink.columns):
            problems.append(("sink.columns", "the lancedb sink replaces rows by id: include row_id"
                             + (f" or {spec.prepare.id_column}" if spec.prepare.id_column else "")))
        if sink.table is not None and not NAME_RE.match(sink.table):
            problems.append(("sink.table", f"{sink.table!r} must match {NAME_RE.pattern}"))
        return problems


SINK = LanceSink()
