"""Source versions by content (batch_assets/stages/sources/versions.py): a file whose bytes did not change keeps its
version whatever its mtime, a changed byte changes it; a local file is read only when its stat changed (the cache
in the storage root), in blocks, never whole; on S3 the version comes from the ETag or the object's checksum,
without downloading it."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from batch_assets.stages.sources import versions
from batch_assets.stages.sources.versions import CACHE_FILE, content_version


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the versions module reads to hash it."""
    seen: list[str] = []
    real = versions._hash_file

    def counting(fs, path: str) -> str:
        seen.append(path)
        return real(fs, path)

    monkeypatch.setattr(versions, "_hash_file", counting)
    return seen


def test_a_touched_file_keeps_its_version_and_is_not_read_again(tmp_path: Path, hashes: list[str]) -> None:
    store, path = tmp_path / "store", tmp_path / "2026-11-01.jsonl"
    path.write_bytes(b'{"doc_id": "a", "text": "hello"}\n')
    first = content_version(str(path), cache_root=str(store))
    assert hashes == [str(path)] and (store / CACHE_FILE).exists()
    assert content_version(str(path), cache_root=str(store)) == first
    assert len(hashes) == 1  # stat unchanged: the cached digest, no read

    later = time.time() + 5
    os.utime(path, (later, later))  # a touch: new mtime, same bytes
    assert content_version(str(path), cache_root=str(store)) == first
    assert len(hashes) == 2  # the stat changed, so it was read once more ...
    assert content_version(str(path), cache_root=str(store)) == first
    assert len(hashes) == 2  # ... and not again

    path.write_bytes(b'{"doc_id": "a", "text": "hellO"}\n')  # one byte, same size
    os.utime(path, (later, later))  # the old mtime put back (rsync -t, cp -p): the ctime still changed
    changed = content_version(str(path), cache_root=str(store))
    assert changed != first


def test_a_large_file_is_hashed_once_in_blocks(tmp_path: Path, hashes: list[str]) -> None:
    store, path = tmp_path / "store", tmp_path / "big.parquet"
    size = 48 * 2**20
    with path.open("wb") as f:
        for i in range(size // 2**20):
            f.write(bytes([i % 251]) * 2**20)
    tracemalloc.start()
    try:
        first = content_version(str(path), cache_root=str(store))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"hashing a {size >> 20} MiB file held {peak >> 20} MiB: it must stream"
    for _ in range(5):  # a sensor's ticks, the raw step, the schedule: all from the cache
        assert content_version(str(path), cache_root=str(store)) == first
    assert hashes == [str(path)]
    # the cache is a file in the storage root: another process (a step worker, the daemon) finds it too
    again = versions._cache_get(str(store / CACHE_FILE), str(path), _stamp(path))
    assert again == first


def _stamp(path: Path) -> tuple:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def test_s3_versions_come_from_etag_or_checksum_without_downloading(s3_bucket: str, hashes: list[str]) -> None:
    import boto3

    from batch_assets.storage import filesystem_for

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    url = f"{s3_bucket}/days/2026-11-01.jsonl"
    body = b'{"doc_id": "a", "text": "hello"}\n'
    s3.put_object(Bucket=bucket, Key="days/2026-11-01.jsonl", Body=body)
    first = content_version(url)
    assert first.startswith("md5:")
    time.sleep(1.1)  # a new LastModified
    s3.put_object(Bucket=bucket, Key="days/2026-11-01.jsonl", Body=body)  # re-uploaded, identical bytes
    assert content_version(url) == first
    s3.put_object(Bucket=bucket, Key="days/2026-11-01.jsonl", Body=body.replace(b"hello", b"hellO"))
    assert content_version(url) != first

    # multipart: the ETag is not the MD5 of the bytes; the object's own checksum is used when it has one
    part = b"x" * (5 * 2**20)
    for key, checksum in (("multi/sha.bin", {"ChecksumAlgorithm": "SHA256"}), ("multi/plain.bin", {})):
        made = []
        for _ in range(2):
            upload = s3.create_multipart_upload(Bucket=bucket, Key=key, **checksum)
            parts = []
            for n, data in enumerate((part, b"tail"), start=1):
                answer = s3.upload_part(Bucket=bucket, Key=key, PartNumber=n, UploadId=upload["UploadId"],
                                        Body=data, **checksum)
                parts.append({"PartNumber": n, "ETag": answer["ETag"],
                              **({"ChecksumSHA256": answer["ChecksumSHA256"]} if checksum else {})})
            s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                         MultipartUpload={"Parts": parts})
            made.append(content_version(f"{s3_bucket}/{key}"))
        assert made[0] == made[1], f"{key}: the same bytes uploaded again must keep their version"
        assert made[0].startswith("sha256:" if checksum else "etag:"), made
    assert hashes == []  # nothing was downloaded
    fs, _ = filesystem_for(url)
    assert fs is not None
