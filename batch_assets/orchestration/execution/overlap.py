"""Partitions of one run inferred at once, for providers whose requests wait on one shared gate.

A run of several partitions (a single-run backfill, a `--partition-range` launch) handles them in order. For an
in-process model that is right: one model, one call at a time. For an HTTP endpoint it leaves the request window
half empty: each partition ends with its last answers trickling in and its file being assembled and checked before
the next partition's first request, and a partition smaller than the window never fills it (four partitions of 250
rows at `max_concurrency: 1000` had at most 250 requests in flight). Here the next partitions start while the
earlier ones are still running, as long as the rows of the unfinished partitions stay under the provider's window
(`partition_window_rows`: the rows it wants queued on its gate), so the gate (`max_concurrency`) stays full
across partition boundaries and still bounds what is in flight. Each partition keeps everything of its own: its
lock, checkpoints, atomic file, lineage record and metadata; results are handed back in partition order.

On a failure nothing more is started; the partitions already running are finished (their requests are paid for and
their files are complete), handed back, and then the first failure in partition order is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from batch_assets.stages.infer_streams import DaemonCallPool

MAX_PARTITIONS_AT_ONCE = 16


def partition_window_rows(provider: Any, chunk_rows: int) -> int:
    """Rows the provider wants queued across the partitions of a run (0: one partition at a time)."""
    return max(0, int(provider.partition_window_rows(chunk_rows)))


def run_overlapped(keys: Sequence[str], work: Callable[[str], Any], rows_of: Callable[[str], int], window_rows: int,
                   on_done: Callable[[str, Any], None], on_other_failure: Callable[[str, BaseException], None],
                   limit: int = MAX_PARTITIONS_AT_ONCE) -> tuple[str, BaseException] | None:
    """Run `work(key)` for every key on threads, starting the next key while the rows of the unfinished ones are
    under `window_rows`; `on_done(key, result)` is called on this thread in key order. Returns the first failure in
    key order, (key, exception), after the partitions running with it have finished; None when all succeeded."""
    pool = DaemonCallPool(max(1, min(limit, len(keys))), name="partition")
    started: list[tuple[str, int, Future]] = []
    handed = 0
    failure: tuple[str, BaseException] | None = None
    try:
        while handed < (len(keys) if failure is None else len(started)):
            while failure is None and len(started) < len(keys) and len(started) - handed < limit:
                waiting = started[handed:]
                if any(f.done() and f.exception() is not None for _, _, f in waiting):
                    break  # one has failed (not yet handed back, it is behind the head): start nothing more
                busy_rows = sum(rows for _, rows, f in waiting if not f.done())
                if waiting and busy_rows >= window_rows:
                    break
                key = keys[len(started)]
                started.append((key, rows_of(key), pool.submit(work, key)))
            key, _, head = started[handed]
            if not head.done():  # sleep until one that is still running finishes (never on one already done: a spin)
                wait([f for _, _, f in started[handed:] if not f.done()], return_when=FIRST_COMPLETED)
                continue
            handed += 1
            exc = head.exception()
            if exc is None:
                on_done(key, head.result())
            elif failure is None:
                failure = (key, exc)  # start nothing more; finish and hand back what is running
            else:
                on_other_failure(key, exc)
        return failure
    finally:
        for _, _, future in started[handed:]:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
