"""What every bad-input test asks: the step failed, with which message; and nothing of the partition is visible."""

from __future__ import annotations

from pathlib import Path

from batch_assets.stages.sources.versions import CACHE_FILE
from batch_assets.storage import ArrowStorage, exists
from tests.conftest import run_pipeline


def failure_message(spec, root: Path | str, key: str) -> str:
    """Run the partition (expecting failure) and return the first failed step's message, unwrapped from Dagster's."""
    result = run_pipeline(spec, root, [key], raise_on_error=False)
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "a step must fail"
    error = failures[0].event_specific_data.error
    return error.cause.message if error.cause else error.message


def assert_nothing_published(spec, root: Path | str, key: str) -> None:
    """No stage of the partition is visible, and (for a local root) no file at all is left under the root."""
    storage = ArrowStorage(root=str(root))
    for stage in ("raw", "prepared", "inferred", "output"):
        assert not exists(storage.stage_url(spec.name, stage, key)), f"{stage} must not be visible"
    local = Path(root)
    # the source-version cache (stages/sources/versions.py: path -> stat -> digest of the source files read) is
    # not a partition's data; anything else left under the root is
    files = [p for p in local.rglob("*") if p.is_file() and p.name != CACHE_FILE] if local.exists() else []
    assert files == [], files
