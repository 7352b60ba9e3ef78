"""Partitioning: which Dagster partitions a pipeline has, and which source rows each one reads.

- static: explicit keys substituted for {partition} in the source path, or one key per file found at load;
- hash: N shards over every source row, by a stable hash of the row id;
- daily: one partition per day, from a per-day file ({partition} = YYYY-MM-DD) or a timestamp column;
- dynamic: keys added at run time (UI, sensor, `add_partitions`), each substituted for {partition}.
- multi: two dimensions crossed (Dagster's MultiPartitionsDefinition: a day or static keys x static or dynamic
  keys). A key is the dimension keys joined by '|' in the order of the dimension names (app, date:
  'android|2026-11-01'); each dimension's key is substituted for {<name>} in the source path, the whole key for
  {partition}. Everywhere else (storage paths, checkpoints, locks, lineage, dead letters) the whole key is the
  partition key, quoted for paths like any other key (storage.partition_file_name).
"""

from __future__ import annotations

import glob as globlib
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import dagster as dg
import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.spec_sections import PARTITION_TOKEN, PartitionDimensionSpec, PipelineSections
from batch_assets.storage import filesystem_for, is_remote, shown_path

RowFilter = Callable[[pa.RecordBatch], np.ndarray]


@dataclass(frozen=True)
class PartitionSlice:
    """The files a partition reads and, for hash/daily-by-column partitioning, which of their rows it keeps."""

    key: str
    files: list[str]
    row_filter: RowFilter | None = None


