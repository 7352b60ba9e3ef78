"""Anthropic's errors read into the one retry policy (resources/anthropic_api/retry.py). Each answer is the SDK's own
exception, built by the SDK from the HTTP answer Anthropic documents (https://docs.anthropic.com/en/api/errors:
`{"type": "error", "error": {"type", "message"}}`), so what is read is what a run would read.

What a user depends on: a transient answer (429, 529 overloaded, 5xx, a timeout, a dropped connection) is asked
again, honouring retry-after; a refusal of the row (400, 413) is that row's error and never paid again; an answer
that no row can get past (rejected key, no permission, unknown model, no credit) fails the step at once, naming what
to change, and stops every other request; the key never shows in what is said."""

from __future__ import annotations

import asyncio

import anthropic
import pytest

from batch_assets.resources.anthropic_api.retry import classify_failure, error_type, failure_for
from batch_assets.resources.provider_errors import ProviderSetupError
from batch_assets.resources.openai_api.limits import RequestGate
from batch_assets.resources.openai_api.retry import Failure, RetryPolicy, call_with_retries

KEY = "sk-ant-api03-0123456789abcdefSECRET"
_CLIENT = anthropic.AsyncAnthropic(api_key=KEY, base_url="http://127.0.0.1:9", max_retries=0)


def _http():
    """The HTTP library the SDK builds its requests and responses with (SDK 2.x: httpx2)."""
    import anthropic._base_client

    return anthropic._base_client.httpx2


def answer(status: int, kind: str | None, message: str, headers: dict[str, str] | None = None) -> Exception:
    http = _http()
    body = {"type": "error", "error": {"type": kind, "message": message}} if kind else {"detail": message}
    request = http.Request("POST", "http://127.0.0.1:9/v1/messages")
    return _CLIENT._make_status_error_from_response(http.Response(status, json=body, headers=headers or {},
                                                                   request=request))


def classify(exc: BaseException) -> Failure | None:
    return classify_failure(exc, secret=KEY, timeout_s=30)


@pytest.mark.parametrize(("status", "kind", "headers", "retry_after"), [
    (529, "overloaded_error", {}, None),
    (429, "rate_limit_error", {"retry-after": "7"}, 7.0),
    (429, "rate_limit_error", {"retry-after-ms": "1500"}, 1.5),
    (500, "api_error", {}, None),
    (504, "timeout_error", {}, None),
    (503, None, {}, None),  # a proxy's answer without Anthropic's body: its status says transient
])
def test_transient_answers_are_asked_again_honouring_retry_after(status, kind, headers, retry_after):
    failure = classify(answer(status, kind, "try later", headers))
    assert failure.retryable and failure.setup_fix is None
    assert failure.retry_after_s == retry_after
    assert failure.rate_limited == (kind == "rate_limit_error")


@pytest.mark.parametrize(("status", "kind", "message"), [
    (400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
    (413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
])
def test_a_refusal_of_the_row_is_its_error_and_not_asked_again(status, kind, message):
    failure = classify(answer(status, kind, message, {"retry-after": "5"}))
    assert not failure.retryable and failure.setup_fix is None and failure.retry_after_s is None
    assert failure.message == f"HTTP {status} {kind}: {message}"


@pytest.mark.parametrize(("status", "kind", "message", "fix"), [
    (401, "authentication_error", f"invalid x-api-key {KEY[:20]}", "ANTHROPIC_API_KEY"),
    (403, "permission_error", "Your API key does not have permission to use the specified resource.", "workspace"),
    (404, "not_found_error", "model: claude-nope", "check `model`"),
    (402, "billing_error", "payment required", "add credit"),
    # Anthropic's exhausted prepaid credit is a 400 invalid_request_error: every row would get it
    (400, "invalid_request_error", "Your credit balance is too low to access the Anthropic API.", "add credit"),
])
def test_an_answer_no_row_can_get_past_names_the_fix_and_never_the_key(status, kind, message, fix):
    failure = classify(answer(status, kind, message))
    assert not failure.retryable and fix in failure.setup_fix
    assert KEY not in failure.message and KEY[:20] not in failure.message


def test_the_key_is_scrubbed_from_what_is_said():
    failure = classify(answer(500, "api_error", f"upstream echoed {KEY} and sk-ant-other-key-123"))
    assert failure.retryable and KEY not in failure.message and "sk-ant-other" not in failure.message


def test_transport_failures_are_transient_and_anything_else_is_a_bug_not_a_row_error():
    request = _http().Request("POST", "http://127.0.0.1:9/v1/messages")
    assert classify(anthropic.APIConnectionError(request=request)).retryable
    assert classify(anthropic.APITimeoutError(request=request)).message == "request timed out after 30s"
    assert classify(TimeoutError()).retryable
    assert classify(KeyError("oops")) is None  # re-raised by the retry loop: never hidden as a row error


def test_an_errored_batch_result_reads_as_the_online_answer_of_the_same_type():
    """The batch path reads an errored result's error body through the same table (anthropic_api/batch.py)."""
    for kind, retryable in (("overloaded_error", True), ("api_error", True), ("invalid_request_error", False)):
        body = {"type": "error", "error": {"type": kind, "message": "m"}}
        assert error_type(None, body) == kind
        assert failure_for(error_type(None, body), None, "m").retryable is retryable
    assert failure_for("authentication_error", None, "m").setup_fix
    assert error_type(529, {"detail": "no Anthropic body"}) == "overloaded_error"


def _retry(send, gate: RequestGate | None = None, attempts: int = 3):
    gate = gate or RequestGate(4, None, None)
    retries: list[Failure] = []
    policy = RetryPolicy(max_attempts=attempts, timeout_s=5, backoff_base_s=0.001, backoff_max_s=0.002,
                         max_retry_after_s=60)
    outcome = asyncio.run(call_with_retries(send, policy=policy, gate=gate, cost=1, secret=KEY,
                                            on_retry=retries.append, classify=classify_failure))
    return outcome, retries


def test_overloaded_then_answered_is_one_answer_after_one_retry():
    answers = [answer(529, "overloaded_error", "Overloaded"), "the answer"]

    async def send():
        value = answers.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    outcome, retries = _retry(send)
    assert outcome == "the answer" and [r.message for r in retries] == ["HTTP 529 overloaded_error: Overloaded"]


def test_a_row_that_stays_overloaded_gives_up_saying_how_often_it_tried():
    async def send():
        raise answer(529, "overloaded_error", "Overloaded")

    outcome, retries = _retry(send, attempts=3)
    assert isinstance(outcome, Failure) and outcome.retryable and "3 attempts" in outcome.message
    assert len(retries) == 2


def test_no_credit_fails_the_call_at_once_and_refuses_every_request_still_waiting():
    gate = RequestGate(4, None, None)
    sent = []

    async def send():
        sent.append(1)
        raise answer(400, "invalid_request_error", "Your credit balance is too low to access the Anthropic API.")

    with pytest.raises(ProviderSetupError, match="credit balance") as caught:
        _retry(send, gate=gate)
    assert len(sent) == 1 and "add credit" in caught.value.fix  # not retried

    async def another_row():
        async with gate.slot(1):
            raise AssertionError("a request was sent after the setup error")

    with pytest.raises(ProviderSetupError):
        asyncio.run(another_row())
