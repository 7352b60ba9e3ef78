"""An asset of the user's project as a pipeline's source (`source.asset`): the raw asset depends on it in the asset
graph (identity partition mapping), the pipeline's automation (on_upstream_update, implied) requests a partition
when the upstream's partition is materialized, any day, not only the newest, and a re-materialization with
byte-identical output pays nothing: its run skips every stage, no model call. At load, a key that is not in the
code location and partitions that do not map are reported with the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from batch_assets.orchestration.upstream_checks import UpstreamAssetWarning, check_upstream_sources
from batch_assets.orchestration.assets.automation import automation_sensor_name
from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_definitions
from batch_assets.orchestration.launch.paths import launch_definitions
from batch_assets.spec import SpecError, parse_spec
from batch_assets.storage import ArrowStorage
from tests.daemon_helpers import daily_spec, model_trace

STAGES = ("raw", "prepared", "inferred", "output")
UPSTREAM = dg.AssetKey("raw_app_reviews")
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01")


def upstream_asset(days: Path, variant: dict[str, str], partitions_def: dg.PartitionsDefinition | None = DAILY
                   ) -> dg.AssetsDefinition:
    """The user's own asset: one JSONL file per day; `variant[day]` changes that day's bytes."""

    @dg.asset(key=UPSTREAM, partitions_def=partitions_def)
    def raw_app_reviews(context) -> None:
        day = context.partition_key
        days.mkdir(parents=True, exist_ok=True)
        rows = [{"doc_id": f"{day}-{i}", "text": f"review-{day}-{i}{variant.get(day, '')}"} for i in range(3)]
        (days / f"{day}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    return raw_app_reviews


def spec_dict(tmp_path: Path, **source: Any) -> dict[str, Any]:
    raw = daily_spec(tmp_path / "days", tmp_path / "model.log")
    raw["source"].update({"asset": "raw_app_reviews", **source})
    return raw


def project(tmp_path: Path, raw: dict[str, Any], upstream: dg.AssetsDefinition | None) -> dg.Definitions:
    """The user's code location: their asset, the pipeline, the storage."""
    spec = parse_spec(raw)
    return dg.Definitions.merge(
        dg.Definitions(assets=[upstream] if upstream else [],
                       resources={STORAGE_KEY: ArrowStorage(root=str(tmp_path / "store"))}),
        build_pipeline_definitions(spec), launch_definitions(spec))


