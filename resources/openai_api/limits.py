"""What stands between a row and the endpoint: a cap on requests in flight, request and token rate limits, and a
shared pause when the server answers with Retry-After.

Rate limits are leaky buckets (`aiolimiter.AsyncLimiter`): asyncio-native, a weighted `acquire(amount)` for token
budgets, and no thread or timer of its own. A bucket holds a tenth of a minute's budget, so a run starts with at most
that much in a burst and then refills continuously: OpenAI enforces per-minute limits over shorter windows too, and
a full minute's budget sent in the first second would come back as 429s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from batch_assets.resources.provider_errors import MissingExtraError

# The share of a per-minute budget that may go out in one burst.
BURST_SECONDS = 6.0
# Rough characters per token for English text; only used to charge the token bucket before a request is sent.
CHARS_PER_TOKEN = 4
# Per-message overhead of the chat format (role markers, separators).
TOKENS_PER_MESSAGE = 4


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # content parts: count the text ones
        return sum(len(part.get("text", "")) for part in content if isinstance(part, dict))
    return 0


def estimate_chat_tokens(conversation: Sequence[dict[str, Any]], max_new_tokens: int) -> int:
    """Tokens a request will use at most, as the endpoint counts them against a tokens-per-minute limit: the prompt
    (estimated from its length) plus the completion budget."""
    prompt = sum(_content_chars(m.get("content")) for m in conversation) // CHARS_PER_TOKEN
    return prompt + TOKENS_PER_MESSAGE * len(conversation) + max_new_tokens


def estimate_text_tokens(texts: Sequence[str]) -> int:
    return sum(len(t) for t in texts) // CHARS_PER_TOKEN + len(texts)


def _bucket(per_minute: float) -> Any:
    try:
        from aiolimiter import AsyncLimiter
    except ImportError as exc:
        raise MissingExtraError("aiolimiter", None, "rate limiting of the OpenAI-compatible provider") from exc
    capacity = max(1.0, per_minute * BURST_SECONDS / 60)
    return AsyncLimiter(max_rate=capacity, time_period=capacity * 60 / per_minute)


class RequestGate:
    """Admits one request at a time into the endpoint's budget. Lives on the provider's event loop and is shared by
    every generate()/embed() call of the process, so limits hold across calls, not only within one."""

    def __init__(self, max_concurrency: int, requests_per_minute: float | None, tokens_per_minute: float | None):
        self._slots = asyncio.Semaphore(max_concurrency)
        self._requests = _bucket(requests_per_minute) if requests_per_minute else None
        self._tokens = _bucket(tokens_per_minute) if tokens_per_minute else None
        self._resume_at = 0.0  # loop time before which nothing is sent (server-requested pause)
        self._broken: BaseException | None = None  # a setup error: nothing more is sent, by any call
        self._stopping = False  # the run is stopping: nothing more is sent; requests in flight may still answer
        self._never: asyncio.Event | None = None
        self.in_flight = 0  # requests sent and not yet answered
        self.stopped_at: float | None = None  # wall-clock time of the first stop_sending (recorded on the run)

    def stop_sending(self) -> None:
        """From any thread: no request starts after this (the run is stopping). Requests waiting for a slot, for a
        rate-limit budget or in a retry's backoff wait until they are cancelled; the ones in flight go on."""
        self._stopping = True
        if self.stopped_at is None:
            self.stopped_at = time.time()

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def _hold_if_stopping(self) -> None:
        if self._stopping:
            self._never = self._never or asyncio.Event()
            await self._never.wait()  # never set: the request is cancelled when the stop's grace ends

    def break_with(self, error: BaseException) -> None:
        """No request can succeed as configured (rejected key, unknown model): refuse every request still waiting,
        of this call and of every other call in flight, instead of sending each one to learn the same thing."""
        self._broken = error

    def pause_for(self, seconds: float) -> None:
        """Hold every request back for `seconds`: a Retry-After (on a 429 or 503) speaks for the whole endpoint."""
        loop = asyncio.get_running_loop()
        self._resume_at = max(self._resume_at, loop.time() + seconds)

    async def _wait_for_resume(self) -> None:
        loop = asyncio.get_running_loop()
        while (wait := self._resume_at - loop.time()) > 0:
            await asyncio.sleep(wait)

    @asynccontextmanager
    async def slot(self, tokens: int) -> AsyncIterator[None]:
        """Held for the duration of one HTTP request. The budget is taken after the concurrency slot so that
        what the buckets admit is what is actually sent."""
        await self._hold_if_stopping()
        async with self._slots:
            if self._broken is not None:
                raise self._broken
            await self._wait_for_resume()
            if self._requests is not None:
                await self._requests.acquire()
            if self._tokens is not None:
                # A request larger than one burst takes a whole burst rather than being refused.
                await self._tokens.acquire(min(float(tokens), self._tokens.max_rate))
            await self._wait_for_resume()
            if self._broken is not None:
                raise self._broken
            await self._hold_if_stopping()
            self.in_flight += 1
            try:
                yield
            finally:
                self.in_flight -= 1
