"""The lean chat path (resources/openai_api/transport.py) against a real HTTP server on loopback: a compressed
answer is read as the server meant it, a compressed error still becomes the SDK's own exception with its code and
Retry-After (so retry.py classifies it: a rate limit waited for, a quota fails the step), and the environment's
proxy settings are honoured as the SDK honours them (HTTP_PROXY, NO_PROXY). The SDK-header and error-type checks
are in tests/resources/openai_api/test_openai_transport.py."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp import web

from batch_assets.resources.openai_api.retry import classify_failure
from batch_assets.resources.openai_api.transport import ChatTransport

KEY = "sk-transport-unit-0123456789"


async def _serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def _gzipped(status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=gzip.compress(json.dumps(payload).encode()),
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip", **(headers or {})})


def _run(handler, call: Callable[[ChatTransport], Awaitable[Any]], base_url: str | None = None) -> Any:
    async def main() -> Any:
        runner, url = await _serve(handler)
        client = openai.AsyncOpenAI(api_key=KEY, base_url=base_url or f"{url}/v1", max_retries=0)
        transport = await ChatTransport(client, max_concurrency=4).open()
        try:
            return await call(transport)
        finally:
            await transport.close()
            await client.close()
            await runner.cleanup()

    return asyncio.run(main())


def test_a_compressed_answer_is_read_as_sent():
    completion = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}

    async def handler(request: web.Request) -> web.Response:
        assert request.path == "/v1/chat/completions" and request.headers["Authorization"] == f"Bearer {KEY}"
        assert json.loads(await request.read())["messages"][0]["content"] == "héllo"
        return _gzipped(200, completion)

    raw = _run(handler, lambda t: t.post({"model": "m", "messages": [{"role": "user", "content": "héllo"}]}))
    assert json.loads(raw) == completion


def test_a_compressed_rate_limit_is_the_sdks_error_with_its_code_and_retry_after():
    async def handler(request: web.Request) -> web.Response:
        return _gzipped(429, {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}},
                        {"retry-after": "3"})

    async def call(t: ChatTransport) -> BaseException:
        with pytest.raises(openai.RateLimitError) as caught:
            await t.post({"model": "m", "messages": []})
        return caught.value

    error = _run(handler, call)
    assert error.code == "rate_limit" and error.response.headers["retry-after"] == "3"
    failure = classify_failure(error, secret=KEY, timeout_s=30)
    assert failure.retryable and failure.rate_limited and failure.retry_after_s == 3.0
    assert failure.message.startswith("HTTP 429: ") and "Rate limit reached" in failure.message


def test_a_compressed_exhausted_quota_is_read_as_a_setup_error_not_a_rate_limit():
    async def handler(request: web.Request) -> web.Response:
        return _gzipped(429, {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                                        "code": "insufficient_quota"}})

    async def call(t: ChatTransport) -> BaseException:
        with pytest.raises(openai.RateLimitError) as caught:
            await t.post({"model": "m", "messages": []})
        return caught.value

    failure = classify_failure(_run(handler, call), secret=KEY, timeout_s=30)
    assert not failure.retryable and "add credit" in failure.setup_fix


def test_the_environments_proxy_is_used_unless_no_proxy_covers_the_host(monkeypatch: pytest.MonkeyPatch):
    """The endpoint's host does not resolve here: an answer can only come through the proxy."""
    seen: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        seen.append(str(request.url))
        return web.json_response({"id": "c", "choices": []})

    async def call(t: ChatTransport) -> bytes:
        return await t.post({"model": "m", "messages": []})

    async def main(no_proxy: str | None) -> Any:
        runner, url = await _serve(proxy)
        monkeypatch.setenv("HTTP_PROXY", url)
        if no_proxy:
            monkeypatch.setenv("NO_PROXY", no_proxy)
        client = openai.AsyncOpenAI(api_key=KEY, base_url="http://api.endpoint.invalid/v1", max_retries=0)
        transport = await ChatTransport(client, max_concurrency=2).open()
        try:
            return await call(transport)
        except BaseException as exc:  # noqa: BLE001 - returned for the assertions below
            return exc
        finally:
            await transport.close()
            await client.close()
            await runner.cleanup()

    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert json.loads(asyncio.run(main(None))) == {"id": "c", "choices": []}
    assert seen and "api.endpoint.invalid" in seen[0]
    direct = asyncio.run(main("api.endpoint.invalid"))
    assert isinstance(direct, openai.APIConnectionError) and len(seen) == 1
