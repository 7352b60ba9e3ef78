"""Sensors on new input: one dynamic partition and one run per new file, exactly once per file version, nothing
half-written, throttled under a flood; local folders and s3:// alike."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from batch_assets.definitions import build_definitions
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.launch.sensors import decode_cursor, sensor_name
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage
from tests.daemon_helpers import daemon_workspace, write_code_location

JOB = "inbox_job"


def inbox_spec(source: str, **sensor: Any) -> dict[str, Any]:
    return {
        "name": "inbox",
        "source": {"format": "jsonl", "path": f"{source}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "dynamic"},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": "tests.daemon_helpers:CountingModel",
                                                   "init_kwargs": {"log": "unused.log"}}},
        "sensor": {"min_age_seconds": 5, "interval_seconds": 30, **sensor},
    }


def drop(folder: Path, name: str, rows: int = 1, age_s: float = 60.0) -> Path:
    """A complete file, last written `age_s` seconds ago."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"doc_id": f"{name}-{i}", "text": "t"}) + "\n" for i in range(rows)))
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


class Ticker:
    """Evaluates the sensor as the daemon would and applies its dynamic-partition requests to the instance."""

    def __init__(self, instance: dg.DagsterInstance, spec: dict[str, Any], storage_root: str | None = None):
        import tempfile

        self.instance, self.cursor = instance, None
        # the storage the sensor reads lineage records from (the daemon hands it the code location's resource)
        self.storage = ArrowStorage(root=storage_root or tempfile.mkdtemp(prefix="sensor-store-"))
        defs = build_definitions([parse_spec(spec)])
        self.sensor = defs.resolve_sensor_def(sensor_name(parse_spec(spec)))
        self.repo = defs.get_repository_def()

    def tick(self) -> Any:
        with dg.build_sensor_context(instance=self.instance, instance_ref=self.instance.get_ref(),
                                     cursor=self.cursor, repository_def=self.repo,
                                     resources={STORAGE_KEY: self.storage}) as context:
            result = self.sensor.evaluate_tick(context)
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        if result.cursor is not None:
            self.cursor = result.cursor
        return result


def test_new_files_become_partitions_and_one_run_each(tmp_path: Path) -> None:
    for name in ("q1", "q2", "q3"):
        drop(tmp_path / "in", name)
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(str(tmp_path / "in")))
        result = ticker.tick()
        assert sorted(r.partition_key for r in result.run_requests) == ["q1", "q2", "q3"]
        assert len({r.run_key for r in result.run_requests}) == 3
        assert sorted(instance.get_dynamic_partitions("inbox")) == ["q1", "q2", "q3"]
        assert all(r.tags["batch/launched_by"] == "sensor" for r in result.run_requests)

        again = ticker.tick()
        assert not again.run_requests and "no new or rewritten files" in again.skip_message

        drop(tmp_path / "in", "q4")
        [request] = ticker.tick().run_requests
        assert request.partition_key == "q4"


def test_a_rewritten_file_is_processed_once_more(tmp_path: Path) -> None:
    path = drop(tmp_path / "in", "q1", rows=1, age_s=120)
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(str(tmp_path / "in")))
        [first] = ticker.tick().run_requests
        drop(tmp_path / "in", "q1", rows=2, age_s=60)  # rewritten in place: new mtime and size
        [second] = ticker.tick().run_requests
        assert second.partition_key == "q1" and second.run_key != first.run_key
        assert not ticker.tick().run_requests
        assert instance.get_dynamic_partitions("inbox") == ["q1"]  # the partition is reused, not duplicated
        assert path.exists()


def test_half_written_files_wait(tmp_path: Path) -> None:
    drop(tmp_path / "in", "done", age_s=60)
    drop(tmp_path / "in", "writing", age_s=0)  # still being appended to: younger than min_age_seconds
    (tmp_path / "in" / ".tmp-upload.jsonl").write_text("{")  # an atomic writer's temporary file
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(str(tmp_path / "in"), min_age_seconds=30))
        assert [r.partition_key for r in ticker.tick().run_requests] == ["done"]
        waiting = ticker.tick()
        assert not waiting.run_requests and "still being written" in waiting.skip_message
        drop(tmp_path / "in", "writing", age_s=31)  # the writer finished and it aged
        assert [r.partition_key for r in ticker.tick().run_requests] == ["writing"]


def test_a_writers_staging_folder_is_not_a_new_partition(tmp_path: Path) -> None:
    """{partition} in a folder's place: a writer's staging folder (Spark's `_temporary`, an uploader's `.staging`)
    beside the partition folders is never requested as a partition (partition_files.is_data_path)."""
    spec = inbox_spec(str(tmp_path / "in"))
    spec["source"]["path"] = f"{tmp_path / 'in'}/{{partition}}/part.jsonl"
    for folder in ("q1", "_temporary", ".staging"):
        path = drop(tmp_path / "in" / folder, "part")
        assert path.name == "part.jsonl"
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, spec)
        assert [r.partition_key for r in ticker.tick().run_requests] == ["q1"]
        assert instance.get_dynamic_partitions("inbox") == ["q1"]


