"""Retry a partition's dead letters: `python -m batch_assets.commands.retry_dead_letters PIPELINE PARTITION`.

Only the rows that failed (and whose input is not empty) go to the model again; good rows are kept as they are, and
the output and its dead letters are republished atomically (see batch_assets.reliability.dead_letters). The model
resource is built from the pipeline's spec exactly as Dagster builds it, `{env: NAME}` secrets included. With
DAGSTER_HOME set, the new output is recorded as a materialization of `<pipeline>/output` for the partition. The
pipeline is looked up in the catalog of the project's code location (batch_assets/catalog.py; run it from the
project's folder, or name the module with `-m`): spec files and pipelines declared as Dagster Components alike, read
without building any pipeline; one declared in Python is found by loading the code location as Dagster does.

The retried rows go through the infer stage's own loop (`batch_assets.stages.infer.infer_rows`): checkpointed chunk by
chunk under `<root>/<pipeline>/_staging/retry/<partition>` (a retry stopped half-way resumes after its committed
chunks) and guarded like any partition (a setup failure, or every row of a chunk failing alike, stops the retry and
leaves the partition as it was). The rows are staged as Parquet under `_staging/retry_rows/<partition>`; both are
removed once the merged partition is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.catalog import DEFAULT_MODULE, UnknownPipelineError, for_project
from batch_assets.errors import PipelineError
from batch_assets.orchestration.assets.factory import build_model_resource
from batch_assets.reliability.cache import ResponseCache, cached
from batch_assets.reliability.checkpoint import ChunkCheckpoint, fingerprint, remove_partition_checkpoints
from batch_assets.reliability.locks import partition_lock
from batch_assets.spec import PipelineSpec
from batch_assets.stage_names import INFER, PREPARE, WRITE
from batch_assets.stages.infer import InferStats, choose_for_partition, infer_rows
from batch_assets.stages.write import run_write
from batch_assets.storage import (ArrowStorage, filesystem_for, join, parquet_schema, read_batches, upstream_url,
                                  write_parquet)
from batch_assets.tasks import task_for

RETRY_STAGE = "retry"  # the retry's checkpoints: <root>/<pipeline>/_staging/retry/<partition>/


def retryable(batch: pa.RecordBatch) -> pa.Array:
    """Rows worth another model call: they failed, and not because their input is empty."""
    failed = pc.is_valid(batch.column("error"))
    return pc.and_(failed, pc.invert(batch.column("_input_empty")))


def merged_batches(original: Iterator[pa.RecordBatch], retried: pa.Table) -> Iterator[pa.RecordBatch]:
    """`original` with each row whose id is in `retried` replaced by its retried version, in place.

    Memory: the retried rows (the partition's dead letters), not the partition."""
    index = {rid: i for i, rid in enumerate(retried.column("row_id").to_pylist())}
    for batch in original:
        ids = batch.column("row_id").to_pylist()
        hits = [index.get(rid) for rid in ids]
        if not any(h is not None for h in hits):
            yield batch
            continue
        n = batch.num_rows
        both = pa.concat_tables([pa.Table.from_batches([batch]), retried.select(batch.schema.names)
                                 .cast(batch.schema)])
        take = [i if h is None else n + h for i, h in enumerate(hits)]
        yield from both.take(pa.array(take, pa.int64())).combine_chunks().to_batches()


def retry_partition(spec: PipelineSpec, storage: ArrowStorage, key: str, provider: Any,
                    log=print) -> dict[str, int]:
    """Re-infer the partition's failed rows, merge them into `inferred`, republish output and dead letters."""
    root = storage.resolved_root()
    if spec.runtime.response_cache:  # a retried row that succeeds is cached like any other
        provider = cached(provider, ResponseCache(root))
    inferred = upstream_url(storage, spec.name, INFER.asset, key)
    prepared = parquet_schema(upstream_url(storage, spec.name, PREPARE.asset, key))
    rows_dir = join(root, spec.name, "_staging", "retry_rows", urllib.parse.quote(key, safe="-_.="))
    todo_url, done_url = join(rows_dir, "prepared.parquet"), join(rows_dir, "inferred.parquet")
    still_failed = 0
    with partition_lock(root, spec.name, INFER.asset, key, on_wait=log):
        retried_rows = 0
        with write_parquet(todo_url, prepared) as writer:
            for batch in read_batches(inferred, batch_rows=spec.runtime.chunk_rows):
                todo = batch.filter(retryable(batch)).select(prepared.names)
                if todo.num_rows:
                    writer.write(todo)
                    retried_rows += todo.num_rows
        if not retried_rows:
            log(f"{spec.name} partition {key!r}: no retryable dead letters")
        else:
            # the precision the partition ran in, decided again from the same rows (same answer: resources/hf/precision.py)
            choose_for_partition(spec, provider, upstream_url(storage, spec.name, PREPARE.asset, key), key)
            checkpoint = ChunkCheckpoint(storage, spec, key, fingerprint(spec, provider), RETRY_STAGE).open()
            stats = InferStats()
            infer_rows(task_for(spec, provider), todo_url, done_url, checkpoint, stats, key)
            still_failed = stats.rows_with_errors
            retried = pa.Table.from_batches(list(read_batches(done_url, batch_rows=spec.runtime.chunk_rows)),
                                            schema=parquet_schema(done_url))
            target = parquet_schema(inferred)
            try:
                retried = retried.select(target.names).cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError) as exc:
                raise PipelineError(f"retried rows do not fit the partition's columns: {exc}", pipeline=spec.name,
                                    partition=key, file=inferred,
                                    fix="re-materialize the partition instead (the model's output type changed)")
            with write_parquet(inferred, target) as writer:
                for batch in merged_batches(read_batches(inferred, batch_rows=spec.source.batch_rows), retried):
                    writer.write(batch)
        remove_partition_checkpoints(storage, spec.name, key, RETRY_STAGE)
        fs, path = filesystem_for(rows_dir)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    with partition_lock(root, spec.name, WRITE.asset, key, on_wait=log):
        report = run_write(spec, storage, key)
    return {"retried": retried_rows, "still_failed": still_failed,
            "dead_letters": int(report.extra["dead_letters"]), "rows": report.rows_out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_assets.commands.retry_dead_letters",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("pipeline")
    parser.add_argument("partition")
    parser.add_argument("--storage-root", default="", help="default: $BATCH_STORAGE_ROOT, else data/storage; a "
                        "relative folder is in the project folder (docs/concepts.md, Relative paths)")
    parser.add_argument("-m", "--module", default="",
                        help="the code location's module (default: the project's [tool.dg.project] in pyproject.toml, "
                        f"else {DEFAULT_MODULE})")
    args = parser.parse_args(argv)

    try:
        spec = for_project(Path.cwd(), args.module).get(args.pipeline)
    except UnknownPipelineError as exc:
        print(exc, file=sys.stderr)
        return 2
    storage = ArrowStorage(root=args.storage_root)
    with dg.build_resources({"model": build_model_resource(spec)}) as resources:
        outcome = retry_partition(spec, storage, args.partition, resources.model)
    print(f"{spec.name} partition {args.partition!r}: retried {outcome['retried']} rows, "
          f"{outcome['still_failed']} still failed; {outcome['dead_letters']} dead letters, {outcome['rows']} rows "
          "published")
    if os.environ.get("DAGSTER_HOME"):
        dg.DagsterInstance.get().report_runless_asset_event(dg.AssetMaterialization(
            asset_key=dg.AssetKey([spec.name, WRITE.asset]), partition=args.partition,
            description="dead letters retried (python -m batch_assets.commands.retry_dead_letters)",
            metadata={k: dg.MetadataValue.int(v) for k, v in outcome.items()},
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
