"""The real `dagster dev` (webserver + daemon) runs a pipeline's `automation: on_missing`: once the automation
sensor is evaluating, each dynamic partition added is materialized by a run it launches, every row inferred once;
a partition already made from the same file and spec elsewhere (a CLI run against another instance) is launched
too, since Dagster's condition only knows this instance, and its run skips every stage without a model call; later
evaluations launch nothing."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest
import yaml

from batch_assets.spec import parse_spec
from tests.conftest import DAEMON_GROUP, free_port, run_pipeline
from tests.daemon_helpers import (
    dagster_dev_command, dagster_home, daily_spec, dev_server, graphql, log_tail, model_trace, wait_for, wait_ready,
    write_day,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts dagster dev

TICKS = """query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) { __typename
  ... on Sensor { sensorState { status ticks(limit: 50) { id status timestamp } } } } }"""


def test_on_missing_under_dagster_dev_materializes_each_new_partition_once(tmp_path: Path) -> None:
    pipelines, store, days, model_log = tmp_path / "pipelines", tmp_path / "store", tmp_path / "days", \
        tmp_path / "model.log"
    pipelines.mkdir()
    raw = daily_spec(days, model_log, partitioning={"kind": "dynamic"},
                     automation={"condition": "on_missing", "interval_seconds": 5})
    (pipelines / "daily_docs.yaml").write_text(yaml.safe_dump(raw))
    for key in ("made-elsewhere", "new"):
        write_day(days, key)
    spec = parse_spec(raw)
    # made before, by a CLI run against another instance: its lineage records are in the storage
    elsewhere = dg.DagsterInstance.ephemeral()
    elsewhere.add_dynamic_partitions(spec.name, ["made-elsewhere"])
    run_pipeline(spec, store, ["made-elsewhere"], instance=elsewhere)
    assert sorted(model_trace(model_log)[1]) == [f"doc-made-elsewhere-{i}" for i in range(3)]

    home, log, port = dagster_home(tmp_path / "home"), tmp_path / "dev.log", free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store)}
    with (dev_server(dagster_dev_command(port), env, log) as proc,
          dg.DagsterInstance.from_config(str(home)) as instance):
        location = wait_ready(port, proc, log)
        selector = {"repositoryLocationName": location, "repositoryName": "__repository__",
                    "sensorName": "daily_docs_automation_sensor"}

        def ticks() -> list[dict]:
            found = graphql(port, TICKS, {"selector": selector})["sensorOrError"]
            assert found["__typename"] == "Sensor", found
            assert found["sensorState"]["status"] == "RUNNING", found
            return [t for t in found["sensorState"]["ticks"] if t["status"] in ("SUCCESS", "SKIPPED")]

        wait_for("the automation sensor's first evaluation", ticks, log, 120)
        instance.add_dynamic_partitions(spec.name, ["made-elsewhere", "new"])

        def runs():
            return [r for r in instance.get_runs() if any(k.path[0] == spec.name for k in r.asset_selection or [])]

        def all_finished():
            done = [r for r in runs() if r.is_finished]
            return done if done and len(done) == len(runs()) and {
                k for r in done for k in _partitions(r)} >= {"made-elsewhere", "new"} else None

        finished = wait_for("the automation's runs to finish", all_finished, log, 240)
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in finished), log_tail(log, 4000)
        assert all(r.tags.get("batch/launched_by") == "automation" for r in finished), [r.tags for r in finished]
        # every row inferred once across both instances: the automation's run of the partition made elsewhere
        # skipped every stage
        inferred = model_trace(model_log)[1]
        assert sorted(inferred) == sorted(f"doc-{k}-{i}" for k in ("made-elsewhere", "new") for i in range(3))
        assert (store / spec.name / "output" / "new.parquet").exists()
        [event] = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey([spec.name, "inferred"]), asset_partitions=["made-elsewhere"]), limit=1).records
        assert "skipped" in event.asset_materialization.metadata

        # later evaluations launch nothing: both partitions are materialized in this instance now
        seen = len(ticks())
        wait_for("two more automation evaluations", lambda: len(ticks()) >= seen + 2, log, 120)
        assert len(runs()) == len(finished), [r.tags for r in runs()]
        assert len(model_trace(model_log)[1]) == 6


def _partitions(run: dg.DagsterRun) -> set[str]:
    tags = run.tags
    if "dagster/partition" in tags:
        return {tags["dagster/partition"]}
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    return {start, end} - {None}
