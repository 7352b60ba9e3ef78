"""The lean chat path (resources/openai_api/transport.py) sends what the SDK sends and fails as the SDK fails: the
same URL (OPENAI_BASE_URL included), the same headers (key, organisation, project, user agent), the SDK's own error
types for an answer that is not 2xx, a connection error named as such; and a request cancelled while its answer is
being made durable never cancels the journal write the other answers wait for; and the collector is paced while
a call runs (loop.py FewerCollections), then restored."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import socket

import pytest

from batch_assets.resources.openai_api import OpenAICompatibleProvider
from batch_assets.resources.openai_api.loop import CALL_GC_THRESHOLD
from batch_assets.resources.openai_api.provider import DurableWaits
from batch_assets.resources.protocols import GenerationParams
from tests.resources.openai_api.fault_proxy import Echo, FaultProxy, Respond

# Set by the SDK per attempt (its own retry count and read timeout), or by the HTTP layer for this body and host.
PER_REQUEST = {"x-stainless-retry-count", "x-stainless-read-timeout", "content-length", "host", "connection",
               "accept-encoding"}


def rows(keys: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": k}] for k in keys]


def test_chat_requests_carry_the_sdks_url_and_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-test")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-transport-test")
    with FaultProxy(lambda key, n: Echo()) as proxy:
        monkeypatch.setenv("OPENAI_BASE_URL", proxy.url)  # no base_url in the config: the SDK's default applies
        provider = OpenAICompatibleProvider(model="m", send_default_api_key=True).load_for_tests()
        try:
            results = provider.generate(rows(["ours"]), GenerationParams(max_new_tokens=2))
            # the same request through the SDK's own generic post: what the lean path must match
            provider.loaded.runner.run(provider.loaded.client.post(
                "/chat/completions", body={"model": "m", "messages": rows(["sdk"])[0]}, cast_to=bytes))
        finally:
            provider.close()
    assert [r.text for r in results] == ["echo:ours"]
    ours, sdk = proxy.attempts_for("ours")[0], proxy.attempts_for("sdk")[0]
    assert ours.path == sdk.path == "/v1/chat/completions"
    assert ours.headers["authorization"] == "Bearer sk-transport-test"
    assert ours.headers["openai-organization"] == "org-test" and ours.headers["openai-project"] == "proj-test"
    assert ours.headers["user-agent"].startswith("AsyncOpenAI/Python")
    assert ({k: v for k, v in ours.headers.items() if k not in PER_REQUEST}
            == {k: v for k, v in sdk.headers.items() if k not in PER_REQUEST})


def test_errors_are_the_sdks_and_a_refused_connection_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    error = {"error": {"message": "no such thing", "type": "invalid_request_error", "code": "bad"}}
    with FaultProxy(lambda key, n: Respond(422, error)) as proxy:
        provider = OpenAICompatibleProvider(model="m", base_url=proxy.url, max_attempts=3).load_for_tests()
        try:
            refused = provider.generate(rows(["x"]), GenerationParams(max_new_tokens=2))
        finally:
            provider.close()
    # the SDK's message for a 422 (not retried: a 4xx that is not 408/409/429)
    assert refused[0].error == "HTTP 422: Error code: 422 - no such thing" and len(proxy.attempts) == 1

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    provider = OpenAICompatibleProvider(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_attempts=2,
                                        backoff_base_s=0.01).load_for_tests()
    try:
        down = provider.generate(rows(["y"]), GenerationParams(max_new_tokens=2))
    finally:
        provider.close()
    assert down[0].text is None
    assert down[0].error.startswith("connection error: ") and "gave up after 2 attempts" in down[0].error
    assert str(port) in down[0].error  # where it tried


def test_a_cancelled_request_never_cancels_the_journal_write_others_wait_for() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        write = concurrent.futures.Future()  # the answer journal's next write (completed by its own thread)
        waits = DurableWaits()
        first = asyncio.ensure_future(waits.wait(write))
        second = asyncio.ensure_future(waits.wait(write))
        await asyncio.sleep(0)
        first.cancel()  # e.g. a stop abandons one request while its answer waits to be written
        await asyncio.sleep(0)
        write.set_result(None)  # would raise InvalidStateError had the cancel reached the write
        await asyncio.wait_for(second, 5)
        return first.cancelled(), second.done() and not second.cancelled(), write.cancelled()

    assert asyncio.run(scenario()) == (True, True, False)


def test_the_collector_is_paced_while_a_call_runs_and_restored_after() -> None:
    before = gc.get_threshold()
    seen: list[int] = []

    def script(key: str, n: int):
        seen.append(gc.get_threshold()[0])  # the proxy answers on a thread of this process, during the call
        return Echo()

    with FaultProxy(script) as proxy:
        provider = OpenAICompatibleProvider(model="m", base_url=proxy.url).load_for_tests()
        try:
            provider.generate(rows(["a", "b"]), GenerationParams(max_new_tokens=2))
        finally:
            provider.close()
    assert seen and min(seen) >= CALL_GC_THRESHOLD
    assert gc.get_threshold() == before
