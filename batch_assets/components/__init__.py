"""Dagster Components of this project (listed by `dg list components`, scaffolded by `dg scaffold defs`)."""

from batch_assets.components.pipeline import BatchInferencePipeline

__all__ = ["BatchInferencePipeline"]
