"""Which files and rows a partition reads (batch_assets/partition_files.py): globs list data files only (no folder,
no hidden or `_`-prefixed file such as an atomic writer's temporary or a `_SUCCESS` marker), in order, local and on
S3; partition keys come from file names, and two files giving one key is an error naming both; a missing source
names the pipeline, partition and path; hash shards split the rows with none lost or repeated, whatever the
batching; a day keeps the rows stamped in it (in the spec's timezone), and a row with no readable timestamp, or one
stamped with another day in a day's file, fails naming the column, the row and the value."""

from __future__ import annotations

import zoneinfo
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.partition_files import (day_check, day_filter, discover_file_keys, expand, file_key, hash_filter,
                                          hash_shard_keys, require_files)
from batch_assets.reliability.row_ids import stable_hash64
from tests.conftest import EMBED_SPEC, make_spec


def _touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")


@pytest.mark.parametrize("count", [1, 2, 10, 11, 100, 101, 1000])
def test_hash_shard_keys_are_distinct_and_sort_in_shard_order(count: int) -> None:
    """The UI and `--partition-range` order keys as text: shard 10 must not come before shard 2."""
    keys = hash_shard_keys(count)
    assert len(set(keys)) == count and sorted(keys) == keys
    assert keys[0].startswith("shard-0") and keys[-1].endswith(f"-of-{count:02d}")


