"""Model classes for the cluster stand-in tests, loaded in step pods through the real `custom` provider."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


class PacedCountingModel:
    """Writes 'rows <ids>' per call to a file (so a test counts every row the model was paid for, across pods and
    retries) and takes `seconds` per call (so a test can evict its pod mid-partition)."""

    def __init__(self, log: str, seconds: float = 0.5) -> None:
        self.log, self.seconds = Path(log), seconds

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        texts = batch["text"]
        with self.log.open("a") as f:
            f.write("rows " + " ".join(texts) + "\n")
        time.sleep(self.seconds)
        return {"prediction": [len(t) for t in texts]}


def rows_paid(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [t for line in lines if line.startswith("rows ") for t in line.split()[1:]]
