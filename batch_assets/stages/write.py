"""The write stage: the pipeline's published output, one partition at a time, committed atomically and only when
every source row id appears exactly once; the formats are modules of stages/sinks/."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.errors import PipelineError, transient_failure
from batch_assets.reliability.checkpoint import remove_partition_checkpoints
from batch_assets.reliability.dead_letters import DeadLetterWriter, dead_letter_url
from batch_assets.reliability.row_ids import FINGERPRINT_KEY, RowIdFingerprint, name_differences
from batch_assets.spec_sections import PipelineSections
from batch_assets.stage_names import INFER, READ
from batch_assets.stages.report import PartitionReport, markdown_preview
from batch_assets.stages.sinks import sink_for
from batch_assets.stages.trial import trial_fingerprint, trial_url
from batch_assets.storage import (
    ArrowStorage,
    parquet_footer_metadata,
    parquet_schema,
    read_batches,
    resolve_local,
    shown_path,
    upstream_url,
)


def run_write(spec: PipelineSections, storage: ArrowStorage, key: str) -> PartitionReport:
    """The write stage for one partition: publish the sink columns of `inferred` and the partition's dead letters
    (rows that failed), each committed atomically, only if every source row id appears exactly once."""
    start = time.perf_counter()
    src = upstream_url(storage, spec.name, INFER.asset, key)
    raw_url = upstream_url(storage, spec.name, READ.asset, key)
    schema = parquet_schema(src)
    columns = sink_columns(spec, schema.names)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise PipelineError(f"sink columns {missing} are not produced; available: {schema.names}",
                            column=missing[0], fix="fix sink.columns in the spec")
    out_schema = pa.schema([schema.field(c) for c in columns])
    trial = trial_fingerprint(src) if spec.prepare.trial else None
    expected = trial if trial is not None else source_fingerprint(raw_url)  # a trial: the rows it kept
    published = RowIdFingerprint()  # O(1) memory, whatever the partition size
    head: list[pa.RecordBatch] = []
    counts = {"rows_in": 0, "errors": 0, "model_errors": 0}
    url = sink_url(spec, storage, key)
    dl_url = dead_letter_url(storage, spec.name, key)
    if spec.prepare.trial:  # never over the partition's full output (stages/trial.py)
        url, dl_url = trial_url(url), trial_url(dl_url)

    keeps_failed = getattr(sink_for(spec.sink.format), "keeps_failed_rows", True)
    with DeadLetterWriter(spec, dl_url) as dead:
        def batches() -> Iterator[pa.RecordBatch]:
            for batch in read_batches(src, batch_rows=spec.source.batch_rows):
                counts["rows_in"] += batch.num_rows
                if "error" in batch.schema.names:
                    counts["errors"] += batch.num_rows - batch.column("error").null_count
                    failed = pc.is_valid(batch.column("error"))
                    if "_input_empty" in batch.schema.names:  # an empty input is a row error, not the model's
                        failed = pc.and_(failed, pc.invert(batch.column("_input_empty")))
                    counts["model_errors"] += pc.sum(failed).as_py() or 0
                published.add(batch)
                dead.add(batch)
                if not keeps_failed and "error" in batch.schema.names and batch.column("error").null_count < len(batch):
                    # failed rows (no vector) live in the dead letters only: a vector store cannot hold a null
                    # vector, and a search must never return one
                    batch = batch.filter(pc.is_null(batch.column("error")))
                out = batch.select(columns)
                if sum(b.num_rows for b in head) < 5:
                    head.append(out.slice(0, 5))
                yield out
            # still inside the atomic write: a mismatch aborts it and nothing is committed
            verify_exactly_once(spec, key, expected, published, src if trial is not None else raw_url, src)

        rows = write_sink(spec, url, batches(), out_schema)
    remove_partition_checkpoints(storage, spec.name, key)  # published: a rerun must not resume from stale chunks
    # An empty partition (a quiet day, a hash shard no row hashes to) is published all the same: a file with the
    # sink's typed columns and no rows, so readers of every partition see one schema.
    empty = {"empty_partition": True} if expected.count == 0 else {}
    if trial is not None:
        empty["trial"] = True
    return PartitionReport(key, counts["rows_in"], rows, time.perf_counter() - start, url,
                           {"rows_in_source": expected.count, "dead_letters": dead.rows,
                            "model_errors": counts["model_errors"], **empty,
                            **({} if keeps_failed else {"failed_rows_in_dead_letters_only": counts["errors"]}),
                            "dead_letters_path": dl_url},
                           rows_with_errors=counts["errors"], schema=sink_for(spec.sink.format).written_schema(url, out_schema),
                           preview=markdown_preview(head, columns))


def source_fingerprint(raw_url: str) -> RowIdFingerprint:
    """The fingerprint the read stage took of the source rows (a raw file from before it existed: recomputed)."""
    stored = parquet_footer_metadata(raw_url).get(FINGERPRINT_KEY)
    fp = RowIdFingerprint.from_json(stored) if stored else None
    if fp is not None:
        return fp
    fp = RowIdFingerprint()
    for batch in read_batches(raw_url, columns=["row_id"]):
        fp.add(batch)
    return fp


def verify_exactly_once(spec: PipelineSections, key: str, expected: RowIdFingerprint, published: RowIdFingerprint,
                        raw_url: str, out_url: str) -> None:
    """Fail unless the published ids are the source ids, each once (prepare proved the source ids unique)."""
    if published == expected:
        return
    diff = name_differences(lambda: read_batches(raw_url, columns=["row_id"]),
                            lambda: read_batches(out_url, columns=["row_id"]))
    raise PipelineError(
        f"output would not hold every source row exactly once: {expected.count} source rows, {published.count} "
        f"output rows; {diff.missing_count} missing (e.g. {diff.missing}), {diff.repeated_count} repeated "
        f"(e.g. {diff.repeated}), {diff.unexpected_count} not in the source (e.g. {diff.unexpected})",
        pipeline=spec.name, partition=key,
        fix="re-materialize the upstream assets of this partition; if it persists, report a bug",
    )


def sink_url(spec: PipelineSections, storage: ArrowStorage, partition: str) -> str:
    base = spec.sink.path or storage.default_sink(spec.name)
    if "://" not in base:
        base = resolve_local(base)
    return sink_for(spec.sink.format).partition_url(base, spec, partition)


def sink_columns(spec: PipelineSections, available: list[str]) -> list[str]:
    """The spec's columns, or every column except internal ones (leading underscore)."""
    if spec.sink.columns:
        return list(spec.sink.columns)
    return [c for c in available if not c.startswith("_")]


def write_sink(spec: PipelineSections, url: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
    """Stream `batches` into `url` in the sink format (stages/sinks/); returns rows written. Visible only when
    complete.

    A failure the sink reports is classified (errors.transient_failure): an outage or timeout is raised as it is,
    so the step's RetryPolicy runs it again; an error a retry would repeat (a bad value or vector, a schema
    mismatch, access denied) fails at once, naming the sink and the cause."""
    try:
        return sink_for(spec.sink.format).write(spec, url, batches, schema)
    except PipelineError:
        raise
    except Exception as exc:
        if transient_failure(exc) is not False:
            raise
        raise PipelineError(
            f"the {spec.sink.format} sink refused the partition's rows: {_first_line(exc)}", file=shown_path(url),
            fix="this error does not go away on a retry, so the step was not retried: check that the output "
            "columns match what the sink already holds (sink.columns, the table's schema), or write to a new "
            "table or path; docs/troubleshooting.md has the known cases",
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."
