"""The infer loop's plumbing (stages/infer_streams.py): chunks of exactly `chunk_rows` rows whatever batches the
prepared file gives (what lets a rerun match committed chunks), a read-ahead that hands over every item in order and
any failure where the consumer sees it, and provider calls that return in order and never hold the process."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest

from batch_assets.stages.infer_streams import DaemonCallPool, Prefetched, calls_in_flight, exact_chunks


def _batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        out.append(pa.RecordBatch.from_pydict({"row_id": [f"r{i}" for i in range(start, start + n)]}))
        start += n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_chunks_hold_exactly_chunk_rows_rows_in_order_whatever_the_batches(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 3, 7, 10, 64]) for _ in range(40)]
    total = sum(sizes)
    chunks = list(exact_chunks(iter(_batches(sizes)), 7))
    assert all(c.num_rows == 7 for c in chunks[:-1]) and 0 < chunks[-1].num_rows <= 7
    assert [r for c in chunks for r in c.column("row_id").to_pylist()] == [f"r{i}" for i in range(total)]


def test_the_same_rows_make_the_same_chunks_however_they_were_batched() -> None:
    one = [c.column("row_id").to_pylist() for c in exact_chunks(iter(_batches([100])), 16)]
    many = [c.column("row_id").to_pylist() for c in exact_chunks(iter(_batches([5, 30, 1, 64])), 16)]
    assert one == many and len(one) == 7


def test_no_rows_make_no_chunk() -> None:
    assert list(exact_chunks(iter([]), 8)) == []
    assert list(exact_chunks(iter(_batches([0, 0])), 8)) == []


def test_read_ahead_hands_over_every_item_in_order_then_the_source_s_failure() -> None:
    def source():
        yield from range(50)
        raise OSError("the prepared file could not be read")

    seen = []
    ahead = Prefetched(source(), depth=2)
    with pytest.raises(OSError, match="could not be read"):
        for item in ahead:
            seen.append(item)
    ahead.close()
    assert seen == list(range(50))


def test_read_ahead_stops_reading_when_the_consumer_stops() -> None:
    read = []

    def source():
        for i in range(10_000):
            read.append(i)
            yield i

    ahead = Prefetched(source(), depth=2)
    for item in ahead:
        if item == 3:
            break
    ahead.close()
    assert not ahead._thread.is_alive()
    assert len(read) < 10  # bounded read-ahead: it did not read the whole source


def test_calls_run_and_return_in_submission_order_and_a_failure_goes_to_its_caller() -> None:
    pool = DaemonCallPool(1, "test_calls")

    def call(i: int) -> int:
        if i == 3:
            raise ValueError("row 3 refused")
        return i * i

    futures = [pool.submit(call, i) for i in range(6)]
    assert [f.result(timeout=10) for i, f in enumerate(futures) if i != 3] == [0, 1, 4, 16, 25]
    with pytest.raises(ValueError, match="row 3 refused"):
        futures[3].result(timeout=10)
    pool.shutdown()


def test_a_hung_call_never_holds_the_process_and_queued_calls_are_cancelled() -> None:
    release = threading.Event()
    pool = DaemonCallPool(1, "test_hung")
    hung = pool.submit(release.wait)
    queued = pool.submit(time.sleep, 0)
    while not hung.running():
        time.sleep(0.01)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    assert all(t.daemon for t in pool._threads)  # the interpreter may exit with the call still running
    release.set()


class _Provider:
    def __init__(self, n: int):
        self.n = n

    def chunks_in_flight(self, chunk_rows: int) -> int:
        return self.n


def test_at_least_one_call_is_in_flight() -> None:
    assert calls_in_flight(_Provider(0), 64) == 1 and calls_in_flight(_Provider(4), 64) == 4
