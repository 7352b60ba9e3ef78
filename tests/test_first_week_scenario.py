"""Issue 14's scenario, kept: a support team's daily per-file export on S3 (a real S3-protocol server on loopback), a
CLI single-run backfill of the first days, then the real `dagster dev` (webserver + daemon) with the pipeline's
sensor and every-minute schedule running, and a backfill through the daemon over every day: each row is inferred
once (the model counts its calls), each day's output holds its rows once, and the sensor and the schedule never
both run a day."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import DAEMON_GROUP, free_port
from tests.daemon_helpers import (
    ROOT, dagster_dev_command, dagster_home, dev_server, log_tail, model_trace, wait_for, wait_ready,
)

DG = str(Path(sys.executable).with_name("dg"))
ROWS_PER_DAY = 3
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts dagster dev


def _upload(bucket: str, day: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    body = "".join(json.dumps({"ticket_id": f"{day}-{i}", "text": f"ticket-{day}-{i}"}) + "\n"
                   for i in range(ROWS_PER_DAY))
    fs.pipe(f"{bucket.removeprefix('s3://')}/tickets/{day}.jsonl", body.encode())


def test_backfill_then_sensor_and_schedule_under_the_daemon_infer_every_row_once(s3_bucket: str,
                                                                                 tmp_path: Path) -> None:
    today = dt.datetime.now(dt.timezone.utc).date()
    days = [str(today - dt.timedelta(days=n)) for n in (4, 3, 2, 1)]  # the last one is yesterday
    for day in days:
        _upload(s3_bucket, day)
    log = tmp_path / "model.log"
    spec = {
        "name": "support_tickets",
        "source": {"format": "jsonl", "path": f"{s3_bucket}/tickets/{{partition}}.jsonl",
                   "columns": ["ticket_id", "text"]},
        "partitioning": {"kind": "daily", "start_date": days[0]},
        "prepare": {"id_column": "ticket_id", "input_columns": ["text"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": "tests.daemon_helpers:CountingModel",
                                                   "init_kwargs": {"log": str(log)}}},
        "schedule": {"cron": "* * * * *"},  # every minute: a tick comes within the test, for yesterday
        "sensor": {"min_age_seconds": 0, "interval_seconds": 2},
        "retries": {"max_retries": 0},
    }
    pipelines, store = tmp_path / "pipelines", tmp_path / "store"
    pipelines.mkdir()
    (pipelines / "support_tickets.yaml").write_text(yaml.safe_dump(spec))
    home = dagster_home(tmp_path / "home")
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store), "PYTHONPATH": str(ROOT)}  # the counting model lives in tests/

    # 1. the CLI single-run backfill of the first three days, in the terminal
    cli = subprocess.run([DG, "launch", "--assets", "group:support_tickets", "--partition-range",
                          f"{days[0]}...{days[2]}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    assert len(model_trace(log)[1]) == 3 * ROWS_PER_DAY

    # 2. the daemon with the sensor and the schedule on; 3. a backfill of every day through it
    dev_log = tmp_path / "dev.log"
    port = free_port()
    with (dev_server(dagster_dev_command(port), env, dev_log) as proc,
          dg.DagsterInstance.from_config(str(home)) as instance):
        wait_ready(port, proc, dev_log)
        out = subprocess.run([sys.executable, "-m", "batch_assets.commands.backfill", "support_tickets", "--from",
                              days[0], "--to", days[-1]], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr

        def ticks(kind: str) -> list:
            origin, selector = _origin(instance, kind)
            if origin is None:
                return []
            return [t for t in instance.get_ticks(origin, selector) if t.status.value != "STARTED"]

        def settled():
            runs = instance.get_runs()
            [backfill] = instance.get_backfills()
            done = backfill.status.value.startswith("COMPLETED") and all(r.is_finished for r in runs)
            published = (store / "support_tickets" / "output" / f"{days[-1]}.parquet").exists()
            return done and published and ticks("schedule") and len(ticks("sensor")) >= 2 and runs

        runs = wait_for("the backfill, the sensor and a schedule tick", settled, dev_log, 240)
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), log_tail(dev_log, 4000)
        launched = Counter(r.tags.get("batch/launched_by", "backfill") for r in runs)
        sensor_and_schedule_runs = [r for r in runs if r.tags.get("batch/launched_by") in ("sensor", "schedule")]
        assert len(sensor_and_schedule_runs) <= 1, launched  # never both for yesterday, never the adopted days
        assert all(r.tags.get("dagster/partition") == days[-1] for r in sensor_and_schedule_runs)

    inferred = model_trace(log)[1]
    counts = Counter(inferred)
    assert len(inferred) == len(days) * ROWS_PER_DAY and max(counts.values()) == 1, counts.most_common(3)
    for day in days:
        table = pq.read_table(store / "support_tickets" / "output" / f"{day}.parquet")
        assert sorted(table.column("ticket_id").to_pylist()) == [f"{day}-{i}" for i in range(ROWS_PER_DAY)]


def _origin(instance: dg.DagsterInstance, kind: str):
    """(origin id, selector id) of the pipeline's schedule or sensor, from the instance's stored states."""
    from dagster._core.scheduler.instigation import InstigatorType

    wanted = InstigatorType.SCHEDULE if kind == "schedule" else InstigatorType.SENSOR
    for state in instance.all_instigator_state(instigator_type=wanted):
        if state.origin.instigator_name.startswith("support_tickets"):
            return state.instigator_origin_id, state.selector_id
    return None, None
