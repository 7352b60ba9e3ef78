"""Progress lines while a partition is inferred: steady cadence, rows done / total, rows/s, ETA, a summary line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dagster as dg

from batch_assets.orchestration.assets.progress import PartitionProgress, format_duration
from tests.conftest import make_spec, run_pipeline, write_csv

LINE = re.compile(r"^(?P<label>\S+ \[\S+\]): (?P<done>\d+)/(?P<total>\d+) rows \((?P<pct>\d+)%\), "
                  r"(?P<rate>[\d.]+) rows/s, ETA (?P<eta>\S+)$")
DONE = re.compile(r"^(?P<label>\S+ \[\S+\]): done, (?P<done>\d+)/(?P<total>\d+) rows in \S+ \([\d.]+ rows/s\)"
                  r", (?P<errors>\d+) row errors$")


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cadence_every_10s_when_fast_heartbeat_each_minute_when_slow() -> None:
    log, clock = Lines(), Clock()
    progress = PartitionProgress(log, "p/inferred [k]", total_rows=1000, every_s=10, clock=clock)
    for _ in range(25):  # 10 rows/s, reported every second: a line every 10 s, not one per report
        clock.now += 1
        progress.add(10)
    assert log.lines == [
        "p/inferred [k]: 100/1000 rows (10%), 10.0 rows/s, ETA 1m30s",
        "p/inferred [k]: 200/1000 rows (20%), 10.0 rows/s, ETA 1m20s",
    ]

    log, clock = Lines(), Clock()
    slow = PartitionProgress(log, "p/inferred [k]", total_rows=10_000, every_s=10, clock=clock)
    for _ in range(130):  # 1 row/s: 5% (500 rows) is far off, so a heartbeat line each minute
        clock.now += 1
        slow.add(1)
    assert log.lines == [
        "p/inferred [k]: 60/10000 rows (1%), 1.0 rows/s, ETA 2h45m",
        "p/inferred [k]: 120/10000 rows (1%), 1.0 rows/s, ETA 2h44m",
    ]
    clock.now += 10
    slow.add(10_000 - slow.done)
    slow.finish(rows_with_errors=3)
    summary = DONE.match(log.lines[-1])
    assert summary and summary["done"] == "10000" and summary["errors"] == "3"
    assert slow.lines == 3


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.4, 59, 61, 3599, 3600 * 2 + 120)] == ["0s", "59s", "1m01s", "59m59s", "2h02m"]


class Echo:
    def __call__(self, batch: dict[str, list[Any]]) -> list[str]:
        return [t.upper() for t in batch["text"]]


def test_progress_lines_in_the_run_log(tmp_path: Path) -> None:
    """A partition of 40 rows in 10 chunks, cadence 0 so the test does not wait: a line per chunk, in the run log
    Dagster keeps (what the UI and the CLI show)."""
    data = tmp_path / "data"
    write_csv(data / "big.csv", ["id", "text"], [[f"r{i}", f"row {i}"] for i in range(40)])
    spec = make_spec({
        "name": "shout",
        "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["id", "text"]},
        "partitioning": {"kind": "static", "keys": ["big"]},
        "prepare": {"id_column": "id", "input_columns": ["text"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": "tests.orchestration.assets.test_progress:Echo"}},
        "runtime": {"chunk_rows": 4, "progress_every_s": 0},
    }, data)
    instance = dg.DagsterInstance.ephemeral()

    result = run_pipeline(spec, tmp_path / "store", ["big"], instance=instance)

    assert result.success
    messages = [e.user_message for e in instance.all_logs(result.run_id) if "shout/inferred [big]" in (e.user_message or "")]
    progress = [LINE.match(m) for m in messages if LINE.match(m)]
    assert len(progress) == 9  # after each of the first 9 chunks; the 10th is the summary
    done = [int(m["done"]) for m in progress]
    assert done == list(range(4, 40, 4))  # monotonic rows done
    assert all(m["total"] == "40" and m["eta"] != "unknown" for m in progress)
    summary = DONE.match(messages[-1])
    assert summary and summary["done"] == "40" and summary["errors"] == "0"
