"""Turns a PipelineSpec into four partitioned assets (read -> prepare -> infer -> write) plus checks.

Each stage's logic lives in batch_assets/stages/ (`read.run_read`, `prepare.run_prepare`, `infer.run_infer`,
`write.run_write`) and is called once per partition of the run, returning a `PartitionReport`. Around that call the
factory adds what runs under Dagster: the partition's lock, the skip of a partition already made from the same
inputs (lineage), the infer step's pool, the model resource (behind the response cache) and each partition's
metadata, for the infer asset also the model, device, tokens, requests, cache hits and estimated cost.
All four assets share one partitions definition and the spec's backfill policy (`single_run` by default: a backfill
or a `--partition-range` run processes its partitions in one run, so the infer step loads the model once), its
step retry policy, and a `code_version` per stage derived from the spec sections that stage depends on.

Why this module is over 400 lines: the four asset bodies are closures over one spec, its partitions definition and
its resource keys, and each is short; splitting them across modules would pass those five values around for no
reader's gain. Stage logic, checks, pools, lineage and metadata live in their own modules.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from typing import Any, NoReturn

import dagster as dg

from batch_assets.errors import PipelineError
from batch_assets.orchestration import evaluation, lineage
from batch_assets.orchestration.automation import automation_condition
from batch_assets.orchestration.checks import blocking_check_results, blocking_check_specs
from batch_assets.orchestration.lineage import stage_code_version
from batch_assets.orchestration.overlap import partition_window_rows, run_overlapped
from batch_assets.orchestration.pools import host_pool_slot, infer_pool, record_infer_process, release_dead_slots
from batch_assets.orchestration.progress import PartitionProgress
from batch_assets.orchestration.resource_policy import INFER_STAGE, PIPELINE_TAG, STAGE_TAG
from batch_assets.orchestration.stopping import stoppable
from batch_assets.orchestration.upstream import upstream_dep
from batch_assets.orchestration.sample_data import ensure_sample
from batch_assets.partitions import partition_kind, partitions_def_for
from batch_assets.reliability.cache import CachedProvider, ResponseCache, cached
from batch_assets.reliability.locks import partition_lock
from batch_assets.spec import PipelineSpec
from batch_assets.stages.infer import InferStats, run_infer
from batch_assets.stages.prepare import run_prepare
from batch_assets.stages.read import run_read, run_read_shards
from batch_assets.stages.report import PartitionReport, counter_delta, partition_metadata, preview_of, run_totals
from batch_assets.stages.write import run_write
from batch_assets.storage import ArrowStorage, parquet_rows, parquet_schema, upstream_url
from batch_assets.tasks import task_type
from batch_assets.resources.base import resolve_device
from batch_assets.resources.errors import ModelLoadError
from batch_assets.resources.registry import provider_class
from batch_assets.resources.secrets import resource_config

# BackfillPolicy is marked beta in dagster 1.13; single-run backfills are the point of this factory.
warnings.filterwarnings("ignore", category=dg.BetaWarning, message=".*backfill_policy.*")

STAGES = ("raw", "prepared", "inferred", "output")
STORAGE_KEY = "storage"
SPEC_METADATA_PREFIX = "batch_assets/spec/"


def model_resource_key(spec: PipelineSpec) -> str:
    return f"{spec.name}_model"


def build_model_resource(spec: PipelineSpec) -> dg.ConfigurableResource:
    """The provider resource from the spec; {env: NAME} references are resolved at run time (resources.secrets)."""
    return provider_class(spec.model.provider)(**resource_config(spec.model.config))


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
    stage: str | None = None, window_rows: int = 0, rows_of: Callable[[str], int] | None = None,
) -> list[PartitionReport]:
    """Run one stage over every partition of the run, in order; each partition gets its own metadata (also in a
    single-run backfill, so the partition view and the plots are per partition).

    Each partition's stage runs under the partition's lock (batch_assets.reliability.locks): two runs of one partition at once
    take turns instead of interleaving.

    Each partition's file is committed atomically as it finishes, so when partition k fails, 1..k-1 are complete:
    they are recorded as materialized (one AssetMaterialization each) before the step fails, and re-executing the
    backfill from failure (or backfilling missing partitions) only does what is left. Bad input (PipelineError) is
    located (pipeline, partition) and fails without retries: rerunning cannot fix it. Anything else (network,
    worker loss) fails the step normally, so the step's RetryPolicy retries it with backoff.

    `window_rows` > 0 (the infer stage of a provider with a shared request gate): partitions overlap, the next one
    starting while the unfinished ones hold fewer rows (`rows_of`) than that (batch_assets/orchestration/overlap.py);
    partitions running when one fails are finished and recorded too.
    """
    reports: list[PartitionReport] = []
    keys = context.partition_keys
    storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
    root = storage.resolved_root()
    stage = stage or context.asset_key.path[-1]

    def locked(key: str) -> PartitionReport:
        with partition_lock(root, spec.name, stage, key, on_wait=context.log.info):
            return _skip_or_run(context, spec, storage, stage, key, stage_fn)

    def done(key: str, report: PartitionReport) -> None:
        if report.schema is None and report.path.endswith(".parquet"):
            report.schema = parquet_schema(report.path)
        reports.append(report)
        # every partition its own metadata, also in a single-run backfill: per-partition views and plots
        context.add_asset_metadata(partition_metadata(report), partition_key=key)

    if window_rows > 0 and len(keys) > 1 and rows_of is not None:
        failure = run_overlapped(keys, locked, rows_of, window_rows, done, lambda key, exc: context.log.error(
            f"{spec.name}/{stage} [{key}] also failed: {exc}"))
        if failure is not None:
            _fail(context, spec, reports, *failure)
        return reports
    for key in keys:
        try:
            report = locked(key)
        except BaseException as exc:
            _fail(context, spec, reports, key, exc)
        done(key, report)
    return reports


def _fail(context: dg.AssetExecutionContext, spec: PipelineSpec, reports: list[PartitionReport], key: str,
          exc: BaseException) -> NoReturn:
    """Record the partitions that finished, then fail the step for partition `key`: bad input without retries."""
    _record_finished(context, reports, failed_key=key)
    if not isinstance(exc, PipelineError):
        raise exc
    located = exc.located(pipeline=spec.name, partition=key)
    if exc.retryable:  # a stage that knows its failure is transient says so
        raise located from None
    raise dg.Failure(
        description=str(located),
        metadata={"pipeline": spec.name, "partition": key, "file": located.file or "",
                  "column": located.column or "", "row": str(located.row or "")},
        allow_retries=False,
    ) from located


def _force_rerun(context: dg.AssetExecutionContext) -> bool:
    return context.run.tags.get(lineage.RERUN_TAG) == lineage.FORCE


def _skipped_report(spec: PipelineSpec, stage: str, key: str, record: dict[str, Any]) -> PartitionReport:
    note = (f"skipped: this partition was already made by {lineage.describe(record)} from the same source files "
            f"and spec; nothing was {'inferred' if stage == 'inferred' else 'redone'} (tag the run "
            f"{lineage.RERUN_TAG}={lineage.FORCE} to redo it)")
    extra = {**record.get("extra", {}), "skipped": note, "made_by_run": str(record.get("run_id", ""))}
    for work in ("tokens_in", "tokens_out", "requests", "cost_usd", "cache_hits", "cache_misses"):
        if work in extra:  # nothing was sent this time: the original run's counts stay on its own event
            extra[work] = 0.0 if work == "cost_usd" else 0
    rows = int(record.get("rows", 0))
    return PartitionReport(key, rows, rows, 0.0, str(record["path"]), extra)


def _skip_or_run(context: dg.AssetExecutionContext, spec: PipelineSpec, storage: ArrowStorage, stage: str,
                 key: str, stage_fn: Callable[[str], PartitionReport]) -> PartitionReport:
    """The stage for one partition, unless the partition was already made from the same inputs (lineage.py):
    then a report of what is there, and no work. Called under the partition's lock."""
    inputs = lineage.inputs_for(spec, storage, stage, key, stage_code_version(spec, stage))
    record = None if _force_rerun(context) else lineage.matching(storage, spec.name, stage, key, inputs)
    if record is not None:
        context.log.info(f"{spec.name}/{stage} [{key}]: already made by {lineage.describe(record)} from the same "
                         f"source and spec; skipped ({lineage.RERUN_TAG}={lineage.FORCE} redoes it)")
        report = _skipped_report(spec, stage, key, record)
        if stage == STAGES[0] and inputs.source_version:
            report.extra["source_version"] = inputs.source_version
        return report
    lineage.forget(storage, spec.name, stage, key)
    report = stage_fn(key)
    if stage == STAGES[0] and inputs.source_version:  # shown per partition; the raw asset's data version
        report.extra["source_version"] = inputs.source_version
    lineage.write_record(storage, spec.name, stage, key,
                         lineage.new_record(inputs, context.run_id, report.path, report.rows_out, report.extra))
    return report


