"""The infer stage: prepared rows in chunks to the model provider, one result per row out, resumable.

One loop for every task kind, provider and caller (`infer_rows`: the infer stage's `run_infer`, and the dead-letter
retry in batch_assets/commands/retry_dead_letters.py); what a task kind means is asked of one Task (batch_assets/tasks/):
- prepared rows are cut into chunks of exactly `runtime.chunk_rows` (read ahead on a thread);
- a chunk already committed under the partition's checkpoint (same fingerprint, same row ids and model inputs) is
  skipped: a rerun after a crash pays only for what was not finished (batch_assets/reliability/checkpoint.py);
- the other chunks go to the provider on worker threads, several at once where the provider says it can take them
  (`provider.chunks_in_flight(chunk_rows)`; the OpenAI-compatible provider queues every row of those chunks on one
  request gate, so its window of requests stays full across chunk boundaries, no drain per chunk), results are
  taken in chunk order, checked for exactly one result per row, and committed on a write-behind thread;
- at the end the `inferred` file is assembled from the prepared rows and the committed chunks, in one schema fixed
  from the output types the Task declares (`Task.schema()`), atomically.

Providers billed per request (`answers_each_row`) have each answer journaled as it arrives (reliability/journal.py):
a rerun after a crash sends only rows never answered. In batch mode (`model.config.batch_api`) the partition's rows
go through the provider's batch API first (stages/infer_batch.py), whose answers fill that journal, so the chunks
then find every row answered and the rest of the loop is the same. A stop (an interrupt: Terminate, SIGTERM, Ctrl-C) stops the
provider: nothing new is sent, calls in flight get `runtime.stop_grace_s`, their answers are journaled.

Failures, by class (docs/RELIABILITY.md): a transient provider failure is retried by the provider; a row that runs
out of attempts is owed, not published (its chunk is not committed, the step fails at the end, retryable, and the
rerun asks only those rows); a bad output for one row is a row error; a failure of the setup (ProviderSetupError: rejected key, no
permission, unknown model, exhausted quota; or every row of a chunk failing the same way) fails the step at once,
naming the cause and the fix. The error rate against `runtime.max_error_fraction` is a blocking asset check.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.errors import PipelineError
from batch_assets.reliability.checkpoint import ChunkCheckpoint, column_digest, fingerprint
from batch_assets.reliability.journal import AnswerJournal, row_keys
from batch_assets.spec_sections import PipelineSections
from batch_assets.stage_names import INFER, PREPARE
from batch_assets.stages.infer_batch import remove_ledger, run_batches, uses_batches
from batch_assets.stages.infer_guards import fail_if_all_failed_alike, fail_on_unparseable, stop_if_unparseable
from batch_assets.stages.infer_streams import DaemonCallPool, Prefetched, calls_in_flight, exact_chunks
from batch_assets.stages.report import PartitionReport
from batch_assets.stages.trial import trial_footer
from batch_assets.storage import ArrowStorage, parquet_rows, parquet_schema, read_batches, upstream_url, write_parquet
from batch_assets.tasks import ERROR_COLUMN, TRUNCATED_COLUMN, ChunkPlan, Task, task_for, task_type
from batch_assets.resources.provider_errors import GAVE_UP, ProviderSetupError
from batch_assets.resources.structured import UNPARSEABLE

log = logging.getLogger(__name__)

# Committed chunks whose write may still be pending (write-behind): bounds memory held for writing.
WRITES_IN_FLIGHT = 2


@dataclass
class InferStats:
    """What the infer loop did, over every partition of a run. `add_rows` is the one place the loop reports rows
    completed (computed or reused from a checkpoint); progress reporters subscribe with `listeners`."""

    rows_in: int = 0
    rows_out: int = 0
    rows_with_errors: int = 0
    model_errors: int = 0  # rows sent to the model whose result is an error (input problems excluded)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks_computed: int = 0
    chunks_reused: int = 0
    rows_reused: int = 0
    rows_sent: int = 0  # rows handed to the provider in this run (not reused from a checkpoint; cache hits included)
    rows_truncated: int = 0  # inputs cut to prepare.max_input_tokens
    batches_submitted: int = 0  # provider batches this run submitted (batch mode: stages/infer_batch.py)
    batch_rows: int = 0  # rows answered by a provider batch (this run's or an earlier one's)
    batch_prompt_tokens: int = 0  # ... and their tokens, billed at the batch price
    batch_completion_tokens: int = 0
    batch_rows_online: int = 0  # rows a batch did not answer, sent online (batch_retry_rows: online)
    unparseable_rows: int = 0  # answers that did not parse as task.structured (row errors)
    unparseable_samples: list[str] = field(default_factory=list)  # the current partition's first few
    error_samples: list[str] = field(default_factory=list)  # the current partition's (reset per partition)
    run_error_samples: list[str] = field(default_factory=list)  # the run's first few, each with its partition
    label_counts: dict[str, int] = field(default_factory=dict)  # the current partition's predicted labels
    partition: str | None = None
    partition_rows_total: int = 0
    partition_rows_done: int = 0
    listeners: list[Callable[[InferStats, int], None]] = field(default_factory=list)
    on_batch: Callable[[dict[str, Any]], None] | None = None  # batch mode: status and counts while it waits

    def begin_partition(self, key: str, rows_total: int) -> None:
        self.partition, self.partition_rows_total, self.partition_rows_done = key, rows_total, 0
        self.error_samples = []
        self.unparseable_samples = []
        self.label_counts = {}

    def add_rows(self, n: int, *, reused: bool = False) -> None:
        self.partition_rows_done += n
        if reused:
            self.rows_reused += n
            self.chunks_reused += 1
        else:
            self.chunks_computed += 1
        for listener in self.listeners:
            listener(self, n)

    def merge(self, part: InferStats) -> None:
        """Add one partition's counts (counted in its own InferStats) to the run's."""
        for f in fields(self):
            if isinstance(getattr(self, f.name), int):
                setattr(self, f.name, getattr(self, f.name) + getattr(part, f.name))
        self.run_error_samples.extend(part.run_error_samples[:max(0, 5 - len(self.run_error_samples))])

    def note_errors(self, ids: list[str], errors: list[str | None]) -> None:
        for row_id, err in zip(ids, errors):
            if err is None:
                continue
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{row_id}: {err}")
            if len(self.run_error_samples) < 5:
                self.run_error_samples.append(f"[{self.partition}] {row_id}: {err}")


def run_infer(spec: PipelineSections, storage: ArrowStorage, key: str, provider: Any,
              stats: InferStats) -> PartitionReport:
    """The infer stage for one partition: `prepared` rows in, `inferred` rows (inputs, outputs, `error`) out.
    `stats` accumulates over every partition of the run."""
    start = time.perf_counter()
    src = upstream_url(storage, spec.name, PREPARE.asset, key)
    url = storage.stage_url(spec.name, INFER.asset, key)
    chosen = choose_for_partition(spec, provider, src, key)
    checkpoint = ChunkCheckpoint(storage, spec, key, fingerprint(spec, provider)).open()
    total = parquet_rows(src)
    rows, extra = infer_rows(task_for(spec, provider), src, url, checkpoint, stats, key)
    return PartitionReport(key, total, rows, time.perf_counter() - start, url, {**extra, **chosen})


def choose_for_partition(spec: PipelineSections, provider: Any, src: str, key: str) -> dict[str, Any]:
    """What the provider decides from the partition's own rows before its fingerprint is taken (the embedder's
    `precision: fast`: resources/hf/precision.py); the partition's metadata about it, and a log line."""
    column = task_type(spec).model_input(spec)[0]

    def inputs() -> list[Any]:
        out: list[Any] = []
        for batch in read_batches(src, columns=[column, "_input_empty"]):
            out += batch.filter(pc.invert(batch.column("_input_empty"))).column(column).to_pylist()
        return out

    chosen = provider.choose_for_partition(inputs)
    if "precision" in chosen:
        log.info("%s partition %s: precision %s (%s)", spec.name, key, chosen["precision"],
                 chosen.get("precision_reason", "as configured"))
    return chosen