def test_marker_readiness_waits_for_a_newer_success_file(tmp_path: Path) -> None:
    folder = tmp_path / "in" / "batch-1"
    drop(folder, "q1", age_s=30)
    spec = inbox_spec(str(tmp_path / "in" / "batch-1"), ready="marker")
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, spec)
        assert not ticker.tick().run_requests  # no marker yet
        marker = folder / "_SUCCESS"
        marker.write_text("")
        old = time.time() - 60
        os.utime(marker, (old, old))
        assert not ticker.tick().run_requests  # a marker older than the file says nothing about it
        os.utime(marker, None)
        assert [r.partition_key for r in ticker.tick().run_requests] == ["q1"]


@pytest.mark.slow
def test_ten_thousand_files_are_throttled(tmp_path: Path) -> None:
    folder = tmp_path / "flood"
    folder.mkdir()
    stamp = time.time() - 60
    for i in range(10_000):
        path = folder / f"f{i:05d}.jsonl"
        path.write_bytes(b"{}\n")
        os.utime(path, (stamp + i * 1e-3, stamp + i * 1e-3))  # arrival order = name order
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(str(folder), max_runs_per_tick=25, max_queued_runs=60))
        first = ticker.tick()
        assert [r.partition_key for r in first.run_requests] == [f"f{i:05d}" for i in range(25)]  # oldest first
        second = ticker.tick()
        assert [r.partition_key for r in second.run_requests] == [f"f{i:05d}" for i in range(25, 50)]
        assert len(instance.get_dynamic_partitions("inbox")) == 50  # only files being processed are partitions
        assert len(decode_cursor(ticker.cursor)) == 50
        assert len(ticker.cursor) < 10_000  # compressed: the cursor stays small as the backlog drains

        # Back-pressure: with 60 runs of the pipeline waiting to start, nothing more is requested.
        from dagster._core.test_utils import create_run_for_test

        for _ in range(60):
            create_run_for_test(instance, job_name=JOB, status=dg.DagsterRunStatus.NOT_STARTED)
        held = ticker.tick()
        assert not held.run_requests and "60 runs of inbox_job are waiting" in held.skip_message
        assert len(decode_cursor(ticker.cursor)) == 50  # nothing skipped for good: the rest waits


@pytest.mark.slow
def test_the_sensor_daemon_keeps_its_cursor_across_a_restart(tmp_path: Path) -> None:
    """The real sensor daemon iteration: runs launched once, nothing repeated by a restarted daemon (the cursor and
    run keys live in the instance), a rewritten file launched once more."""
    from dagster._core.test_utils import freeze_time
    from dagster._daemon.sensor import execute_sensor_iteration
    from dagster._time import get_current_datetime

    for name in ("q1", "q2"):
        drop(tmp_path / "in", name)
    defs_file = write_code_location(tmp_path / "code", [inbox_spec(str(tmp_path / "in"))], tmp_path / "store")
    overrides = {"run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}}
    logger = dg.get_dagster_logger("sensor-test")
    start = get_current_datetime()

    def daemon_tick(instance, seconds: int) -> None:
        from datetime import timedelta

        with daemon_workspace(instance, defs_file) as context, freeze_time(start + timedelta(seconds=seconds)):
            list(execute_sensor_iteration(context, logger, None, None))

    with dg.instance_for_test(overrides=overrides) as instance:
        daemon_tick(instance, 0)
        assert sorted(r.tags["dagster/partition"] for r in instance.get_runs()) == ["q1", "q2"]
        daemon_tick(instance, 40)  # a restarted daemon (new workspace), next interval
        assert len(instance.get_runs()) == 2
        drop(tmp_path / "in", "q2", rows=3, age_s=10)
        daemon_tick(instance, 75)  # the first q2 run has not finished (the mocked launcher never runs it)
        assert len(instance.get_runs()) == 2, "a partition whose run is in flight is not requested again"
        for run in instance.get_runs():
            instance.report_run_failed(run)  # the runs end (how does not matter here)
        daemon_tick(instance, 110)
        assert sorted(r.tags["dagster/partition"] for r in instance.get_runs()) == ["q1", "q2", "q2"]
        assert sorted(instance.get_dynamic_partitions("inbox")) == ["q1", "q2"]


def test_s3_prefix_and_rewritten_object(s3_bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    prefix = f"{s3_bucket}/landing"
    fs.pipe(f"{prefix}/a.jsonl", b'{"doc_id": "1", "text": "x"}\n')
    fs.pipe(f"{prefix}/_SUCCESS", b"")
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(prefix, min_age_seconds=0))
        [first] = ticker.tick().run_requests
        assert first.partition_key == "a" and first.tags["batch/source_file"] == f"{prefix}/a.jsonl"
        assert not ticker.tick().run_requests
        fs.pipe(f"{prefix}/a.jsonl", b'{"doc_id": "1", "text": "y"}\n')  # same size, new ETag
        [second] = ticker.tick().run_requests
        assert second.partition_key == "a" and second.run_key != first.run_key


def test_sensor_spec_needs_per_file_partitions(tmp_path: Path) -> None:
    from batch_assets.spec import SpecError

    spec = inbox_spec(str(tmp_path))
    spec["source"]["path"] = f"{tmp_path}/*.jsonl"
    spec["partitioning"] = {"kind": "hash", "count": 4}
    with pytest.raises(SpecError, match="sensor"):
        parse_spec(spec)


def test_daily_pipeline_sensor_requests_existing_days_only(tmp_path: Path) -> None:
    """On daily (or static) partitioning the sensor adds no partitions: a file for a day is that day's run, and a
    file named for no day of the pipeline is skipped with a warning (and not retried every tick)."""
    spec = inbox_spec(str(tmp_path / "in"))
    spec["partitioning"] = {"kind": "daily", "start_date": "2026-11-01"}
    drop(tmp_path / "in", "2026-11-02")
    drop(tmp_path / "in", "1999-01-01")
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, spec)
        result = ticker.tick()
        assert [r.partition_key for r in result.run_requests] == ["2026-11-02"]
        assert not result.dynamic_partitions_requests
        assert not ticker.tick().run_requests


