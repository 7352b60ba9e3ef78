"""The Batch API stand-ins (openai_api/standin.py, anthropic_api/anthropic_standin.py) as processes of their own, so
a test can kill and restart one and a run launched through the CLI can reach it; their state lives in the test's
tmp_path. Here, not in openai_api/, so that the tests of both providers' batch paths reach these fixtures.

Provider tests also use the session fixtures of tests/conftest.py (`llama_server`, `s3_server`); other helpers live
in their own modules beside their users (openai_api/llama_server.py, openai_api/fault_proxy.py,
vllm_engine/vllm_standin.py)."""

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
    def __init__(self, state: Path, log: Path, *args: str, module: str = "tests.resources.openai_api.standin"):
        self.state, self.log, self.args, self.module = state, log, args, module
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root(self) -> str:
        """The root without /v1: Anthropic's SDK takes its base_url so (it adds /v1/messages itself)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StandinProcess:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--port", str(self.port), "--state", str(self.state),
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


def _running(proc: StandinProcess) -> Iterator[StandinProcess]:
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandinProcess]:
    yield from _running(StandinProcess(tmp_path / "standin-state", tmp_path / "standin.log"))


@pytest.fixture(autouse=True)
def standin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins' key, for specs that read it as {env: STANDIN_KEY} at run time."""
    monkeypatch.setenv("STANDIN_KEY", API_KEY)


def rows(texts: dict[str, str]) -> list[dict]:
    return [{"doc_id": k, "text": v} for k, v in texts.items()]


def inferred_metadata(instance: Any, name: str) -> dict:
    import dagster as dg

    event = instance.get_latest_materialization_event(dg.AssetKey([name, "inferred"]))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def step_error(result: Any) -> str:
    """The message of a run's first step failure (its cause's, where the step wrapped it)."""
    import dagster as dg

    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    error = failure.step_failure_data.error
    return error.cause.message if error.cause else error.message


def sdk_client(standin: StandinProcess):
    import openai

    return openai.OpenAI(api_key=API_KEY, base_url=standin.url, max_retries=0)


@pytest.fixture
def anthropic_standin(tmp_path: Path) -> Iterator[StandinProcess]:
    """Anthropic's Messages API and Message Batches (anthropic_api/anthropic_standin.py), its own process."""
    yield from _running(StandinProcess(tmp_path / "anthropic-state", tmp_path / "anthropic-standin.log",
                                       module="tests.resources.anthropic_api.anthropic_standin"))


def anthropic_client(standin: StandinProcess):
    import anthropic

    return anthropic.Anthropic(api_key=API_KEY, base_url=standin.root, max_retries=0)
