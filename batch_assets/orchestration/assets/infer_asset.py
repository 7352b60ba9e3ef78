"""The inferred asset's body: one object per run whose named steps are the infer step's jobs, in the order they run.

`InferredAsset.materialize` records where a pool slot's holder runs, waits for the model (a local model has been
loading on a thread since the run started), then infers each partition of the run through the one partition loop
(partition_loop.py: locks, lineage skips, overlap, failures) and returns the blocking checks' results. Each partition
(`infer_partition`) runs the infer stage (batch_assets/stages/infer.py, no Dagster), counts what it sent and what the
response cache answered, and describes itself: model, device, tokens, cost, error samples, evaluation, a preview.
Everything counted for one partition is its own: partitions of one run may be inferred at once (overlap.py).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

import dagster as dg

from batch_assets.orchestration.assets import evaluation
from batch_assets.orchestration.assets.checks import blocking_check_results
from batch_assets.orchestration.assets.partition_loop import run_partitions
from batch_assets.orchestration.assets.progress import PartitionProgress
from batch_assets.orchestration.execution.overlap import partition_window_rows
from batch_assets.orchestration.execution.pool_slots import host_pool_slot, infer_pool, record_infer_process
from batch_assets.reliability.cache import CachedProvider, ResponseCache, cached
from batch_assets.spec import PipelineSpec
from batch_assets.stage_names import INFER, PREPARE
from batch_assets.stages.infer import InferStats, run_infer
from batch_assets.stages.report import PartitionReport, counter_delta, preview_of, run_totals
from batch_assets.storage import ArrowStorage, parquet_rows, parquet_schema, upstream_url
from batch_assets.tasks import task_type
from batch_assets.resources.base import resolve_device
from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.resources.registry import provider_class


class InferredAsset:
    """The infer step of one run of `spec`: `materialize()` is the asset's body."""

    def __init__(self, spec: PipelineSpec, context: dg.AssetExecutionContext, storage: ArrowStorage, model: Any):
        self.spec, self.context, self.storage = spec, context, storage
        self.model = model  # the provider resource; each partition wraps it in its own response cache
        self.stats = InferStats()  # the run's: each partition counts into its own, merged in as it finishes
        self._merging = threading.Lock()
        self.confusions: dict[str, evaluation.Confusion] = {}

    def materialize(self) -> dg.MaterializeResult:
        pool = infer_pool(self.spec)
        if pool:  # where the slot holder runs, so a later run can tell when it is gone
            record_infer_process(self.context.instance, self.context.run_id)
        self.wait_for_model()
        self.provider = self._cached(self.model)  # the run's view of the model: describe() and the checks
        self.describe = self.provider.describe()
        self.device = _device(self.spec, self.provider, self.describe)
        with host_pool_slot(self.context.instance, pool, self.context.log) if pool else nullcontext():
            reports = self.infer_partitions()
        self.score_skipped(reports)
        return dg.MaterializeResult(metadata=run_totals(reports), check_results=self.check_results(reports))

    def wait_for_model(self) -> None:
        """A local model has been loading on a thread since the run started (resources/base.py `preload`)."""
        try:
            self.model.wait_for_preload()
        except (ModelLoadError, ImportError) as exc:  # a retry of the step would load and fail the same way
            raise dg.Failure(description=f"pipeline {self.spec.name!r}: {exc}", metadata={"pipeline": self.spec.name},
                             allow_retries=False) from None

    def infer_partitions(self) -> list[PartitionReport]:
        window = partition_window_rows(self.model, self.spec.runtime.chunk_rows)
        return run_partitions(self.context, self.spec, self.storage, self.infer_partition,
                              window_rows=window, rows_of=self._prepared_rows)

    def infer_partition(self, key: str) -> PartitionReport:
        """One partition: the infer stage, then what it did (counters, metadata, evaluation, preview)."""
        spec = self.spec
        progress = PartitionProgress(self.context.log, f"{spec.name}/{INFER.asset} [{key}]",
                                     self._prepared_rows(key), every_s=spec.runtime.progress_every_s)
        part = InferStats(listeners=[lambda _stats, rows: progress.add(rows)],
                          on_batch=lambda report: _batch_progress(self.context, key, report))
        caller = self._cached(self.model)
        report = run_infer(spec, self.storage, key, caller, part)
        delta = counter_delta(part, InferStats())
        if isinstance(caller, CachedProvider):
            delta["cache_hits"], delta["cache_misses"] = caller.hits, caller.misses
        with self._merging:
            self.stats.merge(part)
        progress.finish(delta.get("rows_with_errors"))
        self.describe_partition(key, report, part, delta)
        preview_cols = [id_column(spec), *task_type(spec).source_columns(spec)]
        if spec.evaluation is not None:
            self.confusions[key] = evaluation.evaluate_file(spec, report.path)
            report.extra.update(evaluation.partition_metadata(self.confusions[key]))
            preview_cols.append(spec.evaluation.label_column)
        prepared = parquet_schema(self._prepared_url(key)).names
        produced = [c for c in parquet_schema(report.path).names if c not in prepared]
        report.preview = preview_of(report.path, [*preview_cols, *produced][:10])
        return report

    def describe_partition(self, key: str, report: PartitionReport, part: InferStats, delta: dict[str, int]) -> None:
        spec = self.spec
        # what the partition decided for itself (run_infer: the backend of `precision: fast`) wins over the run's
        for name, value in infer_partition_metadata(spec, self.describe, self.device, delta).items():
            report.extra.setdefault(name, value)
        if spec.prepare.trial:  # a trial's rows only (stages/trial.py): never the partition's full output
            report.extra["trial"] = True
        # Error samples are per partition: run-level metadata is merged into every partition's event, so a run-wide
        # list would show one day's rows on every day.
        if part.error_samples:
            report.extra["error_samples"] = dg.MetadataValue.md("\n".join(f"- {e}" for e in part.error_samples))
        if report.extra.get("labels_never_predicted"):
            self.context.log.warning(
                f"{spec.name} partition {key!r}: the model never predicted label(s) "
                f"{report.extra['labels_never_predicted']} in {report.rows_out} rows; if they should occur, "
                "check the labels' wording, the input text and the model (metadata label_count/<label> plots "
                "each label across partitions)")

    def score_skipped(self, reports: list[PartitionReport]) -> None:
        """Partitions skipped as already made are scored from their file."""
        if self.spec.evaluation is not None:
            for report in reports:
                if report.key not in self.confusions:
                    self.confusions[report.key] = evaluation.evaluate_file(self.spec, report.path)

    def check_results(self, reports: list[PartitionReport]) -> list[dg.AssetCheckResult]:
        stats = self.stats
        checks = [dg.AssetCheckResult(
            check_name="no_row_errors",
            passed=stats.rows_with_errors == 0,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"rows_with_errors": stats.rows_with_errors, "rows": stats.rows_out,
                      "samples": "\n".join(stats.run_error_samples) or "none"},
        )]
        checks += blocking_check_results(self.spec, self.provider, reports)
        if self.spec.evaluation is not None:
            checks.append(evaluation.check_result(self.spec, self.confusions))
        return checks

    def _cached(self, provider: Any) -> Any:
        if not self.spec.runtime.response_cache:
            return provider
        return cached(provider, ResponseCache(self.storage.resolved_root()))

    def _prepared_url(self, key: str) -> str:
        return upstream_url(self.storage, self.spec.name, PREPARE.asset, key)

    def _prepared_rows(self, key: str) -> int:
        return parquet_rows(self._prepared_url(key))


