"""The content version of a source file: what "made from the same source" means for lineage, sensors and the raw
asset's data version.

A file whose bytes did not change keeps its version, whatever its mtime: re-materializing an upstream day with
byte-identical output, a `touch`, a copy that preserves nothing but the bytes, re-uploading the same object to S3.
What each case costs:

- **Local file**: a `stat`. The digest (BLAKE2b, or xxh3-128 when `xxhash` is installed) is streamed over the file
  in 1 MiB blocks, never held in memory, and only when the file's (mtime, ctime, size, inode) differs from the last
  time it was hashed: a small cache of path -> stat -> digest, `_source_versions.sqlite` in the storage root (a local
  root; an `s3://` root keeps the cache in the process only).
- **S3, single-part upload**: the ETag is the MD5 of the bytes: one HEAD request (or none: the listing carries it).
- **S3, multipart upload**: the ETag is an MD5 of the parts' MD5s with the part count (`<md5>-<parts>`); the object's
  own checksum (ChecksumSHA256/SHA1/CRC32/CRC32C/CRC64NVME, asked for with one HEAD `ChecksumMode=ENABLED`) is used
  when the uploader stored one; else the multipart ETag, which stays the same for the same bytes uploaded with the
  same part size (a re-upload with another part size counts as new, and is processed once more).
- **Any other filesystem**: its content hash when it reports one (GCS `md5Hash`), else the bytes are streamed and
  hashed, cached in the process by (modified, size).

The digests are prefixed with their kind (`blake2b:`, `md5:`, `sha256:`, `etag:`), so versions of different kinds
never compare equal by accident.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from batch_assets.storage import filesystem_for, is_remote

BLOCK = 1 << 20  # bytes hashed at a time: memory stays flat whatever the file's size
CACHE_FILE = "_source_versions.sqlite"
# checksums S3 keeps for an object when the uploader asked for one, strongest first
S3_CHECKSUMS = ("ChecksumSHA256", "ChecksumSHA1", "ChecksumCRC64NVME", "ChecksumCRC32C", "ChecksumCRC32")

_memory: dict[tuple[str, tuple], str] = {}  # (path, stat) -> digest: remote storage roots and remote sources
_memory_lock = threading.Lock()


def _hasher() -> tuple[str, Callable[[], Any]]:
    """xxh3-128 when the optional `xxhash` is installed (several times faster on large files), else BLAKE2b."""
    try:
        import xxhash
    except ImportError:
        return "blake2b", lambda: hashlib.blake2b(digest_size=16)
    return "xxh3", xxhash.xxh3_128


def hash_stream(f: Any) -> str:
    """The digest of an open binary file, read in BLOCK-sized pieces."""
    kind, new = _hasher()
    h = new()
    while True:
        block = f.read(BLOCK)
        if not block:
            return f"{kind}:{h.hexdigest()}"
        h.update(block)


def content_version(url: str, info: dict[str, Any] | None = None, cache_root: str | None = None) -> str:
    """The content version of the file at `url` (local path or URL). `info`: its fsspec info when the caller has
    it (a listing); `cache_root`: the storage root, where local digests are cached."""
    fs, path = filesystem_for(url)
    if isinstance(fs, LocalFileSystem):
        return _local_version(path, cache_root)
    info = info if info is not None else fs.info(path)
    if url.startswith("s3://"):
        return _s3_version(fs, path, info)
    for name in ("md5Hash", "md5", "sha256"):  # filesystems that report a content hash (GCS, Azure, ...)
        if info.get(name):
            return f"{name.removesuffix('Hash')}:{info[name]}"
    stamp = (str(info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("updated")),
             info.get("size"))
    return _cached_in_memory(url, stamp, lambda: _hash_file(fs, path))


def _hash_file(fs: Any, path: str) -> str:
    with fs.open(path, "rb") as f:
        return hash_stream(f)


def _local_version(path: str, cache_root: str | None) -> str:
    st = os.stat(path)
    # ctime too: a writer that restores the old mtime after rewriting the same number of bytes (rsync -t, cp -p,
    # os.utime) cannot set it back, so changed bytes are never taken for cached ones
    stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    if cache_root is None or is_remote(cache_root):
        return _cached_in_memory(path, stamp, lambda: _hash_file(LocalFileSystem(), path))
    cache = os.path.join(filesystem_for(cache_root)[1], CACHE_FILE)
    found = _cache_get(cache, path, stamp)
    if found is not None:
        return found
    digest = _hash_file(LocalFileSystem(), path)
    _cache_put(cache, path, stamp, digest)
    return digest


def _cached_in_memory(key: str, stamp: tuple, compute: Callable[[], str]) -> str:
    with _memory_lock:
        found = _memory.get((key, stamp))
    if found is None:
        found = compute()
        with _memory_lock:
            if len(_memory) > 100_000:  # a long-lived code server listing a huge bucket: bound it
                _memory.clear()
            _memory[(key, stamp)] = found
    return found


def _connect(cache: str) -> sqlite3.Connection:
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    # several processes (sensor, step workers) share the file: SQLite's own locking, waiting up to 30 s
    con = sqlite3.connect(cache, timeout=30)
    con.execute("CREATE TABLE IF NOT EXISTS versions (path TEXT PRIMARY KEY, stamp TEXT NOT NULL, "
                "digest TEXT NOT NULL)")
    return con


def _cache_get(cache: str, path: str, stamp: tuple) -> str | None:
    if not os.path.exists(cache):
        return None
    try:
        with closing(_connect(cache)) as con:
            row = con.execute("SELECT stamp, digest FROM versions WHERE path = ?", (path,)).fetchone()
    except sqlite3.DatabaseError:  # a damaged cache costs a hash, never a wrong version
        return None
    return row[1] if row and row[0] == repr(stamp) else None


def _cache_put(cache: str, path: str, stamp: tuple, digest: str) -> None:
    try:
        with closing(_connect(cache)) as con, con:  # the inner `con`: commit on success
            con.execute("INSERT OR REPLACE INTO versions (path, stamp, digest) VALUES (?, ?, ?)",
                        (path, repr(stamp), digest))
    except sqlite3.DatabaseError:
        pass  # the next look hashes again: slower, still right


def _s3_version(fs: Any, path: str, info: dict[str, Any]) -> str:
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    if etag and "-" not in etag:
        return f"md5:{etag}"  # a single-part upload: the ETag is the MD5 of the bytes
    bucket, _, key = path.partition("/")
    head = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    for name in S3_CHECKSUMS:
        if head.get(name):
            return f"{name.removeprefix('Checksum').lower()}:{head[name]}"
    etag = etag or str(head.get("ETag", "")).strip('"')
    if etag:
        return f"etag:{etag}"
    # no content checksum at all (an S3-compatible store that gives none): hash the bytes, once per stamp
    return _cached_in_memory("s3://" + path, (str(info.get("LastModified")), info.get("size")),
                             lambda: _hash_file(fs, path))
