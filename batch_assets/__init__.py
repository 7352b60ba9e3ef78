"""Batch inference as partitioned Dagster assets: read -> prepare -> infer -> write."""

# Every product process: library telemetry off and no child left to hold the process at exit, before anything else
# is imported (resources/telemetry.py, resources/process_exit.py).
import batch_assets.resources.process_exit  # noqa: F401, I001
import batch_assets.resources.telemetry  # noqa: F401
