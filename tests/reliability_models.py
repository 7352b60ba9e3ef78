"""Small model classes for the reliability tests, loaded through the real `custom` provider (class_path)."""

from __future__ import annotations

import hashlib
from typing import Any


class TokenCheckingModel:
    """Needs a credential nested in its config, like a client library would: {"auth": {"headers": {"token": ...}}}.

    It refuses a token that is not the expected one (by hash, so the test source holds no secret), and answers
    with the text's length -- the output never contains the token.
    """

    def __init__(self, auth: dict[str, Any], expect_sha256: str, fail_loudly: bool = False) -> None:
        token = auth["headers"]["token"]
        if not isinstance(token, str):
            raise TypeError(f"token arrived as {type(token).__name__}, not the resolved string")
        if fail_loudly:  # a careless library that puts the credential into its error message
            raise ValueError(f"could not log in with token {token}")
        if hashlib.sha256(token.encode()).hexdigest() != expect_sha256:
            raise ValueError("wrong token")

    def __call__(self, batch: dict[str, list[Any]]) -> list[int]:
        return [len(t or "") for t in batch["text"]]


class TextLength:
    """A deterministic, dependency-free model: the length of each text."""

    def __call__(self, batch: dict[str, list[Any]]) -> list[int]:
        return [len(t or "") for t in batch["text"]]


class SlowTextLength:
    """`TextLength` that takes its time, can pull the plug on a process at its Nth call (to fail storage in the
    middle of a stage), and can hold its first call until a gate file exists (so a test decides when two runs of
    one partition overlap, instead of hoping their timing does): it writes `<gate>.entered`, then waits."""

    calls = 0

    def __init__(self, seconds: float = 0.2, kill_pid_env: str | None = None, kill_at_call: int = 0,
                 gate: str | None = None) -> None:
        self.seconds, self.kill_pid_env, self.kill_at_call, self.gate = seconds, kill_pid_env, kill_at_call, gate

    def __call__(self, batch: dict[str, list[Any]]) -> list[int]:
        import os
        import signal
        import time
        from pathlib import Path

        SlowTextLength.calls += 1
        if self.kill_pid_env and SlowTextLength.calls == self.kill_at_call:
            os.kill(int(os.environ[self.kill_pid_env]), signal.SIGKILL)
        if self.gate and SlowTextLength.calls == 1:
            Path(f"{self.gate}.entered").touch()
            deadline = time.monotonic() + 300
            while not Path(self.gate).exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {self.gate} never opened")
                time.sleep(0.1)
        time.sleep(self.seconds)
        return [len(t or "") for t in batch["text"]]
