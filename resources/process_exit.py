"""A finished process exits: no daemonic child process a library started can hold it at exit.

At exit, Python's multiprocessing sends SIGTERM to every daemonic child and then joins every child without a
timeout (`multiprocessing.util._exit_function`, in the main process at exit and in every multiprocessing child when
its target returns). A child that cannot act on SIGTERM (a fork of a multithreaded process deadlocked on a lock that
another thread held at the fork, as OpenVINO's telemetry child once did offline; or one that inherited a handler
which only sets a flag) then holds its parent forever: a `dagster` run process waited 21 minutes, and on Kubernetes
a step pod that never exits holds its node.

Daemonic children are the ones their owner declared disposable at exit, so here they get what Python gives them
plus a bound: a multiprocessing finalizer that runs just before that join (priority >= 0 finalizers run first)
sends SIGTERM, waits EXIT_GRACE_S, then SIGKILLs any still alive, and says so on stderr. Non-daemonic children
(Dagster's own step processes) are waited for as before. Registered on import, and again in every multiprocessing child.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import sys

EXIT_GRACE_S = 5.0
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


def _register(_owner: object = None) -> None:
    multiprocessing.util.Finalize(None, stop_daemonic_children, exitpriority=_FINALIZER_PRIORITY)


class _Owner:
    """Kept alive by this module: multiprocessing holds after-fork hooks by a weak reference to an owner."""


_OWNER = _Owner()
_register()
# A multiprocessing child clears the finalizers it inherited, then runs the after-fork hooks: register again there.
multiprocessing.util.register_after_fork(_OWNER, _register)
