"""Progress of one partition through the infer stage, logged at a steady cadence with rows/s and an ETA.

A partition on a CPU LLM can take minutes; a line per chunk would flood a fast run, and none at all leaves the user
staring at a silent step. So a line is logged at most every `every_s` seconds (10 by default), and only when another
5% of the partition is done since the last line, or a minute (6 x `every_s`) has passed without one: a short
partition logs every 10 s, an hours-long one every 5% with a heartbeat each minute. One summary line closes the
partition. Lines go to `context.log`: the run's log in the UI and on the CLI.

The count comes from `InferStats.on_rows` (the one place the infer loop reports completed rows); the total from
the prepared Parquet file's footer, so nothing is read twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

STEP_FRACTION = 0.05
HEARTBEAT_FACTOR = 6


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class PartitionProgress:
    """Counts rows done for one partition and logs `label: done/total rows (pct), rows/s, ETA` at a cadence.

    `log` is anything with `.info(str)` (Dagster's `context.log`, a `logging.Logger`); `clock` is injectable so
    tests need not wait.
    """

    def __init__(
        self,
        log: Any,
        label: str,
        total_rows: int,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log = log or logging.getLogger(__name__)
        self.label = label
        self.total = max(0, int(total_rows))
        self.every_s = every_s
        self.clock = clock
        self.done = 0
        self.lines = 0
        self._start = clock()
        self._last_line_at = self._start
        self._last_line_done = 0

    def rate(self, now: float | None = None) -> float:
        elapsed = (now if now is not None else self.clock()) - self._start
        return self.done / elapsed if elapsed > 0 else 0.0

    def add(self, rows: int) -> None:
        """`rows` more rows are complete (with an output or a row error)."""
        self.done += rows
        if self.done >= self.total:
            return  # the summary line says it
        now = self.clock()
        since = now - self._last_line_at
        step_done = self.done - self._last_line_done >= self.total * STEP_FRACTION
        if since >= self.every_s and (step_done or since >= HEARTBEAT_FACTOR * self.every_s):
            self._log_line(now)

    def _log_line(self, now: float) -> None:
        rate = self.rate(now)
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = format_duration((self.total - self.done) / rate) if rate > 0 else "unknown"
        self.log.info(
            f"{self.label}: {self.done}/{self.total} rows ({pct:.0f}%), {rate:.1f} rows/s, ETA {eta}"
        )
        self.lines += 1
        self._last_line_at = now
        self._last_line_done = self.done

    def finish(self, rows_with_errors: int | None = None) -> None:
        now = self.clock()
        elapsed = now - self._start
        errors = "" if rows_with_errors is None else f", {rows_with_errors} row errors"
        self.log.info(
            f"{self.label}: done, {self.done}/{self.total} rows in {format_duration(elapsed)} "
            f"({self.rate(now):.1f} rows/s){errors}"
        )
        self.lines += 1
