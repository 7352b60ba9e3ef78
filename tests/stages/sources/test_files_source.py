"""Files as a source (`source.format: files`, batch_assets/stages/sources/files.py): a local folder or an s3:// prefix
by glob is one row per file, with its path, size, modification time and content version, and no bytes; the stage
that needs the bytes opens the file by `file_path` (`open_input`) within its own chunk. Partitions by hash, by a day
in the path, or one per file through the sensor; a partition made from the same files is never made twice, and a
file rewritten with other bytes is made again. Real files, a real moto S3 server, the real Dagster job."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_assets.spec import SpecError, parse_spec
from batch_assets.stages.read import run_read
from batch_assets.stages.sources.files import FILE_COLUMNS, open_input
from batch_assets.stages.sources.versions import content_version
from batch_assets.storage import ArrowStorage
from tests.conftest import run_pipeline
from tests.orchestration.launch.test_sensors import Ticker


class FirstLines:
    """A user model (custom provider) that needs the files' bytes: it opens each row's file by `file_path` with
    `open_input`, within its chunk, and answers the file's first line. Each call leaves the paths it read in `log`,
    so a test sees which files were inferred, across runs."""

    def __init__(self, log: str):
        self.log = Path(log)

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        lines = []
        for url in batch["file_path"]:
            with open_input(url) as f:
                lines.append(f.read().decode("utf-8").splitlines()[0])
        with self.log.open("a") as f:
            f.write("".join(f"{url}\n" for url in batch["file_path"]))
        return {"first_line": lines}


def read_log(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def files_spec(path: str, log: Path, partitioning: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": "folder",
        "source": {"format": "files", "path": path},
        "partitioning": partitioning,
        "prepare": {"input_columns": ["file_path"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": f"{__name__}:FirstLines",
                                                   "init_kwargs": {"log": str(log)}}},
        "runtime": {"chunk_rows": 2},
        **extra,
    }


def outputs(root: Path, keys: list[str]) -> list[dict[str, Any]]:
    return [row for key in keys for row in pq.read_table(root / "folder" / "output" / f"{key}.parquet").to_pylist()]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_folder_is_one_row_per_file_read_lazily_and_never_inferred_twice(tmp_path: Path) -> None:
    """Hash shards over a folder: every file once across the shards with its size, time and version; no folder,
    marker or temporary file is a row; the model reads each file's bytes itself. A second run infers nothing; a
    file rewritten with other bytes is inferred again, with its own shard's files only (a touch is not)."""
    docs = tmp_path / "docs"
    files = {name: write(docs / name, f"{name} first line\nsecond line of {name}\n")
             for name in ("alpha.txt", "beta.md", "gamma.txt", "delta.csv", "epsilon.txt")}
    write(docs / "_SUCCESS", "")
    write(docs / ".epsilon.txt.tmp", "half written")
    write(docs / "sub" / "nested.txt", "a folder is not a row")
    log, store = tmp_path / "model.log", tmp_path / "store"
    spec = parse_spec(files_spec(f"{docs}/*", log, {"kind": "hash", "count": 2}))
    assert spec.source.columns == list(FILE_COLUMNS)  # left out: all four
    keys = ["shard-00-of-02", "shard-01-of-02"]
    assert run_pipeline(spec, store, keys).success

    rows = outputs(store, keys)
    assert sorted(r["row_id"] for r in rows) == sorted(files)  # every file once, ids below the glob's folder
    assert sorted(read_log(log)) == sorted(str(p) for p in files.values())  # each file's bytes read once
    for row in rows:
        path = files[row["row_id"]]
        assert row["file_path"] == str(path) and row["error"] is None
        assert row["first_line"] == f"{row['row_id']} first line"
        assert row["file_size"] == path.stat().st_size
        assert row["file_mtime"] == datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        assert row["file_version"] == content_version(str(path))
    schema = pq.read_schema(store / "folder" / "raw" / f"{keys[0]}.parquet")
    assert schema.field("file_mtime").type == pa.timestamp("us", tz="UTC")
    assert schema.field("file_size").type == pa.int64()
    assert not [name for name in schema.names if "bytes" in name or "content" in name]

    assert run_pipeline(spec, store, keys).success  # the same files: nothing is inferred again
    assert len(read_log(log)) == len(files)
    later = time.time() + 10
    os.utime(files["alpha.txt"], (later, later))  # touched: same bytes, same version
    assert run_pipeline(spec, store, keys).success
    assert len(read_log(log)) == len(files)

    write(files["beta.md"], "beta rewritten\n")
    assert run_pipeline(spec, store, keys).success
    again = read_log(log)[len(files):]
    # made again with the other files of its own shard only: a shard's version covers its own files
    shard = next(k for k in keys if "beta.md" in pq.read_table(store / "folder" / "raw" / f"{k}.parquet",
                                                               columns=["row_id"]).column("row_id").to_pylist())
    same_shard = pq.read_table(store / "folder" / "raw" / f"{shard}.parquet").column("file_path").to_pylist()
    assert sorted(again) == sorted(same_shard) and len(same_shard) < len(files)
    rows = {r["row_id"]: r for r in outputs(store, keys)}
    assert rows["beta.md"]["first_line"] == "beta rewritten"
    assert rows["beta.md"]["file_version"] == content_version(str(files["beta.md"]))
    assert sorted(rows) == sorted(files)


