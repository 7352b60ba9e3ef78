"""run_overlapped (batch_assets/orchestration/execution/overlap.py), the partitions of one run inferred at once: results in
partition order, admission by the window of rows, a failure after the running partitions finish, no busy wait."""

from __future__ import annotations

import threading
import time

import pytest

from batch_assets.orchestration.execution import overlap
from batch_assets.orchestration.execution.overlap import run_overlapped


def test_results_in_key_order_and_the_window_bounds_what_runs_at_once() -> None:
    keys = [f"p{i}" for i in range(8)]
    rows = {k: 10 for k in keys}
    lock, running, most = threading.Lock(), [0], [0]

    def work(key: str) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05 * (8 - int(key[1:])))  # later keys finish first
        with lock:
            running[0] -= 1
        return key.upper()

    handed: list[tuple[str, str]] = []
    failure = run_overlapped(keys, work, rows.get, 30, lambda k, r: handed.append((k, r)), lambda k, e: None)
    assert failure is None and handed == [(k, k.upper()) for k in keys]
    assert most[0] == 3  # admitted while the unfinished rows were under 30: three partitions of 10 at once


@pytest.mark.parametrize("caller_late_s", [0.0, 0.15])
def test_a_failure_is_returned_after_the_running_partitions_finish_and_nothing_more_starts(
        caller_late_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order is set by events, not by sleeps: b fails only once c has started beside it, and c finishes only
    after b has failed. The second case wakes the caller 150 ms late after every wait, as a loaded machine does: the
    sleep-timed version of this test (b failing at 100 ms) then failed, c never started, though the product was
    right."""
    real_wait = overlap.wait

    def late_wait(*args, **kwargs):
        done = real_wait(*args, **kwargs)
        time.sleep(caller_late_s)
        return done

    monkeypatch.setattr(overlap, "wait", late_wait)
    keys = ["a", "b", "c", "d", "e"]
    started: list[str] = []
    c_started, b_failing = threading.Event(), threading.Event()

    def work(key: str) -> str:
        started.append(key)
        if key == "b":
            assert c_started.wait(30), "c never started beside b"
            b_failing.set()
            raise ValueError("bad input in b")
        if key == "c":
            c_started.set()
            assert b_failing.wait(30)
            time.sleep(0.5)  # b's raise reaches its future first (a late caller only widens this margin)
        return key

    handed, others = [], []
    # a window of 2 rows, 1 row each: a and b start; a finishes at once, so c starts beside b; b fails while c runs
    failure = run_overlapped(keys, work, lambda k: 1, 2, lambda k, r: handed.append(k),
                             lambda k, e: others.append(k))
    assert failure is not None and failure[0] == "b" and "bad input in b" in str(failure[1])
    assert handed == ["a", "c"]  # c was running beside b: finished and handed back
    assert "d" not in started and "e" not in started  # nothing started after the failure


def test_waiting_for_a_slow_head_partition_does_not_spin() -> None:
    """The head partition slow, the others done early: the caller sleeps until the head finishes (a loop that
    waited on futures already done would burn a core the whole time)."""

    def work(key: str) -> str:
        time.sleep(1.0 if key == "slow" else 0.0)
        return key

    cpu = time.thread_time()
    failure = run_overlapped(["slow", "x", "y"], work, lambda k: 1, 10, lambda k, r: None, lambda k, e: None)
    assert failure is None
    assert time.thread_time() - cpu < 0.3  # a spin spends about the whole second on this thread
