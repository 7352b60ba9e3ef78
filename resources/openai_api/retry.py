"""The one retry policy for every request the provider sends.

The SDK's own retries are switched off (`max_retries=0`) so that attempts, waits and the give-up point are decided
here, in one place, and a row that runs out of attempts becomes a row error instead of an exception. An answer that
says the setup itself is wrong (401, 403, 404, insufficient quota) raises ProviderSetupError instead: no row could
succeed, so the step fails at once rather than publishing a partition of row errors.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from batch_assets.resources.provider_errors import GAVE_UP, ProviderSetupError
from batch_assets.resources.openai_api.limits import RequestGate

log = logging.getLogger(__name__)
T = TypeVar("T")

# 408 request timeout, 409 lock conflict, 429 rate limit; every 5xx is retried as well.
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Answers that say the setup is wrong, not the row: every other row would get the same answer.
SETUP_STATUS = {
    403: "the key has no permission for this model or endpoint: check the key's project/organisation and `model`",
    404: "the endpoint does not know this model or path: check `model` (and `embedding_model`) and that `base_url` "
    "ends in /v1",
}
_MAX_MESSAGE_CHARS = 400


class MalformedResponse(Exception):
    """A 2xx answer whose body is not the JSON the endpoint promised (truncated, missing fields): worth retrying."""


class UnusableResponse(Exception):
    """A well-formed answer that cannot be used and will not change on retry (e.g. embeddings of the wrong shape)."""


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    timeout_s: float
    backoff_base_s: float
    backoff_max_s: float
    max_retry_after_s: float


@dataclass(frozen=True)
class Failure:
    """Why one attempt failed, already safe to show (no API key), and whether trying again can help."""

    message: str
    retryable: bool
    retry_after_s: float | None = None  # what the server asked for, when it did
    rate_limited: bool = False
    setup_fix: str | None = None  # set when no row can succeed as configured: what to change (fails the step)


def retry_after_seconds(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The wait a server asks for: `retry-after-ms`, else `Retry-After` as seconds or as an HTTP date."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
            if math.isfinite(value):
                return max(0.0, value)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
        return max(0.0, value) if math.isfinite(value) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is read the same way
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with 'equal jitter': half of the step is fixed, half random, so rows that failed together
    spread out without any of them retrying immediately."""
    step = min(max_s, base_s * 2 ** (attempt - 1))
    return step / 2 + (rng or random).uniform(0, step / 2)


def redact(text: str, secret: str | None) -> str:
    """Remove the API key (and anything shaped like an OpenAI key) from text that may reach logs or row errors."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[redacted]")
    text = re.sub(r"\bsk-[A-Za-z0-9_*.\-]{3,}", "sk-[redacted]", text)
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


def classify_failure(exc: BaseException, *, secret: str | None, timeout_s: float) -> Failure | None:
    """Turn an exception from one attempt into a Failure, or None when it is not an API failure (a bug: re-raise)."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        if status == 429 and exc.code == "insufficient_quota":
            # OpenAI's 429 for an exhausted quota: waiting will not help, and every row would wait in vain
            return Failure("HTTP 429: insufficient quota on this account (billing), not a rate limit", False,
                           setup_fix="add credit or raise the quota of this account, or point the pipeline at another "
                           "key (api_key / OPENAI_API_KEY)")
        if status == 401:
            # Servers (OpenAI included) echo part of a rejected key in the message: say what to do instead.
            return Failure("HTTP 401: the endpoint rejected the API key", False,
                           setup_fix="check `api_key` (OPENAI_API_KEY) for this endpoint and base_url")
        message = f"HTTP {status}: {redact(exc.message, secret)}"
        if status in SETUP_STATUS:
            return Failure(message, False, setup_fix=SETUP_STATUS[status])
        retry_after = retry_after_seconds(exc.response.headers) if retryable else None
        return Failure(message, retryable, retry_after, rate_limited=status == 429)
    return transport_failure(exc, openai, secret=secret, timeout_s=timeout_s)


