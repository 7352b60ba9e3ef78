"""Turns a PipelineSpec into four partitioned assets (read -> prepare -> infer -> write) plus checks and a job.

Each stage's logic lives in batch_assets/stages/ (`read.run_read`, `prepare.run_prepare`, `infer.run_infer`,
`write.run_write`) and is called once per partition of the run, returning a `PartitionReport`, through the one
partition loop (partition_loop.py: the partition's lock, the skip of a partition already made from the same inputs,
each partition's metadata, failures). The infer asset's body is an object with named steps (infer_asset.py: the
pool, the model behind the response cache, what the model did per partition, the blocking checks).
All four assets share one partitions definition and the spec's backfill policy (`single_run` by default: a backfill
or a `--partition-range` run processes its partitions in one run, so the infer step loads the model once), its
step retry policy, and a `code_version` per stage derived from the spec sections that stage depends on. Asset
names come from batch_assets/stage_names.py: they are the keys users' instances hold, never renamed.
"""

from __future__ import annotations

import warnings
from typing import Any

import dagster as dg

from batch_assets.orchestration.assets import evaluation
from batch_assets.orchestration.assets.automation import automation_condition
from batch_assets.orchestration.assets.checks import blocking_check_specs
from batch_assets.orchestration.assets.infer_asset import InferredAsset, id_column
from batch_assets.orchestration.assets.lineage import stage_code_version
from batch_assets.orchestration.assets.partition_loop import run_partitions
from batch_assets.orchestration.assets.upstream import upstream_dep
from batch_assets.orchestration.execution.pool_slots import guard_slot_claims, infer_pool, release_dead_slots
from batch_assets.orchestration.execution.pod_compute import INFER_STAGE, PIPELINE_TAG, STAGE_TAG
from batch_assets.orchestration.execution.stopping import stoppable
from batch_assets.partitions import partition_kind, partitions_def_for
from batch_assets.sample_data import ensure_sample
from batch_assets.spec import PipelineSpec
from batch_assets.stage_names import INFER, PREPARE, READ, WRITE, upstream_of
from batch_assets.stages.prepare import run_prepare
from batch_assets.stages.read import run_read, run_read_shards
from batch_assets.stages.report import PartitionReport, preview_of, run_totals
from batch_assets.stages.write import run_write
from batch_assets.storage import ArrowStorage
from batch_assets.tasks import task_type
from batch_assets.resources.registry import provider_class
from batch_assets.resources.secrets import resource_config

# BackfillPolicy is marked beta in dagster 1.13; single-run backfills are the point of this factory.
warnings.filterwarnings("ignore", category=dg.BetaWarning, message=".*backfill_policy.*")

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


def _storage(context: dg.AssetExecutionContext) -> ArrowStorage:
    return getattr(context.resources, STORAGE_KEY)


