"""The real `dagster dev` (webserver + daemon) runs a pipeline whose source is an asset of the user's project: the
user materializes their asset for a day through the CLI, the daemon's automation sensor launches the pipeline for
that day once (no file sensor), every row inferred once; the user materializes the day again with byte-identical
output and the pipeline's run pays nothing (no model call); changed bytes are inferred once more."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import DAEMON_GROUP, free_port
from tests.daemon_helpers import (
    DAGSTER, ROOT, dagster_home, daily_spec, dev_server, log_tail, model_trace, wait_for, wait_ready,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts dagster dev

DAY = "2026-11-20"
USER_PROJECT = '''
import json
from pathlib import Path

import dagster as dg
import yaml

from batch_assets.orchestration.upstream_checks import check_upstream_sources
from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_definitions
from batch_assets.orchestration.launch.paths import launch_definitions
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage

FEED, DAYS = Path({feed!r}), Path({days!r})


@dg.asset(partitions_def=dg.DailyPartitionsDefinition(start_date="2026-11-01"))
def raw_app_reviews(context) -> None:
    """The user's own daily asset: one JSONL file per day (here copied from a feed the test controls)."""
    DAYS.mkdir(parents=True, exist_ok=True)
    (DAYS / f"{{context.partition_key}}.jsonl").write_bytes((FEED / f"{{context.partition_key}}.jsonl").read_bytes())


spec = parse_spec(yaml.safe_load(Path({spec_file!r}).read_text()))
defs = check_upstream_sources(dg.Definitions.merge(
    dg.Definitions(assets=[raw_app_reviews], resources={{STORAGE_KEY: ArrowStorage(root={store!r})}},
                   executor=dg.in_process_executor),
    build_pipeline_definitions(spec), launch_definitions(spec)))
'''


def feed(folder: Path, day: str, suffix: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"doc_id": f"{day}-{i}", "text": f"review-{day}-{i}{suffix}"} for i in range(3)]
    (folder / f"{day}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_materializing_the_upstream_asset_runs_the_pipeline_once_per_content(tmp_path: Path) -> None:
    days, store, log_file = tmp_path / "days", tmp_path / "store", tmp_path / "model.log"
    raw = daily_spec(days, log_file, automation={"condition": "on_upstream_update", "interval_seconds": 5})
    raw["source"]["asset"] = "raw_app_reviews"
    spec_file = tmp_path / "daily_docs.yaml"
    spec_file.write_text(json.dumps(raw))
    defs_file = tmp_path / "user_project.py"
    defs_file.write_text(textwrap.dedent(USER_PROJECT.format(
        feed=str(tmp_path / "feed"), days=str(days), spec_file=str(spec_file), store=str(store))))
    feed(tmp_path / "feed", DAY)

    home, log, port = dagster_home(tmp_path / "home"), tmp_path / "dev.log", free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    command = [DAGSTER, "dev", "-f", str(defs_file), "-h", "127.0.0.1", "-p", str(port)]

    def materialize_upstream() -> None:  # as the user does, through Dagster's CLI, against the same instance
        done = subprocess.run([DAGSTER, "asset", "materialize", "-f", str(defs_file), "--select", "raw_app_reviews",
                               "--partition", DAY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    with (dev_server(command, env, log) as proc, dg.DagsterInstance.from_config(str(home)) as instance):
        wait_ready(port, proc, log)

        def pipeline_runs() -> list[dg.DagsterRun]:
            return [r for r in instance.get_runs() if any(k.path[0] == "daily_docs" for k in r.asset_selection or [])]

        def finished(count: int):
            def check():
                runs = pipeline_runs()
                return runs if len(runs) >= count and all(r.is_finished for r in runs) else None
            return check

        materialize_upstream()
        [first] = wait_for("the automation's run of the day", finished(1), log, 240)
        assert first.status == dg.DagsterRunStatus.SUCCESS, log_tail(log, 4000)
        assert first.tags.get("batch/launched_by") == "automation" and first.tags.get("dagster/partition") == DAY
        assert sorted(model_trace(log_file)[1]) == [f"review-{DAY}-{i}" for i in range(3)]
        assert (store / "daily_docs" / "output" / f"{DAY}.parquet").exists()

        materialize_upstream()  # the same day again, byte-identical output
        runs = wait_for("the automation's run after the re-materialization", finished(2), log, 240)
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), log_tail(log, 4000)
        assert len(model_trace(log_file)[1]) == 3, "identical upstream bytes were inferred again"
        [event] = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(["daily_docs", "inferred"]), asset_partitions=[DAY]), limit=1).records
        assert "skipped" in event.asset_materialization.metadata

        feed(tmp_path / "feed", DAY, suffix="!")  # the upstream's output changes
        materialize_upstream()
        runs = wait_for("the automation's run after the change", finished(3), log, 240)
        assert len(runs) == 3 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), log_tail(log, 4000)
        assert sorted(model_trace(log_file)[1][3:]) == [f"review-{DAY}-{i}!" for i in range(3)]
