"""Dagster's declarative automation for a pipeline whose spec has an `automation:` section.

The condition goes on all four assets (`raw`, `prepared`, `inferred`, `output`), and one automation sensor per
pipeline (`<name>_automation_sensor`, an AutomationConditionSensorDefinition over the pipeline's asset group)
evaluates them. In one evaluation each stage's condition sees that its upstream stage is requested too, so a
partition is requested at every stage at once and the sensor launches it as one run (or, with the spec's
`backfill.policy: single_run`, one backfill run for all partitions requested together):

- `on_missing`: `AutomationCondition.on_missing()`: a partition that appears after the sensor starts (daily: each
  day, as it ends; dynamic: each key added; static from files: a new file's, when the code location reloads) and
  has never been materialized in this Dagster instance is requested once. Partitions already missing at the first
  evaluation are not (Dagster resets the condition there): they are a backfill's job (docs/launch-paths.md). Hash
  shards and listed static keys never appear, so the spec refuses on_missing there. A failed run is not requested again: it is retried by run retries
  (dagster.yaml) or re-executed by hand.
- `on_cron`: `AutomationCondition.on_cron(cron, timezone)`: at every tick, each partition (daily: the newest day)
  is requested once its upstream stage has updated since the tick.
- `on_upstream_update` (the default when `source.asset` names an asset of the user's project, and the spec has no
  `automation:`, `schedule:` or `sensor:`): the raw asset depends on that asset (factory.py, an `AssetDep` with the
  partition mapping) and a partition is requested each time the upstream's partition updates after the last
  request (`on_upstream_update` below), not while a dependency is missing or in progress, nor while the partition
  is in progress. Unlike `eager()` it is not limited to the newest time window: re-materializing an older upstream
  day runs that day too. Each stage sees its upstream stage requested in the same evaluation, so
  the four stages run as one run. Dagster knows only that the upstream was materialized, not whether its bytes
  changed: a re-materialization with byte-identical output still launches a run, and in it every stage finds
  its lineage record made from the same content (lineage.py, versions by content) and is skipped: no model
  call, nothing re-written.

Dagster's conditions know only what the instance has seen materialized, not whether a partition was already made
from the same source file and spec elsewhere (a CLI run against another instance, a rewritten file). That is
what the lineage records are for (batch_assets/orchestration/assets/lineage.py): a run the automation sensor launches for a partition
already made from the same source and spec skips every stage, without a model call, like any other launch path.
"""

from __future__ import annotations

import dagster as dg

from batch_assets.partitions import day_timezone
from batch_assets.spec import AutomationSpec, PipelineSpec
from batch_assets.stage_names import READ


def effective_automation(spec: PipelineSpec) -> AutomationSpec | None:
    """The spec's `automation:`, or on_upstream_update for a pipeline reading an upstream asset that has no
    launcher of its own (the spec refuses a schedule or sensor beside source.asset)."""
    if spec.automation is not None:
        return spec.automation
    if spec.source.asset and spec.schedule is None and spec.sensor is None:
        return AutomationSpec(condition="on_upstream_update")
    return None


def on_upstream_update(stage: str) -> dg.AutomationCondition:
    """eager() without its newest-time-window limit and without newly_missing. The raw asset is requested when
    the upstream asset's partition updates after the raw asset was last requested; each later stage whenever its
    upstream stage is requested in the same evaluation (or has updated since the stage was last handled).

    Why not `any_deps_updated().since_last_handled()` for raw: Dagster resolves a tick where both the trigger and
    the reset fired by their timestamps only for conditions that carry them (newly_updated, newly_requested), not
    through and/or; with since_last_handled an upstream re-materialization between the pipeline's request and its
    next evaluation, or while its run was still going, was dropped, and so were the later stages of the run that
    followed (tests/orchestration/assets/test_upstream_asset.py)."""
    if stage == READ.asset:
        trigger = dg.AutomationCondition.any_deps_match(dg.AutomationCondition.newly_updated()).since(
            dg.AutomationCondition.newly_requested())
    else:  # requested with its upstream stage in one evaluation (one run), whatever the since-state says
        trigger = (dg.AutomationCondition.any_deps_match(dg.AutomationCondition.will_be_requested())
                   | dg.AutomationCondition.any_deps_updated().since_last_handled())
    return (
        trigger
        & ~dg.AutomationCondition.any_deps_missing()
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label("on_upstream_update")


def automation_condition(spec: PipelineSpec, stage: str) -> dg.AutomationCondition | None:
    """The condition the spec's `automation:` section asks for, for the pipeline's asset `stage`."""
    auto = effective_automation(spec)
    if auto is None:
        return None
    if auto.condition == "on_missing":
        return dg.AutomationCondition.on_missing()
    if auto.condition == "on_upstream_update":
        return on_upstream_update(stage)
    assert auto.condition == "on_cron" and auto.cron  # checked by the spec
    return dg.AutomationCondition.on_cron(auto.cron, auto.timezone or day_timezone(spec))


def automation_sensor_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_automation_sensor"


def build_automation_sensor(spec: PipelineSpec) -> dg.AutomationConditionSensorDefinition | None:
    """The sensor that evaluates the pipeline's conditions (the daemon runs it, like any sensor)."""
    auto = effective_automation(spec)
    if auto is None:
        return None
    return dg.AutomationConditionSensorDefinition(
        automation_sensor_name(spec),
        target=dg.AssetSelection.groups(spec.name),
        default_status=dg.DefaultSensorStatus.RUNNING if auto.running else dg.DefaultSensorStatus.STOPPED,
        minimum_interval_seconds=auto.interval_seconds,
        run_tags={"batch/launched_by": "automation"},
        description=f"Declarative automation of {spec.name}: {auto.condition}"
        + (f" ({auto.cron}, {auto.timezone or day_timezone(spec)})" if auto.cron else "") + ".",
    )
