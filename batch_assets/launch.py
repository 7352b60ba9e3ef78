"""A pipeline's automatic launch paths, gathered for the code location and for component pipelines alike."""

from __future__ import annotations

import dagster as dg

from batch_assets.factory import job_name
from batch_assets.schedules import build_schedule
from batch_assets.sensors import build_sensor
from batch_assets.spec import PipelineSpec


def launch_definitions(spec: PipelineSpec) -> dg.Definitions:
    """The pipeline's schedule and/or sensor, when its spec declares them."""
    schedule, sensor = build_schedule(spec, job_name(spec)), build_sensor(spec, job_name(spec))
    return dg.Definitions(schedules=[schedule] if schedule else [], sensors=[sensor] if sensor else [])
