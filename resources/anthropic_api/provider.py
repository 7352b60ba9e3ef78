"""Text generation through Anthropic's Messages API (`provider: anthropic`), online or through Message Batches.

The reliability is the OpenAI provider's, reused rather than copied: the same request gate (concurrency, RPM/TPM
leaky buckets, the shared Retry-After pause: openai_api/limits.py), the same retry policy with Anthropic's errors
read by anthropic_api/retry.py (529 overloaded and 429 rate-limited are transient, retry-after is honoured), the
same background loop and answer-journal settling (each answer durable before its request frees its slot), the same
stop. Batch mode (`batch_api: true`) goes through the batch machinery every provider family shares
(batch_assets/stages/infer_batch.py, the durable ledger); anthropic_api/batch.py is the Anthropic side of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from batch_assets.resources.fields import operational, secret, semantic
from batch_assets.resources.anthropic_api.batch import AnthropicBatches
from batch_assets.resources.anthropic_api.payloads import MessagesPlan, message_generation, plan_messages, \
    request_body
from batch_assets.resources.anthropic_api.retry import classify_failure
from batch_assets.resources.hosted import HostedApiProvider
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.openai_api.limits import RequestGate, estimate_chat_tokens
from batch_assets.resources.openai_api.loop import BackgroundLoop, FewerCollections
from batch_assets.resources.openai_api.provider import CallStats, DurableWaits, OnAnswer, _all_or_first_error, \
    _public_url, _settle
from batch_assets.resources.openai_api.retry import Failure, call_with_retries
from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.schema_support import ANTHROPIC, warn_unenforced
from batch_assets.resources.structured import StructuredOutput, validate_output

# Where calls go when base_url is unset (the SDK's default): the endpoint pool's name (batch_assets/orchestration/execution/pool_slots.py).
API_HOST = "api.anthropic.com"


@dataclass
class _Loaded:
    client: Any  # anthropic.AsyncAnthropic
    runner: BackgroundLoop
    gate: RequestGate
    secret: str
    last_stats: CallStats = field(default_factory=CallStats)
    batches: set[str] = field(default_factory=set)  # Message Batch ids this process waits on (batch mode)
    waits: DurableWaits = field(default_factory=lambda: DurableWaits())
    warned: set[str] = field(default_factory=set)


class AnthropicProvider(HostedApiProvider):
    """Generation with Claude models through Anthropic's Messages API."""

    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"anthropic"})
    answers_each_row: ClassVar[bool] = True  # billed per request: every answer is journaled as it arrives
    batch_methods: ClassVar[frozenset[str]] = frozenset({"generate"})
    default_endpoint: ClassVar[str | None] = API_HOST
    unparseable_hint: ClassVar[str] = (
        "Anthropic did not enforce the output format: check that `model` supports structured outputs "
        "(output_config.format; docs/providers-anthropic.md)")

    model: str = semantic(description="Claude model id sent with every request, e.g. claude-sonnet-4-5.")
    base_url: str | None = semantic(
        default=None,
        description="API root WITHOUT /v1 (the SDK adds /v1/messages). None: ANTHROPIC_BASE_URL if set, else "
        "https://api.anthropic.com.")
    api_key: str | None = secret(
        default=None, repr=False,
        description="Set it as dg.EnvVar('ANTHROPIC_API_KEY') (in a pipeline spec: {env: ANTHROPIC_API_KEY}) so it is "
        "read at run time and hidden in the UI. Unset: the ANTHROPIC_API_KEY environment variable at run time. Never "
        "logged or recorded in metadata.")
    max_concurrency: int = operational(default=8, ge=1, description="Requests in flight at once, across all calls in this "
                                 "process.")
    requests_per_minute: float | None = operational(
        default=None, gt=0, description="Request rate limit (your tier's RPM; leaky bucket, a tenth of a minute's "
        "budget may go out in one burst). None: no limit.")
    tokens_per_minute: float | None = operational(
        default=None, gt=0, description="Token rate limit: each request is charged its estimated prompt tokens "
        "(characters / 4) plus max_new_tokens before it is sent (Anthropic counts input and output tokens per minute "
        "apart: set the tighter of the two). None: no limit.")
    max_attempts: int = operational(
        default=5, ge=1, description="Attempts per request, the first included. Retried: 429 rate_limit_error, 529 "
        "overloaded_error, 5xx, timeouts, connection errors, malformed answers. Other 4xx fail the row at once.")
    timeout_s: float = operational(default=120.0, gt=0, description="Seconds one attempt may take, the whole body "
                             "included.")
    backoff_base_s: float = operational(default=1.0, ge=0, description="First retry waits about this long (half fixed, "
                                  "half random), doubling each attempt.")
    backoff_max_s: float = operational(default=30.0, ge=0, description="Upper bound of one backoff wait.")
    max_retry_after_s: float = operational(
        default=120.0, description="retry-after is always honoured up to this many seconds; a server asking for "
        "longer fails the row instead of stalling the run.")
    extra_body: dict[str, Any] = semantic(
        default_factory=dict, description="Extra JSON fields merged into every Messages request (e.g. `thinking`, "
        "`metadata`). Per-call GenerationParams.extra wins over it.")

    batch_api: bool = operational(
        default=False,
        description="Send the rows through Anthropic's Message Batches (half the online price) instead of one "
        "request each: answers come within 24 h; the partition's batch ids are kept in the storage root, so a "
        "rerun, a crash or a retry re-attaches and never submits twice (docs/providers-anthropic.md#message-batches).")
    batch_poll_interval_s: float = operational(
        default=60.0, gt=0, description="Batch mode: seconds between two status checks of a partition's batches.")
    batch_retry_rows: Literal["new_batch", "online"] = operational(
        default="new_batch",
        description="Batch mode: where rows go that a batch did not answer for a transient reason (expired, "
        "canceled, an errored result of type overloaded_error / rate_limit_error / api_error): 'new_batch' (batch "
        "price, another wait) or 'online' (sent now at the online price). Either way at most max_attempts times.")
    batch_max_requests: int = operational(
        default=100_000, ge=1, description="Batch mode: requests per Message Batch (Anthropic's limit: 100,000).")
    batch_max_bytes: int = operational(
        default=256_000_000, ge=1, description="Batch mode: request bytes per Message Batch (Anthropic's limit: "
        "256 MB).")

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def load(self) -> _Loaded:
        try:
            import anthropic
        except ImportError as exc:
            raise MissingExtraError("anthropic", "anthropic", "the Anthropic provider (provider: anthropic)") from exc
        key = self.api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ValueError("no Anthropic API key: set api_key=dg.EnvVar('ANTHROPIC_API_KEY') (in a pipeline spec "
                             "`api_key: {env: ANTHROPIC_API_KEY}`) or export ANTHROPIC_API_KEY")
        runner = BackgroundLoop(name="anthropic-provider-loop")

        async def open_client() -> tuple[Any, RequestGate]:  # both belong to the loop that will use them
            import httpx2

            limits = httpx2.Limits(max_connections=self.max_concurrency,
                                   max_keepalive_connections=self.max_concurrency)
            client = anthropic.AsyncAnthropic(
                api_key=key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0,
                http_client=anthropic.DefaultAioHttpClient(limits=limits, timeout=self.timeout_s))
            return client, RequestGate(self.max_concurrency, self.requests_per_minute, self.tokens_per_minute)

        try:
            client, gate = runner.run(open_client())
        except BaseException:
            runner.close()
            raise
        return _Loaded(client, runner, gate, secret=key)

    def _loaded_state(self) -> _Loaded | None:
        return self._model if isinstance(self._model, _Loaded) else None

    async def _close_clients(self, loaded: _Loaded) -> None:
        await loaded.client.close()

    async def _cancel_batch(self, loaded: _Loaded, batch_id: str) -> None:
        await loaded.client.messages.batches.cancel(batch_id)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(base_url=_public_url(self.base_url) or f"SDK default (ANTHROPIC_BASE_URL or {API_HOST})",
                   max_concurrency=self.max_concurrency, max_attempts=self.max_attempts, timeout_s=self.timeout_s)
        if self.batch_api:
            out.update(batch_api=True, batch_retry_rows=self.batch_retry_rows)
        for name in ("requests_per_minute", "tokens_per_minute"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @property
    def last_call_stats(self) -> CallStats:
        return self.loaded.last_stats

    # -- batch mode (anthropic_api/batch.py; the machinery: batch_assets/stages/infer_batch.py) ---------------------
    def batch_session(self, params: GenerationParams, method: str = "generate") -> AnthropicBatches | None:
        if not self.batch_api or method != "generate":
            return None
        loaded = self.loaded
        plan = self._plan(loaded, params)
        return AnthropicBatches(loaded.client, loaded.runner.run, self.model, plan, loaded.secret, self.timeout_s,
                                self.batch_max_requests, self.batch_max_bytes, loaded.batches,
                                stopped=lambda: loaded.gate.stopping, **self._batch_waits())

    # -- capabilities ----------------------------------------------------------------------------------------------
    def generate(self, conversations: Sequence[Conversation], params: GenerationParams, *,
                 on_answer: OnAnswer | None = None) -> list[Generation]:
        loaded = self.loaded
        plan = self._plan(loaded, params)  # an unsupported constraint fails the call here, before any request
        stats = CallStats(rows=len(conversations))
        # Bodies built before the first request: a content part with no Anthropic form fails the call, not a row.
        bodies = [request_body(self.model, list(c), plan) for c in conversations]
        with FewerCollections():
            results = loaded.runner.run(_all_or_first_error([
                self._generate_row(loaded, body, plan, stats, _settle(on_answer, i, loaded.waits))
                for i, body in enumerate(bodies)]))
        if len(results) != len(bodies):
            raise RuntimeError(f"{type(self).__name__}.generate produced {len(results)} results for {len(bodies)} rows")
        loaded.last_stats = stats
        structured = StructuredOutput.from_params(params)
        unparseable = "" if structured is None else ", %d answers not valid %s output" % (
            sum(1 for r in results if r.error is None and validate_output(r.text, structured)[1] is not None),
            structured.kind)
        self._info("%s messages: %d rows, %d failed requests%s, %d retries (%d rate-limited or overloaded), %d input "
                   "+ %d output tokens", self.model_name(), stats.rows, stats.failed_rows, unparseable, stats.retries,
                   stats.rate_limited, stats.prompt_tokens, stats.completion_tokens)
        return results

    # -- internals -------------------------------------------------------------------------------------------------
    def _plan(self, loaded: _Loaded, params: GenerationParams) -> MessagesPlan:
        plan = plan_messages(params, self.config_value("extra_body"))
        unsent = {name: value for name, value, default in (("seed", params.seed, None),
                                                           ("temperature", params.temperature, 0.0),
                                                           ("top_p", params.top_p, 1.0)) if value != default}
        for name, value in unsent.items():
            if name not in loaded.warned:
                loaded.warned.add(name)
                self._info("Anthropic's Messages API takes no %s: %s=%s is not sent", name, name, value,
                           level=logging.WARNING)
        if params.json_schema is not None:
            warn_unenforced(params.json_schema, ANTHROPIC, lambda m: self._info("%s", m, level=logging.WARNING),
                            who=f"{type(self).__name__} (model {self.model_name()!r})")
        return plan

    async def _generate_row(self, loaded: _Loaded, body: dict[str, Any], plan: MessagesPlan, stats: CallStats,
                            settle: Callable[[Any], Awaitable[None]] | None = None) -> Generation:
        create = loaded.client.messages.create

        async def send() -> Generation:
            return message_generation(await create(**body), plan.decode)

        outcome = await call_with_retries(
            send, policy=self._policy(), gate=loaded.gate,
            cost=estimate_chat_tokens(body["messages"], plan.max_tokens) + len(body.get("system") or "") // 4,
            secret=loaded.secret, on_retry=stats.note_retry, settle=settle, classify=classify_failure)
        if isinstance(outcome, Failure):
            stats.failed_rows += 1
            return Generation(text=None, error=outcome.message)
        stats.prompt_tokens += outcome.prompt_tokens or 0
        stats.completion_tokens += outcome.completion_tokens or 0
        return outcome
