"""The Batch API stand-in (standin.py) as a process of its own, so a test can kill and restart it and a run launched
through the CLI can reach it; its state lives in the test's tmp_path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-standin-test-key-0123456789"


class StandinProcess:
    def __init__(self, state: Path, log: Path, *args: str):
        self.state, self.log, self.args = state, log, args
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> StandinProcess:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.batch_api.standin", "--port", str(self.port), "--state", str(self.state),
                 "--api-key", API_KEY, *self.args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.stats()
                return self
            except OSError:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the stand-in did not start:\n" + self.log.read_text()[-3000:]
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        """Killed (SIGKILL, as a crashed host) and started again on the same port and state."""
        self.stop(signal.SIGKILL)
        self.start()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as answer:
            return json.loads(answer.read())

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/_standin/stats")

    def advance(self, seconds: float = 0.0, speed: float | None = None) -> float:
        body: dict[str, Any] = {"seconds": seconds}
        if speed is not None:
            body["speed"] = speed
        return self._call("POST", "/_standin/advance", body)["now"]

    def faults(self, **faults: int) -> None:
        self._call("POST", "/_standin/faults", faults)

    def calls(self, route: str) -> int:
        return self.stats()["calls"].get(route, 0)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandinProcess]:
    proc = StandinProcess(tmp_path / "standin-state", tmp_path / "standin.log").start()
    try:
        yield proc
    finally:
        proc.stop()


def sdk_client(standin: StandinProcess):
    import openai

    return openai.OpenAI(api_key=API_KEY, base_url=standin.url, max_retries=0)