def _free_dead_pool_slots(context: dg.AssetExecutionContext, spec: PipelineSpec) -> None:
    """Before the infer step asks for its pool slot: free slots held by runs that are gone (a killed CLI run's
    slot is never freed otherwise) and say who holds a slot this run will wait for (batch_assets/orchestration/pools.py)."""
    pool = infer_pool(spec)
    if pool:
        release_dead_slots(context.instance, pool, own_run_id=context.run_id, log=context.log)


def _record_finished(context: dg.AssetExecutionContext, reports: list[PartitionReport], failed_key: str) -> None:
    for report in reports:
        context.log_event(dg.AssetMaterialization(
            asset_key=context.asset_key,
            partition=report.key,
            description=f"Finished in the same run as partition {failed_key!r}, which failed.",
            metadata=partition_metadata(report),
        ))
    if reports:
        context.log.warning(
            f"Partition {failed_key!r} failed; {len(reports)} partition(s) finished in the run are recorded as "
            "materialized, so re-executing the backfill from failure redoes only the rest."
        )


def _id_column(spec: PipelineSpec) -> str:
    return spec.prepare.id_column or "row_id"


def _device(spec: PipelineSpec, provider: Any, describe: dict[str, Any]) -> str:
    if describe.get("device"):
        return str(describe["device"])
    if provider_class(spec.model.provider).default_endpoint is not None:
        return "remote (HTTP API)"
    device = getattr(provider, "device", None)
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