def test_a_time_column_daily_pipeline_refuses_a_sensor_and_names_the_alternatives(tmp_path: Path) -> None:
    from batch_assets.spec import SpecError

    spec = inbox_spec(str(tmp_path / "in"))
    spec["source"]["path"] = f"{tmp_path}/in/*.jsonl"
    spec["source"]["columns"] = ["doc_id", "text", "created_at"]
    spec["partitioning"] = {"kind": "daily", "start_date": "2026-11-01", "time_column": "created_at"}
    with pytest.raises(SpecError, match="Use `schedule:` instead") as refused:
        parse_spec(spec)
    assert "put {partition} in source.path" in str(refused.value)
    spec["source"]["path"] = f"{tmp_path}/in/{{partition}}.jsonl"  # one file per day: the sensor is fine
    assert parse_spec(spec).sensor is not None


def test_a_per_day_file_with_a_row_of_another_day_fails_or_keeps_it_as_configured(tmp_path: Path) -> None:
    from tests.conftest import run_pipeline, write_jsonl

    rows = [{"doc_id": "a", "text": "t", "created_at": "2026-11-02T08:00:00"},
            {"doc_id": "b", "text": "t", "created_at": "2026-11-03T00:10:00"}]  # belongs to the next day
    write_jsonl(tmp_path / "in" / "2026-11-02.jsonl", rows)
    spec = inbox_spec(str(tmp_path / "in"))
    spec["source"]["columns"] = ["doc_id", "text", "created_at"]
    spec["partitioning"] = {"kind": "daily", "start_date": "2026-11-01", "time_column": "created_at"}
    spec["model"]["config"]["init_kwargs"]["log"] = str(tmp_path / "model.log")
    result = run_pipeline(parse_spec(spec), tmp_path / "store", ["2026-11-02"], raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message
    assert "stamped 2026-11-03T00:10:00 in column 'created_at'" in message and "not of day 2026-11-02" in message and "row 2" in message
    assert "2026-11-02.jsonl" in message and "day_check: keep" in message
    spec["partitioning"]["day_check"] = "keep"
    assert run_pipeline(parse_spec(spec), tmp_path / "store", ["2026-11-02"]).success


def test_a_touched_file_is_not_requested_again_and_a_changed_byte_is(tmp_path: Path) -> None:
    """Versions by content: re-materializing a day with byte-identical output (a new mtime) requests nothing;
    one changed byte requests the partition once more."""
    path = drop(tmp_path / "in", "q1", rows=2, age_s=120)
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(str(tmp_path / "in")))
        [first] = ticker.tick().run_requests
        path.write_bytes(path.read_bytes())  # rewritten with the same bytes
        stamp = time.time() - 60
        os.utime(path, (stamp, stamp))
        untouched = ticker.tick()
        assert not untouched.run_requests, "the same bytes were requested again"
        assert "no new or rewritten files" in untouched.skip_message
        path.write_bytes(path.read_bytes().replace(b"q1-1", b"q1-2"))  # one byte changed, same size
        os.utime(path, (stamp, stamp))
        [second] = ticker.tick().run_requests
        assert second.partition_key == "q1" and second.run_key != first.run_key
        assert not ticker.tick().run_requests


def test_an_s3_object_re_uploaded_with_the_same_bytes_is_not_requested_again(s3_bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    prefix = f"{s3_bucket}/landing"
    body = b'{"doc_id": "1", "text": "x"}\n'
    fs.pipe(f"{prefix}/a.jsonl", body)
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, inbox_spec(prefix, min_age_seconds=0))
        [first] = ticker.tick().run_requests
        time.sleep(1.1)  # a new LastModified second
        fs.pipe(f"{prefix}/a.jsonl", body)  # re-uploaded: new LastModified, same bytes, same ETag
        assert not ticker.tick().run_requests
        fs.pipe(f"{prefix}/a.jsonl", body.replace(b"x", b"y"))
        [second] = ticker.tick().run_requests
        assert second.run_key != first.run_key
