"""Backfills through Dagster's own machinery (the UI's GraphQL mutations, the Python API, the daemon's backfill
iteration): single-run loads the model once, multi-run makes the declared number of runs, and a single-run backfill
that fails at partition k keeps 1..k-1 recorded so re-executing it from failure only does the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.daemon_helpers import (
    SYNC_LAUNCHER,
    daemon_workspace,
    daily_spec,
    model_trace,
    run_backfill_daemon,
    write_code_location,
    write_day,
)

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
STAGES = ("raw", "prepared", "inferred", "output")

LAUNCH_BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on UnauthorizedError { message }
  }
}"""

REEXECUTE_BACKFILL = """
mutation($params: ReexecutionParams!) {
  reexecutePartitionBackfill(reexecutionParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
  }
}"""


def _graphql(context, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    from dagster_graphql.test.utils import execute_dagster_graphql

    result = execute_dagster_graphql(context.create_request_context(), query, variables)
    assert not result.errors, result.errors
    payload = next(iter(result.data.values()))
    assert payload["__typename"] == "LaunchBackfillSuccess", payload
    return payload


def _launch_from_ui(context, name: str, days: list[str]) -> str:
    """What the UI's Materialize > backfill dialog sends for the pipeline's four assets."""
    params = {"partitionNames": days,
              "assetSelection": [{"path": [name, stage]} for stage in STAGES],
              "title": f"backfill {days[0]}..{days[-1]}"}
    return _graphql(context, LAUNCH_BACKFILL, {"params": params})["backfillId"]


def _materialized(instance, name: str) -> dict[str, set[str]]:
    return {stage: set(instance.get_materialized_partitions(dg.AssetKey([name, stage]))) for stage in STAGES}


@pytest.mark.slow
def test_single_run_backfill_loads_the_model_once(tmp_path: Path) -> None:
    """Three days, one run, one model load, with the default (multiprocess) executor of a real deployment."""
    data, log = tmp_path / "data", tmp_path / "model.log"
    for day in DAYS[:3]:
        write_day(data, day)
    spec = daily_spec(data, log)
    defs_file = write_code_location(tmp_path / "code", [spec], tmp_path / "store", in_process_executor=False)
    with dg.instance_for_test(overrides=SYNC_LAUNCHER) as instance, daemon_workspace(instance, defs_file) as context:
        backfill_id = _launch_from_ui(context, "daily_docs", DAYS[:3])
        run_backfill_daemon(context)
        runs = instance.get_runs()
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
        assert runs[0].tags["dagster/backfill"] == backfill_id
        assert (runs[0].tags["dagster/asset_partition_range_start"],
                runs[0].tags["dagster/asset_partition_range_end"]) == (DAYS[0], DAYS[2])
        assert _materialized(instance, "daily_docs") == {stage: set(DAYS[:3]) for stage in STAGES}
    loads, texts = model_trace(log)
    assert loads == 1
    assert sorted(texts) == sorted(f"doc-{d}-{i}" for d in DAYS[:3] for i in range(3))


@pytest.mark.slow
def test_multi_run_backfill_makes_the_declared_runs(tmp_path: Path) -> None:
    """Five days with max_partitions_per_run 2: three runs (2 + 2 + 1), launched through the Python API."""
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id
    from dagster._time import get_current_timestamp

    data, log = tmp_path / "data", tmp_path / "model.log"
    days = DAYS + ["2026-11-05"]
    for day in days:
        write_day(data, day)
    spec = daily_spec(data, log, backfill={"policy": "multi_run", "max_partitions_per_run": 2})
    defs_file = write_code_location(tmp_path / "code", [spec], tmp_path / "store")
    with dg.instance_for_test(overrides=SYNC_LAUNCHER) as instance, daemon_workspace(instance, defs_file) as context:
        asset_graph = context.create_request_context().asset_graph
        instance.add_backfill(PartitionBackfill.from_asset_partitions(
            backfill_id=make_new_backfill_id(),
            asset_graph=asset_graph,
            partition_names=days,
            asset_selection=[dg.AssetKey(["daily_docs", stage]) for stage in STAGES],
            backfill_timestamp=get_current_timestamp(),
            tags={},
            dynamic_partitions_store=instance,
            all_partitions=False,
            title=None,
            description=None,
            run_config=None,
        ))
        run_backfill_daemon(context)
        runs = instance.get_runs()
        assert len(runs) == 3 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        ranges = sorted((r.tags.get("dagster/asset_partition_range_start", r.tags.get("dagster/partition")),
                         r.tags.get("dagster/asset_partition_range_end", r.tags.get("dagster/partition")))
                        for r in runs)
        assert ranges == [(days[0], days[1]), (days[2], days[3]), (days[4], days[4])]
        assert _materialized(instance, "daily_docs") == {stage: set(days) for stage in STAGES}
    assert model_trace(log)[0] == 3  # one load per run


@pytest.mark.slow
def test_failed_single_run_backfill_keeps_finished_partitions_and_reexecution_does_the_rest(tmp_path: Path) -> None:
    data, log, outage = tmp_path / "data", tmp_path / "model.log", tmp_path / "outage"
    for day in DAYS:
        write_day(data, day, poison=day == DAYS[2])  # the model fails on day 3 while the outage lasts
    outage.write_text("down")
    spec = daily_spec(data, log)
    spec["model"]["config"]["init_kwargs"]["outage"] = str(outage)
    defs_file = write_code_location(tmp_path / "code", [spec], tmp_path / "store")
    with dg.instance_for_test(overrides=SYNC_LAUNCHER) as instance, daemon_workspace(instance, defs_file) as context:
        backfill_id = _launch_from_ui(context, "daily_docs", DAYS)
        run_backfill_daemon(context)
        [failed] = instance.get_runs()
        assert failed.status == dg.DagsterRunStatus.FAILURE
        # Day 1 and 2 went through infer before day 3 failed: recorded, and so counted by the asset status.
        assert _materialized(instance, "daily_docs") == {
            "raw": set(DAYS), "prepared": set(DAYS), "inferred": set(DAYS[:2]), "output": set()}
        assert instance.get_backfill(backfill_id).status.value == "COMPLETED_FAILED"
        _, texts = model_trace(log)
        assert {t.split("-", 1)[1].rsplit("-", 1)[0] for t in texts} == set(DAYS[:2])

        outage.unlink()  # the endpoint is back
        log.unlink()
        retry = _graphql(context, REEXECUTE_BACKFILL, {"params": {"parentRunId": backfill_id,
                                                                  "strategy": "FROM_FAILURE"}})
        run_backfill_daemon(context)
        assert instance.get_backfill(retry["backfillId"]).status.value == "COMPLETED_SUCCESS"
        assert _materialized(instance, "daily_docs") == {stage: set(DAYS) for stage in STAGES}
    _, texts = model_trace(log)
    # Only day 3 and day 4 were inferred again; day 1 and 2 were not redone.
    assert {t.split("-", 1)[1].rsplit("-", 1)[0] for t in texts} == set(DAYS[2:])
    for day in DAYS:
        assert (tmp_path / "store" / "daily_docs" / "output" / f"{day}.parquet").exists()


def test_bad_input_fails_without_retries_and_transient_errors_are_retried(tmp_path: Path) -> None:
    """A PipelineError (bad input) is not retried; an exception from the model is, with the spec's backoff."""
    from tests.conftest import pipeline_definitions

    from batch_assets.spec import parse_spec

    data, log, outage = tmp_path / "data", tmp_path / "model.log", tmp_path / "outage"
    write_day(data, DAYS[0], poison=True)
    (data / f"{DAYS[1]}.jsonl").write_text("")  # an empty file: bad input
    outage.write_text("down")
    spec = daily_spec(data, log, retries={"max_retries": 2, "delay_seconds": 0.2, "jitter": False})
    spec["model"]["config"]["init_kwargs"]["outage"] = str(outage)
    spec = parse_spec(spec)
    defs = pipeline_definitions(spec, tmp_path / "store")
    job = defs.resolve_job_def("daily_docs_job")

    bad = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), partition_key=DAYS[1], raise_on_error=False)
    events = [e.event_type_value for e in bad.all_events]
    assert "STEP_UP_FOR_RETRY" not in events and "STEP_FAILURE" in events
    failure = next(e for e in bad.all_events if e.event_type_value == "STEP_FAILURE")
    assert "source file is empty" in failure.event_specific_data.error.message
    assert failure.event_specific_data.user_failure_data.metadata["partition"].value == DAYS[1]

    transient = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), partition_key=DAYS[0],
                                       raise_on_error=False)
    events = [e.event_type_value for e in transient.all_events]
    assert events.count("STEP_UP_FOR_RETRY") == 2 and not transient.success  # retried, then gave up


def test_code_version_follows_the_spec(tmp_path: Path) -> None:
    from batch_assets.orchestration.assets.factory import stage_code_version
    from batch_assets.spec import parse_spec

    base = daily_spec(tmp_path, tmp_path / "log")
    spec = parse_spec(base)
    versions = {stage: stage_code_version(spec, stage) for stage in STAGES}
    other_model = parse_spec({**base, "model": {**base["model"], "config": {**base["model"]["config"],
                                                                            "batch_size": 7}}})
    assert stage_code_version(other_model, "inferred") != versions["inferred"]
    assert stage_code_version(other_model, "prepared") == versions["prepared"]
    faster = parse_spec({**base, "source": {**base["source"], "batch_rows": 10}})  # speed only: same output
    assert stage_code_version(faster, "raw") == versions["raw"]
    assets = {a.key.path[-1]: a for a in __import__("batch_assets.orchestration.assets.factory", fromlist=["x"]).build_pipeline_assets(spec)}
    assert assets["inferred"].code_versions_by_key[assets["inferred"].key] == versions["inferred"]