def run_partitions_together(
    context: dg.AssetExecutionContext, spec: PipelineSpec, stage_fn: Callable[[list[str]], list[PartitionReport]]
) -> list[PartitionReport]:
    """Like `run_partitions` (each partition under its lock; bad input fails without retries), for a stage that
    handles every partition of the run in one pass: all or none of them are committed."""
    keys = context.partition_keys
    storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
    root, stage = storage.resolved_root(), context.asset_key.path[-1]
    try:
        with ExitStack() as locks:
            for key in keys:
                locks.enter_context(partition_lock(root, spec.name, stage, key, on_wait=context.log.info))
            # one source version for all: the stage reads the same files for every partition of the run; but a
            # files source's hash shard is versioned by its own files (lineage.own_files), so each has its own
            code = stage_code_version(spec, stage)
            first = lineage.inputs_for(spec, storage, stage, keys[0], code)
            inputs = {k: lineage.inputs_for(spec, storage, stage, k, code)
                      if k != keys[0] and lineage.versions_per_key(spec) else first for k in keys}
            records = {} if _force_rerun(context) else {
                k: lineage.matching(storage, spec.name, stage, k, inputs[k]) for k in keys}
            if records and all(records.values()):
                context.log.info(f"{spec.name}/{stage}: all {len(keys)} partitions already made from the same "
                                 f"source and spec; skipped ({lineage.RERUN_TAG}={lineage.FORCE} redoes them)")
                reports = [_skipped_report(spec, stage, k, records[k]) for k in keys]
            else:
                for key in keys:
                    lineage.forget(storage, spec.name, stage, key)
                reports = stage_fn(keys)
                for report in reports:
                    lineage.write_record(storage, spec.name, stage, report.key, lineage.new_record(
                        inputs[report.key], context.run_id, report.path, report.rows_out, report.extra))
    except PipelineError as exc:
        located = exc.located(pipeline=spec.name)
        if exc.retryable:
            raise located from None
        raise dg.Failure(description=str(located), metadata={"pipeline": spec.name, "partitions": ", ".join(keys),
                                                             "file": located.file or ""},
                         allow_retries=False) from located
    for report in reports:
        if report.schema is None and report.path.endswith(".parquet"):
            report.schema = parquet_schema(report.path)
        context.add_asset_metadata(partition_metadata(report), partition_key=report.key)
    return reports


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
    stops: str | None = None,
):
    """The asset decorator of one stage; its body runs under `stop_means_stop` (orchestration/stopping.py): a
    Terminate, SIGTERM or Ctrl-C stops it (and the model resource `stops`), never retried."""
    if stage != "raw":
        deps = [dg.AssetKey([spec.name, STAGES[STAGES.index(stage) - 1]])]
    else:  # source.asset: the user's asset that writes the source files (orchestration/upstream.py)
        deps = [dep] if (dep := upstream_dep(spec)) is not None else []
    asset = dg.asset(
        key=dg.AssetKey([spec.name, stage]),
        deps=deps,
        partitions_def=partitions_def,
        group_name=spec.name,
        kinds=kinds,
        description=description,
        backfill_policy=backfill_policy(spec),
        retry_policy=step_retry_policy(spec),
        code_version=stage_code_version(spec, stage),
        automation_condition=automation_condition(spec, stage),  # spec `automation:`; None without (batch_assets/orchestration/automation.py)
        required_resource_keys=required,
        check_specs=check_specs,
        op_tags=op_tags,
        pool=pool,
        metadata={"pipeline": spec.name, "stage": stage},
    )
    return lambda fn: asset(stoppable(spec, stops)(fn))


