"""The infer loop's plumbing: chunks of exactly `chunk_rows` rows, read ahead on a thread, and provider calls run on
daemon threads (batch_assets/stages/infer.py; docs/infer-loop.md says why each exists)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa


def calls_in_flight(provider: Any, chunk_rows: int) -> int:
    """Chunk calls a provider may run at once: 1 for in-process models (one model, one call at a time; the loop
    still overlaps reading and writing with it), more for providers that queue requests on a shared gate."""
    return max(1, int(provider.chunks_in_flight(chunk_rows)))


class DaemonCallPool:
    """A fixed set of worker threads running provider calls in submission order, like ThreadPoolExecutor, but on
    daemon threads: a call still running when its step failed (a hung endpoint, a stuck user model) is abandoned
    instead of joined when the interpreter exits (ThreadPoolExecutor joins its workers at exit, so one stuck call
    would keep the run worker from ever exiting)."""

    def __init__(self, workers: int, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Any, *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def exact_chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Re-cut batches into chunks of exactly `rows` rows (the last may be shorter): chunk i always covers the
    same prepared rows, which is what lets a rerun match committed chunks."""
    parts: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - size, batch.num_rows)
            parts.append(batch.slice(0, take))
            size += take
            batch = batch.slice(take)
            if size == rows:
                yield _combine(parts)
                parts, size = [], 0
    if size:
        yield _combine(parts)


def _combine(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(parts) == 1:
        return parts[0]
    return pa.Table.from_batches(parts).combine_chunks().to_batches(max_chunksize=None)[0]


class Prefetched:
    """Reads the next items of an iterator on a thread while the caller works on the current one (bounded)."""

    _DONE = object()

    def __init__(self, source: Iterator[Any], depth: int = 2):
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(source,), name="infer-prefetch", daemon=True)
        self._thread.start()

    def _fill(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
            self._put(self._DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
