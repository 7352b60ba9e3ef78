"""What every provider of a hosted HTTP API shares (OpenAI-compatible endpoints, Anthropic): the process's loaded
client lives on its own event loop behind one request gate; a run's stop holds new requests back and gives those in
flight a grace; batch mode waits for the provider's batches side by side and cancels them on a user's stop.

The loaded state of each family (`_Loaded` in its provider module) has `runner` (openai_api/loop.py BackgroundLoop),
`gate` (openai_api/limits.py RequestGate) and `batches` (the batch ids this process waits on); the family says how
to cancel one batch and how to close its clients.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from batch_assets.resources.base import ModelResource
from batch_assets.resources.openai_api.retry import RetryPolicy

log = logging.getLogger(__name__)


class HostedApiProvider(ModelResource):
    """Base of the HTTP API providers. Each family declares its own config fields (max_concurrency, max_attempts,
    timeout_s, backoff_*, max_retry_after_s, batch_api, ...): their descriptions are its docs (docs/spec-reference.md
    is generated from them, in declaration order, and what is retried or limited differs per family)."""

    _log: Any = PrivateAttr(default=None)

    # -- what a family supplies --------------------------------------------------------------------------------
    def _loaded_state(self) -> Any:
        """The loaded client state, or None before the load / after close."""
        raise NotImplementedError

    async def _cancel_batch(self, loaded: Any, batch_id: str) -> None:
        raise NotImplementedError

    async def _close_clients(self, loaded: Any) -> None:
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        super().setup_for_execution(context)
        self._log = context.log

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()
        super().teardown_after_execution(context)

    def close(self) -> None:
        """Close the HTTP clients and stop the provider's event loop (Dagster teardown calls it; so can tests)."""
        loaded = self._loaded_state()
        self._model = None
        if loaded is not None:
            try:
                loaded.runner.run(self._close_clients(loaded))
            finally:
                loaded.runner.close()

    @property
    def stopped_at(self) -> float | None:
        """When this process stopped sending (wall clock), or None: the run records it (batch_assets/stopping.py)."""
        loaded = self._loaded_state()
        return loaded.gate.stopped_at if loaded is not None else None

    def stop(self, grace_s: float) -> None:
        """No new request from now on; requests in flight get `grace_s` to answer (their answers reach
        `on_answer`, so the infer loop keeps them), then every call still running is cancelled."""
        loaded = self._loaded_state()
        if loaded is None:
            return
        if loaded.gate.stopping:  # stopped already (the loop, then the step): end what is left at once
            loaded.runner.cancel_calls()
            return
        loaded.gate.stop_sending()
        deadline = time.monotonic() + max(0.0, grace_s)
        while loaded.gate.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        abandoned = loaded.gate.in_flight
        loaded.runner.cancel_calls()
        self._info("stopping: no new requests; %d in flight abandoned after a %.1fs grace", abandoned, grace_s)

    def chunks_in_flight(self, chunk_rows: int) -> int:
        """How many chunk calls the infer loop may have running at once. Each call queues its rows on the shared
        request gate, so with twice `max_concurrency` rows queued the window of requests in flight stays full
        across chunk boundaries (no drain at the end of a chunk), while memory stays bounded to those chunks."""
        return max(2, -(-2 * self.max_concurrency // max(1, chunk_rows)) + 1)

    def partition_window_rows(self, chunk_rows: int) -> int:
        """Rows the infer stage may have queued across the partitions of a run (batch_assets/orchestration/
        overlap.py): the next partition starts while the unfinished ones hold fewer, so the window stays full at
        partition boundaries and with partitions smaller than `max_concurrency`; the gate still bounds requests.
        Batch mode: no bound, so the partitions of one run are submitted and waited for side by side (overlap.py
        caps them at 16), in one process instead of one each."""
        if self.batch_api:
            return 2**62
        return self.chunks_in_flight(chunk_rows) * chunk_rows

    # -- batch mode (the machinery: batch_assets/stages/infer_batch.py) ------------------------------------------------
    @classmethod
    def waits_on_batches(cls, config: dict[str, Any]) -> bool:
        return config.get("batch_api") is True

    def cancel_batches(self) -> list[str]:
        loaded = self._loaded_state()
        if loaded is None or not loaded.batches:
            return []
        cancelled = []
        for batch_id in sorted(loaded.batches):
            try:
                loaded.runner.run(self._cancel_batch(loaded, batch_id))
                cancelled.append(batch_id)
            except Exception as exc:  # ended meanwhile, or unreachable: said, and the stop goes on
                self._info("could not cancel batch %s: %s", batch_id, exc, level=logging.WARNING)
        loaded.batches.clear()
        if cancelled:
            self._info("stopping: cancelled batch(es) %s", ", ".join(cancelled))
        return cancelled

    # -- internals -------------------------------------------------------------------------------------------------
    def _batch_waits(self) -> dict[str, Any]:
        """How the batch machinery waits and retries for this provider: what its batch session carries."""
        return {"poll_s": self.batch_poll_interval_s, "max_attempts": self.max_attempts,
                "retry_online": self.batch_retry_rows == "online"}

    def _policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.timeout_s, self.backoff_base_s, self.backoff_max_s,
                           self.max_retry_after_s)

    def _info(self, msg: str, *args: Any, level: int = logging.INFO) -> None:
        if self._log is not None:
            self._log.log(level, msg % args)
        else:
            logging.getLogger(type(self).__module__).log(level, msg, *args)
