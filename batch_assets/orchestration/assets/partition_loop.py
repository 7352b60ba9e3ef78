"""The one partition loop every stage asset runs: each partition of the run (a single-run backfill has several)
under its lock, skipped when lineage says it is already made from the same inputs, recorded with its own
metadata as it finishes, and a failure located (pipeline, partition) and reported so that a rerun does only what
is left.

Two shapes of work go through the same loop: a stage that does one partition at a time (`stage_fn(key)`), and a
stage that does every partition of the run in one pass (`together(keys)`: hash shards share a single read of the
source). The second is one group of keys for the loop: locked, skipped or done, and committed all or none.

- Locks: each partition's stage runs under the partition's lock (batch_assets/reliability/locks.py): two runs of
  one partition at once take turns instead of interleaving.
- Failures: each partition's file is committed atomically as it finishes, so when partition k fails, 1..k-1 are
  complete: they are recorded as materialized (one AssetMaterialization each) before the step fails, and
  re-executing the backfill from failure (or backfilling missing partitions) only does what is left. Bad input
  (PipelineError) is located and fails without retries: rerunning cannot fix it. Anything else (network, worker
  loss) fails the step normally, so the step's RetryPolicy retries it with backoff.
- Overlap: `window_rows` > 0 (the infer stage of a provider with a shared request gate): partitions overlap, the
  next one starting while the unfinished ones hold fewer rows (`rows_of`) than that
  (batch_assets/orchestration/execution/overlap.py); partitions running when one fails are finished and recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, NoReturn

import dagster as dg

from batch_assets.errors import PipelineError
from batch_assets.orchestration.assets import lineage
from batch_assets.orchestration.assets.lineage import stage_code_version
from batch_assets.orchestration.execution.overlap import run_overlapped
from batch_assets.reliability.locks import partition_lock
from batch_assets.spec import PipelineSpec
from batch_assets.stage_names import INFER, READ
from batch_assets.stages.report import PartitionReport, partition_metadata
from batch_assets.storage import ArrowStorage, parquet_schema

Group = Callable[[list[str]], list[PartitionReport]]


def run_partitions(
    context: dg.AssetExecutionContext, spec: PipelineSpec, storage: ArrowStorage,
    stage_fn: Callable[[str], PartitionReport], together: Group | None = None,
    window_rows: int = 0, rows_of: Callable[[str], int] | None = None,
) -> list[PartitionReport]:
    """Run one stage over every partition of the run, in order (module docstring); each partition gets its own
    metadata (also in a single-run backfill, so the partition view and the plots are per partition)."""
    loop = _Loop(context, spec, storage)
    keys = context.partition_keys
    if together is not None and len(keys) > 1:
        loop.run_group(keys, together)
    elif window_rows > 0 and len(keys) > 1 and rows_of is not None:
        failure = run_overlapped(keys, lambda key: loop.locked([key], _one(stage_fn))[0], rows_of, window_rows,
                                 loop.done, lambda key, exc: context.log.error(
                                     f"{spec.name}/{loop.stage} [{key}] also failed: {exc}"))
        if failure is not None:
            key, exc = failure
            loop.fail([key], exc)
    else:
        for key in keys:
            loop.run_group([key], _one(stage_fn))
    return loop.reports


def _one(stage_fn: Callable[[str], PartitionReport]) -> Group:
    return lambda keys: [stage_fn(keys[0])]


class _Loop:
    def __init__(self, context: dg.AssetExecutionContext, spec: PipelineSpec, storage: ArrowStorage):
        self.context, self.spec, self.storage = context, spec, storage
        self.stage = context.asset_key.path[-1]
        self.reports: list[PartitionReport] = []

    def run_group(self, keys: list[str], work: Group) -> None:
        try:
            reports = self.locked(keys, work)
        except BaseException as exc:
            self.fail(keys, exc)
        for report in reports:
            self.done(report.key, report)

    def locked(self, keys: list[str], work: Group) -> list[PartitionReport]:
        root = self.storage.resolved_root()
        with ExitStack() as locks:
            for key in keys:
                locks.enter_context(partition_lock(root, self.spec.name, self.stage, key,
                                                   on_wait=self.context.log.info))
            return self._skip_or_run(keys, work)

    def _skip_or_run(self, keys: list[str], work: Group) -> list[PartitionReport]:
        """The stage for the keys, unless every one was already made from the same inputs (lineage.py): then a
        report of what is there, and no work. Called under the keys' locks."""
        spec, storage, stage = self.spec, self.storage, self.stage
        code = stage_code_version(spec, stage)
        # one source version for a group: its stage reads the same files for every key; but a files source's hash
        # shard is versioned by its own files (lineage.own_files), so each has its own
        first = lineage.inputs_for(spec, storage, stage, keys[0], code)
        inputs = {k: lineage.inputs_for(spec, storage, stage, k, code)
                  if k != keys[0] and lineage.versions_per_key(spec) else first for k in keys}
        force = self.context.run.tags.get(lineage.RERUN_TAG) == lineage.FORCE
        records = {} if force else {k: lineage.matching(storage, spec.name, stage, k, inputs[k]) for k in keys}
        skipped = bool(records) and all(records.values())
        if skipped:
            redo = f"{lineage.RERUN_TAG}={lineage.FORCE}"
            if len(keys) == 1:
                self.context.log.info(f"{spec.name}/{stage} [{keys[0]}]: already made by "
                                      f"{lineage.describe(records[keys[0]])} from the same source and spec; "
                                      f"skipped ({redo} redoes it)")
            else:
                self.context.log.info(f"{spec.name}/{stage}: all {len(keys)} partitions already made from the same "
                                      f"source and spec; skipped ({redo} redoes them)")
            reports = [_skipped_report(stage, k, records[k]) for k in keys]
        else:
            for key in keys:
                lineage.forget(storage, spec.name, stage, key)
            reports = work(keys)
        for report in reports:
            if stage == READ.asset and inputs[report.key].source_version:  # shown per partition; raw's data version
                report.extra["source_version"] = inputs[report.key].source_version
            if not skipped:
                lineage.write_record(storage, spec.name, stage, report.key, lineage.new_record(
                    inputs[report.key], self.context.run_id, report.path, report.rows_out, report.extra))
        return reports

    def done(self, key: str, report: PartitionReport) -> None:
        if report.schema is None and report.path.endswith(".parquet"):
            report.schema = parquet_schema(report.path)
        self.reports.append(report)
        # every partition its own metadata, also in a single-run backfill: per-partition views and plots
        self.context.add_asset_metadata(partition_metadata(report), partition_key=key)

    def fail(self, keys: list[str], exc: BaseException) -> NoReturn:
        """Record the partitions that finished, then fail the step for `keys`: bad input without retries."""
        self._record_finished(failed=", ".join(keys))
        if not isinstance(exc, PipelineError):
            raise exc
        one = keys[0] if len(keys) == 1 else None
        located = exc.located(pipeline=self.spec.name, partition=one) if one else exc.located(pipeline=self.spec.name)
        if exc.retryable:  # a stage that knows its failure is transient says so
            raise located from None
        raise dg.Failure(
            description=str(located),
            metadata={"pipeline": self.spec.name, **({"partition": one} if one else {"partitions": ", ".join(keys)}),
                      "file": located.file or "", "column": located.column or "", "row": str(located.row or "")},
            allow_retries=False,
        ) from located

    def _record_finished(self, failed: str) -> None:
        for report in self.reports:
            self.context.log_event(dg.AssetMaterialization(
                asset_key=self.context.asset_key,
                partition=report.key,
                description=f"Finished in the same run as partition {failed!r}, which failed.",
                metadata=partition_metadata(report),
            ))
        if self.reports:
            self.context.log.warning(
                f"Partition {failed!r} failed; {len(self.reports)} partition(s) finished in the run are recorded as "
                "materialized, so re-executing the backfill from failure redoes only the rest."
            )


def _skipped_report(stage: str, key: str, record: dict[str, Any]) -> PartitionReport:
    note = (f"skipped: this partition was already made by {lineage.describe(record)} from the same source files "
            f"and spec; nothing was {'inferred' if stage == INFER.asset else 'redone'} (tag the run "
            f"{lineage.RERUN_TAG}={lineage.FORCE} to redo it)")
    extra = {**record.get("extra", {}), "skipped": note, "made_by_run": str(record.get("run_id", ""))}
    for work in ("tokens_in", "tokens_out", "requests", "cost_usd", "cache_hits", "cache_misses"):
        if work in extra:  # nothing was sent this time: the original run's counts stay on its own event
            extra[work] = 0.0 if work == "cost_usd" else 0
    rows = int(record.get("rows", 0))
    return PartitionReport(key, rows, rows, 0.0, str(record["path"]), extra)
