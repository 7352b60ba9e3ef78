"""The read stage: a partition's source rows streamed into its `raw` file, each with a stable row id.

The formats' readers (csv / parquet / jsonl, local or s3://) are modules of stages/sources/, one per format. Here
their batches are checked (text columns hold text) and given `row_id`, `_source_file` and `_source_row` (1-based
data row within its file), so later stages can say exactly where a bad row came from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.errors import PipelineError
from batch_assets.partition_files import PartitionSlice
from batch_assets.partitions import default_id_prefix, resolve_partition
from batch_assets.reliability.row_ids import (
    FINGERPRINT_KEY,
    ROW_HASH,
    RowIdFingerprint,
    UniqueIdChecker,
    row_hashes,
    stable_hash64,
)
from batch_assets.spec_sections import PipelineSections
from batch_assets.stage_names import READ
from batch_assets.stages.report import PartitionReport
from batch_assets.stages.sources import source_module
from batch_assets.stages.sources.types import READ_ERROR_COLUMN, conform, target_schema
from batch_assets.storage import ArrowStorage, filesystem_for, shown_path, write_parquet

# `_row_hash` is the row id's stable 64-bit hash (the one hash shards are assigned by), computed once here and
# carried: shard routing and the infer step's rows check read it instead of hashing the id again.
LINEAGE_COLUMNS = ("row_id", "_source_file", "_source_row", ROW_HASH)


class _DropDuplicates(Exception):
    """Aborts a read's atomic writes: the partition holds repeated ids that the spec's policy drops on a second read."""

    def __init__(self, duplicates):
        self.duplicates = duplicates


@dataclass
class Duplicates:
    """The rows a `keep_first` / `keep_last` policy drops: {file: {row, ...}}, and what the metadata reports."""

    drop: dict[str, set[int]]
    ids: int  # ids that occurred more than once
    rows_dropped: int
    samples: list[str]

    def metadata(self) -> dict[str, Any]:
        import dagster as dg

        return {"duplicate_ids": self.ids, "duplicate_rows_dropped": self.rows_dropped,
                "duplicate_samples": dg.MetadataValue.md("\n".join(f"- {s}" for s in self.samples) or "none")}

    def filter(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch without the dropped rows (matched by file and row of origin)."""
        files = batch.column("_source_file").to_pylist()
        rows = batch.column("_source_row").to_pylist()
        keep = [r not in self.drop.get(f, ()) for f, r in zip(files, rows)]
        return batch if all(keep) else batch.filter(pa.array(keep, pa.bool_()))


class ReadErrors:
    """Rows of a partition with a value that did not convert to its column's type (`_read_error`): counted, a few
    kept as samples, and held against runtime.max_error_fraction before the partition's `raw` file commits."""

    def __init__(self) -> None:
        self.rows, self.samples = 0, []

    def add(self, batch: pa.RecordBatch) -> None:
        errors = batch.column(READ_ERROR_COLUMN)
        bad = len(errors) - errors.null_count
        if bad:
            self.rows += bad
            if len(self.samples) < 5:
                self.samples += errors.drop_null()[: 5 - len(self.samples)].to_pylist()

    def check(self, spec: PipelineSections, key: str, total: int) -> None:
        limit = spec.runtime.max_error_fraction
        # a format may say what its read errors are (files: a file that could not be stat'ed or hashed)
        what, fix = getattr(source_module(spec.source.format), "READ_ERRORS", (
            "hold a value that does not convert to its column's type",
            "correct the values in the source, or declare those columns as string in source.types (or drop the "
            "declaration), or raise runtime.max_error_fraction to keep such rows as row errors"))
        if self.rows and self.rows / total > limit:
            raise PipelineError(
                f"{self.rows} of {total} rows {what} ({self.rows / total:.1%}, more than "
                f"runtime.max_error_fraction={limit:g}); first: {self.samples[0].split('. What to do:')[0]}",
                pipeline=spec.name, partition=key, fix=fix,
            )

    def metadata(self) -> dict[str, Any]:
        import dagster as dg

        return {"read_errors": self.rows,
                "read_error_samples": dg.MetadataValue.md("\n".join(f"- {s}" for s in self.samples) or "none")}


def _places(where: list[tuple[str, int]]) -> str:
    return ", ".join(f"{f} row {n}" for f, n in where)


