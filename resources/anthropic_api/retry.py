"""Anthropic's errors read into the one retry policy (resources/openai_api/retry.py: attempts, backoff, Retry-After,
the shared pause and the give-up point are decided there, for both provider families).

What differs from OpenAI's SDK is only what an error means: Anthropic answers 529 `overloaded_error` when the API as
a whole is busy (transient, like a 5xx), 429 `rate_limit_error` with `retry-after` (transient, honoured), and names
every error by a `type` that also comes back on an errored batch result, so one table decides both paths.
"""

from __future__ import annotations

from typing import Any

from batch_assets.resources.openai_api.retry import Failure, RETRYABLE_STATUS, redact, retry_after_seconds, \
    transport_failure

# Error types (the `error.type` of an answer or of an errored batch result) that say "not now".
TRANSIENT_TYPES = frozenset({"rate_limit_error", "overloaded_error", "api_error", "timeout_error"})
# ... and those that say no row can succeed as configured: the step fails at once with what to change.
SETUP_TYPES = {
    "authentication_error": "check `api_key` (ANTHROPIC_API_KEY) for this endpoint and base_url",
    "permission_error": "the key has no permission for this model or feature: check the key's workspace and `model`",
    "not_found_error": "the API does not know this model or path: check `model` (and base_url, which has no /v1)",
    "billing_error": "add credit or raise the spend limit of this organisation/workspace, or use another key",
}
STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "rate_limit_error", 529: "overloaded_error"}


def error_type(status: int | None, body: Any) -> str | None:
    """The `error.type` of an error body ({"type": "error", "error": {"type", "message"}}), else by status."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        kind = body["error"].get("type")
        if isinstance(kind, str):
            return kind
    return STATUS_TYPES.get(status or 0)


def failure_for(kind: str | None, status: int | None, message: str, retry_after_s: float | None = None) -> Failure:
    """One failed request as a Failure, by its error type (the batch path reads errored results through it too)."""
    if kind in SETUP_TYPES:
        return Failure(message, False, setup_fix=SETUP_TYPES[kind])
    if kind is not None and "credit balance" in message.lower():
        # Anthropic's exhausted prepaid credit comes back as a 400 invalid_request_error: every row would get it
        return Failure(message, False, setup_fix=SETUP_TYPES["billing_error"])
    retryable = kind in TRANSIENT_TYPES or (status is not None and (status in RETRYABLE_STATUS or status >= 500))
    return Failure(message, retryable, retry_after_s if retryable else None, rate_limited=kind == "rate_limit_error")


def classify_failure(exc: BaseException, *, secret: str | None, timeout_s: float) -> Failure | None:
    """An exception from one attempt as a Failure, or None when it is not an API failure (a bug: re-raised)."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        kind = error_type(status, exc.body)
        if status == 401:  # the message may echo part of the rejected key: say what to do instead
            return Failure("HTTP 401: the API rejected the key", False, setup_fix=SETUP_TYPES["authentication_error"])
        message = f"HTTP {status} {kind or 'error'}: {redact(_message(exc), secret)}"
        return failure_for(kind, status, message, retry_after_seconds(exc.response.headers))
    return transport_failure(exc, anthropic, secret=secret, timeout_s=timeout_s)

def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or "")
    return str(getattr(exc, "message", "") or exc)
