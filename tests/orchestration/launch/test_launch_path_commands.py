"""docs/launch-paths.md's commands, run as written (read from the page) against a throwaway instance that uses the
project's dagster.yaml: the terminal runs (`dg launch`) publish their partitions without a BetaWarning, and the pool
commands set and show a limit. The page's backfill commands need the daemon: tests/orchestration/launch/test_daemon_launches.py runs
them under the real `make ui`."""

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
    if words[0] == "dagster":
        words[0] = DAGSTER
    else:
        assert words[0] == ".venv/bin/dg", command
        words[0] = str(Path(DAGSTER).with_name("dg"))
    proc = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def test_launch_path_commands_run_as_written(tmp_path: Path) -> None:
    commands = _page_commands()
    assert len(commands) == 6, commands  # the page's two terminal runs, two backfills, two pool commands
    home, store = dagster_home(tmp_path / "home"), tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != "BATCH_PIPELINES_DIR"}
    env.update(DAGSTER_HOME=str(home), BATCH_STORAGE_ROOT=str(store))

    launches = [c for c in commands if c.startswith(".venv/bin/dg launch")]
    backfills = [c for c in commands if "backfill " in c]
    pools = [c for c in commands if c.startswith("dagster instance concurrency")]
    assert len(launches) == 2 and len(backfills) == 2 and len(pools) == 2

    for command in launches:
        out = _run(command, env)
        assert "BetaWarning" not in out, out[-2000:]
    days = ["2026-11-20", *(f"2026-11-0{d}" for d in range(1, 8))]
    for day in days:
        table = pq.read_table(store / "daily_review_sentiment" / "output" / f"{day}.parquet")
        assert table.num_rows == 40 and table.column("sentiment").null_count == 0, day
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        # the range ran as ONE run: the model loaded once for seven days
        assert {r.tags.get("dagster/asset_partition_range_start") for r in runs} >= {"2026-11-01"}

    _run(pools[0], env)
    shown = _run(pools[1], env)
    assert "endpoint:api.openai.com" in shown and "2" in shown.split("endpoint:api.openai.com", 1)[1][:80], shown