def resolve_duplicates(spec: PipelineSections, ids: UniqueIdChecker, rescan) -> Duplicates | None:
    """None when every row id of the partition is unique. Else, under `prepare.duplicate_ids: fail`, an error
    naming the id column, the ids, their files and rows and the fix; under keep_first / keep_last, the rows to
    drop (every occurrence but the first / last in read order)."""
    column = spec.prepare.id_column
    # Without an id column the ids are '<file name>:<row>': a repeat means two files of one name, never a row to drop
    policy = spec.prepare.duplicate_ids if column else "fail"
    dupes = ids.duplicates(rescan, limit=5 if policy == "fail" else None)
    if not dupes:
        return None
    if policy == "fail":
        rid, where = dupes[0]
        others = "; ".join(f"{r!r} at {_places(w)}" for r, w in dupes)
        raise PipelineError(
            f"row id {rid!r} appears more than once in the partition ({len(dupes)} repeated id(s) named: {others})",
            file=where[1][0],
            column=column,
            row=where[1][1],
            fix=(f"make the id column {column!r} unique, or set prepare.duplicate_ids to keep_first or keep_last "
                 "(the first / last occurrence in read order is kept; the count and samples go to the metadata), or "
                 "drop prepare.id_column to use '<file>:<row>' ids") if column else
            "two source files have the same name (ids are '<file name>:<row>'): rename one, or set "
            "prepare.id_column to a unique id column",
        )
    drop: dict[str, set[int]] = {}
    samples: list[str] = []
    for rid, where in dupes:
        kept = where[0] if policy == "keep_first" else where[-1]
        dropped = [place for place in where if place != kept]
        for file, row in dropped:
            drop.setdefault(file, set()).add(row)
        if len(samples) < 5:
            samples.append(f"{rid!r}: kept {kept[0]} row {kept[1]}; dropped {_places(dropped)}")
    return Duplicates(drop, len(dupes), sum(len(w) - 1 for _, w in dupes), samples)


def run_read(spec: PipelineSections, storage: ArrowStorage, key: str) -> PartitionReport:
    """The read stage for one partition: stream the partition's source rows into its `raw` file."""
    return run_read_shards(spec, storage, [key])[0]


def _duplicate_metadata(spec: PipelineSections, duplicates) -> dict:
    """Under a keep_first / keep_last policy, the read always reports what it dropped (0 too: plottable)."""
    if spec.prepare.duplicate_ids == "fail" or not spec.prepare.id_column:
        return {}
    if duplicates is None:
        return {"duplicate_ids": 0, "duplicate_rows_dropped": 0}
    return duplicates.metadata()


def run_read_shards(spec: PipelineSections, storage: ArrowStorage, keys: list[str]) -> list[PartitionReport]:
    """The read stage, the one read path: the partitions `keys` of one run, in one pass over their source files.

    One key (`run_read`) reads its partition's files through its row filter (a hash shard's, a day's). Several keys
    must read the same files (the hash shards of one run: every shard reads the whole source): the files are read
    once and each row is routed to the keys whose row filter keeps it, by the hash the read computed once for its
    id, so a row lands in exactly the shard a read of that shard alone puts it in. Each key's file is committed
    atomically, and only if the whole read succeeded; a repeated id aborts every write."""
    start = time.perf_counter()
    slices = {k: resolve_partition(spec, k) for k in keys}
    files = slices[keys[0]].files
    if len(keys) == 1:
        scope, route = slices[keys[0]], {}  # the read applies the partition's own filter
    else:
        if any(part.files != files for part in slices.values()):
            raise ValueError(f"{spec.name}: partitions {keys[0]}...{keys[-1]} read different files; read them one "
                             "at a time")
        scope, route = PartitionSlice(f"{keys[0]}...{keys[-1]}", files), {k: slices[k].row_filter for k in keys}
    urls = {k: storage.stage_url(spec.name, READ.asset, k) for k in keys}
    duplicates: dict[str, Duplicates] | None = None
    while True:  # twice at most: a second read only when the first found ids the policy drops
        source_ids = {k: RowIdFingerprint() for k in keys}  # O(1) memory; the write stage checks against it
        unique = {k: UniqueIdChecker() for k in keys}  # 8 bytes a row
        bad = {k: ReadErrors() for k in keys}
        scanned = [0]
        try:
            with ExitStack() as stack:
                writers = {k: stack.enter_context(write_parquet(urls[k])) for k in keys}
                for batch in read_partition(spec, scope, scanned, cache_root=storage.resolved_root()):
                    for found in (duplicates or {}).values():  # a repeated id lives in one shard (same hash)
                        batch = found.filter(batch)
                    hashes = row_hashes(batch)  # computed once by the read (`_row_hash`), used by both checks
                    for k in keys:
                        keep = route.get(k)
                        mask = np.asarray(keep(batch), dtype=bool) if keep is not None else None
                        if mask is not None and not mask.any():
                            continue
                        rows = batch if mask is None else batch.filter(pa.array(mask))
                        source_ids[k].add_hashes(hashes if mask is None else hashes[mask])
                        unique[k].add_hashes(hashes if mask is None else hashes[mask])
                        bad[k].add(rows)
                        writers[k].write(rows)
                for k in keys:
                    bad[k].check(spec, k, writers[k].rows)
                for k in keys:
                    if not writers[k].rows:  # a quiet day, a shard no row hashes to: an empty file, the source's columns
                        writers[k].schema_if_empty(partition_schema(spec, scope))
                found_now = {}
                for k in keys:  # still inside every write: a repeated id commits no partition
                    found = resolve_duplicates(spec, unique[k], lambda k=k: read_partition(spec, slices[k]))
                    if found is not None:
                        found_now[k] = found
                if found_now:
                    raise _DropDuplicates(found_now)
                for k in keys:
                    writers[k].key_value_metadata[FINGERPRINT_KEY.decode()] = source_ids[k].to_json()
        except _DropDuplicates as redo:
            if duplicates is not None:  # the drop left repeats: cannot happen unless the source changed under us
                raise PipelineError("the source changed while it was read (repeated ids after dropping duplicates)",
                                    fix=f"materialize the partition{'s' if len(keys) > 1 else ''} again once "
                                    f"{'their' if len(keys) > 1 else 'its'} files are complete") from None
            duplicates = redo.duplicates
            continue
        break
    share = (time.perf_counter() - start) / len(keys)  # one shared read: each shard is charged its share
    shared = {"read_shared_by": len(keys)} if len(keys) > 1 else {}
    # rows_in: source rows scanned (once, for every key); more than rows_out where a filter keeps the partition's
    # share (hash, daily)
    return [PartitionReport(k, scanned[0], writers[k].rows, share, urls[k],
                            {"source_files": len(files), **shared, "row_id_check_bytes": unique[k].nbytes,
                             **bad[k].metadata(), **_duplicate_metadata(spec, (duplicates or {}).get(k))})
            for k in keys]


