"""An asset of the user's project as a pipeline's source (batch_assets/orchestration/assets/upstream.py), unit by
unit: whether partition K of the pipeline can read partition K of the upstream asset, and what the problem says when
it cannot (both partitionings described, the fix); a multi-part key; an upstream asset defined by a spec only
(observable, external) is accepted. The load-time path through check_upstream_sources is tested in
tests/orchestration/test_upstream_asset.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_definitions
from batch_assets.orchestration.assets.upstream import mapping_problem, upstream_dep, upstream_key, upstream_problems
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage
from tests.daemon_helpers import daily_spec

DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01")


def _spec(tmp_path: Path, asset: str = "raw_app_reviews", **sections: Any):
    raw = daily_spec(tmp_path / "days", tmp_path / "model.log", **sections)
    raw["source"]["asset"] = asset
    return parse_spec(raw)


def test_a_multi_part_key_is_split_on_slashes_and_mapped_partition_for_partition(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "team/raw_app_reviews")
    assert upstream_key(spec) == dg.AssetKey(["team", "raw_app_reviews"])
    dep = upstream_dep(spec)
    assert dep.asset_key == upstream_key(spec) and isinstance(dep.partition_mapping, dg.IdentityPartitionMapping)
    assert upstream_dep(parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log"))) is None


def test_daily_partitions_map_when_cron_timezone_and_format_agree_whatever_the_start(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert mapping_problem(spec, DAILY, DAILY) is None
    earlier = dg.DailyPartitionsDefinition(start_date="2025-01-01")  # more upstream days than the pipeline reads
    assert mapping_problem(spec, earlier, DAILY) is None
    berlin = dg.DailyPartitionsDefinition(start_date="2026-11-01", timezone="Europe/Berlin")
    problem = mapping_problem(spec, berlin, DAILY)
    assert "timezone Europe/Berlin" in problem and "timezone UTC" in problem
    assert "partition the pipeline as 'raw_app_reviews' is" in problem
    hourly = dg.HourlyPartitionsDefinition(start_date="2026-11-01-00:00")
    assert "format %Y-%m-%d-%H:%M" in mapping_problem(spec, hourly, DAILY)


def test_static_keys_map_when_the_upstream_has_every_key_of_the_pipeline(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    mine = dg.StaticPartitionsDefinition(["android", "ios"])
    assert mapping_problem(spec, dg.StaticPartitionsDefinition(["android", "ios", "web"]), mine) is None
    problem = mapping_problem(spec, dg.StaticPartitionsDefinition(["android"]), mine)
    assert "partitions ios of the pipeline are not partitions of 'raw_app_reviews'" in problem
    assert "static keys android" in problem and "static keys android, ios" in problem
    assert "time windows" in mapping_problem(spec, DAILY, mine)


def test_dynamic_partitions_must_be_the_pipelines_own_set(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    mine = dg.DynamicPartitionsDefinition(name="daily_docs")
    assert mapping_problem(spec, dg.DynamicPartitionsDefinition(name="daily_docs"), mine) is None
    problem = mapping_problem(spec, dg.DynamicPartitionsDefinition(name="uploads"), mine)
    assert "dynamic partitions named 'uploads'" in problem
    assert "give 'raw_app_reviews' the partitions dg.DynamicPartitionsDefinition(name='daily_docs')" in problem


def test_an_unpartitioned_upstream_is_named_with_what_to_partition(tmp_path: Path) -> None:
    problem = mapping_problem(_spec(tmp_path), None, DAILY)
    assert problem.startswith("'raw_app_reviews' is unpartitioned, the pipeline is partitioned by time windows")
    assert "one file per partition at source.path" in problem


def _defs(tmp_path: Path, spec, *upstream: Any) -> dg.Definitions:
    return dg.Definitions.merge(
        dg.Definitions(assets=list(upstream), resources={STORAGE_KEY: ArrowStorage(root=str(tmp_path / "s"))}),
        build_pipeline_definitions(spec))


def test_an_upstream_declared_by_an_asset_spec_of_another_team_is_accepted(tmp_path: Path) -> None:
    """An external asset (dg.AssetSpec, materialized elsewhere) with the same partitions: no problem, no warning."""
    spec = _spec(tmp_path, "team/raw_app_reviews")
    external = dg.AssetSpec(["team", "raw_app_reviews"], partitions_def=DAILY)
    assert upstream_problems(_defs(tmp_path, spec, external), [spec]) == ([], [])
    weekly = dg.AssetSpec(["team", "raw_app_reviews"], partitions_def=dg.WeeklyPartitionsDefinition("2026-11-01"))
    problems, warnings = upstream_problems(_defs(tmp_path, spec, weekly), [spec])
    assert len(problems) == 1 and warnings == []
    assert problems[0].startswith("pipeline 'daily_docs': source.asset 'team/raw_app_reviews': identity partition")


def test_a_missing_upstream_is_a_warning_that_suggests_close_keys_of_the_code_location(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "team/raw_app_review")
    present = dg.AssetSpec(["team", "raw_app_reviews"], partitions_def=DAILY)
    problems, [warning] = upstream_problems(_defs(tmp_path, spec, present), [spec])
    assert problems == []
    assert "'team/raw_app_review' is not an asset of this code location (did you mean 'team/raw_app_reviews'?)" \
        in warning
    assert "daily_docs/raw" not in warning, "the pipeline's own assets are never suggested"
