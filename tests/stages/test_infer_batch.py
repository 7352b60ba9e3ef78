"""The batch path of the infer stage (stages/infer_batch.py) driven directly: every row of a partition goes into
exactly one request line of one input file within the provider's limits, is answered once, refused rows become row
errors, transient failures go into a new batch at most `max_attempts` times and are then owed, and a submission
whose batch id was never written down is found again instead of being submitted twice.

`BatchesStandIn` plays the provider's batch session in memory (the interface infer_batch calls: the OpenAI and
Anthropic sessions in resources/ implement it against their APIs; tests/resources/openai_api/ and anthropic_api/ run those end to end against
loopback stand-ins of the real APIs). Each batch ends the first time it is looked at."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from batch_assets.errors import PipelineError
from batch_assets.reliability.batches import BatchLedger
from batch_assets.reliability.journal import AnswerJournal
from batch_assets.stages.infer_batch import _BatchRun, _Row, custom_id
from batch_assets.resources.provider_errors import GAVE_UP
from batch_assets.resources.protocols import BatchOutcome, BatchState, Generation


class BatchesStandIn:
    family = "standin"
    uploads_input = True
    max_enqueued_tokens = None
    retry_online = False
    poll_s = 0.0

    def __init__(self, max_requests: int = 1000, max_bytes: int = 1 << 20, max_attempts: int = 3,
                 refuse: tuple[str, ...] = (), transient: tuple[str, ...] = ()):
        self.max_requests, self.max_bytes, self.max_attempts = max_requests, max_bytes, max_attempts
        self.refuse, self.transient = refuse, transient
        self.uploads: dict[str, bytes] = {}
        self.batches: dict[str, tuple[str, list[dict]]] = {}  # id -> (submission token, request lines)
        self.sent: Counter[str] = Counter()  # conversation -> times it was in a created batch
        self.lose_create_answers = 0
        self.refused_files: list[str] = []

    def request_digest(self) -> str:
        return "model=m;max_new_tokens=8"

    def request_line(self, cid: str, conversation: str) -> bytes:
        return json.dumps({"custom_id": cid, "body": conversation}).encode() + b"\n"

    def estimate_tokens(self, conversation: str) -> int:
        return len(conversation)

    def upload(self, name: str, data: bytes) -> str:
        file_id = f"file-{len(self.uploads)}"
        self.uploads[file_id] = data
        return file_id

    def create(self, sub, data: bytes) -> str:
        data = self.uploads[sub.file_id]
        lines = [json.loads(line) for line in data.splitlines()]
        # what the real API refuses, noted here (an exception would be taken for a lost answer): tests assert none
        if len(lines) > self.max_requests or len(data) > self.max_bytes \
                or len({line["custom_id"] for line in lines}) < len(lines):
            self.refused_files.append(sub.file_id)
        batch_id = f"batch-{len(self.batches)}"
        self.batches[batch_id] = (sub.token, lines)
        self.sent.update(line["body"] for line in lines)
        if self.lose_create_answers:
            self.lose_create_answers -= 1
            raise ConnectionError("the answer to create was lost on the way")
        return batch_id

    def find_batch(self, sub, claimed: set[str]) -> str | None:
        return next((b for b, (token, _) in self.batches.items() if token == sub.token and b not in claimed), None)

    def find_upload(self, name: str) -> str | None:
        return None

    def state(self, batch_id: str) -> BatchState:
        n = len(self.batches[batch_id][1])
        return BatchState(batch_id, "completed", True, total=n, completed=n)

    def results(self, state: BatchState):
        for line in self.batches[state.id][1]:
            body = line["body"]
            if body in self.refuse:
                yield line["custom_id"], BatchOutcome(error="400: the request was refused")
            elif body in self.transient:
                yield line["custom_id"], BatchOutcome(error="500: server error", retryable=True)
            else:
                yield line["custom_id"], BatchOutcome(answer=Generation(f"answer to {body}", prompt_tokens=3,
                                                                        completion_tokens=2))
        yield "r-of-another-setup", BatchOutcome(answer=Generation("not ours"))

    def stopped(self) -> bool:
        return False


def _stats() -> SimpleNamespace:
    return SimpleNamespace(batches_submitted=0, batch_rows=0, batch_prompt_tokens=0, batch_completion_tokens=0,
                           batch_rows_online=0, on_batch=lambda report: None)


def _run(tmp_path: Path, session: BatchesStandIn, n: int, journal: AnswerJournal | None = None,
         vectors: bool = False) -> tuple[_BatchRun, dict[str, _Row]]:
    rows = {custom_id(f"key-{i}", session.request_digest()): _Row(f"key-{i}", f"id-{i}", f"row {i}") for i in range(n)}
    journal = journal or AnswerJournal(str(tmp_path / "checkpoint")).open()
    ledger = BatchLedger(str(tmp_path / "ledger"))
    run = _BatchRun(SimpleNamespace(vectors=vectors), session, ledger, rows, set(rows), journal, _stats(), "p0")
    run.loop(ledger.submissions())
    assert session.refused_files == []
    return run, rows


def _answers(run: _BatchRun, rows: dict[str, _Row]) -> list:
    return [r.text if r.error is None else f"error: {r.error}"
            for r in run.journal.lookup([row.key for row in rows.values()]).values()]


def test_every_row_goes_once_into_files_within_the_provider_s_limits_and_is_answered(tmp_path: Path) -> None:
    line = len(BatchesStandIn().request_line(custom_id("key-0", "d"), "row 0"))
    session = BatchesStandIn(max_requests=3, max_bytes=int(line * 2.5))  # 2 lines per file by size, not 3
    run, rows = _run(tmp_path, session, 11)
    assert session.sent == Counter({f"row {i}": 1 for i in range(11)})
    assert [len(lines) for _, lines in session.batches.values()] == [2, 2, 2, 2, 2, 1]
    assert _answers(run, rows) == [f"answer to row {i}" for i in range(11)]
    assert run.stats.batches_submitted == 6 and run.stats.batch_rows == 11 and run.stats.batch_prompt_tokens == 33
    assert all(sub.batch_id for sub in run.ledger.submissions())  # each step written down


def test_a_refused_row_is_a_row_error_and_a_failing_one_is_owed_after_max_attempts(tmp_path: Path) -> None:
    session = BatchesStandIn(max_attempts=3, refuse=("row 1",), transient=("row 2",))
    run, rows = _run(tmp_path, session, 4)
    assert session.sent == Counter({"row 0": 1, "row 1": 1, "row 2": 3, "row 3": 1})
    answers = _answers(run, rows)
    assert answers[0] == "answer to row 0" and answers[3] == "answer to row 3"
    assert answers[1] == "error: 400: the request was refused"
    assert answers[2].startswith("error: 500: server error") and f"{GAVE_UP} 3 attempts in batches" in answers[2]
    assert run.stats.batch_rows == 2  # rows of another setup in the results are never counted or journaled


def test_a_row_without_a_vector_stops_an_embedding_partition_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PipelineError) as info:
        _run(tmp_path, BatchesStandIn(refuse=("row 1",)), 3, vectors=True)
    assert info.value.row == "id-1" and "got no embedding from the batch" in str(info.value)


def test_a_request_larger_than_an_input_file_may_be_fails_naming_the_row(tmp_path: Path) -> None:
    with pytest.raises(PipelineError) as info:
        _run(tmp_path, BatchesStandIn(max_bytes=40), 2)
    assert info.value.row == "id-0" and "more than a batch input file may hold (40)" in str(info.value)


def test_a_lost_create_answer_is_found_by_its_token_and_never_submitted_twice(tmp_path: Path) -> None:
    session = BatchesStandIn(max_requests=2)
    session.lose_create_answers = 1
    run, rows = _run(tmp_path, session, 4)
    assert session.sent == Counter({f"row {i}": 1 for i in range(4)}) and len(session.batches) == 2
    assert _answers(run, rows) == [f"answer to row {i}" for i in range(4)]


def test_a_rerun_re_attaches_to_a_submission_whose_batch_id_was_never_written(tmp_path: Path) -> None:
    """A crash between `create` and the ledger write: the next run looks the submission up by its token first."""
    session = BatchesStandIn()
    digest = session.request_digest()
    rows = {custom_id(f"key-{i}", digest): _Row(f"key-{i}", f"id-{i}", f"row {i}") for i in range(3)}
    ledger = BatchLedger(str(tmp_path / "ledger"))
    sub = ledger.new(list(rows), "the crashed run", session.family)
    sub.file_id = session.upload(sub.file_name, b"".join(session.request_line(c, r.conversation)
                                                         for c, r in rows.items()))
    ledger.save(sub)
    session.create(sub, b"")  # the batch exists; the crashed run never wrote its id
    run, rows = _run(tmp_path, session, 3)
    assert session.sent == Counter({f"row {i}": 1 for i in range(3)}) and len(session.batches) == 1
    assert _answers(run, rows) == [f"answer to row {i}" for i in range(3)]


def test_custom_ids_differ_by_row_and_by_request() -> None:
    ids = {custom_id(key, digest) for key in ("a", "b") for digest in ("model=m", "model=n")}
    assert len(ids) == 4 and custom_id("a", "model=m") == custom_id("a", "model=m")


def test_rows_over_the_queue_of_enqueued_tokens_wait_for_a_batch_to_end_and_none_is_lost(tmp_path: Path) -> None:
    """batch_max_enqueued_tokens: unended batches stay under the provider's per-model queue (estimated tokens: here
    the conversation's length, 5 or 6 per row); the rest go once a batch has ended, each exactly once."""
    session = BatchesStandIn()
    session.max_enqueued_tokens = 21
    run, rows = _run(tmp_path, session, 10)
    assert [len(lines) for _, lines in session.batches.values()] == [4, 4, 2]  # 4 x 5 tokens, then 4 x 5, then 2
    assert session.sent == Counter({f"row {i}": 1 for i in range(10)})
    assert _answers(run, rows) == [f"answer to row {i}" for i in range(10)]
    session = BatchesStandIn()
    session.max_enqueued_tokens = 4
    with pytest.raises(PipelineError) as info:  # a row that can never fit is named, not left waiting forever
        _run(tmp_path / "alone", session, 1)
    assert info.value.row == "id-0" and "more than batch_max_enqueued_tokens=4" in str(info.value)