def test_a_day_in_the_path_is_a_daily_partition(tmp_path: Path) -> None:
    calls, log, store = tmp_path / "calls", tmp_path / "model.log", tmp_path / "store"
    for day, names in {"2026-11-01": ["a", "b"], "2026-11-02": ["c", "d", "e"]}.items():
        for name in names:
            write(calls / day / f"{name}.txt", f"{name} said hello on {day}\n")
    write(calls / "2026-11-02" / "notes.json", "{}\n")  # another extension: not matched by the glob
    spec = parse_spec(files_spec(f"{calls}/{{partition}}/*.txt", log,
                                 {"kind": "daily", "start_date": "2026-11-01"}))
    assert run_pipeline(spec, store, ["2026-11-02"]).success
    rows = outputs(store, ["2026-11-02"])
    assert sorted(r["row_id"] for r in rows) == ["2026-11-02/c.txt", "2026-11-02/d.txt", "2026-11-02/e.txt"]
    assert all(r["first_line"].endswith("on 2026-11-02") for r in rows)


def test_one_partition_per_new_file_through_the_sensor(tmp_path: Path) -> None:
    """Dynamic partitions: the sensor makes a partition and one run per new file; the run reads that file alone."""
    inbox, log, store = tmp_path / "inbox", tmp_path / "model.log", tmp_path / "store"
    for name in ("contract-1", "contract-2"):
        path = write(inbox / f"{name}.txt", f"{name} terms\n")
        stamp = time.time() - 60
        os.utime(path, (stamp, stamp))
    raw = files_spec(f"{inbox}/{{partition}}.txt", log, {"kind": "dynamic"},
                     sensor={"min_age_seconds": 5, "interval_seconds": 30})
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, raw, storage_root=str(store))
        requests = ticker.tick().run_requests
        assert sorted(r.partition_key for r in requests) == ["contract-1", "contract-2"]
        assert not ticker.tick().run_requests  # requested once
        spec = parse_spec(raw)
        assert run_pipeline(spec, store, ["contract-2"], instance=instance).success
    rows = outputs(store, ["contract-2"])
    assert [(r["row_id"], r["first_line"]) for r in rows] == [("contract-2.txt", "contract-2 terms")]


def test_an_s3_prefix_is_one_row_per_object_with_its_etag_as_version(s3_bucket: str, tmp_path: Path) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    bodies = {f"incoming/2026-11-01/{n}.txt": f"object {n}\nmore\n".encode() for n in ("one", "two", "three")}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    s3.put_object(Bucket=bucket, Key="incoming/2026-11-01/_SUCCESS", Body=b"")
    log, store = tmp_path / "model.log", tmp_path / "store"
    spec = parse_spec(files_spec(f"{s3_bucket}/incoming/{{partition}}/*", log,
                                 {"kind": "daily", "start_date": "2026-11-01"}))
    assert run_pipeline(spec, store, ["2026-11-01"]).success
    rows = {r["row_id"]: r for r in outputs(store, ["2026-11-01"])}
    assert sorted(rows) == sorted(k.removeprefix("incoming/") for k in bodies)
    for key, body in bodies.items():
        row = rows[key.removeprefix("incoming/")]
        assert row["file_path"] == f"{s3_bucket}/{key}" and row["file_size"] == len(body)
        assert row["file_version"] == f"md5:{hashlib.md5(body).hexdigest()}"  # the ETag: no download to version it
        assert row["first_line"] == body.decode().splitlines()[0]  # the model read the object itself
        assert row["file_mtime"] is not None and row["error"] is None

    assert run_pipeline(spec, store, ["2026-11-01"]).success  # the same objects: nothing inferred again
    assert len(read_log(log)) == len(bodies)


