"""A finished process exits: no child process or thread a library left behind can hold it at exit.

At exit, Python's multiprocessing sends SIGTERM to every daemonic child and then joins every child without a
timeout (`multiprocessing.util._exit_function`, in the main process at exit and in every multiprocessing child when
its target returns). A child that cannot act on SIGTERM (a fork of a multithreaded process deadlocked on a lock that
another thread held at the fork, as OpenVINO's telemetry child once did offline; or one that inherited a handler
which only sets a flag) then holds its parent forever: a `dagster` run process waited 21 minutes, and on Kubernetes
a step pod that never exits holds its node.

Daemonic children are the ones their owner declared disposable at exit, so here they get what Python gives them
plus a bound: a multiprocessing finalizer that runs just before that join (priority >= 0 finalizers run first)
sends SIGTERM, waits EXIT_GRACE_S, then SIGKILLs any still alive, and says so on stderr. Non-daemonic children
(Dagster's own step processes) are waited for as before. Registered on import, and again in every multiprocessing
child.

A non-daemon thread that never ends holds a process the same way (Python joins every one at exit, without a
timeout). When the program has finished (the interpreter starts joining its threads), a watchdog starts; if the
process is still there `BATCH_EXIT_STUCK_AFTER_S` seconds later (default 60), it prints what holds it (each
non-daemon thread with its stack, each child process) on stderr and ends the process with status 1: the work was
done (a run's result is already in the instance), but the process did not end cleanly, which its caller should
see rather than wait forever.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
import traceback

EXIT_GRACE_S = 5.0
STUCK_EXIT_ENV, STUCK_EXIT_DEFAULT_S = "BATCH_EXIT_STUCK_AFTER_S", 60.0
_FINALIZER_PRIORITY = 100  # before any other priority >= 0 finalizer, all before multiprocessing's join


def stop_daemonic_children(grace_s: float = EXIT_GRACE_S) -> list[int]:
    """SIGTERM, then after `grace_s` SIGKILL, every daemonic child still alive; the pids that needed SIGKILL."""
    children = [p for p in multiprocessing.active_children() if p.daemon]
    for child in children:
        child.terminate()
    killed = []
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            killed.append(child.pid)
            child.kill()
            child.join(grace_s)
    if killed:
        print(f"batch_assets: killed daemonic child process(es) {killed} still running {grace_s:g} s after SIGTERM "
              f"at exit (a library's helper; the process exits instead of waiting for it)", file=sys.stderr)
    return killed


def _held_by() -> str:
    frames = sys._current_frames()
    lines = []
    for thread in threading.enumerate():
        if thread.daemon or thread is threading.main_thread() or not thread.is_alive():
            continue
        stack = "".join(traceback.format_stack(frames[thread.ident])) if thread.ident in frames else ""
        lines.append(f"thread {thread.name!r}:\n{stack}")
    lines += [f"child process {child.pid} ({child.name})" for child in multiprocessing.active_children()]
    return "\n".join(lines) or "(nothing Python can see: a C library's thread or child)"


def _exit_when_stuck() -> None:
    """Started when the program has finished: end the process if it has not ended by itself in time."""
    try:
        after_s = float(os.environ.get(STUCK_EXIT_ENV) or STUCK_EXIT_DEFAULT_S)
    except ValueError:
        after_s = STUCK_EXIT_DEFAULT_S

    def watch() -> None:
        time.sleep(after_s)
        print(f"batch_assets: the program finished {after_s:g} s ago but the process is still held by:\n"
              f"{_held_by()}\nending it with status 1 ({STUCK_EXIT_ENV} sets the wait)", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)

    try:
        threading.Thread(target=watch, name="batch-assets-exit-watchdog", daemon=True).start()
    except RuntimeError:  # the interpreter no longer starts threads: nothing more can be done from Python
        pass


def _register(_owner: object = None) -> None:
    multiprocessing.util.Finalize(None, stop_daemonic_children, exitpriority=_FINALIZER_PRIORITY)


class _Owner:
    """Kept alive by this module: multiprocessing holds after-fork hooks by a weak reference to an owner."""


_OWNER = _Owner()
_register()
# Called just before the interpreter joins the non-daemon threads (the hook concurrent.futures uses for the same
# moment; CPython-internal, hence the guard). A fork keeps the list; a spawned child imports this module again.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_exit_when_stuck)
# A multiprocessing child clears the finalizers it inherited, then runs the after-fork hooks: register again there.
multiprocessing.util.register_after_fork(_OWNER, _register)
