"""The Dagster code location: one set of assets per pipeline spec in batch_assets/pipelines/*.yaml.

Set BATCH_PIPELINES_DIR to load specs from another folder (os.pathsep-separated for several).
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from batch_assets.factory import STORAGE_KEY, build_pipeline_definitions
from batch_assets.spec import PipelineSpec, load_specs
from batch_assets.storage import ArrowStorage

PIPELINES_DIR = Path(__file__).parent / "pipelines"


def pipeline_dirs() -> list[Path]:
    extra = os.environ.get("BATCH_PIPELINES_DIR")
    return [Path(p) for p in extra.split(os.pathsep) if p] if extra else [PIPELINES_DIR]


def load_all_specs() -> list[PipelineSpec]:
    return [spec for folder in pipeline_dirs() for spec in load_specs(folder)]


def build_definitions(specs: list[PipelineSpec]) -> dg.Definitions:
    per_pipeline = [build_pipeline_definitions(spec) for spec in specs]
    shared = dg.Definitions(resources={STORAGE_KEY: ArrowStorage()})
    return dg.Definitions.merge(shared, *per_pipeline)


defs = build_definitions(load_all_specs())