def test_the_raw_asset_depends_on_the_upstream_asset_and_runs_on_its_updates(tmp_path: Path) -> None:
    spec = parse_spec(spec_dict(tmp_path))
    defs = check_upstream_sources(project(tmp_path, spec_dict(tmp_path), upstream_asset(tmp_path / "days", {})))
    graph = defs.resolve_asset_graph()
    raw = dg.AssetKey([spec.name, "raw"])
    assert UPSTREAM in graph.get(raw).parent_entity_keys  # the edge the UI and `dg list defs` show
    assert isinstance(defs.resolve_assets_def(raw).get_partition_mapping(UPSTREAM), dg.IdentityPartitionMapping)
    for stage in STAGES:
        assert graph.get(dg.AssetKey([spec.name, stage])).automation_condition.get_label() == "on_upstream_update"
    sensor = defs.resolve_sensor_def(automation_sensor_name(spec))
    assert isinstance(sensor, dg.AutomationConditionSensorDefinition)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_each_upstream_update_runs_once_and_identical_bytes_pay_nothing(tmp_path: Path) -> None:
    variant: dict[str, str] = {}
    upstream = upstream_asset(tmp_path / "days", variant)
    defs = project(tmp_path, spec_dict(tmp_path), upstream)
    spec = parse_spec(spec_dict(tmp_path))
    job = defs.resolve_job_def(f"{spec.name}_job")
    keys = [dg.AssetKey([spec.name, s]) for s in STAGES]
    log = tmp_path / "model.log"
    with dg.instance_for_test() as instance:
        cursor = None

        def evaluate() -> dict[str, set]:
            nonlocal cursor
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            cursor = result.cursor
            return {s: set(result.get_requested_partitions(k)) for s, k in zip(STAGES, keys)}

        def upstream_materialized(day: str) -> None:
            assert dg.materialize([upstream], partition_key=day, instance=instance).success

        def run(day: str) -> dg.ExecuteInProcessResult:
            result = job.execute_in_process(instance=instance, partition_key=day)
            assert result.success
            return result

        assert evaluate() == {s: set() for s in STAGES}  # nothing upstream yet: nothing to do
        upstream_materialized("2026-11-20")
        assert evaluate() == {s: {"2026-11-20"} for s in STAGES}  # every stage at once: one run
        first = run("2026-11-20")
        assert sorted(model_trace(log)[1]) == [f"review-2026-11-20-{i}" for i in range(3)]
        assert evaluate() == {s: set() for s in STAGES}  # handled: not requested again

        upstream_materialized("2026-11-20")  # the same bytes again (a retried upstream run, a re-run day)
        assert evaluate()["raw"] == {"2026-11-20"}  # Dagster knows it updated, not that nothing changed ...
        again = run("2026-11-20")
        assert len(model_trace(log)[1]) == 3  # ... and the run pays nothing: no model call
        [inferred] = again.asset_materializations_for_node(f"{spec.name}__inferred")
        assert "skipped" in inferred.metadata
        [raw_first], [raw_again] = (r.asset_materializations_for_node(f"{spec.name}__raw") for r in (first, again))
        assert raw_first.tags["dagster/data_version"] == raw_again.tags["dagster/data_version"]

        # no evaluation between that run and the next upstream materialization (the daemon ticks every 30 s):
        # the update must not be taken for handled
        variant["2026-11-20"] = "!"  # changed bytes: inferred again, once
        upstream_materialized("2026-11-20")
        assert evaluate() == {s: {"2026-11-20"} for s in STAGES}
        changed = run("2026-11-20")
        assert sorted(model_trace(log)[1][3:]) == [f"review-2026-11-20-{i}!" for i in range(3)]
        [raw_changed] = changed.asset_materializations_for_node(f"{spec.name}__raw")
        assert raw_changed.tags["dagster/data_version"] != raw_first.tags["dagster/data_version"]

        upstream_materialized("2026-11-02")  # an older day (an upstream backfill): not only the newest window
        assert evaluate() == {s: {"2026-11-02"} for s in STAGES}
        variant["2026-11-02"] = "?"  # changed again after the request, before its run started
        upstream_materialized("2026-11-02")
        run("2026-11-02")  # reads the newest bytes
        assert evaluate() == {s: {"2026-11-02"} for s in STAGES}  # the later update is not dropped ...
        run("2026-11-02")
        assert len(model_trace(log)[1]) == 9  # ... and its run, over the bytes already inferred, pays nothing
        assert evaluate() == {s: set() for s in STAGES}


def test_upstream_partitions_that_do_not_map_fail_the_load_with_the_fix(tmp_path: Path) -> None:
    weekly = dg.WeeklyPartitionsDefinition(start_date="2026-11-01")
    with pytest.raises(SpecError) as refused:
        check_upstream_sources(project(tmp_path, spec_dict(tmp_path), upstream_asset(tmp_path, {}, weekly)))
    message = str(refused.value)
    assert "pipeline 'daily_docs': source.asset 'raw_app_reviews'" in message
    assert "0 0 * * 0" in message and "0 0 * * *" in message  # both partitionings, as Dagster defines them
    assert "partition the pipeline as 'raw_app_reviews' is" in message

    with pytest.raises(SpecError, match="'raw_app_reviews' is unpartitioned"):
        check_upstream_sources(project(tmp_path, spec_dict(tmp_path), upstream_asset(tmp_path, {}, None)))

    static = spec_dict(tmp_path)
    static["partitioning"] = {"kind": "static", "keys": ["android", "ios", "web"]}
    apps = dg.StaticPartitionsDefinition(["android", "ios"])
    with pytest.raises(SpecError, match="partitions web of the pipeline are not partitions of 'raw_app_reviews'"):
        check_upstream_sources(project(tmp_path, static, upstream_asset(tmp_path, {}, apps)))


