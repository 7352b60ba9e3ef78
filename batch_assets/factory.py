"""Turns a PipelineSpec into four partitioned assets (read -> prepare -> infer -> write) plus checks.

The factory only wires: each stage's logic lives in its own module and is called once per partition of the run
(`sources.run_read`, `prepare.run_prepare`, `infer.run_infer`, `sink.run_write`), returning a `PartitionReport`.
All four assets share one partitions definition and the spec's backfill policy (`single_run` by default: a backfill
or a `--partition-range` run processes its partitions in one run, so the infer step loads the model once), its
step retry policy, and a `code_version` per stage derived from the spec sections that stage depends on.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from typing import Any

import dagster as dg

from batch_assets.checks import blocking_check_results, blocking_check_specs
from batch_assets.cache import CachedProvider, ResponseCache, cached
from batch_assets.errors import PipelineError
from batch_assets.infer import InferStats, run_infer
from batch_assets.locks import partition_lock
from batch_assets.partitions import partitions_def_for
from batch_assets.pools import infer_pool
from batch_assets.prepare import run_prepare
from batch_assets.report import PartitionReport, partition_metadata, summary_metadata
from batch_assets.resource_policy import INFER_STAGE, PIPELINE_TAG, STAGE_TAG, remember_spec
from batch_assets.sample_data import ensure_sample
from batch_assets.secrets import resource_config
from batch_assets.sink import run_write
from batch_assets.sources import run_read
from batch_assets.spec import PipelineSpec
from batch_assets.storage import ArrowStorage
from resources.registry import provider_class

# BackfillPolicy is marked beta in dagster 1.13; single-run backfills are the point of this factory.
warnings.filterwarnings("ignore", category=dg.BetaWarning, message=".*backfill_policy.*")

STAGES = ("raw", "prepared", "inferred", "output")
STORAGE_KEY = "storage"
PROVIDER_KINDS = {
    "sentence_transformers": {"pytorch", "huggingface"},
    "transformers": {"pytorch", "huggingface"},
    "openai": {"openai"},
    "vllm": {"vllm"},
}


def model_resource_key(spec: PipelineSpec) -> str:
    return f"{spec.name}_model"


def build_model_resource(spec: PipelineSpec) -> dg.ConfigurableResource:
    """The provider resource from the spec; {env: NAME} references are resolved at run time (batch_assets.secrets)."""
    return provider_class(spec.model.provider)(**resource_config(spec.model.config))


# What each stage's output depends on in the spec (upstream changes reach it through Dagster's staleness).
# Knobs that change how fast, not what (batch_rows, chunk_rows, retries, schedules), are left out.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "raw": ("source", "partitioning"),
    "prepared": ("prepare",),
    "inferred": ("task", "model"),
    "output": ("sink",),
}
SPEED_ONLY_FIELDS = {"source": {"batch_rows"}}


def stage_code_version(spec: PipelineSpec, stage: str) -> str:
    """A digest of the spec sections a stage's output depends on: edit the prompt, model or params and that stage
    (and, through Dagster's staleness, everything downstream) shows as stale in the UI. {env: NAME} secrets enter
    by name only, never by value."""
    dumped = spec.model_dump(mode="json")
    sections = {
        name: {k: v for k, v in dumped[name].items() if k not in SPEED_ONLY_FIELDS.get(name, set())}
        for name in STAGE_SECTIONS[stage]
    }
    digest = hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    return f"{stage}-{digest[:12]}"


def step_retry_policy(spec: PipelineSpec) -> dg.RetryPolicy | None:
    """Retries with backoff for transient failures; `run_partitions` turns bad input into a non-retryable Failure."""
    r = spec.retries
    if not r.max_retries:
        return None
    return dg.RetryPolicy(
        max_retries=r.max_retries,
        delay=r.delay_seconds,
        backoff=dg.Backoff.EXPONENTIAL if r.backoff == "exponential" else dg.Backoff.LINEAR,
        jitter=dg.Jitter.PLUS_MINUS if r.jitter and r.delay_seconds else None,
    )


def backfill_policy(spec: PipelineSpec) -> dg.BackfillPolicy:
    if spec.backfill.policy == "multi_run":
        return dg.BackfillPolicy.multi_run(max_partitions_per_run=spec.backfill.max_partitions_per_run)
    return dg.BackfillPolicy.single_run()


def run_partitions(
    context: dg.AssetExecutionContext, spec: PipelineSpec, stage_fn: Callable[[str], PartitionReport],
    stage: str | None = None,
) -> list[PartitionReport]:
    """Run one stage over every partition of the run, in order; each partition gets its own metadata.

    Each partition's stage runs under the partition's lock (batch_assets.locks): two runs of one partition at once
    take turns instead of interleaving.

    Each partition's file is committed atomically as it finishes, so when partition k fails, 1..k-1 are complete:
    they are recorded as materialized (one AssetMaterialization each) before the step fails, and re-executing the
    backfill from failure (or backfilling missing partitions) only does what is left. Bad input (PipelineError) is
    located (pipeline, partition) and fails without retries: rerunning cannot fix it. Anything else (network,
    worker loss) fails the step normally, so the step's RetryPolicy retries it with backoff.
    """
    reports: list[PartitionReport] = []
    keys = context.partition_keys
    root = getattr(context.resources, STORAGE_KEY).resolved_root()
    for key in keys:
        try:
            with partition_lock(root, spec.name, stage or context.asset_key.path[-1], key, on_wait=context.log.info):
                report = stage_fn(key)
        except PipelineError as exc:
            _record_finished(context, reports, failed_key=key)
            located = exc.located(pipeline=spec.name, partition=key)
            if getattr(exc, "retryable", False):  # a stage that knows its failure is transient says so
                raise located from None
            raise dg.Failure(
                description=str(located),
                metadata={"pipeline": spec.name, "partition": key, "file": located.file or "",
                          "column": located.column or "", "row": str(located.row or "")},
                allow_retries=False,
            ) from located
        except BaseException:
            _record_finished(context, reports, failed_key=key)
            raise
        reports.append(report)
        if len(keys) > 1:
            context.add_asset_metadata(partition_metadata(report), partition_key=key)
    return reports


def _record_finished(context: dg.AssetExecutionContext, reports: list[PartitionReport], failed_key: str) -> None:
    for report in reports:
        context.log_event(dg.AssetMaterialization(
            asset_key=context.asset_key,
            partition=report.key,
            description=f"Finished before partition {failed_key!r} failed in the same run.",
            metadata=partition_metadata(report),
        ))
    if reports:
        context.log.warning(
            f"Partition {failed_key!r} failed; {len(reports)} partition(s) finished before it are recorded as "
            "materialized, so re-executing the backfill from failure redoes only the rest."
        )


def _stage_asset(
    spec: PipelineSpec,
    stage: str,
    partitions_def: dg.PartitionsDefinition,
    description: str,
    kinds: set[str],
    required: set[str],
    check_specs: list[dg.AssetCheckSpec] | None = None,
    op_tags: dict[str, Any] | None = None,
    pool: str | None = None,
):
    deps = [dg.AssetKey([spec.name, STAGES[STAGES.index(stage) - 1]])] if stage != "raw" else []
    return dg.asset(
        key=dg.AssetKey([spec.name, stage]),
        deps=deps,
        partitions_def=partitions_def,
        group_name=spec.name,
        kinds=kinds,
        description=description,
        backfill_policy=backfill_policy(spec),
        retry_policy=step_retry_policy(spec),
        code_version=stage_code_version(spec, stage),
        required_resource_keys=required,
        check_specs=check_specs,
        op_tags=op_tags,
        pool=pool,
        metadata={"pipeline": spec.name, "stage": stage},
    )


def build_pipeline_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    remember_spec(spec)  # the batch Kubernetes executor sizes this pipeline's infer steps from it
    pdef = partitions_def_for(spec)
    model_key = model_resource_key(spec)
    storage_kind = "s3" if (spec.sink.path or "").startswith("s3://") else "parquet"

    @_stage_asset(spec, "raw", pdef,
                  f"Read: rows of {spec.source.format} source `{spec.source.path}` for the partition, streamed, "
                  "with a stable row id and their file/row of origin.",
                  {spec.source.format, "pyarrow"}, {STORAGE_KEY})
    def raw(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        made = ensure_sample(spec, context.partition_keys)
        if made:
            context.log.info(f"Generated sample data ({spec.source.sample}) into {len(made)} files")
        reports = run_partitions(context, spec, lambda key: run_read(spec, storage, key))
        return dg.MaterializeResult(metadata=summary_metadata(reports))

    @_stage_asset(spec, "prepared", pdef,
                  "Prepare: renders each row's model input (prompt template / text column), flags empty inputs "
                  "instead of dropping them, and checks that row ids are unique.",
                  {"python", "pyarrow"}, {STORAGE_KEY})
    def prepared(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        reports = run_partitions(context, spec, lambda key: run_prepare(spec, storage, key))
        return dg.MaterializeResult(metadata=summary_metadata(
            reports, {"empty_inputs": dg.MetadataValue.int(sum(r.extra["empty_inputs"] for r in reports))}))

    inferred_key = dg.AssetKey([spec.name, "inferred"])

    @_stage_asset(spec, "inferred", pdef,
                  f"Infer: task `{spec.task.kind}` with provider `{spec.model.provider}` (resource `{model_key}`), "
                  f"{spec.runtime.chunk_rows} rows per model call, each chunk committed so a rerun resumes. Row "
                  "failures are recorded in `error`; blocking checks (rows exactly once against the source, error "
                  "rate, output schema) must pass before the output is published.",
                  PROVIDER_KINDS.get(spec.model.provider, {"python"}) | {"pyarrow"},
                  {STORAGE_KEY, model_key},
                  check_specs=[dg.AssetCheckSpec("no_row_errors", asset=inferred_key,
                                                 description="Every row got a model output (warns otherwise)."),
                               *blocking_check_specs(spec, inferred_key)],
                  op_tags={PIPELINE_TAG: spec.name, STAGE_TAG: INFER_STAGE}, pool=infer_pool(spec))
    def inferred(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        provider = getattr(context.resources, model_key)
        if spec.runtime.response_cache:
            provider = cached(provider, ResponseCache(storage.resolved_root()))
        stats = InferStats()
        reports = run_partitions(context, spec, lambda key: run_infer(spec, storage, key, provider, stats))
        describe = provider.describe()
        extra: dict[str, Any] = {
            "model": dg.MetadataValue.text(str(describe.get("model"))),
            "provider": dg.MetadataValue.text(str(describe.get("provider"))),
            "rows_with_errors": dg.MetadataValue.int(stats.rows_with_errors),
            "model_errors": dg.MetadataValue.int(stats.model_errors),
            "chunks_reused": dg.MetadataValue.int(stats.chunks_reused),
            "chunks_computed": dg.MetadataValue.int(stats.chunks_computed),
        }
        if isinstance(provider, CachedProvider):
            extra["cache_hits"] = dg.MetadataValue.int(provider.hits)
            extra["cache_misses"] = dg.MetadataValue.int(provider.misses)
        if "batch_size" in describe:
            extra["batch_size"] = dg.MetadataValue.int(int(describe["batch_size"]))
        if spec.task.kind == "generate":
            extra["tokens_in"] = dg.MetadataValue.int(stats.prompt_tokens)
            extra["tokens_out"] = dg.MetadataValue.int(stats.completion_tokens)
        if stats.error_samples:
            extra["error_samples"] = dg.MetadataValue.md("\n".join(f"- {e}" for e in stats.error_samples))
        check = dg.AssetCheckResult(
            check_name="no_row_errors",
            passed=stats.rows_with_errors == 0,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"rows_with_errors": stats.rows_with_errors, "rows": stats.rows_out,
                      "samples": "\n".join(stats.error_samples) or "none"},
        )
        blocking = blocking_check_results(spec, provider, reports)
        return dg.MaterializeResult(metadata=summary_metadata(reports, extra), check_results=[check, *blocking])

    @_stage_asset(spec, "output", pdef,
                  f"Write: publishes the sink columns as {spec.sink.format} under "
                  f"`{spec.sink.path or '<storage root>/' + spec.name + '/output'}`, one file per partition, "
                  "committed atomically after verifying every input row id appears exactly once; then the partition's "
                  "inference checkpoints are removed.",
                  {spec.sink.format, storage_kind}, {STORAGE_KEY})
    def output(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        reports = run_partitions(context, spec, lambda key: run_write(spec, storage, key))
        previews = "\n\n".join(f"**{r.key}**\n\n{r.extra['preview'].value}" for r in reports[:3])
        # Rows exactly once is a blocking check on `inferred` (against the source); the sink verifies again before
        # its atomic commit and raises instead of publishing.
        return dg.MaterializeResult(metadata=summary_metadata(reports, {"preview": dg.MetadataValue.md(previews)}))

    return [raw, prepared, inferred, output]


def job_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_job"


def build_pipeline_definitions(spec: PipelineSpec) -> dg.Definitions:
    assets = build_pipeline_assets(spec)
    job = dg.define_asset_job(
        job_name(spec),
        selection=dg.AssetSelection.groups(spec.name),
        partitions_def=assets[0].partitions_def,
        description=f"All four stages of pipeline {spec.name}.",
    )
    return dg.Definitions(assets=assets, jobs=[job], resources={model_resource_key(spec): build_model_resource(spec)})
