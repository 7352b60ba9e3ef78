"""Turns a PipelineSpec into four partitioned assets (read -> prepare -> infer -> write) plus checks.

All four share one partitions definition and a single-run backfill policy: a backfill or a
`--partition-range` run processes its partitions in one run, so the infer step loads the model once.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.infer import InferStats, infer_batches
from batch_assets.partitions import partitions_def_for, resolve_partition, stable_hash64
from batch_assets.prepare import prepare_batches
from batch_assets.sample_data import ensure_sample
from batch_assets.sink import sink_columns, sink_url, write_sink
from batch_assets.sources import read_partition
from batch_assets.spec import PipelineSpec
from batch_assets.storage import ArrowStorage, exists, parquet_schema, read_batches, write_parquet
from resources.registry import provider_class

# backfill_policy is marked beta in dagster 1.13; single-run backfills are the point of this factory.
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
    """The provider resource from the spec; {env: NAME} values become dg.EnvVar (read at run time, hidden)."""
    config = {
        k: dg.EnvVar(v["env"]) if isinstance(v, dict) and set(v) == {"env"} else v
        for k, v in spec.model.config.items()
    }
    return provider_class(spec.model.provider)(**config)


@dataclass
class PartitionReport:
    key: str
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _metadata(reports: list[PartitionReport], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    rows_in = sum(r.rows_in for r in reports)
    rows_out = sum(r.rows_out for r in reports)
    seconds = sum(r.seconds for r in reports)
    md: dict[str, Any] = {
        "rows_in": dg.MetadataValue.int(rows_in),
        "rows_out": dg.MetadataValue.int(rows_out),
        "duration_s": dg.MetadataValue.float(round(seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(rows_out / seconds, 1) if seconds else 0.0),
        "path": dg.MetadataValue.path(reports[0].path) if len(reports) == 1 else dg.MetadataValue.text(
            ", ".join(r.path for r in reports)
        ),
    }
    if len(reports) > 1:
        md["partitions"] = dg.MetadataValue.json(
            {r.key: {"rows_in": r.rows_in, "rows_out": r.rows_out, "seconds": round(r.seconds, 3), "path": r.path,
                     **r.extra} for r in reports}
        )
    md.update(extra or {})
    return md


def _upstream(storage: ArrowStorage, spec: PipelineSpec, stage: str, key: str) -> str:
    url = storage.stage_url(spec.name, stage, key)
    if not exists(url):
        raise PipelineError(
            f"upstream asset {spec.name}/{stage} has no data for this partition",
            pipeline=spec.name,
            partition=key,
            file=url,
            fix=f"materialize {spec.name}/{stage} for partition {key!r} first (or the whole pipeline)",
        )
    return url


def _located(spec: PipelineSpec, key: str, fn: Callable[[], PartitionReport]) -> PartitionReport:
    try:
        return fn()
    except PipelineError as exc:
        raise exc.located(pipeline=spec.name, partition=key) from None


def _stage_asset(
    spec: PipelineSpec,
    stage: str,
    partitions_def: dg.PartitionsDefinition,
    description: str,
    kinds: set[str],
    required: set[str],
    check_specs: list[dg.AssetCheckSpec] | None = None,
    op_tags: dict[str, Any] | None = None,
):
    deps = [dg.AssetKey([spec.name, STAGES[STAGES.index(stage) - 1]])] if stage != "raw" else []
    return dg.asset(
        key=dg.AssetKey([spec.name, stage]),
        deps=deps,
        partitions_def=partitions_def,
        group_name=spec.name,
        kinds=kinds,
        description=description,
        backfill_policy=dg.BackfillPolicy.single_run(),
        required_resource_keys=required,
        check_specs=check_specs,
        op_tags=op_tags,
        metadata={"pipeline": spec.name, "stage": stage},
    )


def build_pipeline_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    pdef = partitions_def_for(spec)
    model_key = model_resource_key(spec)
    storage_kind = "s3" if (spec.sink.path or "").startswith("s3://") else "parquet"

    @_stage_asset(spec, "raw", pdef,
                  f"Read: rows of {spec.source.format} source `{spec.source.path}` for the partition, streamed, "
                  "with a stable row id and their file/row of origin.",
                  {spec.source.format, "pyarrow"}, {STORAGE_KEY})
    def raw(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        made = ensure_sample(spec)
        if made:
            context.log.info(f"Generated sample data ({spec.source.sample}) into {len(made)} files")

        def one(key: str) -> PartitionReport:
            start = time.perf_counter()
            part = resolve_partition(spec, key)
            url = storage.stage_url(spec.name, "raw", key)
            with write_parquet(url) as writer:
                for batch in read_partition(spec, part):
                    writer.write(batch)
            return PartitionReport(key, writer.rows, writer.rows, time.perf_counter() - start, url,
                                   {"files": len(part.files)})

        reports = [_located(spec, k, lambda k=k: one(k)) for k in context.partition_keys]
        return dg.MaterializeResult(metadata=_metadata(reports, {"source_files": sum(r.extra["files"] for r in reports)}))

    @_stage_asset(spec, "prepared", pdef,
                  "Prepare: renders each row's model input (prompt template / text column), flags empty inputs "
                  "instead of dropping them, and checks that row ids are unique.",
                  {"python", "pyarrow"}, {STORAGE_KEY})
    def prepared(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)

        def one(key: str) -> PartitionReport:
            start = time.perf_counter()
            src = _upstream(storage, spec, "raw", key)
            url = storage.stage_url(spec.name, "prepared", key)
            flagged = 0
            with write_parquet(url) as writer:
                for batch in prepare_batches(spec, read_batches(src, batch_rows=spec.source.batch_rows)):
                    flagged += sum(batch.column("_input_empty").to_pylist())
                    writer.write(batch)
            return PartitionReport(key, writer.rows, writer.rows, time.perf_counter() - start, url,
                                   {"empty_inputs": flagged})

        reports = [_located(spec, k, lambda k=k: one(k)) for k in context.partition_keys]
        return dg.MaterializeResult(
            metadata=_metadata(reports, {"empty_inputs": dg.MetadataValue.int(sum(r.extra["empty_inputs"] for r in reports))})
        )

    gpu_tags = (
        {"dagster-k8s/config": {"container_config": {"resources": {
            "requests": {"nvidia.com/gpu": str(spec.runtime.gpus)},
            "limits": {"nvidia.com/gpu": str(spec.runtime.gpus)}}}}}
        if spec.runtime.gpus else None
    )

    @_stage_asset(spec, "inferred", pdef,
                  f"Infer: task `{spec.task.kind}` with provider `{spec.model.provider}` (resource `{model_key}`), "
                  f"{spec.runtime.chunk_rows} rows per model call. Row failures are recorded in `error`.",
                  PROVIDER_KINDS.get(spec.model.provider, {"python"}) | {"pyarrow"},
                  {STORAGE_KEY, model_key},
                  check_specs=[dg.AssetCheckSpec("no_row_errors", asset=dg.AssetKey([spec.name, "inferred"]),
                                                 description="Every row got a model output (warns otherwise).")],
                  op_tags=gpu_tags)
    def inferred(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        provider = getattr(context.resources, model_key)
        stats = InferStats()

        def one(key: str) -> PartitionReport:
            start = time.perf_counter()
            before = (stats.rows_out, stats.rows_with_errors)
            src = _upstream(storage, spec, "prepared", key)
            url = storage.stage_url(spec.name, "inferred", key)
            with write_parquet(url) as writer:
                chunks = read_batches(src, batch_rows=spec.runtime.chunk_rows)
                for batch in infer_batches(spec, provider, chunks, stats):
                    writer.write(batch)
            rows = stats.rows_out - before[0]
            return PartitionReport(key, rows, rows, time.perf_counter() - start, url,
                                   {"rows_with_errors": stats.rows_with_errors - before[1]})

        reports = [_located(spec, k, lambda k=k: one(k)) for k in context.partition_keys]
        describe = provider.describe()
        extra: dict[str, Any] = {
            "model": dg.MetadataValue.text(str(describe.get("model"))),
            "provider": dg.MetadataValue.text(str(describe.get("provider"))),
            "rows_with_errors": dg.MetadataValue.int(stats.rows_with_errors),
        }
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
        return dg.MaterializeResult(metadata=_metadata(reports, extra), check_results=[check])

    @_stage_asset(spec, "output", pdef,
                  f"Write: publishes the sink columns as {spec.sink.format} under "
                  f"`{spec.sink.path or '<storage root>/' + spec.name + '/output'}`, one file per partition, "
                  "committed atomically; checks every input row id appears exactly once.",
                  {spec.sink.format, storage_kind}, {STORAGE_KEY},
                  check_specs=[dg.AssetCheckSpec("rows_exactly_once", asset=dg.AssetKey([spec.name, "output"]),
                                                 description="Every row id read from the source appears exactly "
                                                 "once in the output.")])
    def output(context) -> dg.MaterializeResult:
        storage: ArrowStorage = getattr(context.resources, STORAGE_KEY)
        previews: list[str] = []

        def one(key: str) -> PartitionReport:
            start = time.perf_counter()
            src = _upstream(storage, spec, "inferred", key)
            raw_url = _upstream(storage, spec, "raw", key)
            schema = parquet_schema(src)
            columns = sink_columns(spec, schema.names)
            missing = [c for c in columns if c not in schema.names]
            if missing:
                raise PipelineError(f"sink columns {missing} are not produced; available: {schema.names}",
                                    column=missing[0], fix="fix sink.columns in the spec")
            out_schema = pa.schema([schema.field(c) for c in columns])
            seen: set[int] = set()
            dupes: list[str] = []
            head: list[pa.RecordBatch] = []

            def batches() -> Iterator[pa.RecordBatch]:
                for batch in read_batches(src, batch_rows=spec.source.batch_rows):
                    ids = batch.column("row_id").to_pylist()
                    for rid, h in zip(ids, stable_hash64(ids).tolist()):
                        if h in seen:
                            dupes.append(rid)
                        seen.add(h)
                    out = batch.select(columns)
                    if sum(b.num_rows for b in head) < 5:
                        head.append(out.slice(0, 5))
                    yield out

            url = sink_url(spec, storage, key)
            expected = {h for b in read_batches(raw_url, columns=["row_id"]) for h in stable_hash64(b.column(0).to_pylist()).tolist()}
            rows = write_sink(spec, url, _verified(batches(), seen, dupes, expected, spec, key), out_schema)
            previews.append(f"**{key}**\n\n" + markdown_preview(head, columns))
            return PartitionReport(key, rows, rows, time.perf_counter() - start, url, {"rows_in_source": len(expected)})

        reports = [_located(spec, k, lambda k=k: one(k)) for k in context.partition_keys]
        check = dg.AssetCheckResult(
            check_name="rows_exactly_once",
            passed=True,  # a mismatch raises before the output is committed (see _verified)
            metadata={"source_rows": sum(r.extra["rows_in_source"] for r in reports),
                      "output_rows": sum(r.rows_out for r in reports)},
        )
        return dg.MaterializeResult(
            metadata=_metadata(reports, {"preview": dg.MetadataValue.md("\n\n".join(previews[:3]))}),
            check_results=[check],
        )

    return [raw, prepared, inferred, output]


def _verified(batches: Iterator[pa.RecordBatch], seen: set[int], dupes: list[str], expected: set[int],
              spec: PipelineSpec, key: str) -> Iterator[pa.RecordBatch]:
    """Pass batches through; after the last one, fail (inside the atomic write, so nothing is committed) if any
    source row is missing or repeated."""
    yield from batches
    missing = len(expected - seen)
    if dupes or missing or len(seen) != len(expected):
        raise PipelineError(
            f"output would not hold every source row exactly once: {missing} missing, {len(dupes)} repeated "
            f"(e.g. {dupes[:3]})",
            pipeline=spec.name, partition=key,
            fix="re-materialize the upstream assets of this partition; if it persists, report a bug",
        )


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return f"[{', '.join(f'{v:.3f}' if isinstance(v, float) else str(v) for v in value[:3])}, … {len(value)} values]"
    text = "" if value is None else str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "…"


def markdown_preview(batches: list[pa.RecordBatch], columns: list[str], rows: int = 5) -> str:
    records = [r for b in batches for r in b.to_pylist()][:rows]
    if not records:
        return "_no rows_"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def build_pipeline_definitions(spec: PipelineSpec) -> dg.Definitions:
    assets = build_pipeline_assets(spec)
    job = dg.define_asset_job(
        f"{spec.name}_job",
        selection=dg.AssetSelection.groups(spec.name),
        partitions_def=assets[0].partitions_def,
        description=f"All four stages of pipeline {spec.name}.",
    )
    return dg.Definitions(assets=assets, jobs=[job], resources={model_resource_key(spec): build_model_resource(spec)})