def read_partition(spec: PipelineSections, part: PartitionSlice, scanned: list[int] | None = None,
                   cache_root: str | None = None, ids_only: bool = False) -> Iterator[pa.RecordBatch]:
    """All rows of one partition, batch by batch, after the partition's row filter; `scanned[0]` counts the rows
    read before the filter. `cache_root`: the storage root, where a files source finds the digests of local files
    the lineage has just taken (stages/sources/versions.py). `ids_only`: the caller reads only the row ids (the
    rows check), so a files source does not take the files' versions again (a local file's is a read)."""
    module = source_module(spec.source.format)
    if hasattr(module, "partition_batches"):  # one row per file: every file of the partition at once
        try:
            batches = _file_rows(spec, module, part.files, cache_root, versions=not ids_only)
            yield from _kept(part, batches, scanned)
        except PipelineError as exc:
            raise exc.located(pipeline=spec.name, partition=part.key) from None
        return
    for url in part.files:
        try:
            yield from _kept(part, _read_file(spec, url), scanned)
        except PipelineError as exc:
            raise exc.located(pipeline=spec.name, partition=part.key, file=shown_path(url)) from None


def _kept(part: PartitionSlice, batches: Iterator[pa.RecordBatch], scanned: list[int] | None
          ) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if scanned is not None:
            scanned[0] += batch.num_rows
        if part.row_filter is not None:
            batch = batch.filter(pa.array(part.row_filter(batch), type=pa.bool_()))
        if batch.num_rows:
            yield batch


def _file_rows(spec: PipelineSections, module, urls: list[str], cache_root: str | None, versions: bool = True
               ) -> Iterator[pa.RecordBatch]:
    """A files source's rows (stages/sources/files.py) with the lineage columns: the file is `_source_file`, its
    one row `_source_row` 1, and its id its path below source.path's fixed folder unless prepare.id_column says."""
    for batch, errors in module.partition_batches(spec, urls, cache_root, versions=versions):
        n = batch.num_rows
        urls_now = batch.column("file_path")
        rows = pa.array(np.ones(n, dtype=np.int64))
        if spec.prepare.id_column is None:
            ids = pa.array(module.file_row_ids(spec, urls_now.to_pylist()), pa.string())
        else:
            ids = _row_ids(spec, "", batch, rows)
        hashes = pa.array(stable_hash64(ids.to_pylist()), pa.uint64())
        yield pa.RecordBatch.from_arrays(
            [*(batch.column(c) for c in spec.source.columns), ids, urls_now, rows, hashes,
             pa.array(errors, pa.string()) if any(errors) else pa.nulls(n, pa.string())],
            names=[*spec.source.columns, *LINEAGE_COLUMNS, READ_ERROR_COLUMN],
        )


