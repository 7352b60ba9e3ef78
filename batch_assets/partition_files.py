"""Which files and rows a partition reads: a local or s3:// glob listed (a refused listing is an error, not "no
files"), partition keys from file names, and the row filters of hash shards and days. The partition kinds
(partitions.py) decide which of these a partition uses; nothing here knows the kinds."""

from __future__ import annotations

import glob as globlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.reliability.row_ids import row_hashes
from batch_assets.spec_sections import PARTITION_TOKEN, PipelineSections
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


def expand(pattern: str) -> list[str]:
    """Files matching a local or s3:// glob, as URLs of the same kind, sorted. An object store that refuses the
    listing (bad credentials, no permission) or cannot be reached is a clear error, not "no files"."""
    try:
        return _expand_unchecked(pattern)
    except FileNotFoundError:  # e.g. a bucket that does not exist: require_files says so, with the path
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


# Names that are not data: an atomic writer's temporary file (`.x.jsonl.tmp-1`), a marker (`_SUCCESS`), a writer's
# staging folder (Spark's `_temporary/`, an uploader's `.staging/`), a notebook's `.ipynb_checkpoints/`. The rule of
# pyarrow.dataset (`ignore_prefixes`) and Hadoop: a file whose name, or a folder the glob chose, starts with one.
NOT_DATA_PREFIXES = (".", "_")


def is_data_path(matched: str, pattern: str | None = None) -> bool:
    """Whether a listed file is data. Its own name must not start with '.' or '_'; nor may a folder the wildcards of
    `pattern` chose (folders the pattern names literally are the user's: `s3://bucket/_raw/*.jsonl` reads `_raw`).
    `matched` and `pattern` are both URLs or both paths without a scheme, as the same filesystem lists them."""
    parts = matched.rstrip("/").split("/")
    if parts[-1].startswith(NOT_DATA_PREFIXES):
        return False
    if pattern is None:
        return True
    pattern_parts = pattern.rstrip("/").split("/")
    first_wild = next((i for i, part in enumerate(pattern_parts) if globlib.has_magic(part)), len(pattern_parts))
    literal = set(pattern_parts)
    return not any(part.startswith(NOT_DATA_PREFIXES) and part not in literal for part in parts[first_wild:-1])


def _expand_unchecked(pattern: str) -> list[str]:
    fs, path = filesystem_for(pattern)
    if not globlib.has_magic(path):
        return [pattern] if fs.exists(path) else []
    # What a glob matches is data only if it is a file and is_data_path says so, as the sensor takes it: a folder or a
    # half-written file in the listing would otherwise be read as a row (files source) or fail the read, change the
    # partition's source version, or (with {partition} in a folder's place) become a partition key of its own.
    matches = sorted(name for name, info in fs.glob(path, detail=True).items()
                     if info.get("type") != "directory" and is_data_path(name, path))
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
        for url in expand(pattern):
            key = file_key(url)
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
    for url in expand(pattern.replace(PARTITION_TOKEN, "*")):
        _, p = filesystem_for(url)
        m = regex.match(p)
        if m:
            prefix, _, suffix = path.partition(PARTITION_TOKEN)
            keys.append(p[len(prefix) : len(p) - len(suffix)] if suffix else p[len(prefix) :])
    return sorted(set(keys))


def file_key(url: str) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1]
    return name.split(".", 1)[0]


def require_files(files: list[str], spec: PipelineSections, key: str, pattern: str) -> list[str]:
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


def shard_of(hashes: np.ndarray, count: int) -> np.ndarray:
    return hashes % np.uint64(count)


def hash_filter(index: int, count: int) -> RowFilter:
    def keep(batch: pa.RecordBatch) -> np.ndarray:
        return shard_of(row_hashes(batch), count) == np.uint64(index)

    return keep


def _midnight(day: datetime, timezone: str) -> Any:
    import pandas as pd

    # A day is midnight to the next midnight on the wall clock of `timezone`: 23 or 25 hours on the days clocks
    # change (adding 24 hours would leave an hour in no day, or in two). Where a zone changes clocks at midnight,
    # the day starts at the first instant that exists.
    return pd.Timestamp(day).tz_localize(timezone, ambiguous=True, nonexistent="shift_forward")


# A year (2026, 20261101) or a day/month/short year (01/11/26): what every written date has and "12:00" lacks
DATE_IN_TEXT = r"\d{4}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2}"


def _instants(raw: Any, timezone: str) -> Any:
    """Each value as a moment in `timezone`; NaT where it is no timestamp. A value without an offset is wall time
    in `timezone`; one with an offset is that moment, so one column may mix both, and offsets (a day's data across a
    clock change is +02:00 then +01:00)."""
    import pandas as pd

    if raw.dtype == object or isinstance(raw.dtype, pd.StringDtype):
        # pandas reads "now", "today" and a bare time ("12:00") as moments of the day the run happens: such a row
        # would silently land in today's partition and be missing from its own. Text without a date is no timestamp.
        dated = raw.astype("string").str.contains(DATE_IN_TEXT, regex=True).fillna(False).to_numpy(dtype=bool)
        raw = raw.where(dated, None)
    try:
        values = pd.to_datetime(raw, errors="coerce", format="mixed", utc=False)
    except ValueError:  # offsets that differ, or some values with an offset and some without: one at a time
        values = pd.Series([_instant(value, timezone) for value in raw], index=raw.index, dtype=object)
        return pd.to_datetime(values, utc=True).dt.tz_convert(timezone)
    if values.dt.tz is None:
        # a wall time the clock change skips or repeats is still on its own date: either reading is in the same day
        return values.dt.tz_localize(timezone, ambiguous=np.ones(len(values), dtype=bool),
                                     nonexistent="shift_forward")
    return values.dt.tz_convert(timezone)


def _instant(value: Any, timezone: str) -> Any:
    import pandas as pd

    try:
        moment = pd.Timestamp(value)
    except (ValueError, TypeError):
        return pd.NaT
    if moment is pd.NaT or moment.tzinfo is not None:
        return moment
    return moment.tz_localize(timezone, ambiguous=True, nonexistent="shift_forward")


def day_filter(key: str, column: str, timezone: str) -> RowFilter:
    first = datetime.strptime(key, "%Y-%m-%d")
    start, end = _midnight(first, timezone), _midnight(first + timedelta(days=1), timezone)

    def keep(batch: pa.RecordBatch) -> np.ndarray:
        raw = batch.column(column).to_pandas()
        values = _instants(raw, timezone)
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
        return ((values >= start) & (values < end)).to_numpy(dtype=bool, na_value=False)

    return keep


def day_check(key: str, column: str, timezone: str) -> RowFilter:
    """For a per-day file: every row's timestamp must fall in the file's day (keeps all rows, or fails)."""
    in_day = day_filter(key, column, timezone)

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