def test_a_glob_lists_data_files_only_in_order(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _touch(data / "b.jsonl", data / "a.jsonl", data / ".a.jsonl.tmp-123", data / "_SUCCESS", data / "_tmp.jsonl")
    (data / "folder.jsonl").mkdir()
    assert expand(str(data / "*.jsonl")) == [str(data / "a.jsonl"), str(data / "b.jsonl")]
    assert expand(str(data / "*")) == [str(data / "a.jsonl"), str(data / "b.jsonl")]


def test_a_path_without_wildcards_is_itself_or_nothing(tmp_path: Path) -> None:
    _touch(tmp_path / "one.jsonl")
    assert expand(str(tmp_path / "one.jsonl")) == [str(tmp_path / "one.jsonl")]
    assert expand(str(tmp_path / "missing.jsonl")) == []


def test_an_s3_glob_lists_s3_urls_of_data_files(s3_bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem()
    for name in ("in/b.jsonl", "in/a.jsonl", "in/_SUCCESS", "in/.a.jsonl.tmp-1", "in/sub/c.jsonl"):
        fs.pipe(f"{s3_bucket}/{name}", b"{}\n")
    assert expand(f"{s3_bucket}/in/*.jsonl") == [f"{s3_bucket}/in/a.jsonl", f"{s3_bucket}/in/b.jsonl"]
    assert expand(f"{s3_bucket}/in/**/*.jsonl") == [f"{s3_bucket}/in/a.jsonl", f"{s3_bucket}/in/b.jsonl",
                                                    f"{s3_bucket}/in/sub/c.jsonl"]
    assert expand(f"{s3_bucket}-no-such-bucket/in/*.jsonl") == [], "require_files names the path: not an error here"


def test_an_s3_listing_that_is_refused_is_an_error_not_an_empty_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.s3_auth import authenticated_s3

    with authenticated_s3() as s3:
        s3.client().put_object(Bucket=s3.bucket, Key="in/a.jsonl", Body=b"{}\n")
        for name, value in {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": s3.region,
                            "AWS_ACCESS_KEY_ID": s3.key_id, "AWS_SECRET_ACCESS_KEY": "w" * 40}.items():
            monkeypatch.setenv(name, value)
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        with pytest.raises(PipelineError) as info:
            expand(f"s3://{s3.bucket}/in/*.jsonl")
    message = str(info.value)
    assert "refused" in message and f"s3://{s3.bucket}/in/*.jsonl" in message and "AWS_ACCESS_KEY_ID" in message


def test_a_file_key_is_the_name_before_its_first_dot() -> None:
    assert file_key("/data/2026-11-01.jsonl.gz") == "2026-11-01"
    assert file_key("s3://bucket/in/shop.v2.csv") == "shop"


def _static_spec(tmp_path: Path, path: str):
    spec = make_spec(EMBED_SPEC, tmp_path)
    spec.source.path = path  # the keys are what this module discovers from the path
    return spec


def test_keys_come_from_the_part_of_each_name_that_partition_matches(tmp_path: Path) -> None:
    data = tmp_path / "reviews"
    _touch(data / "shop-a" / "2026.jsonl", data / "shop-b" / "2026.jsonl", data / "shop-b" / "2025.jsonl",
           data / "shop-c" / "notes.txt", data / "shop-d" / "_2026.jsonl")
    spec = _static_spec(tmp_path, str(data / "{partition}" / "2026.jsonl"))
    assert discover_file_keys(spec) == ["shop-a", "shop-b"]
    spec = _static_spec(tmp_path, str(data / "shop-b" / "{partition}.jsonl"))
    assert discover_file_keys(spec) == ["2025", "2026"]


def test_a_writers_staging_folder_is_no_partition_and_no_data(tmp_path: Path) -> None:
    """{partition} in a folder's place: a writer's staging folder (Spark's `_temporary`, an uploader's `.staging`, a
    notebook's `.ipynb_checkpoints`) beside the day folders is not a partition key, and a `**` glob does not read
    the files inside it; a folder the spec names literally (`_raw`) is the user's and is read."""
    data = tmp_path / "_raw" / "reviews"
    _touch(data / "2026-11-01" / "part.jsonl", data / "2026-11-02" / "part.jsonl",
           data / "_temporary" / "part.jsonl", data / ".staging" / "part.jsonl",
           data / ".ipynb_checkpoints" / "part.jsonl", data / "2026-11-02" / "_temporary" / "part.jsonl")
    spec = _static_spec(tmp_path, str(data / "{partition}" / "part.jsonl"))
    assert discover_file_keys(spec) == ["2026-11-01", "2026-11-02"]
    assert expand(str(data / "**" / "*.jsonl")) == [str(data / "2026-11-01" / "part.jsonl"),
                                                    str(data / "2026-11-02" / "part.jsonl")]
    assert expand(str(data / "_temporary" / "*.jsonl")) == [str(data / "_temporary" / "part.jsonl")], \
        "a folder the pattern names is the user's choice"


def test_without_partition_in_the_path_one_key_per_file(tmp_path: Path) -> None:
    _touch(tmp_path / "in" / "north.jsonl", tmp_path / "in" / "south.jsonl")
    assert discover_file_keys(_static_spec(tmp_path, str(tmp_path / "in" / "*.jsonl"))) == ["north", "south"]


def test_two_files_that_give_one_key_are_an_error_naming_both(tmp_path: Path) -> None:
    _touch(tmp_path / "in" / "north.jsonl", tmp_path / "in" / "north.v2.jsonl")
    with pytest.raises(PipelineError) as info:
        discover_file_keys(_static_spec(tmp_path, str(tmp_path / "in" / "*.jsonl")))
    message = str(info.value)
    assert "'north'" in message and "pipeline 'docs'" in message
    assert str(tmp_path / "in" / "north.jsonl") in message and str(tmp_path / "in" / "north.v2.jsonl") in message
    assert "rename one of the files" in message


def test_a_partition_without_files_names_pipeline_partition_and_path(tmp_path: Path) -> None:
    spec = make_spec(EMBED_SPEC, tmp_path)
    assert require_files(["x"], spec, "a", "p") == ["x"]
    with pytest.raises(PipelineError) as info:
        require_files([], spec, "a", str(tmp_path / "a.jsonl"))
    message = str(info.value)
    assert "does not exist" in message and "pipeline 'docs'" in message and "partition 'a'" in message
    assert str(tmp_path / "a.jsonl") in message


def _ids_batch(ids: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"row_id": ids})


def test_hash_shards_keep_every_row_exactly_once_however_the_rows_are_batched() -> None:
    ids = [f"docs.jsonl:{i}" for i in range(1000)]
    count = 4
    whole = [hash_filter(i, count)(_ids_batch(ids)) for i in range(count)]
    assert (np.sum(whole, axis=0) == 1).all(), "a row in no shard is lost, in two is inferred twice"
    assert all(mask.any() for mask in whole), "every shard gets rows"
    for i in range(count):  # the same row lands in the same shard in any batch: the ids decide, not positions
        pieces = np.concatenate([hash_filter(i, count)(_ids_batch(ids[s:s + 97])) for s in range(0, 1000, 97)])
        assert (pieces == whole[i]).all()
    # and the shard of an id is fixed (stable across processes and releases): partitions already published stay valid
    assert int(stable_hash64(["docs.jsonl:0"])[0] % np.uint64(count)) == int(np.argmax([m[0] for m in whole]))


def _stamped(values: list, rows: list[int] | None = None, type_: pa.DataType | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "ts": pa.array(values, type=type_) if type_ is not None else values,
        "_source_row": rows or list(range(len(values)))})


def test_a_day_keeps_the_rows_stamped_in_it_in_the_spec_timezone() -> None:
    batch = _stamped(["2026-11-01T00:00:00", "2026-11-01T23:59:59", "2026-11-02T00:00:00", "2026-10-31T23:59:59",
                      "2026-11-02T02:30:00+00:00"])  # the last is 2026-11-01 21:30 in New York
    assert day_filter("2026-11-01", "ts", "UTC")(batch).tolist() == [True, True, False, False, False]
    # the same instants, days cut in New York: naive stamps are local time there
    assert day_filter("2026-11-01", "ts", "America/New_York")(batch).tolist() == [True, True, False, False, True]


def test_a_day_reads_arrow_timestamps_with_and_without_a_timezone() -> None:
    import datetime as dt

    stamps = [dt.datetime(2026, 11, 1, 23, 30), dt.datetime(2026, 11, 2, 0, 30)]
    naive = _stamped(stamps, type_=pa.timestamp("s"))
    assert day_filter("2026-11-01", "ts", "UTC")(naive).tolist() == [True, False]
    aware = _stamped(stamps, type_=pa.timestamp("s", tz="UTC"))
    # 23:30 UTC is 00:30 next day in Berlin; 00:30 UTC on the 2nd is 01:30 on the 2nd
    assert day_filter("2026-11-02", "ts", "Europe/Berlin")(aware).tolist() == [True, True]


