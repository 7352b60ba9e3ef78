"""Stopping servers that tests start in their own process group (Popen(..., start_new_session=True))."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the whole group (a server and its children), SIGKILL it if it is still there after `grace_s`."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)
