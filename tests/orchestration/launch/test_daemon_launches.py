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
from tests.orchestration.launch.test_sensors import drop, inbox_spec

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts dagster dev


def test_schedule_sensor_and_cli_backfill_fire_under_dagster_dev(tmp_path: Path) -> None:
    pipelines, store, log = tmp_path / "pipelines", tmp_path / "store", tmp_path / "dev.log"
    home = dagster_home(tmp_path / "home")
    pipelines.mkdir()
    today = dt.datetime.now(dt.timezone.utc).date()
    yesterday, before = str(today - dt.timedelta(days=1)), str(today - dt.timedelta(days=2))
    # today's file too: if UTC midnight passes during the test, the next tick asks for this (by then yesterday's) day
    for day in (before, yesterday, str(today)):
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
        # the newest complete day as of the tick that launched it (not as of the test's start)
        ticked = instance.get_run_record_by_id(scheduled.run_id).create_timestamp.astimezone(dt.timezone.utc)
        assert scheduled.job_name == "daily_docs_job"
        assert scheduled.tags["dagster/partition"] == str(ticked.date() - dt.timedelta(days=1))

        def backfill_run():
            return [r for r in instance.get_runs() if r.tags.get("dagster/backfill")]

        [backfilled] = wait_for("the CLI backfill's run", backfill_run, log, 60)
        assert backfilled.tags.get("dagster/partition") == before

        finished = wait_for("the sensor run to finish", lambda: (
            r := instance.get_run_by_id(sensor_run.run_id)) and r.is_finished and r, log, 120)
        assert finished.status == dg.DagsterRunStatus.SUCCESS, log_tail(log, 4000)
        assert (store / "inbox" / "output" / "first-drop.parquet").exists()
        assert len(runs_by("sensor")) == 1  # later ticks found nothing new


def _documented_backfills() -> tuple[str, str]:
    from tests.test_docs_commands import documented_commands

    commands = [c for page, c in documented_commands() if page == "docs/launch-paths.md" and "backfill " in c]
    [asset_backfill] = [c for c in commands if "batch_assets.commands.backfill" in c]
    [job_backfill] = [c for c in commands if "dagster job backfill" in c]
    return asset_backfill, job_backfill


def test_documented_backfills_under_make_ui_follow_the_spec_policy_and_never_infer_twice(tmp_path: Path) -> None:
    """docs/launch-paths.md's two backfill commands, as written (the instance folder aside), against the real
    `make ui` (dg dev: webserver + daemon, code location from workspace settings): the asset backfill of seven days
    is ONE run (the spec's single_run policy); the job backfill's two runs start in the daemon (no
    DagsterCodeLocationNotFoundError) and, their days being published already, infer nothing."""
    import shutil

    pipelines, store, log = tmp_path / "pipelines", tmp_path / "store", tmp_path / "ui.log"
    pipelines.mkdir()
    shutil.copyfile(ROOT / "batch_assets/pipelines/daily_review_sentiment.yaml",
                    pipelines / "daily_review_sentiment.yaml")
    home = tmp_path / "home"  # `make ui` creates it and copies dagster.yaml into it
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store)}
    asset_backfill, job_backfill = _documented_backfills()
    port = free_port()

    def run_documented(command: str) -> str:
        command = command.replace("$PWD/.dagster_home", str(home))  # this test's instance, not the checkout's
        proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, command + "\n" + proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout + proc.stderr

    from tests.daemon_helpers import TERMINAL_RUN_STATUSES, wait_ready

    with dev_server(["make", "ui", f"UI_PORT={port}"], env, log) as proc:
        wait_ready(port, proc, log, seconds=180)
        out = run_documented(asset_backfill)
        backfill_id = out.split("Requested backfill ", 1)[1].split(":", 1)[0]
        with dg.DagsterInstance.from_config(str(home)) as instance:
            def runs_of(backfill: str):
                runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill}))
                return runs if runs and all(r.status.value in TERMINAL_RUN_STATUSES for r in runs) else None

            [run] = wait_for("the asset backfill's run", lambda: runs_of(backfill_id), log, 300)
            assert run.status == dg.DagsterRunStatus.SUCCESS, log_tail(log, 4000)
            assert (run.tags["dagster/asset_partition_range_start"],
                    run.tags["dagster/asset_partition_range_end"]) == ("2026-11-01", "2026-11-07")
            days = [f"2026-11-0{d}" for d in range(1, 8)]
            for day in days:
                assert (store / "daily_review_sentiment" / "output" / f"{day}.parquet").exists(), day

            before = {r.run_id for r in instance.get_runs()}
            run_documented(job_backfill)
            new = lambda: [r for r in instance.get_runs() if r.run_id not in before]  # noqa: E731
            done = wait_for("the job backfill's two runs", lambda: (
                runs := new()) and len(runs) == 2 and all(r.is_finished for r in runs) and runs, log, 300)
            assert {r.tags["dagster/partition"] for r in done} == {"2026-11-03", "2026-11-05"}
            assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in done), log_tail(log, 4000)
            for r in done:  # already published by the asset backfill: skipped, not inferred again
                [event] = instance.fetch_materializations(dg.AssetRecordsFilter(
                    asset_key=dg.AssetKey(["daily_review_sentiment", "inferred"]),
                    asset_partitions=[r.tags["dagster/partition"]]), limit=1).records
                assert event.run_id == r.run_id
                assert "already made by run" in event.asset_materialization.metadata["skipped"].value