def test_an_upstream_key_not_in_the_code_location_is_named_with_close_matches(tmp_path: Path) -> None:
    raw = spec_dict(tmp_path, asset="raw_app_review")  # a typo
    with pytest.warns(UpstreamAssetWarning, match="'raw_app_review' is not an asset of this code location "
                                                  r"\(did you mean 'raw_app_reviews'\?\)"):
        check_upstream_sources(project(tmp_path, raw, upstream_asset(tmp_path, {})))


@pytest.mark.parametrize(("change", "problem"), [
    ({"partitioning": {"kind": "hash", "count": 2}}, "hash shards have no upstream partition"),
    ({"source": {"path": "days/all.jsonl"}}, "put {partition} in it"),
    ({"sensor": {}}, "`sensor:` would launch the same partitions again"),
    ({"source": {"asset": "daily_docs/raw"}}, "one of this pipeline's own assets"),
    ({"source": {"asset": "raw app reviews"}}, "is not an asset key"),
])
def test_the_spec_refuses_what_cannot_work_with_an_upstream_asset(tmp_path: Path, change: dict, problem: str
                                                                  ) -> None:
    raw = spec_dict(tmp_path)
    for section, value in change.items():
        raw[section] = {**raw.get(section, {}), **value} if section == "source" else value
    if "hash" in json.dumps(change):
        raw["source"]["path"] = str(tmp_path / "days" / "*.jsonl")
    with pytest.raises(SpecError, match=problem.replace("{", r"\{").replace("}", r"\}")
                       .replace("(", r"\(").replace(")", r"\)")):
        parse_spec(raw)


def test_on_upstream_update_needs_an_upstream_asset(tmp_path: Path) -> None:
    raw = daily_spec(tmp_path / "days", tmp_path / "model.log", automation={"condition": "on_upstream_update"})
    with pytest.raises(SpecError, match="name that asset in source.asset"):
        parse_spec(raw)


@pytest.mark.slow
def test_a_component_pipeline_on_a_project_asset_is_listed_with_its_edge_by_dg(tmp_path: Path) -> None:
    """Component attributes take source.asset like a spec file: in a project whose defs folder holds the user's own
    asset and a BatchInferencePipeline reading it, `dg check defs` passes and `dg list defs` lists the edge and the
    pipeline's automation sensor."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.daemon_helpers import project_copy

    project = project_copy(tmp_path / "project")
    defs_dir = project / "batch_assets" / "defs"
    (defs_dir / "app_reviews").mkdir()
    (defs_dir / "app_reviews" / "assets.py").write_text(
        "import dagster as dg\n\n\n"
        "@dg.asset(partitions_def=dg.DailyPartitionsDefinition(start_date='2026-11-01'))\n"
        "def raw_app_reviews() -> None:\n    ...\n")
    raw = spec_dict(tmp_path)
    raw["name"] = "review_docs"
    (defs_dir / "review_docs").mkdir()
    (defs_dir / "review_docs" / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "batch_assets.components.BatchInferencePipeline", "attributes": raw}, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "BATCH_PIPELINES_DIR"}
    env["PYTHONPATH"] = str(project)  # the copy's package, not the checkout's
    dg_cli = str(Path(sys.executable).with_name("dg"))

    def dg_run(*args: str) -> str:
        done = subprocess.run([dg_cli, *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    assert "All definitions loaded successfully" in dg_run("check", "defs")
    listed = json.loads(dg_run("list", "defs", "--json"))
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert assets["review_docs/raw"]["dependency_keys"] == ["raw_app_reviews"]
    assert assets["raw_app_reviews"]["is_executable"]
    assert "review_docs_automation_sensor" in {s["name"] for s in listed["sensors"]}
