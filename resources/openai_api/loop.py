"""A private event loop on a daemon thread, so the sync provider methods can run async requests from anywhere."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Why not `asyncio.run` per call: the client's connection pool and the rate-limit buckets belong to one loop
    and must outlive a single generate() call, and asyncio.run refuses to start inside a thread that already runs a
    loop (async Dagster assets, notebooks). Calls from any thread are submitted here and waited for."""

    def __init__(self, name: str = "openai-provider-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BackgroundLoop.run called from its own loop thread: await the coroutine instead")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt in the caller: stop the requests instead of orphaning them
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
