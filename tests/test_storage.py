"""Streaming write/read and atomic replace, on a local folder and on S3 (a real moto server on loopback)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from batch_assets.storage import ArrowStorage, exists, parquet_rows, read_batches, write_parquet


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"row_id": [f"r{i}" for i in range(start, start + n)], "x": list(range(start, start + n))})


def _roundtrip_and_replace(root: str) -> None:
    storage = ArrowStorage(root=root)
    url = storage.stage_url("pipe", "raw", "2026-11-01")
    # streaming write: many small batches become row groups of one file
    with write_parquet(url) as w:
        for b in range(20):
            w.write(_batch(b * 50, 50))
    assert parquet_rows(url) == 1000
    batches = list(read_batches(url, batch_rows=128))
    assert max(b.num_rows for b in batches) <= 128
    ids = [i for b in batches for i in b.column("row_id").to_pylist()]
    assert ids == [f"r{i}" for i in range(1000)]

    # re-materializing replaces exactly: no duplicate rows
    with write_parquet(url) as w:
        w.write(_batch(0, 10))
    assert parquet_rows(url) == 10

    # a write that fails half-way leaves the previous version, whole and alone
    with pytest.raises(RuntimeError, match="boom"):
        with write_parquet(url) as w:
            w.write(_batch(100, 500))
            raise RuntimeError("boom")
    assert parquet_rows(url) == 10

    # a first write that fails leaves nothing visible at all
    fresh = storage.stage_url("pipe", "raw", "never")
    with pytest.raises(RuntimeError):
        with write_parquet(fresh) as w:
            w.write(_batch(0, 5))
            raise RuntimeError("boom")
    assert not exists(fresh)


def test_local_roundtrip_and_atomic_replace(tmp_path: Path) -> None:
    _roundtrip_and_replace(str(tmp_path / "store"))
    leftovers = [p for p in (tmp_path / "store").rglob("*") if p.name.startswith(".")]
    assert leftovers == [], "temporary files must be cleaned up"


def test_s3_roundtrip_and_atomic_replace(s3_bucket: str) -> None:
    _roundtrip_and_replace(f"{s3_bucket}/prefix")


def test_s3_large_multipart_write_streams(s3_bucket: str) -> None:
    """Bigger than one multipart part (16 MiB): committed only at the end, readable whole."""
    url = ArrowStorage(root=s3_bucket).stage_url("pipe", "raw", "big")
    payload = "x" * 4000
    with write_parquet(url) as w:
        for b in range(6):
            w.write(pa.record_batch({"row_id": [f"{b}-{i}" for i in range(1500)], "blob": [payload + str(i) for i in range(1500)]}))
    assert parquet_rows(url) == 9000


def test_empty_partition_is_a_valid_empty_file(tmp_path: Path) -> None:
    url = str(tmp_path / "empty.parquet")
    schema = pa.schema([("row_id", pa.string())])
    with write_parquet(url, schema):
        pass
    assert parquet_rows(url) == 0


def test_storage_root_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BATCH_STORAGE_ROOT", str(tmp_path / "envroot"))
    assert ArrowStorage().stage_url("p", "raw", "k/1").startswith(str(tmp_path / "envroot") + "/p/raw/")
    assert ArrowStorage().stage_url("p", "raw", "k/1").endswith("k%2F1.parquet")
