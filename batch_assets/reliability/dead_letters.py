"""Dead letters: the rows of a partition that failed, kept where a user can see them and retry them.

The write stage publishes, beside the output, `<storage root>/<pipeline>/dead_letters/<partition>.parquet`: one row
per failed row with its id, origin, error class, message, raw model output and model input. It is rewritten (or
emptied) atomically with every publish of the partition, so it always describes the published output.

`retry_partition` re-runs only the failed rows through the model and merges the new results into the partition:
the `inferred` file is rewritten with every good row copied unchanged and each retried row in its original place,
then the write stage republishes the output and the dead letters atomically, with the exactly-once check. Rows that
failed because their input is empty are not retried (the model would get nothing); fix the source for those.
Command: `python -m batch_assets.retry_dead_letters PIPELINE PARTITION` (see docs/RELIABILITY.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.spec import PipelineSpec
from batch_assets.storage import ArrowStorage, join, partition_file_name, read_batches, write_parquet

DEAD_LETTER_SCHEMA = pa.schema([
    pa.field("row_id", pa.string()),
    pa.field("_source_file", pa.string()),
    pa.field("_source_row", pa.int64()),
    pa.field("error_class", pa.string()),
    pa.field("error", pa.string()),
    pa.field("raw_output", pa.string()),
    pa.field("model_input", pa.string()),
])

_CLASSES = [  # used when the infer stage did not record an `error_class` column itself
    ("input", re.compile(r"^empty input|image could not be read|input too long", re.I)),
    ("transient", re.compile(r"\b(429|5\d\d|timed? ?out|timeout|rate.?limit|connection|retries)\b", re.I)),
]


def dead_letter_url(storage: ArrowStorage, pipeline: str, partition: str) -> str:
    return join(storage.resolved_root(), pipeline, "dead_letters", partition_file_name(partition, "parquet"))


def classify_error(message: str | None) -> str | None:
    if message is None:
        return None
    for name, pattern in _CLASSES:
        if pattern.search(message):
            return name
    return "row"


def _text(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def dead_letters_of(spec: PipelineSpec, batch: pa.RecordBatch) -> pa.RecordBatch | None:
    """The failed rows of an `inferred` batch, in the dead-letter schema; None when none failed."""
    failed = pc.is_valid(batch.column("error"))
    if not pc.any(failed).as_py():
        return None
    rows = batch.filter(failed)
    names = rows.schema.names
    errors = rows.column("error").to_pylist()
    classes = (rows.column("error_class").to_pylist() if "error_class" in names
               else [classify_error(e) for e in errors])
    raw_col = next((c for c in ("raw_output", spec.task.resolved_output_column()) if c in names), None)
    raw = [_text(v) for v in rows.column(raw_col).to_pylist()] if raw_col else [None] * rows.num_rows
    input_col = next((c for c in ("_prompt", "_text") if c in names), None)
    inputs = [_text(v) for v in rows.column(input_col).to_pylist()] if input_col else [None] * rows.num_rows
    return pa.RecordBatch.from_arrays(
        [rows.column("row_id"), rows.column("_source_file"), rows.column("_source_row"),
         pa.array(classes, pa.string()), pa.array(errors, pa.string()), pa.array(raw, pa.string()),
         pa.array(inputs, pa.string())],
        schema=DEAD_LETTER_SCHEMA,
    )


class DeadLetterWriter:
    """Streams the failed rows of a partition into its dead-letter file, committed atomically on a clean exit."""

    def __init__(self, spec: PipelineSpec, url: str) -> None:
        self.spec, self.url, self.rows = spec, url, 0
        self._cm = write_parquet(url, DEAD_LETTER_SCHEMA)
        self._writer = None

    def __enter__(self) -> "DeadLetterWriter":
        self._writer = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._cm.__exit__(*exc)

    def add(self, batch: pa.RecordBatch) -> None:
        dead = dead_letters_of(self.spec, batch)
        if dead is not None:
            self._writer.write(dead)
            self.rows += dead.num_rows


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
    from batch_assets.errors import PipelineError
    from batch_assets.reliability.locks import partition_lock
    from batch_assets.stages.infer import InferStats, infer_batches
    from batch_assets.stages.write import run_write
    from batch_assets.storage import parquet_schema, upstream_url

    from batch_assets.reliability.cache import ResponseCache, cached

    root = storage.resolved_root()
    if spec.runtime.response_cache:  # a retried row that succeeds is cached like any other
        provider = cached(provider, ResponseCache(root))
    inferred = upstream_url(storage, spec.name, "inferred", key)
    prepared_cols = parquet_schema(upstream_url(storage, spec.name, "prepared", key)).names
    with partition_lock(root, spec.name, "inferred", key, on_wait=log):
        todo = [b.filter(retryable(b)).select(prepared_cols)
                for b in read_batches(inferred, batch_rows=spec.runtime.chunk_rows)]
        todo = [b for b in todo if b.num_rows]
        retried_rows = sum(b.num_rows for b in todo)
        if not retried_rows:
            log(f"{spec.name} partition {key!r}: no retryable dead letters")
        stats = InferStats()
        chunks = pa.Table.from_batches(todo).to_batches(max_chunksize=spec.runtime.chunk_rows) if todo else []
        results = list(infer_batches(spec, provider, iter(chunks), stats))
        # counted here: infer_batches (no checkpoints) leaves the stats' error counts to its caller
        still_failed = sum(b.num_rows - b.column("error").null_count for b in results)
        if retried_rows:
            retried = pa.Table.from_batches(results)
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
    with partition_lock(root, spec.name, "output", key, on_wait=log):
        report = run_write(spec, storage, key)
    return {"retried": retried_rows, "still_failed": still_failed,
            "dead_letters": int(report.extra["dead_letters"]), "rows": report.rows_out}
