"""Which Dagster executor runs a pipeline's steps locally, chosen with $BATCH_EXECUTOR.

- `in_process` (default): the four steps of a run share one process, so the run pays for Python, Dagster and the
  model's imports once and loads the model once. Measured against the alternative in docs/BENCHMARKS.md
  ("Levers: fixed cost per run"); the steps of one pipeline depend on each other, so nothing ran in parallel
  anyway.
- `multiprocess`: one process per step, forked from a forkserver that has already imported Dagster, this code
  location and torch (each step skips those imports, ~2-3 s; a step that needs the model still loads it once).
  Isolates a crashing step from the run.
Production on Kubernetes: BATCH_EXECUTOR=k8s selects batch_assets/orchestration/execution/k8s_executor.py (one Job per step); see
docs/deployment.md.
"""

from __future__ import annotations

import importlib.util
import os

import dagster as dg

DEFAULT = "in_process"


def _preload_modules() -> list[str]:
    modules = ["batch_assets.definitions"]
    if importlib.util.find_spec("torch") is not None:
        modules.append("torch")
    return modules


def local_executor(choice: str | None = None) -> dg.ExecutorDefinition:
    """The executor named by `choice` or $BATCH_EXECUTOR (default in_process)."""
    choice = choice or os.environ.get("BATCH_EXECUTOR") or DEFAULT
    if choice == "in_process":
        return dg.in_process_executor
    if choice == "multiprocess":
        return dg.multiprocess_executor.configured(
            {"start_method": {"forkserver": {"preload_modules": _preload_modules()}}}, name="multiprocess_forkserver"
        )
    raise ValueError(f"BATCH_EXECUTOR={choice!r} is not a local executor; choose in_process or multiprocess (or k8s on "
                     "Kubernetes, docs/deployment.md)")
