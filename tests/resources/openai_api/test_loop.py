"""The providers' private event loop (resources/openai_api/loop.py): torn down with a call still running, the call's
coroutine runs its cancellation to the end on the live loop, never later on a closed one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import sys
import threading

from resources.openai_api.loop import BackgroundLoop


def test_closing_the_loop_lets_a_running_call_finish_its_cancellation() -> None:
    loop = BackgroundLoop()
    started, cleaned = threading.Event(), threading.Event()

    async def call() -> None:  # the shape of a chunk call: requests as tasks, cancelled and awaited on interruption
        requests = [asyncio.ensure_future(asyncio.sleep(60)) for _ in range(3)]
        try:
            started.set()
            await asyncio.wait(requests)
        except BaseException:
            for request in requests:
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)
            cleaned.set()
            raise

    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            loop.run(call())
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    unraisable: list = []
    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        thread = threading.Thread(target=caller)
        thread.start()
        assert started.wait(10)
        loop.close()  # the provider torn down (a step failed) while the call runs
        thread.join(10)
        assert not thread.is_alive()  # the caller was released
        assert outcome and isinstance(outcome[0], concurrent.futures.CancelledError)
        gc.collect()
        assert cleaned.is_set(), "the call's cancellation never ran: its coroutine was left suspended on the loop"
        assert loop.loop.is_closed()
        assert not unraisable, [u.exc_value for u in unraisable]
    finally:
        sys.unraisablehook = previous
