"""A pipeline's automatic launch paths, gathered for the code location and for component pipelines alike: its
schedule, its sensor on new source files, or its declarative-automation sensor (launch-paths.md). The backfill
command is batch_assets/commands/backfill.py."""

from __future__ import annotations

import dagster as dg

from batch_assets.orchestration.assets.automation import build_automation_sensor
from batch_assets.orchestration.assets.factory import job_name
from batch_assets.orchestration.launch.schedules import build_schedule
from batch_assets.orchestration.launch.sensors import build_sensor
from batch_assets.spec import PipelineSpec


def launch_definitions(spec: PipelineSpec) -> dg.Definitions:
    """The pipeline's schedule and/or sensor, or its automation sensor, when its spec declares them."""
    schedule, sensor = build_schedule(spec, job_name(spec)), build_sensor(spec, job_name(spec))
    automation = build_automation_sensor(spec)
    return dg.Definitions(schedules=[schedule] if schedule else [],
                          sensors=[s for s in (sensor, automation) if s is not None])