def transport_failure(exc: BaseException, sdk: Any, *, secret: str | None, timeout_s: float) -> Failure | None:
    """The failures that are not an HTTP status, read alike for OpenAI's and Anthropic's SDKs (`sdk`: the module;
    both name their timeout, connection and validation errors the same)."""
    if isinstance(exc, (sdk.APITimeoutError, TimeoutError)):
        return Failure(f"request timed out after {timeout_s:g}s", retryable=True)
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc
        return Failure(f"connection error: {redact(str(cause) or type(cause).__name__, secret)}", retryable=True)
    if isinstance(exc, (MalformedResponse, json.JSONDecodeError, sdk.APIResponseValidationError)):
        return Failure(f"malformed response: {redact(str(exc), secret)}", retryable=True)
    if isinstance(exc, UnusableResponse):
        return Failure(f"unusable response: {redact(str(exc), secret)}", retryable=False)
    return None


CONTROL_ATTEMPTS = 5


def control_call(run: Callable[[Any], Any], call: Callable[[], Awaitable[Any]], *, secret: str | None,
                 timeout_s: float, classify: Callable[..., Failure | None] = classify_failure) -> Any:
    """A batch API read or idempotent call (status, list, results, cancel), run on the provider's loop
    (`run`: BackgroundLoop.run) within `timeout_s`, retried on transient failures (a restarting endpoint, 529
    overloaded); a setup failure (rejected key, no permission) raises ProviderSetupError, except a 404, which is
    re-raised as it came for the caller to explain (an unknown batch id)."""
    async def timed() -> Any:
        async with asyncio.timeout(timeout_s):
            return await call()

    for attempt in range(1, CONTROL_ATTEMPTS + 1):
        try:
            return run(timed())
        except Exception as exc:
            failure = classify(exc, secret=secret, timeout_s=timeout_s)
            if failure is None or not failure.retryable or attempt == CONTROL_ATTEMPTS:
                if failure is not None and failure.setup_fix is not None and getattr(exc, "status_code", None) != 404:
                    raise ProviderSetupError(failure.message, failure.setup_fix) from None
                raise
            time.sleep(max(backoff_delay(attempt, 1.0, 30.0), failure.retry_after_s or 0))
    raise AssertionError("unreachable")


async def call_with_retries(
    send: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    gate: RequestGate,
    cost: int,
    secret: str | None,
    on_retry: Callable[[Failure], None] | None = None,
    settle: Callable[[T], Awaitable[None]] | None = None,
    classify: Callable[..., Failure | None] = classify_failure,
) -> T | Failure:
    """Run `send` until it succeeds, fails for good, or runs out of attempts; returns its value or the last Failure.

    Each attempt waits for a slot in `gate` (concurrency cap, rate limits, server-requested pause) and then gets
    `policy.timeout_s` for the whole request, body included. `classify(exc, secret=, timeout_s=)` reads one
    provider family's errors (this module's for OpenAI's SDK; resources/anthropic_api/retry.py for Anthropic's).
    `settle(value)` runs on success while the slot is still
    held (the answer journal: the slot is freed once the answer is durable, so requests sent plus answers not yet
    durable never exceed the gate's concurrency).
    """
    for attempt in range(1, policy.max_attempts + 1):
        try:
            async with gate.slot(cost):
                async with asyncio.timeout(policy.timeout_s):
                    value = await send()
                if settle is not None:
                    await settle(value)
                return value
        except Exception as exc:
            failure = classify(exc, secret=secret, timeout_s=policy.timeout_s)
            if failure is None:
                raise
        if failure.setup_fix is not None:
            error = ProviderSetupError(failure.message, failure.setup_fix)
            gate.break_with(error)
            raise error
        if not failure.retryable:
            return failure
        if attempt == policy.max_attempts:
            return replace(failure, message=f"{failure.message} ({GAVE_UP} {attempt} attempts)")
        delay = backoff_delay(attempt, policy.backoff_base_s, policy.backoff_max_s)
        if failure.retry_after_s is not None:
            if failure.retry_after_s > policy.max_retry_after_s:
                return replace(
                    failure,
                    message=f"{failure.message} (the server asked to wait {failure.retry_after_s:.0f}s, more than "
                    f"max_retry_after_s={policy.max_retry_after_s:g}; raise it or lower the request rate)",
                )
            # The server said when it can take more work: hold every request back, not only this row's.
            gate.pause_for(failure.retry_after_s)
            delay = max(delay, failure.retry_after_s)
        if on_retry is not None:
            on_retry(failure)
        log.debug("attempt %d/%d failed (%s); retrying in %.2fs", attempt, policy.max_attempts, failure.message, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable: the loop returns on its last attempt")
