"""Hash shards of one run share a single read of the source, and every row's id is hashed once (read stage) and
carried: the rows each shard gets, and the exactly-once checks, are the same as when each shard reads alone."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.partitions import hash_shard_keys
from batch_assets.reliability.row_ids import ROW_HASH, stable_hash64
from batch_assets.reliability.row_ids import FINGERPRINT_KEY
from batch_assets.stages.read import run_read, run_read_shards
from batch_assets.storage import ArrowStorage, parquet_footer_metadata, read_batches
from tests.conftest import EMBED_SPEC, docs_rows, make_spec, write_jsonl


def _rows(storage: ArrowStorage, key: str) -> list[tuple]:
    table = pa.Table.from_batches(list(read_batches(storage.stage_url("docs", "raw", key))))
    return sorted(zip(*(table.column(c).to_pylist() for c in ("row_id", "_source_file", "_source_row", ROW_HASH))))


def _spec(data: Path):
    return make_spec(EMBED_SPEC, data, source={"path": f"{data}/*.jsonl"},
                     partitioning={"kind": "hash", "count": 3, "keys": None})


def test_stable_hash64_keeps_its_values() -> None:
    # Shard assignment of data already written depends on these exact values: blake2b-64, little-endian.
    ids = ["a", "doc-17", "ü"]
    expected = [int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "little") for i in ids]
    assert stable_hash64(ids).tolist() == expected
    assert stable_hash64([]).dtype == np.uint64


def test_shared_read_routes_each_row_to_the_shard_it_would_read_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "one.jsonl", docs_rows("x", 40))
    write_jsonl(data / "two.jsonl", docs_rows("y", 35))
    spec = _spec(data)
    keys = hash_shard_keys(3)
    alone, shared, subset = (ArrowStorage(root=str(tmp_path / n)) for n in ("alone", "shared", "subset"))
    for k in keys:
        run_read(spec, alone, k)
    reports = run_read_shards(spec, shared, keys)
    run_read_shards(spec, subset, keys[1:])  # a run over some shards only

    assert [r.key for r in reports] == keys
    for k in keys:
        assert _rows(shared, k) == _rows(alone, k)
        if k != keys[0]:
            assert _rows(subset, k) == _rows(alone, k)
    assert not Path(subset.stage_url("docs", "raw", keys[0])).exists()
    every = [r for k in keys for r in _rows(shared, k)]
    assert sorted(r[0] for r in every) == sorted([f"x{i}" for i in range(40)] + [f"y{i}" for i in range(35)])
    assert all(h == stable_hash64([rid])[0] for rid, _, _, h in every)  # the carried hash is the id's hash
    assert sum(r.rows_out for r in reports) == 75


def test_shared_read_commits_no_shard_when_a_file_fails(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("x", 10))
    (data / "b.jsonl").write_text('{"doc_id": "y1", "text": "fine"}\n{"doc_id": "y2"\n')  # broken JSON
    spec = _spec(data)
    storage = ArrowStorage(root=str(tmp_path / "store"))
    with pytest.raises(PipelineError) as err:
        run_read_shards(spec, storage, hash_shard_keys(3))
    assert "b.jsonl" in str(err.value)
    assert not any(Path(storage.stage_url("docs", "raw", k)).exists() for k in hash_shard_keys(3))


def test_shared_read_checks_each_shard_like_a_read_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "one.jsonl", docs_rows("x", 30))
    spec = _spec(data)
    keys = hash_shard_keys(3)
    alone, shared = ArrowStorage(root=str(tmp_path / "alone")), ArrowStorage(root=str(tmp_path / "shared"))
    for k in keys:
        run_read(spec, alone, k)
    run_read_shards(spec, shared, keys)
    for k in keys:  # the source fingerprint the write stage checks against is the same either way
        assert (parquet_footer_metadata(shared.stage_url("docs", "raw", k))[FINGERPRINT_KEY]
                == parquet_footer_metadata(alone.stage_url("docs", "raw", k))[FINGERPRINT_KEY])

    write_jsonl(data / "two.jsonl", [{"doc_id": "x7", "text": "a second x7"}])  # a repeated id
    again = ArrowStorage(root=str(tmp_path / "again"))
    with pytest.raises(PipelineError, match="row id 'x7' appears more than once"):
        run_read_shards(spec, again, keys)
    assert not any(Path(again.stage_url("docs", "raw", k)).exists() for k in keys)
