"""Files as a source (`source.format: files`): one row per file that `source.path` matches, local or s3://.

Each row holds what is known without reading the file's contents into the batch:

| column | type | what |
|---|---|---|
| `file_path` | string | the absolute local path, or the s3:// URL |
| `file_size` | int64 | bytes |
| `file_mtime` | timestamp[us, UTC] | last modified (S3: the object's LastModified) |
| `file_version` | string | the content version (stages/sources/versions.py): a local file's digest (xxh3 or BLAKE2b, streamed in 1 MiB blocks, cached by stat in the storage root, so a file is read again only when its stat changed); on S3 the ETag of a single-part upload (the MD5 of the bytes), else the object's stored checksum, else the multipart ETag, with no download |

No bytes travel in the Arrow batches: a stage that needs them (images, documents, audio) opens the file by
`file_path` with `open_input`, within its own chunk. The version is the same one the lineage records and the sensor
cursor hold, so "never twice" holds per file as for tables: a partition made from the same files with the same
bytes is not made again, a file rewritten with other bytes is.

Names starting with `.` or `_` (an atomic writer's temporary file, a `_SUCCESS` marker) and folders are never rows,
as the sensor never takes them for data. A file that cannot be stat'ed or hashed (removed since the listing, access
refused) is still a row, with a row error naming the file: it is never dropped without a word.

The read stage (stages/read.py) gives each row its id, by default the file's path below the fixed part of
`source.path` (`data/calls/{partition}/*.wav` -> `2026-11-01/a.wav`): stable wherever the project or bucket is, and
the same for a local folder and its copy on S3.
"""

from __future__ import annotations

import glob as globlib
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from batch_assets.partition_files import is_data_path
from batch_assets.registries import FILE_COLUMNS
from batch_assets.stages.sources.common import Problems, no_row_count_problems, option_problems
from batch_assets.stages.sources.versions import content_version
from batch_assets.storage import filesystem_for, is_remote, open_input, shown_path

__all__ = ["FILE_COLUMNS", "SCHEMA", "batches", "empty_schema", "file_infos", "file_row_ids", "open_input",
           "partition_batches", "spec_problems"]

SCHEMA = pa.schema([  # the columns are FILE_COLUMNS, in order (tests/test_registries.py): the spec chooses from those
    pa.field("file_path", pa.string()),
    pa.field("file_size", pa.int64()),
    pa.field("file_mtime", pa.timestamp("us", tz="UTC")),
    pa.field("file_version", pa.string()),
])
# An object-store folder holding more of a partition's files than this is listed once (one LIST per 1,000 objects)
# instead of asked file by file (one HEAD each); a folder of 10,000 objects read by a one-file partition is still
# asked for that object alone.
LIST_FOLDER_FROM = 8
GONE = "not found (removed after it was listed, or a link to nothing)"
# what the read stage says when too many rows have a read error (stages/read.py ReadErrors)
READ_ERRORS = ("are files that could not be looked up or read",
               "fix the access to the files named (or remove them), or raise runtime.max_error_fraction to keep such "
               "files as row errors")


OPTIONS: frozenset[str] = frozenset()  # no source field of common.FORMAT_OPTIONS applies to the files themselves


def spec_problems(spec: Any) -> Problems:
    """What a files source reads is fixed: its columns and their types; no text setting or sample data applies
    (spec.PipelineSpec asks at load)."""
    problems: Problems = []
    unknown = [c for c in spec.source.columns if c not in FILE_COLUMNS]
    if unknown:
        problems.append(("source.columns", f"{', '.join(map(repr, unknown))} is not a column of a files source (one "
                         f"row per file: {', '.join(FILE_COLUMNS)}); name the file's column, or leave columns out"))
    problems += option_problems(spec, OPTIONS, "one row per file, with fixed columns and types")
    return problems + no_row_count_problems(spec)


def partition_batches(spec: Any, urls: list[str], cache_root: str | None = None, versions: bool = True
                      ) -> Iterator[tuple[pa.RecordBatch, list[str | None]]]:
    """The partition's files as rows, `source.batch_rows` at a time, each with its row error (None when fine). Only
    the columns of `SCHEMA`; the read stage adds the lineage. `cache_root`: the storage root, where local digests are
    cached (the lineage hashed them there a moment ago, so they are not read twice). `versions=False`: file_version
    left null, for a caller that needs only which files there are (the rows check)."""
    infos = file_infos(urls)
    rows: list[tuple[str, dict[str, Any] | None, str | None]] = []
    for url in urls:
        info = infos.get(url)
        if isinstance(info, dict) and info.get("type") == "directory":
            continue
        if not is_data_path(url):
            continue
        rows.append((url, info if isinstance(info, dict) else None, info if isinstance(info, str) else None))
        if len(rows) == spec.source.batch_rows:
            yield _batch(rows, cache_root, versions)
            rows = []
    if rows:
        yield _batch(rows, cache_root, versions)


