"""What every hosted-API provider shares (resources/hosted.py), on the real OpenAI-compatible provider: a user's stop
cancels every batch the process still waits on (so none is paid for after the stop) and one that ended meanwhile
does not stop the stop; a stop lets the requests in flight answer within the grace and sends nothing new; batch
mode puts no row bound on a run's partitions; the provider closes cleanly, twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from batch_assets.resources.openai_api import OpenAICompatibleProvider
from batch_assets.resources.protocols import GenerationParams
from tests.resources.conftest import API_KEY, StandinProcess, sdk_client
from tests.resources.openai_api.standin import FINALIZE_S, PER_REQUEST_S, VALIDATE_S
from tests.resources.openai_api.fault_proxy import Echo, FaultProxy, Stall

PARAMS = GenerationParams(max_new_tokens=4)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandinProcess]:
    proc = StandinProcess(tmp_path / "state", tmp_path / "standin.log").start()
    try:
        yield proc
    finally:
        proc.stop()


def _submit(session, text: str) -> str:
    data = session.request_line(f"id-{text}", [{"role": "user", "content": text}])
    sub = SimpleNamespace(token=f"tok-{text}", created=time.time(), file_id=session.upload(f"{text}.jsonl", data))
    return session.create(sub, data)


def test_a_stop_cancels_every_batch_still_running_and_one_that_ended_does_not_stop_it(standin):
    provider = OpenAICompatibleProvider(model="gpt-standin", base_url=standin.url, api_key=API_KEY,
                                        batch_api=True).load_for_tests()
    try:
        session = provider.batch_session(PARAMS)
        ended = _submit(session, "quick")
        standin.advance(VALIDATE_S + PER_REQUEST_S + FINALIZE_S + 1)
        running = _submit(session, "slow [[slow]]")
        assert sdk_client(standin).batches.retrieve(ended).status == "completed"
        session.active.add(ended)  # still on the list: the process had not polled it since it ended
        assert provider.cancel_batches() == [running]
        assert sdk_client(standin).batches.retrieve(running).status in ("cancelling", "cancelled")
        assert sdk_client(standin).batches.retrieve(ended).status == "completed"  # refused (409), said, skipped
        assert provider.cancel_batches() == []  # nothing left to cancel
    finally:
        provider.close()
        provider.close()  # teardown after a test's own close: no error


def test_a_stop_lets_requests_in_flight_answer_and_sends_nothing_new():
    """Two rows in flight are held by the endpoint; the stop comes while they are; their answers are kept, the
    rows queued behind them are never sent."""
    release = threading.Event()

    def respond(key: str, n: int):
        if key.startswith("held"):
            release.wait(30)
        return Echo()

    with FaultProxy(respond) as proxy:
        provider = OpenAICompatibleProvider(model="m", base_url=proxy.url, max_concurrency=2,
                                            max_attempts=1).load_for_tests()
        answers: dict[int, object] = {}
        rows = [[{"role": "user", "content": f"held{i}"}] for i in range(2)] + \
               [[{"role": "user", "content": f"queued{i}"}] for i in range(3)]
        call = threading.Thread(target=lambda: _generate(provider, rows, answers), daemon=True)
        try:
            assert provider.stopped_at is None
            call.start()
            while len(proxy.attempts) < 2:
                time.sleep(0.01)
            threading.Timer(0.2, release.set).start()
            provider.stop(grace_s=30)
            call.join(30)
            assert provider.stopped_at is not None
        finally:
            release.set()
            provider.close()
    sent = sorted(a.key for a in proxy.attempts)
    assert sent == ["held0", "held1"]  # nothing queued went out after the stop
    assert {i: getattr(a, "text", None) for i, a in answers.items()} == {0: "echo:held0", 1: "echo:held1"}


def _generate(provider, rows, answers) -> None:
    try:
        provider.generate(rows, PARAMS, on_answer=lambda i, a: answers.__setitem__(i, a))
    except BaseException:  # noqa: BLE001 - the stop cancels the call: what matters is what was answered
        pass


def test_batch_mode_puts_no_row_bound_on_a_runs_partitions_and_online_mode_keeps_the_window_full():
    online = OpenAICompatibleProvider(model="m", base_url="http://127.0.0.1:9/v1", max_concurrency=64)
    # twice max_concurrency rows queued on the gate, so requests in flight never drain at a chunk boundary
    assert online.chunks_in_flight(chunk_rows=16) * 16 >= 2 * 64
    assert online.chunks_in_flight(chunk_rows=10_000) >= 2
    assert online.partition_window_rows(16) == online.chunks_in_flight(16) * 16
    batch = OpenAICompatibleProvider(model="m", base_url="http://127.0.0.1:9/v1", batch_api=True)
    assert batch.partition_window_rows(16) >= 2**62
    assert OpenAICompatibleProvider.waits_on_batches({"batch_api": True})
    assert not OpenAICompatibleProvider.waits_on_batches({})