def infer_rows(task: Task, src: str, url: str, checkpoint: ChunkCheckpoint, stats: InferStats,
               key: str) -> tuple[int, dict[str, Any]]:
    """THE infer loop, for every caller (the infer stage, the dead-letter retry): the prepared rows in the Parquet
    file `src` through the model chunk by chunk, committed under `checkpoint`, guarded (setup failures, all rows of
    a chunk failing alike, unparseable answers), then assembled into `url` (prepared columns + outputs + `error`).
    Returns the rows written and the partition's metadata counts."""
    spec, provider = task.spec, task.provider
    stats.begin_partition(key, parquet_rows(src))
    if checkpoint.invalidated:
        log.info("partition %s: checkpoints of another setup (%s) were removed", key, ", ".join(checkpoint.invalidated))
    before = (stats.rows_out, stats.rows_with_errors, stats.model_errors, stats.chunks_reused, stats.chunks_computed,
              stats.rows_truncated, stats.unparseable_rows)
    limit = task.limit
    if limit is not None and limit.mode == "fail":
        limit.check_partition(src, key, spec.runtime.chunk_rows)
    try:
        chunks = _infer_chunks(task, src, checkpoint, stats)
    except ProviderSetupError as exc:
        raise PipelineError(
            f"{type(provider).__name__} (model {provider.model_name()!r}) cannot serve this pipeline: {exc.what}; "
            "the step stopped at once and nothing was published",
            fix=exc.fix,
        ) from None
    _assemble(task, src, url, checkpoint, chunks, stats)
    rows = stats.rows_out - before[0]
    return rows, {
        "rows_with_errors": stats.rows_with_errors - before[1],
        "model_errors": stats.model_errors - before[2],
        "chunks_reused": stats.chunks_reused - before[3],
        "chunks_computed": stats.chunks_computed - before[4],
        **({"rows_truncated": stats.rows_truncated - before[5]} if limit is not None else {}),
        **(_unparseable_metadata(stats, stats.unparseable_rows - before[6]) if spec.task.structured else {}),
        **label_metadata(spec, stats, rows),
    }


