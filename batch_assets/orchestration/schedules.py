"""Schedules: a daily pipeline's nightly tick materializes the newest complete day.

A day is complete once its window has ended in the partitioning timezone (DailyPartitionsDefinition's last key at
the tick's scheduled time). A day that another launch path is making (a sensor's run, a backfill) or has already
published from the same source and spec (batch_assets/orchestration/lineage.py) is not launched. Each day is launched once: a later tick for the same day (an hourly cron that waits for
a late file, a daemon catching up) finds the scheduled run and skips, whatever became of it; a failed day is
retried by run retries (dagster.yaml) or re-executed by hand. Older missing days are a backfill's job
(docs/launch-paths.md), not the schedule's: a schedule that silently backfilled would hide the gap.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import dagster as dg

from batch_assets.orchestration import claims, lineage
from batch_assets.orchestration.claims import LAUNCHED_BY_TAG
from batch_assets.orchestration.factory import STORAGE_KEY
from batch_assets.partitions import partitions_def_for
from batch_assets.spec import PARTITION_TOKEN, PipelineSpec
from batch_assets.storage import filesystem_for


def schedule_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_newest_day_schedule"


def newest_complete_day(spec: PipelineSpec, at: datetime) -> str | None:
    """The key of the last day whose window has ended at `at`, or None before the first day ends."""
    pdef = partitions_def_for(spec)
    assert isinstance(pdef, dg.TimeWindowPartitionsDefinition)
    # the public get_partition_keys takes a time; get_last_partition_key reads it from this context
    with dg.partition_loading_context(effective_dt=at):
        return pdef.get_last_partition_key()


def _missing_source(spec: PipelineSpec, day: str) -> str | None:
    """The day's source file when it has not landed yet (a sample pipeline writes its own on first use)."""
    if spec.source.sample is not None or PARTITION_TOKEN not in spec.source.path:
        return None
    url = spec.source.path.replace(PARTITION_TOKEN, day)
    fs, path = filesystem_for(url)
    return None if fs.glob(path) else url


def build_schedule(spec: PipelineSpec, job_name: str) -> dg.ScheduleDefinition | None:
    if spec.schedule is None:
        return None
    cfg = spec.schedule
    timezone = cfg.timezone or spec.partitioning.timezone

    @dg.schedule(
        name=schedule_name(spec),
        cron_schedule=cfg.cron,
        execution_timezone=timezone,
        job_name=job_name,
        required_resource_keys={STORAGE_KEY},
        default_status=dg.DefaultScheduleStatus.RUNNING if cfg.running else dg.DefaultScheduleStatus.STOPPED,
        description=f"Materializes the newest complete day of {spec.name} ({cfg.cron}, {timezone}).",
    )
    def _newest_day(context: dg.ScheduleEvaluationContext):
        at = context.scheduled_execution_time or datetime.now(ZoneInfo(timezone))
        day = newest_complete_day(spec, at)
        if day is None:
            return dg.SkipReason(f"no day has ended yet since partitioning.start_date {spec.partitioning.start_date}")
        launched = context.instance.get_runs_count(dg.RunsFilter(
            job_name=job_name, tags={"dagster/partition": day, LAUNCHED_BY_TAG: "schedule"}))
        if launched:
            return dg.SkipReason(f"day {day} was already launched by this schedule")
        missing = _missing_source(spec, day)
        if missing:
            return dg.SkipReason(f"day {day} is complete but its source file {missing} has not landed yet")
        busy = lineage.runs_in_flight(context.instance, spec, job_name).get(day)
        if busy is not None:  # a sensor, a backfill or a user is making this day now
            return dg.SkipReason(f"day {day} is being made by {lineage.launched_by(busy)}; not launched twice")
        storage = getattr(context.resources, STORAGE_KEY)
        version = lineage.source_version(spec, day, storage)
        record = lineage.published(spec, storage, day, version)
        if record is not None:
            return dg.SkipReason(f"day {day} is already published from the same source and spec (made by "
                                 f"{lineage.describe(record)}); nothing to do")
        held = claims.claim(storage, context.instance, spec.name, job_name, day, "schedule", version)
        if held is not None:  # a sensor evaluated at this same moment requested it
            return dg.SkipReason(f"day {day}: {held.describe()}; not launched twice")
        return dg.RunRequest(run_key=day, partition_key=day, tags={LAUNCHED_BY_TAG: "schedule"})

    return _newest_day