def test_hash_shards_of_a_bucket_list_each_folder_once(s3_bucket: str, tmp_path: Path) -> None:
    """Twelve objects in one folder (more than LIST_FOLDER_FROM: listed, not asked one by one) over three shards:
    every object once; a new object makes its own shard run again, the others are not inferred again."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    for i in range(12):
        s3.put_object(Bucket=bucket, Key=f"scans/page-{i:02d}.txt", Body=f"page {i}\n".encode())
    log, store = tmp_path / "model.log", tmp_path / "store"
    spec = parse_spec(files_spec(f"{s3_bucket}/scans/*.txt", log, {"kind": "hash", "count": 3}))
    keys = ["shard-00-of-03", "shard-01-of-03", "shard-02-of-03"]
    assert run_pipeline(spec, store, keys).success
    rows = outputs(store, keys)
    assert sorted(r["row_id"] for r in rows) == [f"page-{i:02d}.txt" for i in range(12)]
    assert all(r["first_line"] == f"page {int(r['row_id'][5:7])}" for r in rows)

    s3.put_object(Bucket=bucket, Key="scans/page-12.txt", Body=b"page 12\n")
    assert run_pipeline(spec, store, keys).success
    again = read_log(log)[12:]
    shard = next(k for k in keys if "page-12.txt" in pq.read_table(store / "folder" / "raw" / f"{k}.parquet",
                                                                   columns=["row_id"]).column("row_id").to_pylist())
    same_shard = pq.read_table(store / "folder" / "raw" / f"{shard}.parquet").column("file_path").to_pylist()
    assert sorted(again) == sorted(same_shard) and len(same_shard) < 13
    assert len(outputs(store, keys)) == 13


def test_a_file_that_cannot_be_looked_up_is_a_row_error_naming_it(tmp_path: Path) -> None:
    """A dangling link in the folder (its target removed after the listing would look the same): the row is kept
    with an error naming the file; the other files are published. The partition is not made again while nothing
    changed (the unreadable file has a version too), and is once the link is mended."""
    docs, log, store = tmp_path / "docs", tmp_path / "model.log", tmp_path / "store"
    write(docs / "kept.txt", "kept\n")
    (docs / "broken.txt").symlink_to(tmp_path / "nowhere.txt")
    spec = parse_spec(files_spec(f"{docs}/*.txt", log, {"kind": "hash", "count": 1},
                                 runtime={"max_error_fraction": 0.6, "chunk_rows": 2}))
    assert run_pipeline(spec, store, ["shard-00-of-01"]).success
    rows = {r["row_id"]: r for r in outputs(store, ["shard-00-of-01"])}
    assert sorted(rows) == ["broken.txt", "kept.txt"]
    assert rows["kept.txt"]["first_line"] == "kept" and rows["kept.txt"]["error"] is None
    assert rows["broken.txt"]["first_line"] is None
    assert str(docs / "broken.txt") in rows["broken.txt"]["error"]
    assert read_log(log) == [str(docs / "kept.txt")]  # the broken one never reached the model
    assert run_pipeline(spec, store, ["shard-00-of-01"]).success  # the same files, the link still broken:
    assert read_log(log) == [str(docs / "kept.txt")]  # nothing is inferred (and paid for) again
    (tmp_path / "nowhere.txt").write_text("now there\n")  # the link mended: that file is new content
    assert run_pipeline(spec, store, ["shard-00-of-01"]).success
    rows = {r["row_id"]: r for r in outputs(store, ["shard-00-of-01"])}
    assert rows["broken.txt"]["first_line"] == "now there" and rows["broken.txt"]["error"] is None


def test_the_files_source_spec(tmp_path: Path) -> None:
    base = files_spec(f"{tmp_path}/*", tmp_path / "log", {"kind": "hash", "count": 2})
    chosen = parse_spec({**base, "source": {**base["source"], "columns": ["file_path", "file_version"]}})
    assert chosen.source.columns == ["file_path", "file_version"]
    with pytest.raises(SpecError, match=r"'text' is not a column of a files source"):
        parse_spec({**base, "source": {**base["source"], "columns": ["file_path", "text"]}})
    with pytest.raises(SpecError, match=r"types: does not apply to a files source"):
        parse_spec({**base, "source": {**base["source"], "types": {"file_size": "int32"}}})
    table = {**base, "source": {"format": "jsonl", "path": f"{tmp_path}/*.jsonl"}}
    with pytest.raises(SpecError, match=r"source.columns: Field required"):  # a table still lists its columns
        parse_spec(table)


def test_the_partition_is_read_without_its_bytes(tmp_path: Path) -> None:
    """The raw partition holds no file contents: a 5 MB file is a row of a few dozen bytes."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "big.bin").write_bytes(os.urandom(5 * 2**20))
    spec = parse_spec(files_spec(f"{docs}/*", tmp_path / "log", {"kind": "hash", "count": 1}))
    report = run_read(spec, ArrowStorage(root=str(tmp_path / "store")), "shard-00-of-01")
    assert report.rows_out == 1
    assert os.path.getsize(report.path) < 20_000
