"""Dagster wiring, one folder per concern: `assets/` builds a pipeline's four partitioned assets from its spec
(checks, job, code versions, lineage skips, the automation condition each asset carries); `launch/` starts runs of
them (schedules, sensors on new files, the automation sensor, and the claims that keep two launchers off one
partition); `execution/` runs the steps (local and Kubernetes executors, per-partition pod resources, pools,
overlapped partitions, stopping). Folders import one way: launch -> assets -> execution. `upstream_checks.py`
stays at the top: users import it in their own definitions.py. The stages (batch_assets/stages/) know nothing of
Dagster."""
