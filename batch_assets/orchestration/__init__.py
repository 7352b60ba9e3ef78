"""Dagster wiring: the asset factory, checks, evaluation, progress, launch paths (schedules, sensors, automation,
backfills), pools, executors, the Kubernetes executor and its per-partition resource policy."""
