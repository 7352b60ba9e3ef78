"""Start and stop a real llama.cpp OpenAI-compatible server (llama-cpp-python) with the SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class LlamaServerUnavailable(RuntimeError):
    """llama-cpp-python or the GGUF model is not installed here."""


@dataclass
class LlamaServer:
    process: subprocess.Popen[bytes]
    root: str  # http://127.0.0.1:PORT
    log_path: Path

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path() -> str:
    from batch_assets.resources.hf.models import smollm2_location

    folder, name = smollm2_location()
    return os.path.join(folder, name)


def check_available() -> None:
    """Raise LlamaServerUnavailable saying what to install when the server cannot start here."""
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise LlamaServerUnavailable(
            "llama-cpp-python is not installed: `make install-test` (or CMAKE_ARGS=-DGGML_NATIVE=OFF pip install "
            "'llama-cpp-python[server]==0.3.36', a ~5 min source build)"
        )
    try:
        model_path()
    except (ImportError, FileNotFoundError) as exc:
        raise LlamaServerUnavailable(str(exc)) from exc


def start_llama_server(ready_timeout_s: float = 60.0, embedding: bool = True) -> LlamaServer:
    """`python -m llama_cpp.server` on a free loopback port; returns once /v1/models answers.

    `embedding=True` also serves /v1/embeddings (chat generation is unaffected)."""
    check_available()
    port = _free_port()
    log_path = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", model_path(),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "2048",
        "--verbose", "false",
    ]
    if embedding:
        cmd += ["--embedding", "true"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = LlamaServer(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited with {process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.base_url + "/models", timeout=2) as resp:
                if resp.status == 200 and json.loads(resp.read()).get("data") is not None:
                    return server
        except OSError:
            pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"llama.cpp server not ready after {ready_timeout_s:.0f}s:\n{server.log_tail()}")