def label_metadata(spec: PipelineSections, stats: InferStats, rows: int) -> dict[str, Any]:
    """Predicted-label counts of the partition, one int per declared label (0 included, so Dagster plots each
    label across partitions), and the declared labels the model never predicted in it."""
    predicted = task_type(spec).predicted_labels(spec)
    if predicted is None:
        return {}
    _, labels = predicted
    counts = stats.label_counts
    md: dict[str, Any] = {f"label_count/{label}": int(counts.get(label, 0)) for label in labels}
    others = {k: v for k, v in counts.items() if k not in labels}  # generate's default_label, for one
    md.update({f"label_count/{label}": int(n) for label, n in sorted(others.items())})
    never = [label for label in labels if not counts.get(label)]
    if never and rows:
        md["labels_never_predicted"] = ", ".join(never)
    return md


def _unparseable_metadata(stats: InferStats, rows: int) -> dict[str, Any]:
    """How many answers did not parse (0 too: plottable across partitions), and a sample of their raw answers."""
    import dagster as dg

    md: dict[str, Any] = {"unparseable_rows": rows}
    if stats.unparseable_samples:
        md["unparseable_samples"] = dg.MetadataValue.md("\n".join(f"- {s}" for s in stats.unparseable_samples))
    return md


# -- the loop --------------------------------------------------------------------------------------------------------
@dataclass
class _Pending:
    index: int
    batch: pa.RecordBatch
    plan: ChunkPlan
    call: Future | None
    ids_digest: str
    inputs_digest: str
    keys: list[str]  # the sent rows' answer journal keys (empty without a journal)


def is_stop(exc: BaseException) -> bool:
    """Ctrl-C, SIGTERM (Dagster maps it to SIGINT) and a Terminate from the UI reach the step as an exception that
    is not an `Exception` (KeyboardInterrupt, Dagster's DagsterExecutionInterruptedError, SystemExit)."""
    return not isinstance(exc, Exception)


def stop_provider(provider: Any, grace_s: float) -> None:
    """The run is stopping: no new model call; calls in flight get `grace_s`, then are abandoned. Idempotent."""
    provider.stop(grace_s)


