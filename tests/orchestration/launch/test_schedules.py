"""Schedules: a tick requests the newest complete day, in the partitioning's timezone, once per day; the daemon's
own tick logic launches that run."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from batch_assets.definitions import build_definitions
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.launch.schedules import schedule_name
from batch_assets.spec import load_spec, parse_spec
from batch_assets.storage import ArrowStorage
from tests.daemon_helpers import daemon_workspace, daily_spec, write_code_location, write_day

UTC = dt.timezone.utc


def _storage(root: Path | None = None) -> dict:
    """The storage resource the schedule reads lineage records from (the daemon hands it the code location's)."""
    import tempfile

    return {STORAGE_KEY: ArrowStorage(root=str(root or tempfile.mkdtemp(prefix="schedule-store-")))}


def _schedule(spec):
    # built inside instance_for_test: loading definitions reads the current instance's state storage
    defs = build_definitions([spec])
    return defs.resolve_schedule_def(schedule_name(spec)), defs.get_repository_def()


def _tick(spec, at: dt.datetime):
    with dg.instance_for_test() as instance:
        schedule, repo = _schedule(spec)
        # as a context manager: what the context opens (its resources) is closed here, in order, not when it is
        # collected after this instance has gone (a later test then found a dead instance's state storage)
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=at, repository_def=repo,
                                       resources=_storage()) as context:
            return schedule.evaluate_tick(context)


def _spec(tmp_path: Path, **sections):
    sections.setdefault("schedule", {"cron": "30 1 * * *"})
    return parse_spec(daily_spec(tmp_path / "data", tmp_path / "model.log", **sections))


def test_tick_requests_the_newest_complete_day(tmp_path: Path) -> None:
    write_day(tmp_path / "data", "2026-11-04")
    result = _tick(_spec(tmp_path), dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC))
    [request] = result.run_requests
    assert request.partition_key == "2026-11-04"
    assert request.run_key == "2026-11-04"
    assert request.tags["batch/launched_by"] == "schedule"


def test_day_boundaries_follow_the_partitioning_timezone(tmp_path: Path) -> None:
    for day in ("2026-11-03", "2026-11-04"):
        write_day(tmp_path / "data", day)
    spec = _spec(tmp_path, partitioning={"kind": "daily", "start_date": "2026-11-01", "timezone": "America/New_York"},
                 schedule={"cron": "0 * * * *", "timezone": "UTC"})
    # 03:00 UTC on the 5th is 22:00 on the 4th in New York: the 4th is not over there yet.
    [request] = _tick(spec, dt.datetime(2026, 11, 5, 3, 0, tzinfo=UTC)).run_requests
    assert request.partition_key == "2026-11-03"
    [request] = _tick(spec, dt.datetime(2026, 11, 5, 5, 0, tzinfo=UTC)).run_requests
    assert request.partition_key == "2026-11-04"


def test_nothing_before_the_first_day_ends_and_nothing_before_the_file_lands(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    early = _tick(spec, dt.datetime(2026, 11, 1, 12, 0, tzinfo=UTC))
    assert not early.run_requests and "no day has ended" in early.skip_message
    waiting = _tick(spec, dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC))
    assert not waiting.run_requests and "2026-11-04.jsonl has not landed" in waiting.skip_message
    write_day(tmp_path / "data", "2026-11-04")
    [request] = _tick(spec, dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC)).run_requests
    assert request.partition_key == "2026-11-04"


def test_shipped_daily_pipeline_has_a_running_schedule_for_yesterday() -> None:
    spec = load_spec(Path(__file__).resolve().parents[3] / "batch_assets/pipelines/daily_review_sentiment.yaml")
    with dg.instance_for_test() as instance:
        schedule, repo = _schedule(spec)
        assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
        assert schedule.cron_schedule == "30 1 * * *"
        at = dt.datetime(2026, 11, 21, 1, 30, tzinfo=UTC)
        with dg.build_schedule_context(instance=instance, repository_def=repo, resources=_storage(),
                                       scheduled_execution_time=at) as context:
            [request] = schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2026-11-20"  # a sample pipeline writes the day's file itself


def test_schedule_spec_is_validated(tmp_path: Path) -> None:
    from batch_assets.spec import SpecError

    raw = daily_spec(tmp_path, tmp_path / "log", schedule={"cron": "every day", "timezone": "Mars/Olympus"})
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    assert "schedule.cron" in str(info.value) and "schedule.timezone" in str(info.value)
    raw = daily_spec(tmp_path, tmp_path / "log", schedule={"cron": "30 1 * * *"},
                     partitioning={"kind": "dynamic"})
    with pytest.raises(SpecError, match="needs daily partitioning"):
        parse_spec(raw)


def test_the_scheduler_daemon_launches_the_day_once(tmp_path: Path) -> None:
    """The daemon's own tick loop (launch_scheduled_runs): an hourly cron fires twice after midnight, the day is
    launched once, as a run of the pipeline's job for that partition."""
    from dagster._core.test_utils import freeze_time
    from dagster._scheduler.scheduler import launch_scheduled_runs
    from dagster._time import get_current_datetime

    write_day(tmp_path / "data", "2026-11-04")
    spec = daily_spec(tmp_path / "data", tmp_path / "model.log", schedule={"cron": "30 * * * *"})
    defs_file = write_code_location(tmp_path / "code", [spec], tmp_path / "store")
    overrides = {"run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}}
    with dg.instance_for_test(overrides=overrides) as instance, daemon_workspace(instance, defs_file) as context:
        logger = dg.get_dagster_logger("scheduler-test")
        times: dict = {}
        for at in (dt.datetime(2026, 11, 5, 0, 10, tzinfo=UTC), dt.datetime(2026, 11, 5, 1, 40, tzinfo=UTC),
                   dt.datetime(2026, 11, 5, 2, 40, tzinfo=UTC)):
            with freeze_time(at):
                list(launch_scheduled_runs(context, logger, get_current_datetime(), times))
        runs = instance.get_runs()
        ticks = instance.get_ticks(*_origin_and_selector(context, spec))
    assert [r.tags.get("dagster/partition") for r in runs] == ["2026-11-04"]
    assert runs[0].job_name == "daily_docs_job"
    assert runs[0].tags["dagster/schedule_name"] == "daily_docs_newest_day_schedule"
    assert sorted(t.status.value for t in ticks) == ["SKIPPED", "SUCCESS"]  # 02:30 found the day launched


def _origin_and_selector(context, spec):
    repo = next(iter(context.create_request_context().get_code_location_entries().values())).code_location
    [repository] = repo.get_repositories().values()
    schedule = repository.get_schedule(f"{spec['name']}_newest_day_schedule")
    return schedule.get_remote_origin_id(), schedule.selector_id
