"""Anthropic's Message Batches as the provider side of the batch path (resources/anthropic_api/batch.py), read
through the real SDK against the strict stand-in (tests/resources/anthropic_api/anthropic_standin.py): each row's request is the
online body under its custom_id; results are collected by custom_id (they come back in an order of their own) and
each is classified: answered, refused (the row's error, not paid again), transient (asked again), never ran
(canceled, expired: asked again); a lost create answer is adopted only when exactly one batch can be it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from batch_assets.resources.anthropic_api.batch import AnthropicBatches
from batch_assets.resources.anthropic_api.provider import AnthropicProvider
from batch_assets.resources.provider_errors import BatchNotIdentified, ProviderSetupError
from batch_assets.resources.protocols import GenerationParams
from tests.resources.anthropic_api.anthropic_standin import PER_REQUEST_S, WINDOW_S, check_params
from tests.resources.conftest import API_KEY, StandinProcess

MODEL = "claude-standin"
PARAMS = GenerationParams(max_new_tokens=16)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandinProcess]:
    proc = StandinProcess(tmp_path / "anthropic-state", tmp_path / "anthropic.log",
                          module="tests.resources.anthropic_api.anthropic_standin").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def session(standin: StandinProcess) -> Iterator[AnthropicBatches]:
    provider = AnthropicProvider(model=MODEL, base_url=standin.root, api_key=API_KEY, batch_api=True,
                                 max_attempts=1).load_for_tests()
    try:
        yield provider.batch_session(PARAMS)
    finally:
        provider.close()


def conversation(text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def submit(session: AnthropicBatches, prompts: dict[str, str]) -> tuple[str, SimpleNamespace]:
    data = b"".join(session.request_line(cid, conversation(p)) for cid, p in prompts.items())
    sub = SimpleNamespace(custom_ids=list(prompts), created=time.time(), token=None, file_id=None)
    return session.create(sub, data), sub


def test_each_row_goes_as_its_online_body_under_its_custom_id():
    line_session = AnthropicBatches(client=None, run=None, model=MODEL, plan=_plan(), secret=None, timeout_s=5,
                                    max_requests=10, max_bytes=10_000, active=set())
    line = json.loads(line_session.request_line("row-1", conversation("Grüße")))
    # https://docs.anthropic.com/en/api/creating-message-batches: requests[] = {custom_id, params}
    assert set(line) == {"custom_id", "params"} and line["custom_id"] == "row-1"
    assert check_params(line["params"]) is None
    assert line["params"]["system"] == "Be brief." and line["params"]["messages"][0]["content"] == "Grüße"
    assert "Grüße" in line_session.request_line("r", conversation("Grüße")).decode()  # UTF-8, not \u escapes
    with pytest.raises(NotImplementedError):  # requests travel inline: nothing is ever uploaded
        line_session.upload("x", b"")
    assert line_session.find_upload("x") is None


def _plan():
    from batch_assets.resources.anthropic_api.payloads import plan_messages

    return plan_messages(PARAMS, {})


def test_results_come_back_by_custom_id_each_classified(standin, session):
    prompts = {f"row-{i}": f"text {i}" for i in range(8)}
    prompts["row-2"] = "refuse me [[400]]"
    prompts["row-5"] = "server trouble [[500]]"
    batch_id, _ = submit(session, prompts)
    assert batch_id in session.active
    state = session.state(batch_id)
    assert not state.ended and state.status == "in_progress"

    standin.advance(len(prompts) * PER_REQUEST_S + 1)
    state = session.state(batch_id)
    assert state.ended and state.status == "ended" and batch_id not in session.active
    assert (state.total, state.completed, state.failed) == (8, 6, 2)

    results = list(session.results(state))
    assert sorted(cid for cid, _ in results) == sorted(prompts)  # each row exactly once, in whatever order
    outcome = dict(results)
    for cid, prompt in prompts.items():
        if cid not in ("row-2", "row-5"):
            assert outcome[cid].answer.text == f"echo: {prompt}" and outcome[cid].error is None
    assert outcome["row-2"].error.startswith("invalid_request_error") and not outcome["row-2"].retryable
    assert outcome["row-5"].error.startswith("api_error") and outcome["row-5"].retryable


def test_requests_that_never_ran_are_asked_again(standin, session):
    batch_id, _ = submit(session, {"done": "quick", "stuck": "forever [[slow]]"})
    standin.advance(WINDOW_S + 1)
    outcome = dict(session.results(session.state(batch_id)))
    assert outcome["done"].answer.text == "echo: quick"
    assert outcome["stuck"].unfinished and outcome["stuck"].retryable and outcome["stuck"].error == \
        "batch request expired"


def test_a_cancelled_batch_ends_with_its_unanswered_requests_asked_again(standin, session):
    batch_id, _ = submit(session, {"a": "quick", "b": "forever [[slow]]"})
    standin.advance(PER_REQUEST_S + 0.5)
    session.cancel(batch_id)
    assert batch_id not in session.active
    standin.advance(60)
    state = session.state(batch_id)
    assert state.ended
    outcome = dict(session.results(state))
    assert outcome["b"].unfinished and outcome["b"].retryable and outcome["b"].error == "batch request canceled"
    session.cancel(batch_id)  # cancelling an ended batch again is no error


def test_a_409_to_a_cancel_is_asked_once_not_retried(session, monkeypatch):
    """Anthropic documents no answer for cancelling a batch that has ended; should it be a 409 (as OpenAI's is), it
    means nothing is left to cancel: asked once, not five times with backoff (the retry policy retries 409s as lock
    conflicts). The stand-in answers 200 there, so this one answer is a named fake: the SDK's own ConflictError."""
    import anthropic
    import httpx

    calls = []

    async def ended(batch_id, **_):
        calls.append(batch_id)
        response = httpx.Response(409, request=httpx.Request("POST", f"https://api.anthropic.com/{batch_id}/cancel"),
                                  json={"type": "error", "error": {"type": "invalid_request_error",
                                                                   "message": "batch has ended"}})
        raise anthropic.ConflictError("batch has ended", response=response, body=response.json())

    monkeypatch.setattr(session.client.messages.batches, "cancel", ended)
    session.active.add("msgbatch_ended")
    session.cancel("msgbatch_ended")
    assert calls == ["msgbatch_ended"] and "msgbatch_ended" not in session.active


def test_a_lost_create_answer_is_adopted_only_when_one_batch_can_be_it(standin, session):
    batch_id, sub = submit(session, {"a": "one", "b": "two"})
    session.active.clear()
    assert session.find_batch(sub) == batch_id and batch_id in session.active
    assert session.find_batch(sub, claimed={batch_id}) is None  # another submission of the partition holds it
    assert session.find_batch(SimpleNamespace(custom_ids=["x"], created=time.time())) is None  # no 1-row batch

    twin, _ = submit(session, {"c": "three", "d": "four"})
    with pytest.raises(BatchNotIdentified, match="2 batches of 2 requests") as caught:
        session.find_batch(sub)
    assert set(caught.value.candidates) == {batch_id, twin}  # named, never guessed: no row paid twice


def test_a_batch_unknown_to_the_api_says_how_to_start_the_partition_over(session):
    with pytest.raises(ProviderSetupError, match="msgbatch_nope.*unknown to this API") as caught:
        session.state("msgbatch_nope")
    assert "inferred-batches" in caught.value.fix


def test_an_errored_result_that_no_row_can_get_past_fails_the_partition(session):
    """A billing or key error inside a batch's results means every row would get it: the step fails, naming the
    fix, instead of publishing a partition of row errors."""
    result = SimpleNamespace(type="errored", error={"type": "error", "error": {
        "type": "billing_error", "message": f"no credit for {API_KEY}"}})
    with pytest.raises(ProviderSetupError) as caught:
        session._outcome(result)
    assert "add credit" in caught.value.fix and API_KEY not in str(caught.value)


def test_a_batch_filled_to_the_byte_limit_is_accepted(tmp_path: Path):
    """The batch machinery (stages/infer_batch.py) fills a Message Batch with request lines while their bytes stay
    within the session's max_bytes; the create body the SDK sends wraps them (`{"requests":[...]}`), and must still
    be within batch_max_bytes (Anthropic's limit: 256 MB a request), or a full batch is refused with a 413 and its
    rows are not submitted. Non-ASCII text included: the SDK sends UTF-8, as the lines are counted."""
    lines = [AnthropicBatches(client=None, run=None, model=MODEL, plan=_plan(), secret=None, timeout_s=5,
                              max_requests=100, max_bytes=10**6, active=set())
             .request_line(f"r{i}", conversation("日本語のテキスト é " * (i + 1))) for i in range(40)]
    limit = sum(len(line) for line in lines[:30])  # a limit the first 30 lines fill to the byte
    proc = StandinProcess(tmp_path / "state", tmp_path / "log", "--max-bytes", str(limit),
                          module="tests.resources.anthropic_api.anthropic_standin").start()
    provider = AnthropicProvider(model=MODEL, base_url=proc.root, api_key=API_KEY, batch_api=True, max_attempts=1,
                                 batch_max_bytes=limit).load_for_tests()
    try:
        session = provider.batch_session(PARAMS)
        group, size = [], 0
        for line in lines:  # as infer_batch.py groups them
            if size + len(line) > session.max_bytes:
                break
            group.append(line)
            size += len(line)
        sub = SimpleNamespace(custom_ids=[f"r{i}" for i in range(len(group))], created=time.time())
        assert session.create(sub, b"".join(group)).startswith("msgbatch_")  # not a 413
        assert len(group) >= 29  # and nearly full: the envelope costs bytes, not a row's worth of room
    finally:
        provider.close()
        proc.stop()