def transient_failures(ids: list[Any], errors: list[str | None]) -> list[str]:
    """Rows whose attempts ran out on a transient failure (5xx, timeout, refused connection): their answer is
    still owed, so they are never published as row errors."""
    return [f"{row_id}: {err}" for row_id, err in zip(ids, errors) if err is not None and GAVE_UP in err]


class TransientRowsError(PipelineError):
    """Rows of the partition ran out of attempts on transient failures: the partition is not made (retryable)."""


def _infer_chunks(task: Task, src: str, checkpoint: ChunkCheckpoint, stats: InferStats) -> int:
    """Compute and commit every chunk not already committed; returns the number of chunks of the partition."""
    spec, provider = task.spec, task.provider
    chunk_rows = spec.runtime.chunk_rows
    inputs = ["row_id", "_input_empty", *task.model_input(spec)]
    workers = calls_in_flight(provider, chunk_rows)
    # a provider billed per request: every answer durable within about a second (reliability/journal.py)
    journal = AnswerJournal(checkpoint.url).open() if provider.answers_each_row else None
    owed: list[str] = []  # rows that ran out of attempts on a transient failure (never published as errors)
    batched = False
    if journal is not None:
        try:  # batch mode: every row through the provider's batch API first, answers into the journal
            batched = uses_batches(task)
            if batched:
                run_batches(task, src, checkpoint, journal, stats, checkpoint.manifest["partition"])
        except BaseException:
            journal.close()
            raise
    calls = DaemonCallPool(workers, name="infer-call")
    writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer-commit")
    pending: deque[_Pending] = deque()
    committing: deque[Future] = deque()
    chunks = Prefetched(exact_chunks(read_batches(src, batch_rows=chunk_rows), chunk_rows))

    def finish(item: _Pending) -> None:
        n = item.batch.num_rows
        results = item.call.result() if item.call is not None else None
        if item.call is not None:
            task.check(len(item.plan.sent), results)
        names, arrays = task.columns(item.plan, results, n)
        fail_if_all_failed_alike(provider, item.plan, item.index)
        ids = item.batch.column("row_id").to_pylist()
        fail_on_unparseable(spec, provider, item.plan, ids, item.index, results)
        transient = transient_failures(ids, item.plan.errors)
        if transient:
            # Not committed: its answered rows stay in the journal, so the rerun asks only the owed rows.
            owed.extend(transient)
            stats.add_rows(n)
            return
        outputs = pa.RecordBatch.from_arrays(
            [item.batch.column("row_id"), *arrays, pa.array(item.plan.errors, pa.string())],
            names=["row_id", *names, ERROR_COLUMN],
        )
        committing.append(writes.submit(_commit, checkpoint, journal, item, outputs))
        while len(committing) > WRITES_IN_FLIGHT:
            committing.popleft().result()
        stats.add_rows(n)

    count = 0
    failed = True
    structured = spec.task.structured
    # with max_error_fraction 1 every row may fail: the user accepts it, so nothing stops early
    probe = structured.stop_after_unparseable if structured is not None and spec.runtime.max_error_fraction < 1 else 0
    try:
        for index, batch in enumerate(chunks):
            count = index + 1
            stats.rows_in += batch.num_rows
            ids_digest, inputs_digest = column_digest(batch, ["row_id"]), column_digest(batch, inputs)
            if checkpoint.reusable(index, ids_digest, inputs_digest):
                stats.add_rows(batch.num_rows, reused=True)
                continue
            plan = task.plan(batch)
            stats.rows_sent += len(plan.sent)
            sent_ids = batch.column("row_id").take(pa.array(plan.sent, pa.int64())).to_pylist()
            keys = row_keys(sent_ids, plan.inputs) if journal is not None else []
            if probe and len(plan.sent) > probe:
                # The partition's first answers go first, alone: when all of them fail to parse the same way, the
                # step stops here instead of paying for the rest of the chunk (and of the partition).
                first = _answer(task, journal, plan.inputs[:probe], keys[:probe])
                stop_if_unparseable(spec, provider, sent_ids[:probe], first)
                call = calls.submit(_after, first, _answer, task, journal, plan.inputs[probe:], keys[probe:])
            else:
                call = calls.submit(_answer, task, journal, plan.inputs, keys) if len(plan.sent) else None
            if len(plan.sent):
                probe = 0
            pending.append(_Pending(index, batch, plan, call, ids_digest, inputs_digest, keys))
            # one more than the workers: the next call is queued before a worker frees, so none idles
            while len(pending) > workers:
                finish(pending.popleft())
        while pending:
            finish(pending.popleft())
        while committing:
            committing.popleft().result()
        failed = False
    except BaseException as exc:
        if is_stop(exc):  # nothing new is sent; what answers within the grace is journaled below
            stop_provider(provider, spec.runtime.stop_grace_s)
        raise
    finally:
        chunks.close()
        if journal is not None:
            journal.close()
            stats.rows_sent -= journal.reused  # answered by an earlier run: not asked again, not paid again
        for item in pending:
            if item.call is not None:
                item.call.cancel()
        # On failure (or an interrupt) do not wait for a call already running: the step is over. Commits queued
        # before the failure still complete, so the rerun keeps every chunk that was finished.
        calls.shutdown(wait=not failed, cancel_futures=True)
        writes.shutdown(wait=True)
    if batched and not owed:
        remove_ledger(checkpoint)  # every row committed: the batches' answers live in the chunks now
    if owed:
        raise TransientRowsError(
            f"{len(owed)} row(s) got no answer: the model endpoint failed transiently until their attempts ran out "
            f"(first: {owed[0]}); the partition is not published, and every other answer is kept",
            fix="run the partition again (the step's retry policy does so by itself when `retries` allows): a rerun "
            f"asks the model only for these {len(owed)} row(s); if the endpoint is down, wait until it is back",
            retryable=True,
        )
    return count


