"""docs/launch-paths.md's commands, run as written (read from the page) against a throwaway instance that uses the
project's dagster.yaml: the terminal runs publish their partitions, the backfill commands queue the runs the daemon
would start (tests/test_daemon_launches.py starts them under a real `dagster dev`), and the pool commands set and
show a limit."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from tests.daemon_helpers import DAGSTER, ROOT, dagster_home
from tests.test_docs_commands import documented_commands

pytestmark = pytest.mark.slow


def _page_commands() -> list[str]:
    return [cmd for page, cmd in documented_commands() if page == "docs/launch-paths.md"]


def _run(command: str, env: dict[str, str]) -> str:
    words = shlex.split(command)
    assert words[0] == "dagster"
    proc = subprocess.run([DAGSTER, *words[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def test_launch_path_commands_run_as_written(tmp_path: Path) -> None:
    commands = _page_commands()
    assert len(commands) == 6, commands  # the page's two terminal runs, two backfills, two pool commands
    home, store = dagster_home(tmp_path / "home"), tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != "BATCH_PIPELINES_DIR"}
    env.update(DAGSTER_HOME=str(home), BATCH_STORAGE_ROOT=str(store))

    materialize = [c for c in commands if c.startswith("dagster asset materialize")]
    backfills = [c for c in commands if c.startswith("dagster job backfill")]
    pools = [c for c in commands if c.startswith("dagster instance concurrency")]
    assert len(materialize) == 2 and len(backfills) == 2 and len(pools) == 2

    for command in materialize:
        _run(command, env)
    days = ["2026-11-20", *(f"2026-11-0{d}" for d in range(1, 8))]
    for day in days:
        table = pq.read_table(store / "daily_review_sentiment" / "output" / f"{day}.parquet")
        assert table.num_rows == 40 and table.column("sentiment").null_count == 0, day
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        # the range ran as ONE run: the model loaded once for seven days
        assert {r.tags.get("dagster/asset_partition_range_start") for r in runs} >= {"2026-11-01"}

    for command in backfills:
        _run(command, env)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        queued = [r for r in instance.get_runs() if r.tags.get("dagster/backfill")]
        # dagster.yaml queues runs: the daemon (dagster dev / the deployment's daemon) starts them
        assert queued and all(r.status == dg.DagsterRunStatus.QUEUED for r in queued)
        partitions = {r.tags.get("dagster/partition") for r in queued}
        assert {"2026-11-01", "2026-11-03", "2026-11-05", "2026-11-07"} <= partitions, partitions

    _run(pools[0], env)
    shown = _run(pools[1], env)
    assert "endpoint:api.openai.com" in shown and "2" in shown.split("endpoint:api.openai.com", 1)[1][:80], shown
