"""Batch inference as partitioned Dagster assets: read -> prepare -> infer -> write."""