def _commit(checkpoint: ChunkCheckpoint, journal: AnswerJournal | None, item: _Pending, outputs: pa.RecordBatch) -> None:
    checkpoint.commit(item.index, outputs, item.ids_digest, item.inputs_digest)
    if journal is not None:
        journal.release(item.keys)  # in a committed chunk now: compaction may drop them


def _answer(task: Task, journal: AnswerJournal | None, inputs: Any, keys: list[str]) -> Any:
    """The provider's results for `inputs`: rows an earlier run already got an answer for come from the journal,
    only the rest is sent, and each of their answers goes into the journal the moment it arrives."""
    if journal is None:
        return task.call(inputs)
    found = journal.lookup(keys)
    missing = [i for i in range(len(keys)) if i not in found]
    fresh: Any = []
    if missing:
        fresh = task.call([inputs[i] for i in missing],
                          on_answer=lambda j, result: journal.record(keys[missing[j]], result))
        task.check(len(missing), fresh)
    if not found:
        return fresh
    out: list[Any] = [None] * len(keys)
    for i, result in found.items():
        out[i] = result
    for i, result in zip(missing, fresh):
        out[i] = result
    return np.stack(out) if task.method in ("embed", "embed_images") else out


def _after(first: Any, call: Callable[..., Any], *args: Any) -> list[Any]:
    """The probe's results followed by the rest of the chunk's (one result per sent row, in order)."""
    return [*first, *call(*args)]


def _assemble(task: Task, src: str, url: str, checkpoint: ChunkCheckpoint, chunks: int, stats: InferStats) -> None:
    """Write `inferred` = prepared rows + committed outputs, chunk by chunk, in one schema for the partition."""
    spec = task.spec
    prepared_schema = parquet_schema(src)
    declared = task.schema()
    out_schema = _output_schema(declared, [checkpoint.schema(i) for i in range(chunks)],
                                spec.task.resolved_output_column())
    schema = pa.schema([*prepared_schema, *out_schema])
    batches = exact_chunks(read_batches(src, batch_rows=spec.runtime.chunk_rows), spec.runtime.chunk_rows)
    with write_parquet(url, schema) as writer:
        for index, batch in enumerate(batches):
            outputs = checkpoint.read(index)
            if not outputs.column("row_id").combine_chunks().equals(batch.column("row_id")):
                raise PipelineError(
                    f"checkpoint chunk {index} does not cover the prepared rows it claims to",
                    file=checkpoint.chunk_path(index),
                    fix="re-materialize the partition; if it persists, report a bug",
                )
            columns = [outputs.column(f.name).combine_chunks().cast(f.type) for f in out_schema]
            table = pa.Table.from_arrays([*batch.columns, *columns], schema=schema)
            writer.write(table)
            _count(task, table, stats)
        writer.key_value_metadata.update(trial_footer(src))  # a trial's kept ids, for the rows check (stages/trial.py)


