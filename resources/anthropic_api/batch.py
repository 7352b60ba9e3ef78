"""Anthropic's Message Batches (`/v1/messages/batches`) as the provider side of the batch path.

The machinery (batch_assets/stages/infer_batch.py: rows, the durable ledger, waiting, re-attaching, retries) is
the one the OpenAI family uses; what is Anthropic's is here: a request is `{custom_id, params}` with `params` the
very body the online path POSTs to /v1/messages; the requests go inline in the create call (no file upload); status
is `processing_status` (in_progress, canceling, ended) with `request_counts` (processing, succeeded, errored,
canceled, expired); results are read once the batch has ended, by `custom_id` (in no particular order), each
`succeeded`, `errored` (its error type decides transient vs deterministic, as online: anthropic_api/retry.py),
`canceled` or `expired` (never ran: transient).

Never submitted twice, and the limit of that promise. An Anthropic batch carries no metadata, so a create whose
answer was lost cannot be found by a token as OpenAI's can. `find_batch` lists the batches created since the
ledger's intent (minus clock skew) whose request count equals the submission's and that no other submission of the
partition holds: exactly one is adopted (if it is someone else's after all, its results carry none of this
submission's custom_ids, so no answer is mistaken for ours and the rows are asked again); none means it was never
created (its rows go again, once); several raise BatchNotIdentified, and the partition stops naming them rather
than guess (docs/providers-anthropic.md#never-submitted-twice).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from batch_assets.resources.anthropic_api.payloads import MessagesPlan, message_generation, request_body
from batch_assets.resources.anthropic_api.retry import classify_failure, error_type, failure_for
from batch_assets.resources.provider_errors import BatchNotIdentified, ProviderSetupError
from batch_assets.resources.openai_api.limits import estimate_chat_tokens
from batch_assets.resources.openai_api.retry import MalformedResponse, control_call, redact
from batch_assets.resources.protocols import BatchOutcome, BatchState

# How far the provider's clock may be behind ours when a lost create is looked for among the listed batches.
CLOCK_SKEW_S = 300.0
# The create body wraps the request lines as `{"requests":[line,line,...]}` (the SDK sends compact UTF-8, as the lines
# are counted): 15 bytes of envelope, one comma per newline dropped. The batch machinery sizes a batch by its lines,
# so the session's byte budget leaves the envelope out, and a batch filled to the byte stays within the limit.
ENVELOPE_BYTES = len(b'{"requests":[]}')


@dataclass
class AnthropicBatches:
    """One partition's view of Message Batches: built by the provider with its loaded client and the call's plan."""

    client: Any  # anthropic.AsyncAnthropic
    run: Callable[[Any], Any]  # runs a coroutine on the provider's loop (BackgroundLoop.run)
    model: str
    plan: MessagesPlan
    secret: str | None
    timeout_s: float
    max_requests: int
    max_bytes: int
    active: set[str]  # batch ids this process waits on (the provider cancels them on a user's stop)
    stopped: Callable[[], bool] = lambda: False
    max_enqueued_tokens: int | None = None  # Anthropic limits requests in processing, not tokens: no throttle
    family: str = "anthropic"
    uploads_input: bool = False  # the requests travel inside the create call
    # how the batch machinery waits and retries for this provider (its batch_poll_interval_s, max_attempts and
    # batch_retry_rows: 'online' sends rows a batch did not answer as ordinary requests)
    poll_s: float = 60.0
    max_attempts: int = 5
    retry_online: bool = False

    def __post_init__(self) -> None:
        self.max_bytes = max(1, self.max_bytes - ENVELOPE_BYTES)

    # -- building the requests -------------------------------------------------------------------------------------
    def request_line(self, custom_id: str, conversation: list[dict[str, Any]]) -> bytes:
        line = {"custom_id": custom_id, "params": request_body(self.model, conversation, self.plan)}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    def estimate_tokens(self, conversation: list[dict[str, Any]]) -> int:
        return estimate_chat_tokens(conversation, self.plan.max_tokens)

    def request_digest(self) -> str:
        return json.dumps({"family": self.family, "model": self.model, **self.plan.body}, sort_keys=True, default=str)

    # -- submitting ------------------------------------------------------------------------------------------------
    def upload(self, name: str, data: bytes) -> str:
        raise NotImplementedError("Message Batches take their requests inline: nothing is uploaded")

    def find_upload(self, name: str) -> str | None:
        return None  # nothing is ever uploaded

    def create(self, sub: Any, data: bytes) -> str:
        """Submit the requests (one JSON line each); raises on failure, never retries: a lost answer is looked
        for first (find_batch)."""
        requests = [json.loads(line) for line in data.splitlines() if line.strip()]
        batch = self.run(self._timed(self.client.messages.batches.create(requests=requests)))
        self.active.add(batch.id)
        return batch.id

    def find_batch(self, sub: Any, claimed: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
        """The batch of a submission whose create answer was lost (see the module's docstring), or None."""
        since, count = sub.created - CLOCK_SKEW_S, len(sub.custom_ids)

        async def candidates() -> list[str]:
            found = []
            async for batch in self.client.messages.batches.list(limit=100):  # newest first
                if batch.created_at.timestamp() < since:
                    break
                c = batch.request_counts
                total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
                if total == count and batch.id not in claimed:
                    found.append(batch.id)
            return found

        found = self._control(candidates)
        if len(found) > 1:
            raise BatchNotIdentified(
                f"the answer to a Message Batch create was lost, and {len(found)} batches of {count} requests were "
                f"created since: {', '.join(found)}; Anthropic batches carry no token to tell which is this "
                "submission's", found)
        if found:
            self.active.add(found[0])
            return found[0]
        return None

    # -- waiting ---------------------------------------------------------------------------------------------------
    def state(self, batch_id: str) -> BatchState:
        import anthropic

        try:
            b = self._control(lambda: self.client.messages.batches.retrieve(batch_id))
        except anthropic.NotFoundError:
            raise ProviderSetupError(
                f"Message Batch {batch_id}, recorded in the partition's batch ledger, is unknown to this API",
                "the ledger was written against another endpoint or workspace (base_url, api_key): point the "
                "pipeline back at it, or remove the partition's folder under <storage root>/<pipeline>/_staging/"
                "inferred-batches/ to submit its rows again (they are then paid again)", status=404) from None
        c = b.request_counts
        ended = b.processing_status == "ended"
        (self.active.discard if ended else self.active.add)(batch_id)
        return BatchState(
            id=b.id, status=b.processing_status, ended=ended,
            total=c.processing + c.succeeded + c.errored + c.canceled + c.expired,
            completed=c.succeeded, failed=c.errored + c.canceled + c.expired, files=(b.id,))

    def cancel(self, batch_id: str) -> None:
        import anthropic

        async def cancel_once() -> None:
            try:
                await self.client.messages.batches.cancel(batch_id)
            except anthropic.ConflictError:
                pass  # it ended meanwhile: nothing left to cancel (a 409 the retry policy would ask again)

        self._control(cancel_once)
        self.active.discard(batch_id)

    # -- results ---------------------------------------------------------------------------------------------------
    def results(self, state: BatchState) -> Iterator[tuple[str, BatchOutcome]]:
        """(custom_id, outcome) of every result of the ended batch; each result is read into its outcome as it
        streams in, so the SDK's Message objects of a 100,000-request batch are never all in memory."""

        async def read() -> list[tuple[str, BatchOutcome]]:
            out = []
            async for item in await self.client.messages.batches.results(state.id):
                out.append((item.custom_id, self._outcome(item.result)))
            return out

        yield from self._control(read)

    def _outcome(self, result: Any) -> BatchOutcome:
        kind = getattr(result, "type", None)
        if kind == "succeeded":
            try:
                return BatchOutcome(message_generation(result.message, self.plan.decode))
            except MalformedResponse as exc:
                return BatchOutcome(None, f"malformed response: {exc}", retryable=True)
        if kind in ("canceled", "expired"):  # never ran
            return BatchOutcome(None, f"batch request {kind}", retryable=True, unfinished=True)
        if kind == "errored":
            body = result.error.model_dump() if hasattr(result.error, "model_dump") else result.error
            error = error_type(None, body)
            message = str(((body or {}).get("error") or {}).get("message") or "")
            failure = failure_for(error, None, f"{error or 'error'}: {redact(message, self.secret)}")
            if failure.setup_fix is not None:
                raise ProviderSetupError(failure.message, failure.setup_fix)
            return BatchOutcome(None, failure.message, retryable=failure.retryable)
        raise MalformedResponse(f"a Message Batch result of unknown type {kind!r}")

    # -- plumbing --------------------------------------------------------------------------------------------------
    async def _timed(self, coro: Any) -> Any:
        async with asyncio.timeout(self.timeout_s):
            return await coro

    def _control(self, call: Callable[[], Any]) -> Any:
        return control_call(self.run, call, secret=self.secret, timeout_s=self.timeout_s, classify=classify_failure)