def _free_dead_pool_slots(context: dg.AssetExecutionContext, spec: PipelineSpec) -> None:
    """Before the infer step asks for its pool slot: free slots held by runs that are gone (a killed CLI run's
    slot is never freed otherwise) and say who holds a slot this run will wait for (execution/pool_slots.py)."""
    pool = infer_pool(spec)
    if pool:
        release_dead_slots(context.instance, pool, own_run_id=context.run_id, log=context.log)


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
    """The asset decorator of one stage; its body runs under `stop_means_stop` (orchestration/execution/stopping.py): a
    Terminate, SIGTERM or Ctrl-C stops it (and the model resource `stops`), never retried."""
    if (upstream := upstream_of(stage)) is not None:
        deps = [dg.AssetKey([spec.name, upstream.asset])]
    else:  # source.asset: the user's asset that writes the source files (orchestration/assets/upstream.py)
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
        automation_condition=automation_condition(spec, stage),  # spec `automation:`; None without (batch_assets/orchestration/assets/automation.py)
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

    @_stage_asset(spec, READ.asset, pdef,
                  f"Read: rows of {spec.source.format} source `{spec.source.path}` for the partition"
                  + (f" (written by asset `{spec.source.asset}`)" if spec.source.asset else "")
                  + ", streamed, with a stable row id and their file/row of origin.",
                  {spec.source.format, "pyarrow"}, {STORAGE_KEY})
    def raw(context) -> dg.MaterializeResult:
        storage = _storage(context)
        _free_dead_pool_slots(context, spec)
        if spec.source.sample:  # a demo pipeline's data, written once where none is (batch_assets/sample_data.py)
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

        # Every hash shard reads the whole source: the shards of one run share a single read.
        shared = together if partition_kind(spec).reads_whole_source else None
        reports = run_partitions(context, spec, storage, one, together=shared)
        # The data version is the content version of the partition's source files (lineage.py): the same bytes
        # re-materialized upstream give the same version. One per event, so only for a one-partition run; a
        # range's partitions carry it in their `source_version` metadata.
        version = reports[0].extra.get("source_version") if len(reports) == 1 else None
        return dg.MaterializeResult(metadata=run_totals(reports),
                                    data_version=dg.DataVersion(str(version)) if version else None)

    @_stage_asset(spec, PREPARE.asset, pdef,
                  "Prepare: renders each row's model input (prompt template / text column), flags empty inputs "
                  "instead of dropping them, and checks that row ids are unique.",
                  {"python", "pyarrow"}, {STORAGE_KEY})
    def prepared(context) -> dg.MaterializeResult:
        storage = _storage(context)
        _free_dead_pool_slots(context, spec)
        # encoded images and documents: no preview
        model_input = [c for c in task_type(spec).model_input(spec) if c not in ("_images", "_files")]

        def one(key: str) -> PartitionReport:
            report = run_prepare(spec, storage, key)
            report.preview = preview_of(report.path, [id_column(spec), *model_input, "_input_problem"])
            return report

        return dg.MaterializeResult(metadata=run_totals(run_partitions(context, spec, storage, one)))

    inferred_key = dg.AssetKey([spec.name, INFER.asset])
    infer_checks = [dg.AssetCheckSpec("no_row_errors", asset=inferred_key,
                                      description="Every row got a model output (warns otherwise)."),
                    *blocking_check_specs(spec, inferred_key)]
    if spec.evaluation is not None:
        infer_checks.append(evaluation.check_spec(spec, inferred_key))

    @_stage_asset(spec, INFER.asset, pdef,
                  f"Infer: task `{spec.task.kind}` with provider `{spec.model.provider}` (resource `{model_key}`), "
                  f"{spec.runtime.chunk_rows} rows per model call, each chunk committed so a rerun resumes. Row "
                  "failures are recorded in `error`; blocking checks (rows exactly once against the source, error "
                  "rate, output schema) must pass before the output is published.",
                  set(provider_class(spec.model.provider).dagster_kinds) | {"pyarrow"},
                  {STORAGE_KEY, model_key},
                  check_specs=infer_checks,
                  op_tags={PIPELINE_TAG: spec.name, STAGE_TAG: INFER_STAGE}, pool=infer_pool(spec), stops=model_key)
    def inferred(context) -> dg.MaterializeResult:
        # the infer step's dozen jobs, as named steps of one object (infer_asset.py)
        return InferredAsset(spec, context, _storage(context), getattr(context.resources, model_key)).materialize()

    @_stage_asset(spec, WRITE.asset, pdef,
                  f"Write: publishes the sink columns as {spec.sink.format} under "
                  f"`{spec.sink.path or '<storage root>/' + spec.name + '/output'}`, one file per partition, "
                  "committed atomically after verifying every input row id appears exactly once; then the partition's "
                  "inference checkpoints are removed.",
                  {spec.sink.format, storage_kind}, {STORAGE_KEY})
    def output(context) -> dg.MaterializeResult:
        storage = _storage(context)
        reports = run_partitions(context, spec, storage, lambda key: run_write(spec, storage, key))
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
    guard_slot_claims()  # whichever process executes these steps claims pool slots one step per slot
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
