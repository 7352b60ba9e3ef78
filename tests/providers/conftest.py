"""Fixtures for provider tests. Helpers live in their own modules (llama_server.py, fault_proxy.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.providers.llama_server import LlamaServer, LlamaServerUnavailable, check_available, start_llama_server


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """A real llama.cpp OpenAI-compatible server with SmolLM2-135M on loopback, shared by the session.

    Missing llama-cpp-python skips the tests on a workstation but fails them under CI, where it must be installed."""
    try:
        check_available()
    except LlamaServerUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the llama.cpp server cannot start: {exc}")
        pytest.skip(f"llama.cpp server unavailable: {exc}")
    server = start_llama_server()
    try:
        yield server
    finally:
        server.stop()
