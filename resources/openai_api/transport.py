"""The request path of chat completions, the provider's hot path: one aiohttp session that posts the JSON body and
reads the answer's bytes, with the SDK's own URL, headers and errors.

Why not the SDK's `client.post`: at 1,000 requests in flight every request went through the SDK's request machinery
(a `FinalRequestOptions` pydantic model, header merging and validation, an httpx2 `Request`, the transport adapter
that turns it into an aiohttp request and the answer back into an httpx2 `Response` with a byte stream, the SDK's
response wrapper), which cost more CPU than the HTTP exchange itself; the profile and the figures are in
docs/BENCHMARKS.md ("A client that keeps up"). What stays the SDK's:
- the client is built and configured by the SDK exactly as before, and this path takes from it what it would send:
  `base_url` (OPENAI_BASE_URL included), the key's `Authorization`, the organisation and project headers, its
  user agent and platform headers;
- an answer that is not 2xx becomes the SDK's own exception, built by the SDK from the response
  (`_make_status_error_from_response`: `RateLimitError`, `AuthenticationError`, ... with `.code`, `.body` and
  `.response.headers`), and a failed connection the SDK's `APIConnectionError`, so retry.py classifies every
  failure (Retry-After, quota, setup errors, key scrubbing) as it always has;
- proxies and certificates: like the SDK's transport, HTTP(S)_PROXY / NO_PROXY are honoured (read once, when the
  provider loads) and the SSL context is httpx2's (which honours SSL_CERT_FILE). Not aiohttp's `trust_env`: it
  looks for ~/.netrc credentials on a thread-pool hop for every request.
The Responses API, embeddings and /models still go through the SDK: one request per row only on the chat path.
"""

from __future__ import annotations

import json
from typing import Any

# Headers the body this path hands to the SDK's error builder no longer matches: aiohttp already decompressed it.
_STALE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class ChatTransport:
    """POST `<base_url>/chat/completions` with one aiohttp session (its pool as large as the requests in flight, so
    every request keeps its connection alive). Built and used on the provider's event loop."""

    def __init__(self, client: Any, max_concurrency: int):
        import httpx2

        self._client = client
        self.url = str(client.base_url).rstrip("/") + "/chat/completions"
        self._request = httpx2.Request("POST", self.url)  # what the SDK's exceptions point at
        headers = {**client.default_headers, **client.auth_headers}
        # Omit() in the SDK's headers means "do not send" (e.g. no organisation set)
        self._headers = {k: v for k, v in headers.items() if isinstance(v, str)}
        self._limit = max_concurrency
        self._session: Any = None
        self._proxy: dict[str, Any] = {}  # the environment's proxy for this URL, if any
        self._target: Any = None
        # bound in open(): aiohttp and openai are imported when the provider loads, not when this module is
        self._client_error: type[BaseException] = Exception
        self._connection_error: Any = None

    async def open(self) -> ChatTransport:
        import aiohttp
        import httpx2
        import openai
        import yarl

        self._client_error, self._connection_error = aiohttp.ClientError, openai.APIConnectionError

        ssl = httpx2.create_ssl_context(trust_env=True) if self.url.startswith("https:") else None
        # idle connections kept 5 s, as the SDK's pool keeps them: servers close theirs after about that (uvicorn,
        # vLLM's: 5 s), and a connection the server closed is one a request must not be sent on
        connector = aiohttp.TCPConnector(limit=self._limit, ssl=ssl if ssl is not None else True, keepalive_timeout=5)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers,
            cookie_jar=aiohttp.DummyCookieJar(),  # an API answer sets no cookie worth keeping; no jar to filter
            timeout=aiohttp.ClientTimeout(total=None),  # retry.py bounds each attempt (asyncio.timeout)
        )
        self._target = yarl.URL(self.url)  # parsed once, not per request
        try:
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(self._target)
            self._proxy = {"proxy": proxy, "proxy_auth": auth}
        except LookupError:  # none set, or NO_PROXY covers this host
            self._proxy = {}
        return self

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, body: dict[str, Any]) -> bytes:
        """The answer's body for a 2xx; the SDK's exception otherwise."""
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            async with self._session.post(self._target, data=data, **self._proxy) as response:
                raw = await response.read()
                status = response.status
                raw_headers = response.raw_headers
        except self._client_error as exc:
            raise self._connection_error(request=self._request) from exc
        if 200 <= status < 300:
            return raw
        raise self._status_error(status, raw_headers, raw)

    def _status_error(self, status: int, raw_headers: Any, raw: bytes) -> Exception:
        import httpx2

        headers = [(k, v) for k, v in raw_headers if k.decode("latin-1").lower() not in _STALE_HEADERS]
        response = httpx2.Response(status, headers=headers, content=raw, request=self._request)
        return self._client._make_status_error_from_response(response)
