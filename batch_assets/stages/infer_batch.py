"""The batch path of the infer stage: a partition's rows through the provider's batch API (half the online price at
OpenAI), answered within 24 hours, every row exactly once, never submitted twice.

It runs before the infer loop's chunks (stages/infer.py) and feeds the same answer journal the online path feeds
(reliability/journal.py): every answer read back from a batch is journaled under its row key, so the chunk loop
then finds each row answered and sends nothing, and everything after it (alignment, structured-output validation,
checks, the atomic assembly) is the online path's, unchanged. Per partition:

1. the rows to ask: those of chunks not committed yet and not answered in the journal, each with a `custom_id`
   (a digest of the row's id, its model input and the request: model, params, schema), one JSONL line each (the
   body the online path POSTs);
2. re-attach first: every submission in the partition's ledger (reliability/batches.py) is looked at before
   anything new is sent; a submission with no batch id yet is looked up by its token (a crash, or a lost answer,
   between `create` and the ledger write); its rows are in flight, not to be sent;
3. submit the rest, split to the provider's limits (requests and bytes per file), each step durable before the next;
4. wait: poll every `batch_poll_interval_s` (one cheap GET per batch; the step holds no model and no pool slot:
   docs/providers-openai.md#batch-mode); progress goes to the caller (`InferStats.on_batch`: the run's log and the
   UI) at every change;
5. collect each ended batch by custom_id (output files are in no particular order): an answer is journaled; a
   refusal (4xx) or a model answer with no text is the row's error; a transient failure (5xx, 429, and a row the
   batch never ran because it expired or was cancelled) goes, per `batch_retry_rows`, into a new batch or to the
   online path, at most `max_attempts` times in this run, then the row is owed (the partition is not published and
   a rerun asks for it again), as the online path does.
A batch refused as a whole (its input file failed validation) fails the step, naming the provider's reasons; one
refused because the model's queue of enqueued tokens was full counts as a failed attempt of its rows, which go again.
`batch_max_enqueued_tokens` keeps the partition's unended batches under that queue limit, so none is refused.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.reliability.batches import BatchLedger, Submission, ledger_url
from batch_assets.reliability.checkpoint import ChunkCheckpoint, column_digest
from batch_assets.reliability.journal import AnswerJournal, row_keys
from batch_assets.stages.infer_streams import exact_chunks
from batch_assets.storage import read_batches
from batch_assets.tasks import Task
from batch_assets.resources.provider_errors import GAVE_UP, BatchNotIdentified
from batch_assets.resources.protocols import BatchState, Generation

log = logging.getLogger(__name__)

HEARTBEAT_POLLS = 10  # progress is reported at every change, and at least every this many polls


class BatchWaitStopped(PipelineError):
    """The run was stopped while its partition waited for batches (the step's stop handling cancels them)."""


@dataclass
class _Row:
    key: str  # the answer journal's key (row id + input digest)
    row_id: Any
    conversation: Any
    tokens: int | None = None  # estimated, for the enqueued-token limit (computed when a limit is set)


def custom_id(key: str, request_digest: str) -> str:
    """Unique per row, input and request: a batch of another setup never answers for this one."""
    return "r-" + hashlib.blake2b(f"{key}\x1e{request_digest}".encode(), digest_size=16).hexdigest()


def uses_batches(task: Task) -> bool:
    """Whether the partition goes through the provider's batch API (`batch_api` in model.config)."""
    methods = task.provider.batch_methods
    if task.method not in methods:
        if task.provider.waits_on_batches(task.spec.model.config):
            kinds = " and ".join(f"'{m}'" for m in sorted(methods)) or "no task"
            raise PipelineError(
                f"model.config batch_api applies to task {kinds} with this provider, not {task.kind!r}: nothing was "
                "sent", fix="remove batch_api from model.config (this task's rows are then sent online)")
        return False
    return task.provider.batch_session(task.params, task.method) is not None


def run_batches(task: Task, src: str, checkpoint: ChunkCheckpoint, journal: AnswerJournal, stats: Any,
                key: str) -> None:
    """Every row of the partition that still needs an answer, through the provider's batch API; answers into the
    journal, row errors and owed rows into `journal.settled` (the chunk loop takes them as results), rows for the
    online path left unanswered."""
    session = task.provider.batch_session(task.params, task.method)
    ledger = BatchLedger(ledger_url(checkpoint.partition_url))
    rows = _rows_to_ask(task, src, checkpoint, session.request_digest())
    waiting = {cid for cid, row in rows.items() if not journal.answered(row.key)}
    run = _BatchRun(task, session, ledger, rows, waiting, journal, stats, key)
    submissions = ledger.submissions()
    if submissions:
        log.info("partition %s: re-attaching to %d batch submission(s) found in %s", key, len(submissions), ledger.url)
    run.loop(submissions)
    journal.flush()


def _rows_to_ask(task: Task, src: str, checkpoint: ChunkCheckpoint, request_digest: str) -> dict[str, _Row]:
    spec = task.spec
    chunk_rows = spec.runtime.chunk_rows
    inputs = ["row_id", "_input_empty", *task.model_input(spec)]
    rows: dict[str, _Row] = {}
    for index, batch in enumerate(exact_chunks(read_batches(src, batch_rows=chunk_rows), chunk_rows)):
        if checkpoint.reusable(index, column_digest(batch, ["row_id"]), column_digest(batch, inputs)):
            continue
        plan = task.plan(batch)
        sent_ids = batch.column("row_id").take(pa.array(plan.sent, pa.int64())).to_pylist()
        for row_id, row_key, conversation in zip(sent_ids, row_keys(sent_ids, plan.inputs), plan.inputs):
            rows[custom_id(row_key, request_digest)] = _Row(row_key, row_id, conversation)
    return rows


class _BatchRun:
    def __init__(self, task: Task, session: Any, ledger: BatchLedger, rows: dict[str, _Row], waiting: set[str],
                 journal: AnswerJournal, stats: Any, key: str):
        self.task, self.session, self.ledger, self.rows = task, session, ledger, rows
        self.waiting, self.journal, self.stats, self.key = waiting, journal, stats, key
        self.max_attempts, self.poll_s, self.retry_online = session.max_attempts, session.poll_s, session.retry_online
        # an embedding has no per-row error slot (as online: EmbeddingError): a row that cannot get its vector
        # stops the partition, naming the row
        self.vectors = task.vectors
        self.me = uuid.uuid4().hex  # this run's session: its transient failures count against max_attempts
        self.attempts: Counter[str] = Counter()
        self.collected: set[str] = set()  # submission tokens read back in this run
        self.answered_by_batch: set[str] = set()
        self.last_report: tuple[Any, ...] | None = None
        self.polls_since_report = 0

    # -- the loop ------------------------------------------------------------------------------------------------
    def loop(self, submissions: list[Submission]) -> None:
        while True:
            in_flight: set[str] = set()
            states: list[BatchState] = []
            for sub in list(submissions):
                if sub.token in self.collected:
                    continue
                if sub.batch_id is None and not self._reattach(sub):
                    submissions.remove(sub)
                    continue
                state = self.session.state(sub.batch_id)
                states.append(state)
                if state.ended:
                    self._collect(sub, state)
                    self.collected.add(sub.token)
                else:
                    in_flight |= set(sub.custom_ids) & self.waiting
            to_send = self.waiting - in_flight
            made = self._submit([cid for cid in self.rows if cid in to_send], in_flight) if to_send else []
            if made:
                submissions += made
                continue  # look at the new batches at once: their status is the progress to show
            self._report(states)
            if not in_flight:
                if to_send:  # nothing could go: a single row over the enqueued-token limit (said by _submit)
                    raise AssertionError("rows left unsent with nothing in flight")
                return
            self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + self.poll_s
        while time.monotonic() < deadline:
            if self.session.stopped():
                raise BatchWaitStopped(
                    f"partition {self.key!r}: the run was stopped while waiting for its batches",
                    fix="run the partition again to re-attach (a user's stop cancels the batches first)")
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    # -- submitting ------------------------------------------------------------------------------------------------
    def _submit(self, cids: list[str], in_flight: set[str]) -> list[Submission]:
        """Files of at most max_requests / max_bytes, while the tokens enqueued (estimated as the online path's
        token budget: prompt plus completion budget) stay under the provider's per-model queue limit; rows that do
        not fit now wait for a batch to end."""
        limit = self.session.max_enqueued_tokens
        enqueued = sum(self._tokens(cid) for cid in in_flight) if limit else 0
        made = []
        group: list[str] = []
        lines: list[bytes] = []
        size = tokens = 0
        for cid in cids:
            cost = self._tokens(cid) if limit else 0
            if limit and cost > limit:
                raise PipelineError(
                    f"row {self.rows[cid].row_id!r}: its request alone is estimated at {cost} tokens, more than "
                    f"batch_max_enqueued_tokens={limit}", row=str(self.rows[cid].row_id),
                    fix="raise batch_max_enqueued_tokens to your tier's limit, or shorten the prompt / max_new_tokens")
            if limit and enqueued + tokens + cost > limit:
                break  # the queue is full: the rest goes once a batch has ended
            line = self.session.request_line(cid, self.rows[cid].conversation)
            if len(line) > self.session.max_bytes:
                raise PipelineError(
                    f"row {self.rows[cid].row_id!r}: its request is {len(line)} bytes, more than a batch input file "
                    f"may hold ({self.session.max_bytes})", row=str(self.rows[cid].row_id),
                    fix="shorten the prompt (prepare.max_input_tokens), or send this pipeline online (batch_api off)")
            if group and (len(group) >= self.session.max_requests or size + len(line) > self.session.max_bytes):
                made.append(self._submit_file(group, lines))
                enqueued += tokens
                group, lines, size, tokens = [], [], 0, 0
            group.append(cid)
            lines.append(line)
            size += len(line)
            tokens += cost
        if group:
            made.append(self._submit_file(group, lines))
        return made

    def _tokens(self, cid: str) -> int:
        row = self.rows[cid]
        if row.tokens is None:
            row.tokens = self.session.estimate_tokens(row.conversation)
        return row.tokens

    def _submit_file(self, cids: list[str], lines: list[bytes]) -> Submission:
        sub = self.ledger.new(cids, self.me, self.session.family)
        self.ledger.save(sub)  # intent: before the upload (or, inline requests: before the create)
        data = b"".join(lines)
        if self.session.uploads_input:
            sub.file_id = self.session.upload(sub.file_name, data)
            self.ledger.save(sub)  # the file: before the batch exists
        self._create(sub, data)
        self.stats.batches_submitted += 1
        where = f"input file {sub.file_id}" if sub.file_id else "requests inline"
        self._say(f"submitted batch {sub.batch_id} ({len(cids)} rows, {where})")
        return sub

    def _create(self, sub: Submission, data: bytes) -> None:
        try:
            sub.batch_id = self.session.create(sub, data)
        except Exception:
            # The answer may have been lost after the batch was made: look before anything is sent again.
            sub.batch_id = self._find(sub)
            if sub.batch_id is None:
                raise
        self.ledger.save(sub)

    def _find(self, sub: Submission) -> str | None:
        """The provider's batch of a submission whose batch id was never written down, or None. A provider that
        cannot tell (several candidates, no token: Anthropic's) stops the partition here, naming what to check."""
        claimed = {s.batch_id for s in self.ledger.submissions() if s.batch_id}
        try:
            return self.session.find_batch(sub, claimed)
        except BatchNotIdentified as exc:
            raise PipelineError(
                f"partition {self.key!r}: {exc}", file=f"{self.ledger.url}/submission-{sub.token}.json",
                fix=f"look at these batches in the provider's console ({', '.join(exc.candidates)}): if one holds "
                "this partition's rows, write its id as \"batch_id\" into the named ledger file and run again (it is "
                "re-attached); if none does, delete that file and run again (its rows are submitted); cancel any "
                "that is a duplicate") from None

    def _reattach(self, sub: Submission) -> bool:
        """A submission written down before its batch id was: find its batch by token (or its upload by name and
        create the batch now). False: nothing of it reached the provider, and it is dropped."""
        found = self._find(sub)
        if found is not None:
            sub.batch_id = found
            self.ledger.save(sub)
            return True
        if not self.session.uploads_input:  # inline requests: not found means never created
            self.ledger.forget(sub)
            return False
        if sub.file_id is None:
            sub.file_id = self.session.find_upload(sub.file_name)
            if sub.file_id is None:
                self.ledger.forget(sub)
                return False
            self.ledger.save(sub)
        self._create(sub, b"")  # the file is uploaded: the create names it
        self.stats.batches_submitted += 1
        return True

    # -- collecting ------------------------------------------------------------------------------------------------
    def _collect(self, sub: Submission, state: BatchState) -> None:
        if state.status == "failed" and not state.retry_later:
            raise PipelineError(
                f"partition {self.key!r}: batch {state.id} was refused by the provider: {state.failure}",
                fix="fix what the provider names (the request lines are built from the spec: model, params, "
                "structured schema); then run the partition again: a refused batch is never billed")
        seen: set[str] = set()
        for cid, outcome in self.session.results(state):
            row = self.rows.get(cid)
            if row is None:
                continue  # a row of another setup (its input or the request changed since)
            seen.add(cid)
            answer = outcome.answer
            generation = isinstance(answer, Generation)
            if answer is not None and cid not in self.answered_by_batch:
                self.answered_by_batch.add(cid)
                self.stats.batch_rows += 1
                self.stats.batch_prompt_tokens += (answer.prompt_tokens if generation else outcome.prompt_tokens) or 0
                self.stats.batch_completion_tokens += (answer.completion_tokens if generation else 0) or 0
            if cid not in self.waiting:
                continue
            if answer is not None:
                if generation and answer.error is not None:  # the model answered with no text: a row error
                    self._settle(cid, outcome.answer)
                else:
                    self.journal.record(row.key, outcome.answer)
                    self.waiting.discard(cid)
            elif not outcome.retryable:
                self._settle(cid, Generation(None, error=outcome.error))
            else:
                self._transient(cid, sub, str(outcome.error))
        missing = (set(sub.custom_ids) & self.waiting) - seen
        why = (f"batch {state.id} ended {state.status} without it" if state.status != "failed"
               else f"batch {state.id} was not run now ({state.failure})")
        for cid in missing:
            self._transient(cid, sub, why)

    def _settle(self, cid: str, result: Generation) -> None:
        if self.vectors:
            row = self.rows[cid].row_id
            raise PipelineError(
                f"partition {self.key!r}: row {row!r} got no embedding from the batch: {result.error}", row=str(row),
                fix="a refusal (4xx) names what to change in the row's text or the embedding settings; an outage "
                "(gave up after N attempts): run the partition again, only the rows without a vector are asked")
        self.journal.settle(self.rows[cid].key, result)
        self.waiting.discard(cid)

    def _transient(self, cid: str, sub: Submission, message: str) -> None:
        if sub.session == self.me:
            self.attempts[cid] += 1
        tries = self.attempts[cid]
        if tries >= self.max_attempts:
            self._settle(cid, Generation(None, error=f"{message} ({GAVE_UP} {tries} attempts in batches)"))
        elif self.retry_online:
            self.stats.batch_rows_online += 1
            self.waiting.discard(cid)  # left unanswered: the chunk loop sends it online

    # -- progress --------------------------------------------------------------------------------------------------
    def _report(self, states: list[BatchState]) -> None:
        statuses = Counter(s.status for s in states)
        summary = (tuple(sorted(statuses.items())), sum(s.completed for s in states), sum(s.failed for s in states))
        self.polls_since_report += 1
        if summary == self.last_report and self.polls_since_report < HEARTBEAT_POLLS:
            return
        self.last_report, self.polls_since_report = summary, 0
        report = {
            "partition": self.key,
            "batches": ", ".join(f"{s.id}: {s.status}" for s in states),
            "status": ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())),
            "requests_total": sum(s.total for s in states),
            "requests_completed": summary[1],
            "requests_failed": summary[2],
            "rows_waiting": len(self.waiting),
        }
        on_batch: Callable[[dict[str, Any]], None] | None = getattr(self.stats, "on_batch", None)
        if on_batch is not None:
            on_batch(report)
        else:
            log.info("partition %s: %s", self.key, report)

    def _say(self, message: str) -> None:
        on_batch = getattr(self.stats, "on_batch", None)
        if on_batch is not None:
            on_batch({"partition": self.key, "event": message})
        else:
            log.info("partition %s: %s", self.key, message)


def remove_ledger(checkpoint: ChunkCheckpoint) -> None:
    """Every row of the partition is committed: its batches' answers live in the chunks now."""
    BatchLedger(ledger_url(checkpoint.partition_url)).remove()
