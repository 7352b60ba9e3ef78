"""A finished process exits (issue 23, item 4): a daemonic child process that a library left behind and that cannot
act on SIGTERM (OpenVINO's telemetry child once deadlocked after a fork; the `dagster` process then waited 21
minutes at exit) does not hold a process of the product at exit (resources/process_exit.py), neither the main
process nor a multiprocessing child (a step process), which clears the finalizers it inherits.

Shown red once: with `register()`/`register_after_fork` taken out of resources/process_exit.py, both cases ran into
the 120 s timeout below (Python's multiprocessing joins a daemonic child without a timeout at exit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import user_env

ROOT = Path(__file__).resolve().parents[2]


def _run_until_it_exits(script: Path, text: str, where: str,
                        env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    """Runs `text` as a script with argument `where`; fails the test when the process has not exited 120 s later."""
    script.write_text(text)
    proc = subprocess.Popen([sys.executable, str(script), where], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the process did not exit within 120 s of finishing:\n{out}\n{err[-2000:]}") from None
    return proc, out, err

# Both scripts end the same way: `leave` runs in the main process, or in a (non-daemonic) multiprocessing child, as
# Dagster runs a step.
IN_MAIN_OR_STEP = textwrap.dedent('''
    if __name__ == "__main__":
        if sys.argv[1] == "main":
            {leave}()
        else:
            step = multiprocessing.get_context("fork").Process(target={leave})
            step.start()
            step.join()
            print("step exited", step.exitcode, flush=True)
''')

SCRIPT = textwrap.dedent('''
    import multiprocessing, os, signal, sys, time

    import batch_assets  # the product: what every product process imports first

    def stuck(ready):
        # a child whose SIGTERM handler never runs, like one deadlocked on a lock copied locked by fork()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ready.set()
        time.sleep(3600)

    def leave_a_stuck_child():
        context = multiprocessing.get_context("fork")
        ready = context.Event()
        child = context.Process(target=stuck, args=(ready,), daemon=True)
        child.start()
        assert ready.wait(60)
        print(child.pid, flush=True)
''') + IN_MAIN_OR_STEP.format(leave="leave_a_stuck_child")


@pytest.mark.parametrize("where", ["main", "step"])
def test_a_stuck_daemonic_child_does_not_hold_a_finished_process(tmp_path: Path, where: str) -> None:
    proc, out, err = _run_until_it_exits(tmp_path / "leaves_a_child.py", SCRIPT, where, user_env())
    assert proc.returncode == 0, err[-3000:]
    child = int(out.split()[0])
    assert "killed daemonic child process(es)" in err and str(child) in err, err[-2000:]
    if where == "step":
        assert "step exited 0" in out
    state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{child}").exists() \
        else "gone"
    assert state in ("gone", "Z"), state


THREAD_SCRIPT = textwrap.dedent('''
    import multiprocessing, sys, threading, time

    import batch_assets

    def leave_a_stuck_thread():
        # a library's non-daemon thread that never ends (Python joins it at exit, without a timeout)
        threading.Thread(target=time.sleep, args=(3600,), name="stuck-library-thread").start()
        print("done", flush=True)
''') + IN_MAIN_OR_STEP.format(leave="leave_a_stuck_thread")


@pytest.mark.parametrize("where", ["main", "step"])
def test_a_stuck_non_daemon_thread_does_not_hold_a_finished_process(tmp_path: Path, where: str) -> None:
    """Shown red once: without the `threading._register_atexit` hook both cases ran into the 120 s timeout."""
    env = user_env(BATCH_EXIT_STUCK_AFTER_S="2")  # the default 60 s is for real programs
    proc, out, err = _run_until_it_exits(tmp_path / "leaves_a_thread.py", THREAD_SCRIPT, where, env)
    assert "done" in out
    assert "still held by" in err and "stuck-library-thread" in err, err[-2000:]
    if where == "main":
        assert proc.returncode == 1  # ended, and says it did not end cleanly
    else:
        assert "step exited 1" in out and proc.returncode == 0, (out, err[-2000:])
