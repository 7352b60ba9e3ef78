"""Shipped pipelines as `make ui` runs them, with their specs exactly as shipped (only the sample folder moved to
tmp_path):
- `quote_classification`'s sensor (on by default) writes the sample files on a fresh clone, waits until they are
  complete, then asks for one run per file; the run it asks for passes the pipeline's own blocking checks;
- `daily_review_sentiment`'s nightly schedule, ticked by the scheduler daemon's own loop at 01:30 UTC, launches
  yesterday's run, which runs and publishes the day."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.catalog import PIPELINES_DIR
from batch_assets.definitions import build_definitions
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.launch.sensors import sensor_name
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage
from tests.conftest import pipeline_definitions

pytestmark = pytest.mark.slow


def test_shipped_quote_sensor_launches_runs_that_pass_their_blocking_checks(tmp_path: Path) -> None:
    raw = yaml.safe_load((PIPELINES_DIR / "quote_classification.yaml").read_text())
    raw["source"]["path"] = raw["source"]["path"].replace("data/samples", str(tmp_path / "samples"))
    spec = parse_spec(raw)
    defs = build_definitions([spec])
    sensor = defs.resolve_sensor_def(sensor_name(spec))
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING  # on by default under `make ui`

    with dg.instance_for_test() as instance:
        def tick(cursor):
            store = ArrowStorage(root=str(tmp_path / "store"))
            with dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), cursor=cursor,
                                         repository_def=defs.get_repository_def(),
                                         resources={STORAGE_KEY: store}) as context:
                result = sensor.evaluate_tick(context)
            for request in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            return result

        first = tick(None)
        files = sorted((tmp_path / "samples" / "quotes").glob("*.jsonl"))
        assert [f.name for f in files] == [f"part-{i}.jsonl" for i in range(4)]  # the fresh clone's samples
        assert not first.run_requests  # written just now: not complete for min_age_seconds yet
        aged = time.time() - raw["sensor"]["min_age_seconds"] - 5
        for f in files:
            os.utime(f, (aged, aged))
        second = tick(first.cursor)
        requests = second.run_requests
        assert sorted(r.partition_key for r in requests) == [f"part-{i}" for i in range(4)]

        # The run for part-0 (it holds the quote SmolLM2 used to ramble on), as the daemon would launch it.
        request = next(r for r in requests if r.partition_key == "part-0")
        job = pipeline_definitions(spec, tmp_path / "store").resolve_job_def(request.job_name or
                                                                            "quote_classification_job")
        result = job.execute_in_process(instance=instance, partition_key=request.partition_key,
                                        tags=request.tags, raise_on_error=False)
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert result.success, checks
    assert all(checks[name] for name in ("error_rate", "rows_exactly_once", "output_schema")), checks
    rows = pq.read_table(tmp_path / "store" / "quote_classification" / "output" / "part-0.parquet").to_pylist()
    assert len(rows) == 4
    assert [r["error"] for r in rows] == [None] * 4, [(r["quote_id"], r["error"]) for r in rows]
    assert all(r["show"] and r["character"] and r["explanation"] for r in rows)


def test_shipped_daily_schedule_launches_a_run_that_publishes_yesterday(tmp_path: Path) -> None:
    from dagster._core.test_utils import freeze_time
    from dagster._scheduler.scheduler import launch_scheduled_runs
    from dagster._time import get_current_datetime

    from tests.daemon_helpers import SYNC_LAUNCHER, daemon_workspace, write_code_location

    raw = yaml.safe_load((PIPELINES_DIR / "daily_review_sentiment.yaml").read_text())
    raw["source"]["path"] = raw["source"]["path"].replace("data/samples", str(tmp_path / "samples"))
    store = tmp_path / "store"
    defs_file = write_code_location(tmp_path / "code", [raw], store)
    with dg.instance_for_test(overrides=SYNC_LAUNCHER) as instance, daemon_workspace(instance, defs_file) as context:
        iterations: dict = {}
        for minute in (29, 31):  # the daemon first sees the schedule at 01:29, then its 01:30 tick is due
            with freeze_time(dt.datetime(2026, 11, 21, 1, minute, tzinfo=dt.timezone.utc)):
                list(launch_scheduled_runs(context, dg.get_dagster_logger("scheduler-test"), get_current_datetime(),
                                           iterations))
        [run] = instance.get_runs()
    assert run.tags["dagster/partition"] == "2026-11-20" and run.tags["batch/launched_by"] == "schedule"
    assert run.status == dg.DagsterRunStatus.SUCCESS
    published = pq.read_table(store / "daily_review_sentiment" / "output" / "2026-11-20.parquet")
    assert published.num_rows == raw["source"]["sample_rows"]
    assert published.column("error").null_count == published.num_rows