def id_column(spec: PipelineSpec) -> str:
    """The column that holds each row's id in the stage files (previews show it first)."""
    return spec.prepare.id_column or "row_id"


def _device(spec: PipelineSpec, provider: Any, describe: dict[str, Any]) -> str:
    if describe.get("device"):
        return str(describe["device"])
    if provider_class(spec.model.provider).default_endpoint is not None:
        return "remote (HTTP API)"
    device = provider.configured_device()
    if isinstance(device, str):
        try:
            return resolve_device(device)
        except (ImportError, ModelLoadError):
            # Metadata only describes the device: the provider loaded (or chose not to use torch), so a device
            # that cannot be resolved here is reported as configured instead of failing a finished step.
            return device
    return "n/a"


def _batch_progress(context: dg.AssetExecutionContext, key: str, report: dict[str, Any]) -> None:
    """Batch mode, while the partition waits: a line in the run's log and an observation of the infer asset (its
    page shows the batches' status and counts as they change, hours before the partition is materialized)."""
    if "event" in report:
        context.log.info(f"[{key}] {report['event']}")
        return
    context.log.info(f"[{key}] batches: {report['status']}; {report['requests_completed']}/"
                     f"{report['requests_total']} requests done, {report['requests_failed']} failed, "
                     f"{report['rows_waiting']} rows waiting ({report['batches']})")
    context.log_event(dg.AssetObservation(
        asset_key=context.asset_key, partition=key,
        metadata={name: value for name, value in report.items() if name != "partition"}))


def infer_partition_metadata(spec: PipelineSpec, describe: dict[str, Any], device: str,
                             delta: dict[str, int]) -> dict[str, Any]:
    """What the model did for one partition: who ran it where, tokens, requests, cache hits, estimated cost."""
    md: dict[str, Any] = {
        "model": str(describe.get("model")),
        "provider": spec.model.provider,
        "provider_class": str(describe.get("provider")),
        "device": device,
    }
    if "batch_size" in describe:
        md["batch_size"] = int(describe["batch_size"])
    for name in ("backend", "backend_reason"):  # what ran a local model (torch, onnx, openvino, ...) and why
        if name in describe:
            md[name] = str(describe[name])
    if "settings" in describe:  # what the answers were computed with: the provider's fields declared semantic
        md["model_settings"] = dg.MetadataValue.json(describe["settings"])
    if task_type(spec).counts_tokens:
        md["tokens_in"] = delta.get("prompt_tokens", 0)
        md["tokens_out"] = delta.get("completion_tokens", 0)
        # requests this materialization sent to the model: one per row handed to the provider (rows flagged empty
        # are never sent), less the answers the response cache gave (`cache_hits`) and less rows of chunks resumed
        # from a checkpoint (`chunks_reused`: paid by an earlier run). Tokens and cost are the partition's output's.
        md["requests"] = delta.get("rows_sent", 0) - delta.get("cache_hits", 0)
    for name in ("cache_hits", "cache_misses"):
        if name in delta:
            md[name] = delta[name]
    pricing = spec.model.pricing
    batch_in, batch_out = delta.get("batch_prompt_tokens", 0), delta.get("batch_completion_tokens", 0)
    cost = pricing.cost(max(0, delta.get("prompt_tokens", 0) - batch_in),
                        max(0, delta.get("completion_tokens", 0) - batch_out))
    if delta.get("batch_rows"):  # rows answered through the provider's batch API, at its price
        cost += pricing.batch_cost(batch_in, batch_out)
    if provider_class(spec.model.provider).waits_on_batches(spec.model.config):
        md.update({name: delta.get(name, 0) for name in ("batches_submitted", "batch_rows", "batch_rows_online")})
        md["batch_tokens_in"], md["batch_tokens_out"] = batch_in, batch_out
    md["cost_usd"] = float(round(cost, 6))
    return md
