"""The one-file-per-partition sinks (stages/sinks/base.py `FileSink`: parquet, jsonl, csv): a partition appears only
when its write completes, a failed write leaves the previous partition exactly as it was (locally and on S3), and
every partition key has a file of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from batch_assets.spec import SpecError
from batch_assets.stages.sinks import sink_for
from batch_assets.storage import filesystem_for
from tests.conftest import GENERATE_SPEC, make_spec

FILE_SINKS = ["parquet", "jsonl", "csv"]
SCHEMA = pa.schema([("customer_id", pa.string()), ("industry", pa.string())])


def _batches(prefix: str, n: int, fail_after: int | None = None) -> Iterator[pa.RecordBatch]:
    """`n` batches of two rows; raises (as the exactly-once check or a model error would) after `fail_after`."""
    for i in range(n):
        if fail_after is not None and i == fail_after:
            raise RuntimeError("the model failed half-way")
        yield pa.RecordBatch.from_pylist([{"customer_id": f"{prefix}{2 * i}", "industry": "Other"},
                                          {"customer_id": f"{prefix}{2 * i + 1}", "industry": "Law Firm"}], SCHEMA)


def _listing(base: str) -> list[str]:
    fs, path = filesystem_for(base)
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("fmt", FILE_SINKS)
def test_a_write_that_fails_half_way_leaves_the_previous_partition_as_it_was(
        fmt: str, where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    base = f"{request.getfixturevalue('s3_bucket')}/out" if where == "s3" else str(tmp_path / "out")
    spec = make_spec(GENERATE_SPEC, tmp_path, sink={"format": fmt, "path": base})
    sink = sink_for(fmt)
    url = sink.partition_url(base, spec, "p0")
    fs, path = filesystem_for(url)

    # the first write of a partition fails: nothing is published, not even an empty or partial file
    with pytest.raises(RuntimeError, match="half-way"):
        sink.write(spec, url, _batches("new", 3, fail_after=2), SCHEMA)
    assert not fs.exists(path)

    assert sink.write(spec, url, _batches("old", 3), SCHEMA) == 6
    published = fs.cat_file(path)
    with pytest.raises(RuntimeError, match="half-way"):
        sink.write(spec, url, _batches("new", 3, fail_after=2), SCHEMA)
    assert fs.cat_file(path) == published  # readers still see the old partition, byte for byte
    assert _listing(base) == [f"p0.{fmt}"]  # and no temporary file is left beside it


@pytest.mark.parametrize("fmt", FILE_SINKS)
def test_every_partition_key_gets_its_own_file_in_the_sink_folder(fmt: str, tmp_path: Path) -> None:
    """Dynamic keys and time windows hold any character: '/' must not make a sub-folder, and two keys never share a
    file (one would overwrite the other's rows)."""
    keys = ["2026-11-01", "a/b", "a%2Fb", "a b", "café", "..", "x?y#z", "2026-11-01T00:00|2026-11-02T00:00"]
    base = str(tmp_path / "out")
    spec = make_spec(GENERATE_SPEC, tmp_path, sink={"format": fmt, "path": base})
    sink = sink_for(fmt)
    urls = [sink.partition_url(base, spec, k) for k in keys]
    assert len(set(urls)) == len(keys)
    for i, url in enumerate(urls):
        assert url.startswith(base + "/") and "/" not in url.removeprefix(base + "/")
        sink.write(spec, url, _batches(f"k{i}-", 1), SCHEMA)
    assert len(_listing(base)) == len(keys)


@pytest.mark.parametrize("fmt", FILE_SINKS)
def test_a_file_sink_refuses_a_table_name_at_load(fmt: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="sink.table") as info:
        make_spec(GENERATE_SPEC, tmp_path, sink={"format": fmt, "table": "customers"})
    assert f"does not apply to a {fmt} sink" in str(info.value) and "lancedb sink" in str(info.value), info.value
