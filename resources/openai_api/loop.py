"""A private event loop on a daemon thread, so the sync provider methods can run async requests from anywhere, and
the HTTP client the SDK sends through on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
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
        # Calls still waiting when the loop closes must be released, not left waiting on a loop that will never
        # run their coroutine again: a caller blocked forever (e.g. a chunk call still running when its step
        # failed and the provider was torn down) would also keep the interpreter from exiting.
        self._waiting: set[concurrent.futures.Future] = set()
        self._lock = threading.Lock()
        self._closed = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BackgroundLoop.run called from its own loop thread: await the coroutine instead")
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("the provider's event loop is closed: the provider was torn down")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._waiting.add(future)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt in the caller: stop the requests instead of orphaning them
            raise
        finally:
            with self._lock:
                self._waiting.discard(future)

    def cancel_calls(self) -> None:
        """Cancel every call running on the loop (its requests are abandoned); the loop itself stays usable."""
        with self._lock:
            waiting = list(self._waiting)
        for future in waiting:
            future.cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waiting = list(self._waiting)
        for future in waiting:
            future.cancel()  # wakes the waiting caller at once; the coroutine is cancelled if the loop still runs
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            # let every task still on the loop (a call's requests, cancelled above) run its cancellation to the end
            # before the loop stops: a coroutine left suspended is finalized later, on a closed loop, and fails there
            drained = asyncio.run_coroutine_threadsafe(_cancel_tasks(DRAIN_S), self.loop)
            try:
                drained.result(timeout=DRAIN_S + 1)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # a task ignoring cancellation: the loop stops anyway, as before
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


DRAIN_S = 5.0  # at most this long for the loop's tasks to finish cancelling when the provider is torn down


async def _cancel_tasks(timeout_s: float) -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        if not task.cancelling():  # one being cancelled already is running its own clean-up: never interrupt it
            task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)


def http_client(max_concurrency: int, timeout_s: float) -> Any:
    """The SDK's aiohttp transport (`openai.DefaultAioHttpClient`), with a connection pool as large as the requests
    in flight, so every request in flight keeps its connection alive between requests. It carries what still goes
    through the SDK (the Responses API, embeddings, /models); chat completions take the leaner path of transport.py.

    Why not the SDK's default httpx client: its pool keeps at most 100 idle connections (with more in flight, every
    further answer closes its connection and the next request opens a new one), and httpcore scans every pooled
    connection on each request and each answer, so its cost per request grows with the pool. Measured against
    bench/api_server.py at 1,000 in flight: 3.5 ms of client CPU per request with the default client, 5.3 ms with
    its pool raised to 1,000, 1.2 ms with aiohttp (docs/BENCHMARKS.md). The SDK, its errors and its request
    building are unchanged: only the transport underneath differs.
    """
    import httpx2
    import openai

    limits = httpx2.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    return openai.DefaultAioHttpClient(limits=limits, timeout=timeout_s)


# Allocations between two young-generation collections while a call runs (CPython's default: 700).
CALL_GC_THRESHOLD = 50_000


class FewerCollections:
    """While any generate()/embed() call of this process runs, CPython's young generation is collected every
    `CALL_GC_THRESHOLD` allocations instead of every 700; the previous thresholds come back when the last call ends.

    Why: each request allocates a few hundred short-lived objects (futures, handles, the HTTP request and response),
    so at thousands of requests a second the collector ran constantly, and every tenth of every tenth collection is a
    full one that walks the whole heap, which in a Dagster process (Dagster, pydantic, pyarrow loaded) is large.
    Measured against bench/api_server.py at 1,000 in flight, the provider alone: 0.44-0.56 ms of CPU per request
    with the default thresholds, 0.23-0.26 ms with these, 0.20-0.28 ms with the collector off (docs/BENCHMARKS.md).
    Nothing is kept alive by it: objects are freed by reference counting as before, and only cyclic garbage waits
    longer (up to that many allocations). Not `gc.freeze()`: objects frozen are never collected, even once garbage.
    """

    _lock = threading.Lock()
    _depth = 0
    _saved: tuple[int, int, int] | None = None

    def __enter__(self) -> FewerCollections:
        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                cls._saved = gc.get_threshold()
                young, *older = cls._saved
                gc.set_threshold(max(young, CALL_GC_THRESHOLD), *older)
            cls._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0 and cls._saved is not None:
                gc.set_threshold(*cls._saved)
                cls._saved = None
