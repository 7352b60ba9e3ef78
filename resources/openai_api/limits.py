"""What stands between a row and the endpoint: a cap on requests in flight, request and token rate limits, and a
shared pause when the server answers with Retry-After.

Rate limits are leaky buckets (`aiolimiter.AsyncLimiter`): asyncio-native, a weighted `acquire(amount)` for token
budgets, and no thread or timer of its own. A bucket holds a tenth of a minute's budget, so a run starts with at most
that much in a burst and then refills continuously: OpenAI enforces per-minute limits over shorter windows too, and
a full minute's budget sent in the first second would come back as 429s.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import math
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


# Images and PDFs are charged what the endpoints document they cost, not their base64 characters (a thousand times
# too much) nor nothing (an image row would then be undercounted against tokens_per_minute and the Batch API's
# enqueued-token limit, and the endpoint would answer with 429s or refuse the batch). An image in OpenAI's shape
# (`image_url`): its high-detail count (fit in 2048 x 2048, shortest side at most 768, 170 a 512-px tile + 85; 'low'
# detail: 85) or the newer models' 32-px patches (at most 1,536), whichever is more. In Anthropic's shape (`image`):
# width x height / 750, the image first scaled to at most 1092 x 1092's pixels (1.19 megapixels). An image whose
# size cannot be read here (a URL the endpoint fetches): the most either charges. A PDF (OpenAI's `file` part,
# Anthropic's `document`): its pages' text and each page as an image, up to 3,000 a page (Anthropic's documented
# 1,500-3,000); its page count read with pypdf, which a pipeline sending PDFs has (the `documents` extra checked them
# at prepare).
IMAGE_TOKENS_MAX = 1_600
IMAGE_TOKENS_LOW_DETAIL = 85
PDF_TOKENS_PER_PAGE = 3_000
_ANTHROPIC_MAX_PIXELS = 1092 * 1092  # the largest square Anthropic does not scale down: ~1,590 tokens


def openai_image_tokens(width: int, height: int, detail: str | None = None) -> int:
    """What OpenAI's chat endpoints count for an image of this size (see above)."""
    if detail == "low":
        return IMAGE_TOKENS_LOW_DETAIL
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        w, h = w * 2048 / max(w, h), h * 2048 / max(w, h)
    if min(w, h) > 768:
        w, h = w * 768 / min(w, h), h * 768 / min(w, h)
    tiles = 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)
    patches = min(math.ceil(width / 32) * math.ceil(height / 32), 1_536)
    return max(tiles, patches)


def anthropic_image_tokens(width: int, height: int) -> int:
    """What Anthropic's Messages API counts for an image of this size (see above)."""
    return math.ceil(min(float(width) * float(height), _ANTHROPIC_MAX_PIXELS) / 750)


def _base64_payload(url: Any) -> bytes | None:
    """The bytes of a `data:...;base64,` URL, or None (a URL the endpoint fetches, or not base64)."""
    header, sep, data = str(url or "").partition(",")
    if not (header.startswith("data:") and sep and ";base64" in header):
        return None
    return _b64decode(data)


def _b64decode(data: Any) -> bytes | None:
    try:
        return base64.b64decode(data or "", validate=False)
    except (binascii.Error, ValueError, TypeError):
        return None


def _image_size(data: bytes | None) -> tuple[int, int] | None:
    if data is None:
        return None
    try:
        from PIL import Image  # core dependency; reads the header only

        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:  # not an image PIL reads: the endpoint decides
        return None


def _pdf_part_tokens(data: bytes | None) -> int:
    if data is None:
        return PDF_TOKENS_PER_PAGE
    try:
        from pypdf import PdfReader

        pages = len(PdfReader(io.BytesIO(data)).pages)
    except Exception:  # no pypdf, or a PDF it cannot count: about one page a 50 KB, at least one
        pages = len(data) // 50_000 + 1
    return max(1, pages) * PDF_TOKENS_PER_PAGE


def _part_tokens(part: dict[str, Any]) -> int:
    """Tokens of one non-text content part, OpenAI's shape (image_url, file) or Anthropic's (image, document)."""
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url, detail = (image.get("url"), image.get("detail")) if isinstance(image, dict) else (image, None)
        if detail == "low":
            return IMAGE_TOKENS_LOW_DETAIL
        size = _image_size(_base64_payload(url))
        return openai_image_tokens(*size, detail) if size else IMAGE_TOKENS_MAX
    if kind in ("image", "document"):
        source = part.get("source") if isinstance(part.get("source"), dict) else {}
        data = _b64decode(source.get("data")) if source.get("type") == "base64" else None
        if kind == "document":
            return _pdf_part_tokens(data)
        size = _image_size(data)
        return anthropic_image_tokens(*size) if size else IMAGE_TOKENS_MAX
    if kind == "file":
        file = part.get("file") if isinstance(part.get("file"), dict) else {}
        return _pdf_part_tokens(_base64_payload(file.get("file_data")))
    return 0


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # content parts: count the text ones
        return sum(len(part.get("text", "")) for part in content if isinstance(part, dict))
    return 0


def _content_media_tokens(content: Any) -> int:
    if isinstance(content, list):
        return sum(_part_tokens(part) for part in content if isinstance(part, dict) and part.get("type") != "text")
    return 0


def estimate_chat_tokens(conversation: Sequence[dict[str, Any]], max_new_tokens: int) -> int:
    """Tokens a request will use at most, as the endpoint counts them against a tokens-per-minute limit: the prompt
    (its text estimated from its length, its images and PDFs as the endpoints document them) plus the completion
    budget."""
    prompt = sum(_content_chars(m.get("content")) for m in conversation) // CHARS_PER_TOKEN
    media = sum(_content_media_tokens(m.get("content")) for m in conversation)
    return prompt + media + TOKENS_PER_MESSAGE * len(conversation) + max_new_tokens


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