def partition_schema(spec: PipelineSections, part: PartitionSlice) -> pa.Schema:
    """The schema of the rows a partition's read yields, for a partition that has none: the first batch of its
    files before the row filter (the types the rows would have had), else, for files with a header and no rows,
    the declared columns as the readers type them (csv: text; parquet: the file's own types)."""
    module = source_module(spec.source.format)
    if hasattr(module, "partition_batches"):  # files: the columns are the same whatever the files hold
        return output_schema(spec, module.SCHEMA)
    for url in part.files:
        for batch in _read_file(spec, url):
            return batch.schema
    stored = module.empty_schema(spec, part.files[0]) if part.files else None
    if stored is not None:
        return output_schema(spec, stored)
    return output_schema(spec, pa.schema([pa.field(c, pa.string()) for c in spec.source.columns]))


def output_schema(spec: PipelineSections, source_schema: pa.Schema) -> pa.Schema:
    fields = list(target_schema(spec, source_schema))
    return pa.schema(fields + [pa.field("row_id", pa.string()), pa.field("_source_file", pa.string()),
                               pa.field("_source_row", pa.int64()), pa.field(ROW_HASH, pa.uint64()),
                               pa.field(READ_ERROR_COLUMN, pa.string())])


def _read_file(spec: PipelineSections, url: str) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    try:
        size = fs.size(path)
    except FileNotFoundError:
        raise PipelineError("the source file does not exist", fix="check source.path") from None
    if not size:
        raise PipelineError(
            "the source file is empty (0 bytes): it has no header and no rows",
            fix="remove the empty file or re-export it with its header and rows",
        )
    next_row = 1
    target: pa.Schema | None = None  # every batch of the file is cast to it (stages/sources/types.py)
    for batch in source_module(spec.source.format).batches(spec, url):
        if target is None:
            target = target_schema(spec, batch.schema)
            _check_text_types(spec, target, batch, next_row)
        n = batch.num_rows
        columns, errors = conform(batch, target, url, next_row)
        batch = pa.RecordBatch.from_arrays(columns, schema=target)
        rows = pa.array(np.arange(next_row, next_row + n, dtype=np.int64))
        ids = _row_ids(spec, url, batch, rows)
        hashes = pa.array(stable_hash64(ids.to_pylist()), pa.uint64())
        next_row += n
        yield pa.RecordBatch.from_arrays(
            [*columns, ids, pa.repeat(pa.scalar(url, pa.string()), n), rows, hashes,
             pa.array(errors, pa.string()) if any(errors) else pa.nulls(n, pa.string())],
            names=[*spec.source.columns, *LINEAGE_COLUMNS, READ_ERROR_COLUMN],
        )


def _row_ids(spec: PipelineSections, url: str, batch: pa.RecordBatch, rows: pa.Array) -> pa.Array:
    id_column = spec.prepare.id_column
    if id_column is None:
        name = default_id_prefix(spec, url)
        return pa.array([f"{name}:{r}" for r in rows.to_pylist()], pa.string())
    ids = pc.cast(batch.column(id_column), pa.string())
    blank = pc.or_kleene(pc.is_null(ids), pc.equal(pc.utf8_trim_whitespace(ids), ""))
    blank = pc.fill_null(blank, True)
    if pc.any(blank).as_py():
        i = pc.index(blank, True).as_py()
        raise PipelineError(
            "the row id is empty", column=id_column, row=rows[i].as_py(),
            fix="give every row an id, or drop prepare.id_column to use '<file>:<row>' ids",
        )
    return ids


def _text_columns(spec: PipelineSections) -> list[str]:
    """Columns whose values become text: the row id, the text column, the prompt template's fields."""
    prep = spec.prepare
    cols = [prep.id_column, prep.text_column, *prep.template_fields()]
    made = set(prep.derived_columns())  # joined / function columns: made by the prepare stage, not read
    return [c for c in dict.fromkeys(cols) if c and c not in made]


def _check_text_types(spec: PipelineSections, schema: pa.Schema, batch: pa.RecordBatch, first_row: int) -> None:
    """A list, struct, map or binary value would reach the model as its Python repr: refuse it by name instead."""
    for column in _text_columns(spec):
        kind = schema.field(column).type
        if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            valid = pc.is_valid(batch.column(column))
            at = pc.index(valid, True).as_py() if pc.any(valid).as_py() else 0
            raise PipelineError(
                f"the column holds {kind} values, not text", column=column, row=first_row + max(at, 0),
                fix="point the spec at a text column (prepare.text_column / the template's fields / "
                "prepare.id_column), or convert the column to strings in the source",
            )





