"""stop_daemonic_children (resources/process_exit.py) on real child processes: a daemonic child that ignores SIGTERM
(a library's helper deadlocked after a fork) is killed after the grace and named on stderr, one that obeys SIGTERM
just ends, and a non-daemonic child (a Dagster step process) is never touched. The whole-process behaviour at exit
(main process and multiprocessing step child) is tests/resources/test_process_exit.py."""

from __future__ import annotations

import multiprocessing
import signal
import time

from batch_assets.resources.process_exit import stop_daemonic_children

CTX = multiprocessing.get_context("fork")


def _deaf(ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    while True:
        time.sleep(1)


def _obedient(ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the handler a fork inherits from the test runner
    ready.set()
    while True:
        time.sleep(1)


def _start(target, daemon: bool):
    ready = CTX.Event()
    child = CTX.Process(target=target, args=(ready,), daemon=daemon)
    child.start()
    assert ready.wait(30)
    return child


def _scenario(report) -> None:
    """Runs in a process of its own, so that only this test's children are there to be stopped (a pytest worker may
    hold other tests' children)."""
    deaf, obedient, step = _start(_deaf, True), _start(_obedient, True), _start(_obedient, False)
    killed = stop_daemonic_children(grace_s=0.5)
    report.put({"killed": killed, "deaf": deaf.pid, "deaf_exit": deaf.exitcode, "deaf_alive": deaf.is_alive(),
                "obedient_exit": obedient.exitcode, "obedient_alive": obedient.is_alive(),
                "step_alive": step.is_alive()})
    step.kill()
    step.join(10)


def test_a_daemonic_child_deaf_to_sigterm_is_killed_and_named_and_a_step_process_is_left_alone(capfd):
    report = CTX.Queue()
    owner = CTX.Process(target=_scenario, args=(report,))
    owner.start()
    try:
        seen = report.get(timeout=60)
    finally:
        owner.join(30)
        if owner.is_alive():
            owner.kill()
    assert seen["killed"] == [seen["deaf"]]
    assert not seen["deaf_alive"] and seen["deaf_exit"] == -signal.SIGKILL
    assert not seen["obedient_alive"] and seen["obedient_exit"] == -signal.SIGTERM
    assert seen["step_alive"]  # non-daemonic: waited for as Python always does, never killed
    assert f"killed daemonic child process(es) [{seen['deaf']}]" in capfd.readouterr().err


def test_nothing_to_stop_says_nothing(capfd):
    report = CTX.Queue()
    owner = CTX.Process(target=lambda q: q.put(stop_daemonic_children(grace_s=0.1)), args=(report,))
    owner.start()
    assert report.get(timeout=60) == []
    owner.join(30)
    assert capfd.readouterr().err == ""
