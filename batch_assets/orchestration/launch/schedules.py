"""Schedules: a daily pipeline's nightly tick materializes the newest complete day.

A day is complete once its window has ended in the partitioning timezone (DailyPartitionsDefinition's last key at
the tick's scheduled time). A day that another launch path is making (a sensor's run, a backfill) or has already
published from the same source and spec (batch_assets/orchestration/assets/lineage.py) is not launched. Each day is launched once: a later tick for the same day (an hourly cron that waits for
a late file, a daemon catching up) finds the scheduled run and skips, whatever became of it; a failed day is
retried by run retries (dagster.yaml) or re-executed by hand. Older missing days are a backfill's job
(docs/launch-paths.md), not the schedule's: a schedule that silently backfilled would hide the gap.

Multi partitioning with a daily dimension (day x app): a tick requests the newest complete day for every key of
the other dimension (static keys, or the dynamic keys in the instance at the tick), one run each, each key judged
on its own by the rules above: the day's `ios` file may land later than its `android` one.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import dagster as dg

from batch_assets.orchestration.assets import lineage
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.launch import claims
from batch_assets.orchestration.launch.claims import LAUNCHED_BY_TAG
from batch_assets.partitions import (
    KINDS,
    day_timezone,
    dimension_keys,
    multi_key,
    partitions_def_for,
    source_path_for,
    time_dimension,
)
from batch_assets.spec import PARTITION_TOKEN, PipelineSpec
from batch_assets.storage import filesystem_for


def schedule_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_newest_day_schedule"


def newest_complete_day(spec: PipelineSpec, at: datetime) -> str | None:
    """The key of the last day whose window has ended at `at`, or None before the first day ends."""
    pdef = partitions_def_for(spec)
    day_dim = time_dimension(spec)
    if day_dim is not None:  # multi: the day is the daily dimension's
        pdef = pdef.get_partitions_def_for_dimension(day_dim.name)  # type: ignore[attr-defined]
    assert isinstance(pdef, dg.TimeWindowPartitionsDefinition)
    # the public get_partition_keys takes a time; get_last_partition_key reads it from this context
    with dg.partition_loading_context(effective_dt=at):
        return pdef.get_last_partition_key()


def _missing_source(spec: PipelineSpec, key: str) -> str | None:
    """The partition's source file when it has not landed yet (a sample pipeline writes its own on first use)."""
    if spec.source.sample is not None or (PARTITION_TOKEN not in spec.source.path and not dimension_keys(spec, key)):
        return None
    url = source_path_for(spec, key)
    fs, path = filesystem_for(url)
    return None if fs.glob(path) else url


def _other_dimension_keys(spec: PipelineSpec, instance: dg.DagsterInstance) -> tuple[str, list[str]]:
    """multi: the non-daily dimension's name and its keys now (a dynamic dimension's are in the instance)."""
    other = next(d for d in spec.partitioning.dimensions or [] if not KINDS[d.kind].days)
    pdef = partitions_def_for(spec).get_partitions_def_for_dimension(other.name)  # type: ignore[attr-defined]
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return other.name, list(pdef.get_partition_keys())


def _request_or_skip(context: dg.ScheduleEvaluationContext, spec: PipelineSpec, job_name: str,
                     key: str) -> dg.RunRequest | str:
    """The run request for one partition of the newest day, or why it is not launched."""
    launched = context.instance.get_runs_count(dg.RunsFilter(
        job_name=job_name, tags={"dagster/partition": key, LAUNCHED_BY_TAG: "schedule"}))
    if launched:
        return f"day {key} was already launched by this schedule"
    missing = _missing_source(spec, key)
    if missing:
        return f"day {key} is complete but its source file {missing} has not landed yet"
    busy = lineage.runs_in_flight(context.instance, spec, job_name).get(key)
    if busy is not None:  # a sensor, a backfill or a user is making this day now
        return f"day {key} is being made by {lineage.launched_by(busy)}; not launched twice"
    storage = getattr(context.resources, STORAGE_KEY)
    version = lineage.source_version(spec, key, storage)
    record = lineage.published(spec, storage, key, version)
    if record is not None:
        return (f"day {key} is already published from the same source and spec (made by "
                f"{lineage.describe(record)}); nothing to do")
    held = claims.claim(storage, context.instance, spec.name, job_name, key, "schedule", version)
    if held is not None:  # a sensor evaluated at this same moment requested it
        return f"day {key}: {held.describe()}; not launched twice"
    return dg.RunRequest(run_key=key, partition_key=key, tags={LAUNCHED_BY_TAG: "schedule"})


def build_schedule(spec: PipelineSpec, job_name: str) -> dg.ScheduleDefinition | None:
    if spec.schedule is None:
        return None
    cfg = spec.schedule
    timezone = cfg.timezone or day_timezone(spec)
    day_dim = time_dimension(spec)
    start_date = day_dim.start_date if day_dim is not None else spec.partitioning.start_date

    @dg.schedule(
        name=schedule_name(spec),
        cron_schedule=cfg.cron,
        execution_timezone=timezone,
        job_name=job_name,
        required_resource_keys={STORAGE_KEY},
        default_status=dg.DefaultScheduleStatus.RUNNING if cfg.running else dg.DefaultScheduleStatus.STOPPED,
        description=f"Materializes the newest complete day of {spec.name} ({cfg.cron}, {timezone})"
        + (f", for every key of the other dimension." if day_dim is not None else "."),
    )
    def _newest_day(context: dg.ScheduleEvaluationContext):
        at = context.scheduled_execution_time or datetime.now(ZoneInfo(timezone))
        day = newest_complete_day(spec, at)
        if day is None:
            return dg.SkipReason(f"no day has ended yet since the start date {start_date}")
        if day_dim is None:
            outcome = _request_or_skip(context, spec, job_name, day)
            return outcome if isinstance(outcome, dg.RunRequest) else dg.SkipReason(outcome)
        other, keys = _other_dimension_keys(spec, context.instance)
        if not keys:
            return dg.SkipReason(f"day {day}: dimension {other!r} has no keys yet (a dynamic dimension's keys are "
                                 "added by a sensor, the UI or add_partitions)")
        requests, skipped = [], []
        for key in (multi_key(spec, {day_dim.name: day, other: k}) for k in keys):
            outcome = _request_or_skip(context, spec, job_name, key)
            (requests if isinstance(outcome, dg.RunRequest) else skipped).append(outcome)
        for reason in skipped:  # the tick's log says why each key that was not launched
            context.log.info(reason)
        return requests or dg.SkipReason("; ".join(skipped))

    return _newest_day