def _batch(rows: list[tuple[str, dict[str, Any] | None, str | None]], cache_root: str | None, versions: bool
           ) -> tuple[pa.RecordBatch, list[str | None]]:
    paths, sizes, mtimes, digests, errors = [], [], [], [], []
    for url, info, problem in rows:
        version = None
        if problem is None and info is not None and info.get("type") == "other":  # a pipe would block the read
            problem = "is not a regular file (a pipe, socket or device)"
        if problem is None and info is not None and versions:
            try:
                version = content_version(url, info, cache_root=cache_root)
            except FileNotFoundError:
                problem = GONE
            except PermissionError as exc:
                problem = f"access refused ({exc})"
            except OSError as exc:
                problem = f"could not be read ({type(exc).__name__}: {exc})"
        paths.append(url)
        sizes.append(int(info["size"]) if info and info.get("size") is not None else None)
        mtimes.append(_modified(info) if info else None)
        digests.append(version)
        errors.append(None if problem is None else
                      f"bad file: {shown_path(url)}: {problem}; the row is kept as an error (fix or remove the file, "
                      "then materialize the partition again)")
    batch = pa.RecordBatch.from_arrays(
        [pa.array(paths, pa.string()), pa.array(sizes, pa.int64()), pa.array(mtimes, SCHEMA.field("file_mtime").type),
         pa.array(digests, pa.string())], schema=SCHEMA)
    return batch, errors


def file_infos(urls: list[str]) -> dict[str, dict[str, Any] | str]:
    """Each file's fsspec info (size, mtime / LastModified, ETag), or the problem that kept us from it. A folder
    holding many of the files is listed once (S3: one LIST per 1,000 objects, where a HEAD each would take minutes
    for 10,000 objects); the lineage asks the same for its source version."""
    by_folder: dict[str, list[str]] = {}
    for url in urls:
        by_folder.setdefault(url.rstrip("/").rsplit("/", 1)[0], []).append(url)
    found: dict[str, dict[str, Any] | str] = {}
    for folder, members in by_folder.items():
        fs, folder_path = filesystem_for(folder)
        listed: dict[str, dict[str, Any]] = {}
        if len(members) > LIST_FOLDER_FROM and is_remote(folder):  # a local stat is cheaper than a listing
            try:
                listed = {entry["name"].rstrip("/"): entry for entry in fs.ls(folder_path, detail=True)}
            except OSError:
                listed = {}  # asked one by one below, each problem then named with its file
        for url in members:
            _, path = filesystem_for(url)
            if path.rstrip("/") in listed:
                found[url] = listed[path.rstrip("/")]
                continue
            try:
                found[url] = fs.info(path)
            except FileNotFoundError:
                found[url] = GONE
            except PermissionError as exc:
                found[url] = f"access refused ({exc})"
            except OSError as exc:
                found[url] = f"could not be looked up ({type(exc).__name__}: {exc})"
    return found


def _modified(info: dict[str, Any]) -> datetime | None:
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        if isinstance(value, (int, float)):
            return datetime.fromtimestamp(float(value), tz=timezone.utc)
    return None


def base_of(pattern: str) -> str:
    """The fixed folder of `source.path`: everything before the first segment with a placeholder or glob."""
    scheme, sep, rest = pattern.partition("://")
    if not sep:
        scheme, rest = "", pattern
    kept = []
    for segment in rest.split("/")[:-1]:
        if "{" in segment or globlib.has_magic(segment):
            break
        kept.append(segment)
    base = "/".join(kept) + "/"
    return f"{scheme}://{base}" if sep else base


def file_row_ids(spec: Any, urls: list[str]) -> list[str]:
    """Default row ids: each file's path below the fixed folder of source.path (module docstring)."""
    base = base_of(spec.source.path)
    return [url[len(base):] if url.startswith(base) and len(url) > len(base) else url for url in urls]


def batches(spec: Any, url: str) -> Iterator[pa.RecordBatch]:
    """One file alone as its row, the declared columns (the read stage hands this format a partition's files at
    once: `partition_batches`)."""
    for batch, _ in partition_batches(spec, [url]):
        yield batch.select(spec.source.columns)


def empty_schema(spec: Any, url: str) -> pa.Schema | None:
    """The declared columns' types: the same whatever the files hold."""
    return pa.schema([SCHEMA.field(name) for name in spec.source.columns])