@pytest.mark.parametrize("days", [["2026-10-24", "2026-10-25", "2026-10-26"],  # clocks go back: a 25-hour day
                                  ["2026-03-28", "2026-03-29", "2026-03-30"]],  # clocks go forward: 23 hours
                         ids=["autumn", "spring"])
def test_across_a_clock_change_every_row_is_in_exactly_one_day(days: list[str]) -> None:
    """Days are cut at local midnight, however long the day: no hour in no day (lost) or in two (inferred twice)."""
    import datetime as dt

    start = dt.datetime.fromisoformat(days[0]).replace(tzinfo=dt.timezone.utc) - dt.timedelta(hours=3)
    stamps = [start + dt.timedelta(minutes=30 * i) for i in range(2 * 24 * 3)]
    batch = _stamped(stamps, type_=pa.timestamp("s", tz="UTC"))
    kept = np.array([day_filter(day, "ts", "Europe/Berlin")(batch) for day in days])
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    local_dates = [s.astimezone(berlin).date().isoformat() for s in stamps]
    for i, date in enumerate(local_dates):
        expected = [day == date for day in days]
        assert kept[:, i].tolist() == expected, f"{stamps[i]} (local date {date}) kept by {kept[:, i].tolist()}"
    hours_in_middle_day = int(kept[1].sum()) / 2
    assert hours_in_middle_day == (25 if days[1] == "2026-10-25" else 23)


def test_one_column_may_mix_offsets_and_times_without_one() -> None:
    """Local times written with their offset change it at a clock change (+02:00, then +01:00); a time without an
    offset is wall time in the spec's timezone."""
    batch = _stamped(["2026-10-25T01:30:00+02:00", "2026-10-25T23:30:00+01:00", "2026-10-26T00:30:00+01:00",
                      "2026-10-25T12:00:00", "2026-10-24T22:30:00+00:00", "2026-10-25T02:30:00"])
    assert day_filter("2026-10-25", "ts", "Europe/Berlin")(batch).tolist() == [True, True, False, True, True, True]
    with pytest.raises(PipelineError, match=r"'soon' is not a timestamp.*row 2"):
        day_filter("2026-10-25", "ts", "Europe/Berlin")(_stamped(["2026-10-25T01:30:00+02:00", "2026-10-25", "soon"]))


def test_a_row_without_a_readable_timestamp_fails_naming_column_row_and_value() -> None:
    batch = _stamped(["2026-11-01T10:00:00", "yesterday"], rows=[41, 42])
    with pytest.raises(PipelineError) as info:
        day_filter("2026-11-01", "ts", "UTC")(batch)
    message = str(info.value)
    assert "'yesterday'" in message and "column 'ts'" in message and "row 42" in message


def test_a_null_timestamp_is_no_day_and_fails_rather_than_losing_the_row() -> None:
    batch = _stamped(["2026-11-01T10:00:00", None], rows=[0, 7])
    with pytest.raises(PipelineError, match=r"row 7"):
        day_filter("2026-11-01", "ts", "UTC")(batch)


def test_a_row_of_another_day_in_a_days_file_fails_naming_it_and_the_fix() -> None:
    batch = _stamped(["2026-11-01T10:00:00", "2026-11-03T09:15:00", "2026-11-04T09:15:00"], rows=[0, 1, 2])
    with pytest.raises(PipelineError) as info:
        day_check("2026-11-01", "ts", "UTC")(batch)
    message = str(info.value)
    assert "2026-11-03T09:15:00" in message and "not of day 2026-11-01" in message and "row 1" in message
    assert "2 such row(s)" in message and "day_check: keep" in message
    good = _stamped(["2026-11-01T10:00:00", "2026-11-01T11:00:00"])
    assert day_check("2026-11-01", "ts", "UTC")(good).tolist() == [True, True]


@pytest.mark.parametrize("value", ["now", "today", "12:00"])
def test_text_without_a_date_is_no_timestamp_not_a_moment_of_the_day_the_run_happens(value: str) -> None:
    """pandas reads these as moments of today: the row would land in today's partition and be missing from its own."""
    import datetime as dt

    today = dt.date.today().isoformat()
    batch = _stamped([f"{today}T09:00:00", value], rows=[0, 5])
    with pytest.raises(PipelineError) as info:
        day_filter(today, "ts", "UTC")(batch)
    assert f"value {value!r} is not a timestamp" in str(info.value) and "row 5" in str(info.value)


def test_dates_written_in_other_common_ways_are_read() -> None:
    batch = _stamped(["2026-11-01 10:00", "11/01/2026 10:00", "2026/11/01 10:00", "Nov 1 2026 10:00", "20261101T1000"])
    assert day_filter("2026-11-01", "ts", "UTC")(batch).tolist() == [True] * 5