def hash_shard_keys(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [f"shard-{i:0{width}d}-of-{count:0{width}d}" for i in range(count)]


def partitions_def_for(spec: PipelineSections) -> dg.PartitionsDefinition:
    part = spec.partitioning
    if part.kind == "static":
        keys = part.keys or discover_file_keys(spec)
        if not keys:
            raise PipelineError(
                "no partition keys: no file matches source.path and partitioning.keys is not set",
                pipeline=spec.name,
                file=shown_path(spec.source.path),
                fix="add files, or list partitioning.keys",
            )
        return dg.StaticPartitionsDefinition(keys)
    if part.kind == "hash":
        return dg.StaticPartitionsDefinition(hash_shard_keys(part.count or 1))
    if part.kind == "daily":
        return dg.DailyPartitionsDefinition(
            start_date=part.start_date, end_date=part.end_date, timezone=part.timezone
        )
    if part.kind == "multi":
        return dg.MultiPartitionsDefinition({d.name: _dimension_def(spec, d) for d in part.dimensions or []})
    return dg.DynamicPartitionsDefinition(name=spec.name)


def _dimension_def(spec: PipelineSections, dim: PartitionDimensionSpec) -> dg.PartitionsDefinition:
    if dim.kind == "daily":
        return dg.DailyPartitionsDefinition(start_date=dim.start_date, end_date=dim.end_date, timezone=dim.timezone)
    if dim.kind == "static":
        return dg.StaticPartitionsDefinition(list(dim.keys or []))
    return dg.DynamicPartitionsDefinition(name=dynamic_dimension_name(spec, dim.name))


def dynamic_dimension_name(spec: PipelineSections, dimension: str) -> str:
    """The instance-wide name of a multi pipeline's dynamic dimension (dynamic keys live in the instance)."""
    return f"{spec.name}__{dimension}"


def dimension_keys(spec: PipelineSections, key: str) -> dict[str, str]:
    """A multi partition key's key in each dimension, by dimension name ({} for any other partitioning)."""
    part = spec.partitioning
    if part.kind != "multi":
        return {}
    names = sorted(d.name for d in part.dimensions or [])  # Dagster orders a key's parts by dimension name
    parts = str(key).split("|")
    if len(parts) != len(names):
        raise PipelineError(
            f"partition key {key!r} is not a key of two dimensions: multi partition keys are the dimension keys "
            f"joined by '|' in the order of the dimension names ({'|'.join('<' + n + '>' for n in names)})",
            pipeline=spec.name, partition=str(key),
            fix=f"launch e.g. --partition \"{'|'.join('<' + n + '>' for n in names)}\"",
        )
    return dict(zip(names, parts))


def multi_key(spec: PipelineSections, by_dimension: dict[str, str]) -> str:
    """The multi partition key (as Dagster spells it) of one key per dimension."""
    return str(dg.MultiPartitionKey(by_dimension))


def default_id_prefix(spec: PipelineSections, url: str) -> str:
    """The file part of a default row id ('<file>:<row>'). Multi partitioning names a partition's files by folders
    as well (data/reviews/{date}/{app}.jsonl): every day has an `android.jsonl`, so the id keeps the path from the
    first placeholder on (`2026-11-01/android.jsonl:3`), unique across partitions as a daily file's name is."""
    parts = url.rstrip("/").split("/")
    if spec.partitioning.kind != "multi":
        return parts[-1]
    segments = spec.source.path.rstrip("/").split("/")
    first = next((i for i, seg in enumerate(segments) if "{" in seg), len(segments) - 1)
    return "/".join(parts[-(len(segments) - first):])


def source_path_for(spec: PipelineSections, key: str) -> str:
    """source.path for one partition: {partition} is the whole key, and for multi partitioning {<dimension>} is
    that dimension's key (the placeholders of the agreed source interface)."""
    path = spec.source.path.replace(PARTITION_TOKEN, str(key))
    for name, value in dimension_keys(spec, key).items():
        path = path.replace("{" + name + "}", value)
    return path


def _expand(pattern: str) -> list[str]:
    """Files matching a local or s3:// glob, as URLs of the same kind, sorted. An object store that refuses the
    listing (bad credentials, no permission) or cannot be reached is a clear error, not "no files"."""
    try:
        return _expand_unchecked(pattern)
    except FileNotFoundError:  # e.g. a bucket that does not exist: _require says so, with the path
        return []
    except PermissionError as exc:
        raise PipelineError(
            f"access to the source was refused ({exc})", file=shown_path(pattern),
            fix="check the credentials where the pipeline runs (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
            "AWS_PROFILE or the pod's role) and that they may list and read this bucket",
        ) from None
    except OSError as exc:
        raise PipelineError(
            f"the source could not be listed: {type(exc).__name__}: {exc}", file=shown_path(pattern),
            fix="check that the storage is reachable from where the pipeline runs (for S3: AWS_ENDPOINT_URL, the "
            "network, the bucket name)",
        ) from None


def _expand_unchecked(pattern: str) -> list[str]:
    fs, path = filesystem_for(pattern)
    if not globlib.has_magic(path):
        return [pattern] if fs.exists(path) else []
    # What a glob matches is data only if it is a file whose name does not start with '.' or '_' (an atomic writer's
    # temporary file, a `_SUCCESS` marker), as the sensor takes it: a folder or a half-written file in the listing
    # would otherwise be read as a row (files source) or fail the read, and change the partition's source version.
    matches = sorted(name for name, info in fs.glob(path, detail=True).items()
                     if info.get("type") != "directory"
                     and not name.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_")))
    if pattern.startswith("s3://"):
        return [f"s3://{m}" for m in matches]
    if is_remote(pattern):
        return [fs.unstrip_protocol(m) for m in matches]
    return matches


def discover_file_keys(spec: PipelineSections) -> list[str]:
    """Static partitioning without keys: one key per file, the part of its name that {partition} matches."""
    pattern = spec.source.path
    if PARTITION_TOKEN not in pattern:
        by_key: dict[str, str] = {}
        for url in _expand(pattern):
            key = _file_key(url)
            if key in by_key:
                raise PipelineError(
                    f"two source files give the same partition key {key!r}: {by_key[key]} and {url} (the key is "
                    "the file name before its first dot)",
                    pipeline=spec.name, file=url,
                    fix="rename one of the files, narrow source.path, or put {partition} in the path and list "
                    "partitioning.keys",
                )
            by_key[key] = url
        return sorted(by_key)
    fs, path = filesystem_for(pattern)
    regex = re.compile(
        "^" + ".*".join(re.escape(p) for p in path.split(PARTITION_TOKEN)).replace(r"\*", "[^/]*") + "$"
    )
    keys = []
    for url in _expand(pattern.replace(PARTITION_TOKEN, "*")):
        _, p = filesystem_for(url)
        m = regex.match(p)
        if m:
            prefix, _, suffix = path.partition(PARTITION_TOKEN)
            keys.append(p[len(prefix) : len(p) - len(suffix)] if suffix else p[len(prefix) :])
    return sorted(set(keys))


def _file_key(url: str) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1]
    return name.split(".", 1)[0]


def resolve_partition(spec: PipelineSections, key: str) -> PartitionSlice:
    part, pattern = spec.partitioning, spec.source.path
    if part.kind == "multi":  # each partition reads its own files (spec.multi_partition_problems)
        concrete = source_path_for(spec, key)
        return PartitionSlice(key, _require(_expand(concrete), spec, key, concrete))
    if part.kind == "hash":
        files = _expand(pattern)
        index = hash_shard_keys(part.count or 1).index(key)
        return PartitionSlice(key, _require(files, spec, key, pattern), _hash_filter(index, part.count or 1))
    if part.kind == "daily" and part.time_column and PARTITION_TOKEN in pattern:
        concrete = pattern.replace(PARTITION_TOKEN, key)  # one file per day: check its rows are of that day
        files = _require(_expand(concrete), spec, key, concrete)
        check = _day_check(key, part.time_column, part.timezone) if part.day_check == "fail" else None
        return PartitionSlice(key, files, check)
    if part.kind == "daily" and part.time_column:
        files = _expand(pattern)
        return PartitionSlice(key, _require(files, spec, key, pattern), _day_filter(key, part.time_column, part.timezone))
    if PARTITION_TOKEN in pattern:
        concrete = pattern.replace(PARTITION_TOKEN, key)
    elif part.kind == "static" and not part.keys:
        # one partition per file found at load: pick that file again
        concrete = next((u for u in _expand(pattern) if _file_key(u) == key), pattern + f" (key {key})")
    else:
        concrete = pattern
    return PartitionSlice(key, _require(_expand(concrete), spec, key, concrete))


def _require(files: list[str], spec: PipelineSections, key: str, pattern: str) -> list[str]:
    if not files:
        raise PipelineError(
            "the source path does not exist (no file matches it)",
            pipeline=spec.name,
            partition=key,
            file=shown_path(pattern),
            fix="check source.path in the spec and that the files were uploaded; for s3:// check the bucket "
            "and AWS_ENDPOINT_URL",
        )
    return files


def stable_hash64(values: list[str]) -> np.ndarray:
    """A hash of each row id that is the same in every process and Python version (unlike hash()).

    blake2b-64 of the UTF-8 id, read little-endian: shard assignment of existing data depends on these exact
    values, so the function never changes. Computed once per row, in the read stage (`ROW_HASH` column); the
    digests are joined and viewed as one uint64 array instead of converting each to a Python int."""
    blake = hashlib.blake2b
    digests = b"".join([blake(v.encode("utf-8"), digest_size=8).digest() for v in values])
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


ROW_HASH = "_row_hash"


def row_hashes(batch: pa.RecordBatch) -> np.ndarray:
    """The row ids' stable hashes: the `_row_hash` column the read stage carries (files written before it
    existed: computed from `row_id`)."""
    if ROW_HASH in batch.schema.names:
        return batch.column(ROW_HASH).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    return stable_hash64(batch.column("row_id").to_pylist())


def shard_of(hashes: np.ndarray, count: int) -> np.ndarray:
    return hashes % np.uint64(count)


def _hash_filter(index: int, count: int) -> RowFilter:
    def keep(batch: pa.RecordBatch) -> np.ndarray:
        return shard_of(row_hashes(batch), count) == np.uint64(index)

    return keep


def _day_filter(key: str, column: str, timezone: str) -> RowFilter:
    import pandas as pd

    start = pd.Timestamp(datetime.strptime(key, "%Y-%m-%d")).tz_localize(timezone)
    end = start + timedelta(days=1)

    def keep(batch: pa.RecordBatch) -> np.ndarray:
        raw = batch.column(column).to_pandas()
        values = pd.to_datetime(raw, errors="coerce", format="mixed", utc=False)
        bad = values.isna().to_numpy()
        if bad.any():
            # A row without a readable timestamp belongs to no day: fail rather than lose it.
            i = int(np.argmax(bad))
            raise PipelineError(
                f"value {raw.iloc[i]!r} is not a timestamp, so the row belongs to no daily partition",
                column=column,
                row=int(batch.column("_source_row")[i].as_py()),
                fix="fix or drop the row, or use another partitioning",
            )
        if values.dt.tz is None:
            values = values.dt.tz_localize(timezone)
        return ((values >= start) & (values < end)).to_numpy(dtype=bool, na_value=False)

    return keep


def _day_check(key: str, column: str, timezone: str) -> RowFilter:
    """For a per-day file: every row's timestamp must fall in the file's day (keeps all rows, or fails)."""
    in_day = _day_filter(key, column, timezone)

    def check(batch: pa.RecordBatch) -> np.ndarray:
        inside = in_day(batch)
        if not inside.all():
            i = int(np.argmin(inside))
            value = batch.column(column)[i].as_py()
            shown = value.isoformat() if hasattr(value, "isoformat") else str(value)
            raise PipelineError(
                f"row stamped {shown} in column {column!r} is not of day {key} "
                f"({int((~inside).sum())} such row(s) in this batch), yet it is in day {key}'s file",
                column=column,
                row=int(batch.column("_source_row")[i].as_py()),
                fix="move the row to its day's file, or set partitioning.day_check: keep to keep such rows in the "
                "file's day",
            )
        return inside

    return check