def _output_schema(declared: dict[str, pa.DataType | None], chunk_schemas: list[pa.Schema],
                   default_column: str) -> pa.Schema:
    """Output columns in the declared order and types. A column without a declared type takes the one type its
    chunks agree on (null in chunks with no value, e.g. an all-failed first chunk, does not count)."""
    names = [n for n in (chunk_schemas[0].names if chunk_schemas else [*(declared or [default_column]), ERROR_COLUMN])
             if n != "row_id"]
    for i, s in enumerate(chunk_schemas):
        if [n for n in s.names if n != "row_id"] != names:
            raise PipelineError(
                f"the model's output columns changed between chunks: {names} in chunk 0, {s.names[1:]} in chunk {i}",
                fix="make the model return the same output columns for every batch (declare task.output_types)",
            )
    fields = []
    for name in names:
        seen = [s.field(name).type for s in chunk_schemas if s.field(name).type != pa.null()]
        if name == ERROR_COLUMN:
            type_: pa.DataType = pa.string()
        elif seen:
            type_ = seen[0]
            for other in seen[1:]:
                try:
                    type_ = pa.unify_schemas([pa.schema([(name, type_)]), pa.schema([(name, other)])],
                                             promote_options="permissive").field(name).type
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                    raise PipelineError(
                        f"the model's output column {name!r} has type {type_} in one chunk and {other} in another",
                        column=name,
                        fix="return one type per output column, or declare it in task.output_types",
                    ) from None
        else:
            type_ = declared.get(name) or pa.null()
        fields.append(pa.field(name, type_))
    return pa.schema(fields)


def _count(task: Task, table: pa.Table, stats: InferStats) -> None:
    spec = task.spec
    errors = table.column(ERROR_COLUMN)
    failed = pc.is_valid(errors)
    n_failed = pc.sum(failed).as_py() or 0
    stats.rows_out += table.num_rows
    stats.rows_with_errors += n_failed
    if n_failed:
        model_failed = pc.and_(failed, pc.invert(table.column("_input_empty")))
        stats.model_errors += pc.sum(model_failed).as_py() or 0
        rows = table.filter(failed).slice(0, 5)
        stats.note_errors(rows.column("row_id").to_pylist(), rows.column(ERROR_COLUMN).to_pylist())
        if spec.task.structured is not None:
            unparseable = pc.fill_null(pc.match_substring(errors, UNPARSEABLE), False)
            stats.unparseable_rows += pc.sum(unparseable).as_py() or 0
            room = 5 - len(stats.unparseable_samples)
            if room > 0:
                bad = table.filter(unparseable).slice(0, room)
                stats.unparseable_samples += [f"{rid}: {err}" for rid, err in zip(
                    bad.column("row_id").to_pylist(), bad.column(ERROR_COLUMN).to_pylist())]
    if TRUNCATED_COLUMN in table.column_names:
        stats.rows_truncated += pc.sum(table.column(TRUNCATED_COLUMN)).as_py() or 0
    predicted = task.predicted_labels(spec)
    if predicted is not None and predicted[0] in table.column_names:
        for item in pc.value_counts(table.column(predicted[0]).drop_null()).to_pylist():
            stats.label_counts[item["values"]] = stats.label_counts.get(item["values"], 0) + item["counts"]
    if task.counts_tokens:
        stats.prompt_tokens += pc.sum(table.column("prompt_tokens")).as_py() or 0
        stats.completion_tokens += pc.sum(table.column("completion_tokens")).as_py() or 0


__all__ = ["InferStats", "infer_rows", "run_infer"]
