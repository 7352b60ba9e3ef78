"""OpenAI's Batch API (`/v1/files` + `/v1/batches`) as the provider side of the batch path.

The machinery that owns a partition's batches (batch_assets/stages/infer_batch.py: which rows go in which file,
the durable ledger, waiting, re-attaching, retries) is the same for every provider family; this module is what is
OpenAI's: the JSONL line of one row (the very body the online path sends to /chat/completions, structured-output
schema included; for task embed, an /v1/embeddings body with the row's one text, whose vector is read back into the
answer journal as the online path's are), upload, submit with `completion_window: 24h`, find a submission again by the token it carries,
status, cancel, and the results read back from `output_file_id` and `error_file_id` by `custom_id`.

Every call goes through the SDK (the same client, key and base_url as the online path). Control-plane calls are
retried on transient failures, except `batches.create`: a create whose answer was lost may have created the batch,
so the caller looks it up by its token before it ever creates again (never submitted twice).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from batch_assets.resources.openai_api.limits import estimate_chat_tokens, estimate_text_tokens
from batch_assets.resources.openai_api.payloads import RequestPlan, chat_generation
from batch_assets.resources.openai_api.retry import MalformedResponse, RETRYABLE_STATUS, SETUP_STATUS, \
    UnusableResponse, control_call, redact
from batch_assets.resources.provider_errors import ProviderSetupError
from batch_assets.resources.protocols import BatchOutcome, BatchState

ENDPOINT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
TOKEN_KEY = "batch_assets_token"  # the metadata key a submission carries: how a lost create is found again
PENDING = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
ENDED = frozenset({"completed", "expired", "cancelled", "failed"})
# Error codes of a failed batch that say "not now" rather than "this file is wrong": the rows go into a later batch.
RETRY_LATER_CODES = frozenset({"token_limit_exceeded", "rate_limit_exceeded"})


@dataclass
class OpenAIBatches:
    """One partition's view of the Batch API: built by the provider with its loaded client and the call's plan."""

    client: Any  # openai.AsyncOpenAI
    run: Callable[[Any], Any]  # runs a coroutine on the provider's loop (BackgroundLoop.run)
    model: str
    plan: RequestPlan | None  # the chat request of every row (task generate); None for embeddings
    secret: str | None
    timeout_s: float
    max_requests: int
    max_bytes: int
    active: set[str]  # batch ids this process waits on (the provider cancels them on a user's stop)
    max_enqueued_tokens: int | None = None  # the model's queue of enqueued tokens, as the provider limits it
    stopped: Callable[[], bool] = lambda: False  # the run is stopping: the wait ends at its next poll
    family: str = "openai"
    uploads_input: bool = True  # the requests go up as a file first (/v1/files), then the batch names it
    # task embed: the /v1/embeddings body besides `input` (model, encoding_format, dimensions); None: chat
    embed_body: dict[str, Any] | None = None
    # how the batch machinery waits and retries for this provider (its batch_poll_interval_s, max_attempts and
    # batch_retry_rows: 'online' sends rows a batch did not answer as ordinary requests)
    poll_s: float = 60.0
    max_attempts: int = 5
    retry_online: bool = False

    @property
    def endpoint(self) -> str:
        return ENDPOINT if self.embed_body is None else EMBEDDINGS

    # -- building the input file ---------------------------------------------------------------------------------
    def request_line(self, custom_id: str, conversation: list[dict[str, Any]]) -> bytes:
        """One JSONL line: the documented {custom_id, method, url, body}; body = what the online path POSTs."""
        if self.embed_body is not None:  # `conversation` is the row's text
            body = {**self.embed_body, "input": conversation}
        else:
            body = {"model": self.model, "messages": conversation, **self.plan.body}
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body},
                          ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    def estimate_tokens(self, conversation: list[dict[str, Any]]) -> int:
        """What the row counts against the enqueued-token limit: the online path's token estimate (prompt
        characters / 4 plus the whole completion budget), which does not undercount."""
        if self.embed_body is not None:
            return estimate_text_tokens([conversation])
        return estimate_chat_tokens(conversation, self.plan.max_tokens)

    def request_digest(self) -> str:
        """What, besides the row's input, decides its answer (model and every request field): part of custom_id,
        so a batch of another setup is never read as this one's."""
        if self.embed_body is not None:
            return json.dumps({"url": EMBEDDINGS, **self.embed_body}, sort_keys=True)
        return json.dumps({"model": self.model, **self.plan.body}, sort_keys=True, default=str)

    # -- submitting ------------------------------------------------------------------------------------------------
    def upload(self, name: str, data: bytes) -> str:
        import openai

        try:
            return self._control(lambda: self.client.files.create(file=(name, data, "application/jsonl"),
                                                                  purpose="batch")).id
        except openai.NotFoundError:  # llama.cpp's and vLLM's servers have no Files API
            raise ProviderSetupError("the endpoint has no /v1/files: it does not offer OpenAI's Batch API",
                                     "set batch_api: false for this endpoint (self-hosted servers such as vLLM and "
                                     "llama.cpp answer online only), or point base_url at one that has it",
                                     status=404) from None

    def find_upload(self, name: str) -> str | None:
        """The id of an input file uploaded under `name` (a crash between the upload and the ledger write)."""

        async def find() -> str | None:
            async for f in self.client.files.list(purpose="batch"):
                if f.filename == name:
                    return f.id
            return None

        return self._control(find)

    def create(self, sub: Any, data: bytes) -> str:
        """Submit the submission's uploaded file (`data` is already in it); raises on failure, never retries (the
        caller looks the token up first: a lost answer)."""
        batch = self.run(self._timed(self.client.batches.create(
            input_file_id=sub.file_id, endpoint=self.endpoint, completion_window="24h", metadata={TOKEN_KEY: sub.token})))
        self.active.add(batch.id)
        return batch.id

    def find_batch(self, sub: Any, claimed: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
        """The batch submitted with the submission's token (created at or after its intent), or None."""
        token, since = sub.token, sub.created

        async def find() -> str | None:
            async for batch in self.client.batches.list(limit=100):
                if (batch.metadata or {}).get(TOKEN_KEY) == token:
                    return batch.id
                if batch.created_at < since - 3600:  # newest first: older ones cannot be ours
                    return None
            return None

        found = self._control(find)
        if found:
            self.active.add(found)
        return found

    # -- waiting -----------------------------------------------------------------------------------------------------
    def state(self, batch_id: str) -> BatchState:
        import openai

        try:
            b = self._control(lambda: self.client.batches.retrieve(batch_id))
        except openai.NotFoundError:
            raise ProviderSetupError(
                f"batch {batch_id}, recorded in the partition's batch ledger, is unknown to this endpoint",
                "the ledger was written against another endpoint or account (base_url, api_key): point the pipeline "
                "back at it, or remove the partition's folder under <storage root>/<pipeline>/_staging/"
                "inferred-batches/ to submit its rows again (they are then paid again)", status=404) from None
        counts = b.request_counts
        ended = b.status in ENDED
        if ended:
            self.active.discard(batch_id)
        else:
            self.active.add(batch_id)
        errors = [f"line {e.line}: {e.code}: {e.message}" if e.line else f"{e.code}: {e.message}"
                  for e in ((b.errors.data if b.errors else None) or [])]
        codes = {e.code for e in ((b.errors.data if b.errors else None) or [])}
        return BatchState(
            id=b.id, status=b.status, ended=ended, total=counts.total if counts else 0,
            completed=counts.completed if counts else 0, failed=counts.failed if counts else 0,
            failure="; ".join(errors) if b.status == "failed" else None,
            retry_later=b.status == "failed" and bool(codes) and codes <= RETRY_LATER_CODES,
            files=tuple(f for f in (b.output_file_id, b.error_file_id) if f))

    def cancel(self, batch_id: str) -> None:
        import openai

        async def cancel_once() -> None:
            try:
                await self.client.batches.cancel(batch_id)
            except openai.ConflictError:
                pass  # it ended meanwhile: nothing left to cancel (a 409 the retry policy would ask again)

        self._control(cancel_once)
        self.active.discard(batch_id)

    # -- results ---------------------------------------------------------------------------------------------------
    def results(self, state: BatchState) -> Iterator[tuple[str, BatchOutcome]]:
        """(custom_id, outcome) of every line of the batch's output and error files, in the files' order."""
        for file_id in state.files:
            raw = self._control(lambda f=file_id: self.client.files.content(f)).read()
            for number, line in enumerate(raw.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                    custom_id = item["custom_id"]
                except (ValueError, KeyError, TypeError):
                    raise MalformedResponse(f"line {number} of batch {state.id}'s file {file_id} is not a result "
                                            "line") from None
                yield custom_id, self._outcome(item)

    def _outcome(self, item: dict[str, Any]) -> BatchOutcome:
        error, response = item.get("error"), item.get("response")
        if error:  # the request never ran: batch_expired, batch_cancelled
            code = error.get("code") or "error"
            return BatchOutcome(None, f"{code}: {redact(str(error.get('message') or ''), self.secret)}",
                                retryable=True, unfinished=code in ("batch_expired", "batch_cancelled"))
        status = (response or {}).get("status_code")
        body = (response or {}).get("body")
        if status == 200:
            try:
                if self.embed_body is not None:
                    return self._vector(body)
                return BatchOutcome(chat_generation(body, self.plan.decode))
            except MalformedResponse as exc:
                return BatchOutcome(None, f"malformed response: {exc}", retryable=True)
            except UnusableResponse as exc:
                return BatchOutcome(None, f"unusable response: {exc}")
        message = ((body or {}).get("error") or {}).get("message") if isinstance(body, dict) else None
        text = f"HTTP {status}: {redact(str(message or body), self.secret)}"
        if status == 401 or status in SETUP_STATUS:
            raise ProviderSetupError(text, SETUP_STATUS.get(status) or "check `api_key` (OPENAI_API_KEY) for this "
                                     "endpoint and base_url", status=status)
        retryable = isinstance(status, int) and (status in RETRYABLE_STATUS or status >= 500)
        return BatchOutcome(None, text, retryable=retryable)

    def _vector(self, body: Any) -> BatchOutcome:
        """One row's embedding from an embeddings response body (one input per line: one vector)."""
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
            raise MalformedResponse("expected an embeddings response with one vector")
        try:
            vector = np.asarray(data[0].get("embedding"), dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise UnusableResponse(f"the embedding is not a list of numbers ({exc})") from None
        dimensions = self.embed_body.get("dimensions") if self.embed_body else None
        if vector.ndim != 1 or not vector.size or (dimensions is not None and vector.shape[0] != dimensions):
            raise UnusableResponse(f"expected one flat vector{f' of {dimensions} numbers' if dimensions else ''}, "
                                   f"got shape {vector.shape}")
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        tokens = usage.get("prompt_tokens")
        return BatchOutcome(vector, prompt_tokens=tokens if isinstance(tokens, int) else None)

    # -- plumbing --------------------------------------------------------------------------------------------------
    async def _timed(self, coro: Any) -> Any:
        async with asyncio.timeout(self.timeout_s):
            return await coro

    def _control(self, call: Callable[[], Any]) -> Any:
        return control_call(self.run, call, secret=self.secret, timeout_s=self.timeout_s)
