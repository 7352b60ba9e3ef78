"""The real `dagster dev` (webserver + daemon) on a fresh DAGSTER_HOME: a sensor tick launches a run for a new
file, an every-minute schedule launches the newest complete day, and a `dagster job backfill` from the CLI is
picked up by the backfill daemon."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.conftest import DAEMON_GROUP, free_port
from tests.daemon_helpers import (
    DAGSTER, ROOT, daily_spec, dagster_dev_command, dagster_home, dev_server, log_tail, wait_for, write_day,
)
from tests.test_sensors import drop, inbox_spec

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts dagster dev


def test_schedule_sensor_and_cli_backfill_fire_under_dagster_dev(tmp_path: Path) -> None:
    pipelines, store, log = tmp_path / "pipelines", tmp_path / "store", tmp_path / "dev.log"
    home = dagster_home(tmp_path / "home")
    pipelines.mkdir()
    today = dt.datetime.now(dt.timezone.utc).date()
    yesterday, before = str(today - dt.timedelta(days=1)), str(today - dt.timedelta(days=2))
    for day in (before, yesterday):
        write_day(tmp_path / "days", day)
    daily = daily_spec(tmp_path / "days", tmp_path / "daily-model.log",
                       partitioning={"kind": "daily", "start_date": str(today - dt.timedelta(days=5))},
                       schedule={"cron": "* * * * *"})  # every minute, so a tick comes within the test
    inbox = inbox_spec(str(tmp_path / "inbox"), min_age_seconds=0, interval_seconds=2)
    inbox["model"]["config"]["init_kwargs"]["log"] = str(tmp_path / "inbox-model.log")
    drop(tmp_path / "inbox", "first-drop")
    for spec in (daily, inbox):
        (pipelines / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store)}

    with (dev_server(dagster_dev_command(free_port()), env, log),
          dg.DagsterInstance.from_config(str(home)) as instance):
        def runs_by(kind: str):
            return [r for r in instance.get_runs() if r.tags.get("batch/launched_by") == kind]

        [sensor_run] = wait_for("a sensor run", lambda: runs_by("sensor"), log, 90)
        assert sensor_run.job_name == "inbox_job" and sensor_run.tags["dagster/partition"] == "first-drop"
        assert instance.get_dynamic_partitions("inbox") == ["first-drop"]

        cli = subprocess.run([DAGSTER, "job", "backfill", "-m", "batch_assets.definitions", "-j", "daily_docs_job",
                              "--partitions", before, "--noprompt"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]

        [scheduled] = wait_for("a schedule run", lambda: runs_by("schedule"), log, 100)
        assert scheduled.job_name == "daily_docs_job" and scheduled.tags["dagster/partition"] == yesterday

        def backfill_run():
            return [r for r in instance.get_runs() if r.tags.get("dagster/backfill")]

        [backfilled] = wait_for("the CLI backfill's run", backfill_run, log, 60)
        assert backfilled.tags.get("dagster/partition") == before

        finished = wait_for("the sensor run to finish", lambda: (
            r := instance.get_run_by_id(sensor_run.run_id)) and r.is_finished and r, log, 120)
        assert finished.status == dg.DagsterRunStatus.SUCCESS, log_tail(log, 4000)
        assert (store / "inbox" / "output" / "first-drop.parquet").exists()
        assert len(runs_by("sensor")) == 1  # later ticks found nothing new
