"""stop_daemonic_children (resources/process_exit.py) on real child processes: a daemonic child that ignores SIGTERM
(a library's helper deadlocked after a fork) is killed after the grace and named on stderr, one that obeys SIGTERM
just ends, and a non-daemonic child (a Dagster step process) is never touched. The whole-process behaviour at exit
(main process and multiprocessing step child) is tests/test_process_exit.py."""

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
    ready.set()
    while True:
        time.sleep(1)


def _start(target, daemon: bool):
    ready = CTX.Event()
    child = CTX.Process(target=target, args=(ready,), daemon=daemon)
    child.start()
    assert ready.wait(30)
    return child


def test_a_daemonic_child_deaf_to_sigterm_is_killed_and_named_and_a_step_process_is_left_alone(capfd):
    deaf, obedient, step = _start(_deaf, True), _start(_obedient, True), _start(_obedient, False)
    try:
        killed = stop_daemonic_children(grace_s=0.5)
        assert killed == [deaf.pid]
        assert not deaf.is_alive() and deaf.exitcode == -signal.SIGKILL
        assert not obedient.is_alive() and obedient.exitcode == -signal.SIGTERM
        assert step.is_alive()  # non-daemonic: waited for as Python always does, never killed
        assert f"killed daemonic child process(es) [{deaf.pid}]" in capfd.readouterr().err
    finally:
        for child in (deaf, obedient, step):
            if child.is_alive():
                child.kill()
            child.join(10)


def test_nothing_to_stop_says_nothing(capfd):
    assert stop_daemonic_children(grace_s=0.1) == []
    assert capfd.readouterr().err == ""