def build_pipeline_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    pdef = partitions_def_for(spec)
    model_key = model_resource_key(spec)
    storage_kind = "s3" if (spec.sink.path or "").startswith("s3://") else "parquet"

    @_stage_asset(spec, "raw", pdef,
                  f"Read: rows of {spec.source.format} source `{spec.source.path}` for the partition"
                  + (f" (written by asset `{spec.source.asset}`)" if spec.source.asset else "")
                  + ", streamed, with a stable row id and their file/row of origin.",
                  {spec.source.format, "pyarrow"}, {STORAGE_KEY})
    def raw(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        _free_dead_pool_slots(context, spec)
        made = ensure_sample(spec, context.partition_keys)
        if made:
            context.log.info(f"Generated sample data ({spec.source.sample}) into {len(made)} files")
        def one(key: str) -> PartitionReport:
            report = run_read(spec, storage, key)
            report.preview = preview_of(report.path, spec.source.columns[:8])
            return report

        def together(keys: list[str]) -> list[PartitionReport]:
            reports = run_read_shards(spec, storage, keys)
            for report in reports:
                report.preview = preview_of(report.path, spec.source.columns[:8])
            return reports

        if partition_kind(spec).reads_whole_source and len(context.partition_keys) > 1:
            # Every hash shard reads the whole source: the shards of one run share a single read.
            reports = run_partitions_together(context, spec, together)
        else:
            reports = run_partitions(context, spec, one)
        # The data version is the content version of the partition's source files (lineage.py): the same bytes
        # re-materialized upstream give the same version. One per event, so only for a one-partition run; a
        # range's partitions carry it in their `source_version` metadata.
        version = reports[0].extra.get("source_version") if len(reports) == 1 else None
        return dg.MaterializeResult(metadata=run_totals(reports),
                                    data_version=dg.DataVersion(str(version)) if version else None)

    @_stage_asset(spec, "prepared", pdef,
                  "Prepare: renders each row's model input (prompt template / text column), flags empty inputs "
                  "instead of dropping them, and checks that row ids are unique.",
                  {"python", "pyarrow"}, {STORAGE_KEY})
    def prepared(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        _free_dead_pool_slots(context, spec)
        # encoded images and documents: no preview
        model_input = [c for c in task_type(spec).model_input(spec) if c not in ("_images", "_files")]

        def one(key: str) -> PartitionReport:
            report = run_prepare(spec, storage, key)
            report.preview = preview_of(report.path, [_id_column(spec), *model_input, "_input_problem"])
            return report

        return dg.MaterializeResult(metadata=run_totals(run_partitions(context, spec, one)))

    inferred_key = dg.AssetKey([spec.name, "inferred"])
    infer_checks = [dg.AssetCheckSpec("no_row_errors", asset=inferred_key,
                                      description="Every row got a model output (warns otherwise)."),
                    *blocking_check_specs(spec, inferred_key)]
    if spec.evaluation is not None:
        infer_checks.append(evaluation.check_spec(spec, inferred_key))

    @_stage_asset(spec, "inferred", pdef,
                  f"Infer: task `{spec.task.kind}` with provider `{spec.model.provider}` (resource `{model_key}`), "
                  f"{spec.runtime.chunk_rows} rows per model call, each chunk committed so a rerun resumes. Row "
                  "failures are recorded in `error`; blocking checks (rows exactly once against the source, error "
                  "rate, output schema) must pass before the output is published.",
                  set(provider_class(spec.model.provider).dagster_kinds) | {"pyarrow"},
                  {STORAGE_KEY, model_key},
                  check_specs=infer_checks,
                  op_tags={PIPELINE_TAG: spec.name, STAGE_TAG: INFER_STAGE}, pool=infer_pool(spec), stops=model_key)
    def inferred(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        if infer_pool(spec):  # where the slot holder runs, so a later run can tell when it is gone
            record_infer_process(context.instance, context.run_id)
        provider = getattr(context.resources, model_key)
        try:  # a local model has been loading on a thread since the run started (resources/base.py `preload`)
            provider.wait_for_preload()
        except (ModelLoadError, ImportError) as exc:  # a retry of the step would load and fail the same way
            raise dg.Failure(description=f"pipeline {spec.name!r}: {exc}", metadata={"pipeline": spec.name},
                             allow_retries=False) from None
        model = provider
        if spec.runtime.response_cache:
            provider = cached(provider, ResponseCache(storage.resolved_root()))
        describe = provider.describe()
        device = _device(spec, provider, describe)
        stats = InferStats()  # the run's: each partition counts into its own, merged in as it finishes
        merging = threading.Lock()
        confusions: dict[str, evaluation.Confusion] = {}
        inputs = task_type(spec).source_columns(spec)

        def one(key: str) -> PartitionReport:
            # partitions may be inferred at once (overlap.py): everything counted here is this partition's own
            total = parquet_rows(upstream_url(storage, spec.name, "prepared", key))
            progress = PartitionProgress(context.log, f"{spec.name}/inferred [{key}]", total,
                                         every_s=spec.runtime.progress_every_s)
            part = InferStats(listeners=[lambda _stats, rows: progress.add(rows)],
                              on_batch=lambda report: _batch_progress(context, key, report))
            caller = cached(model, ResponseCache(storage.resolved_root())) if spec.runtime.response_cache else model
            report = run_infer(spec, storage, key, caller, part)
            delta = counter_delta(part, InferStats())
            if isinstance(caller, CachedProvider):
                delta["cache_hits"], delta["cache_misses"] = caller.hits, caller.misses
            with merging:
                stats.merge(part)
            progress.finish(delta.get("rows_with_errors"))
            # what the partition decided for itself (run_infer: the backend of `precision: fast`) wins over the run's
            for name, value in infer_partition_metadata(spec, describe, device, delta).items():
                report.extra.setdefault(name, value)
            if spec.prepare.trial:  # a trial's rows only (stages/trial.py): never the partition's full output
                report.extra["trial"] = True
            if part.error_samples:
                report.extra["error_samples"] = dg.MetadataValue.md("\n".join(f"- {e}" for e in part.error_samples))
            if report.extra.get("labels_never_predicted"):
                context.log.warning(
                    f"{spec.name} partition {key!r}: the model never predicted label(s) "
                    f"{report.extra['labels_never_predicted']} in {report.rows_out} rows; if they should occur, "
                    "check the labels' wording, the input text and the model (metadata label_count/<label> plots "
                    "each label across partitions)")
            preview_cols = [_id_column(spec), *inputs]
            if spec.evaluation is not None:
                confusions[key] = evaluation.evaluate_file(spec, report.path)
                report.extra.update(evaluation.partition_metadata(confusions[key]))
                preview_cols.append(spec.evaluation.label_column)
            produced = [c for c in parquet_schema(report.path).names
                        if c not in parquet_schema(upstream_url(storage, spec.name, "prepared", key)).names]
            report.preview = preview_of(report.path, [*preview_cols, *produced][:10])
            return report

        pool = infer_pool(spec)
        window = partition_window_rows(model, spec.runtime.chunk_rows)
        with host_pool_slot(context.instance, pool, context.log) if pool else nullcontext():
            reports = run_partitions(context, spec, one, window_rows=window, rows_of=lambda key: parquet_rows(
                upstream_url(storage, spec.name, "prepared", key)))
        # Error samples are per partition (in each partition's metadata, added by `one`): run-level metadata is
        # merged into every partition's event, so a run-wide list here would show one day's rows on every day.
        if spec.evaluation is not None:  # partitions skipped as already made are scored from their file
            for report in reports:
                if report.key not in confusions:
                    confusions[report.key] = evaluation.evaluate_file(spec, report.path)
        metadata = run_totals(reports)
        checks = [dg.AssetCheckResult(
            check_name="no_row_errors",
            passed=stats.rows_with_errors == 0,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"rows_with_errors": stats.rows_with_errors, "rows": stats.rows_out,
                      "samples": "\n".join(stats.run_error_samples) or "none"},
        )]
        checks += blocking_check_results(spec, provider, reports)
        if spec.evaluation is not None:
            checks.append(evaluation.check_result(spec, confusions))
        return dg.MaterializeResult(metadata=metadata, check_results=checks)

    @_stage_asset(spec, "output", pdef,
                  f"Write: publishes the sink columns as {spec.sink.format} under "
                  f"`{spec.sink.path or '<storage root>/' + spec.name + '/output'}`, one file per partition, "
                  "committed atomically after verifying every input row id appears exactly once; then the partition's "
                  "inference checkpoints are removed.",
                  {spec.sink.format, storage_kind}, {STORAGE_KEY})
    def output(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        reports = run_partitions(context, spec, lambda key: run_write(spec, storage, key))
        empty = [r.key for r in reports if r.extra.get("empty_partition")]
        if empty:
            context.log.info(f"{len(empty)} partition(s) have no source rows ({', '.join(empty[:10])}"
                             f"{', ...' if len(empty) > 10 else ''}): each is published as an empty "
                             f"{spec.sink.format} output with the declared columns (row count 0)")
        # Rows exactly once is a blocking check on `inferred` (against the source); the sink verifies again before
        # its atomic commit and raises instead of publishing.
        return dg.MaterializeResult(metadata=run_totals(reports))

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
    # The spec travels in the Definitions' metadata (not shown in the UI): whoever gathers the pipelines, spec files
    # and Dagster Components alike, reads every pipeline's spec back with `pipeline_specs` (definitions.py hands
    # them to the Kubernetes executor, which sizes each infer step from its pipeline's policy).
    return dg.Definitions(assets=assets, jobs=[job], resources={model_resource_key(spec): build_model_resource(spec)},
                          metadata={SPEC_METADATA_PREFIX + spec.name: spec.model_dump(mode="json")})


def pipeline_specs(defs: dg.Definitions) -> list[PipelineSpec]:
    """The spec of every pipeline in `defs`, as `build_pipeline_definitions` recorded it."""
    return [PipelineSpec.model_validate(value.value) for key, value in defs.metadata.items()
            if key.startswith(SPEC_METADATA_PREFIX)]
