"""Declarative automation from the spec's `automation:` section: the condition on every asset, the pipeline's
automation sensor, what Dagster's evaluation requests (each new partition once, at every stage), and the spec
refusing automation beside a schedule or sensor, or on_cron without a valid cron."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from batch_assets.definitions import build_definitions
from batch_assets.orchestration.assets.automation import automation_sensor_name
from batch_assets.spec import SpecError, parse_spec
from tests.daemon_helpers import daily_spec, write_day

UTC = dt.timezone.utc
STAGES = ("raw", "prepared", "inferred", "output")


def _spec(tmp_path: Path, **sections):
    return parse_spec(daily_spec(tmp_path / "data", tmp_path / "model.log", **sections))


def _keys(spec) -> list[dg.AssetKey]:
    return [dg.AssetKey([spec.name, stage]) for stage in STAGES]


def _requested(result, spec) -> dict[str, set]:
    return {stage: set(result.get_requested_partitions(key)) for stage, key in zip(STAGES, _keys(spec))}


def test_every_asset_carries_the_spec_condition_and_the_pipeline_has_its_sensor(tmp_path: Path) -> None:
    spec = _spec(tmp_path, automation={"condition": "on_cron", "cron": "0 2 * * *", "timezone": "Europe/Paris"})
    with dg.instance_for_test():
        defs = build_definitions([spec])
        graph = defs.resolve_asset_graph()
        for key in _keys(spec):
            condition = graph.get(key).automation_condition
            assert condition is not None and condition.get_label() == "on_cron(0 2 * * *, Europe/Paris)", key
        sensor = defs.resolve_sensor_def(automation_sensor_name(spec))
        assert isinstance(sensor, dg.AutomationConditionSensorDefinition)
        assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
        assert sensor.asset_selection.resolve(graph) == set(_keys(spec))

    plain = _spec(tmp_path)
    with dg.instance_for_test():
        defs = build_definitions([plain])
        assert all(defs.resolve_asset_graph().get(k).automation_condition is None for k in _keys(plain))
        assert not [s for s in defs.sensors or [] if isinstance(s, dg.AutomationConditionSensorDefinition)]


def test_on_missing_requests_each_new_day_once_at_every_stage(tmp_path: Path) -> None:
    spec = _spec(tmp_path, automation={"condition": "on_missing"})
    nothing = {stage: set() for stage in STAGES}
    with dg.instance_for_test() as instance:
        defs = build_definitions([spec])
        # Switched on when 2026-11-04 is the newest complete day: a day already missing then is a backfill's job.
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance,
                                                  evaluation_time=dt.datetime(2026, 11, 5, 1, 0, tzinfo=UTC))
        assert _requested(first, spec) == nothing
        # The 5th ends: it is requested at all four stages in the same evaluation (one run), once.
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor,
                                                   evaluation_time=dt.datetime(2026, 11, 6, 0, 5, tzinfo=UTC))
        assert _requested(second, spec) == {stage: {"2026-11-05"} for stage in STAGES}
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor,
                                                  evaluation_time=dt.datetime(2026, 11, 6, 0, 10, tzinfo=UTC))
        assert _requested(third, spec) == nothing
        # Materialized meanwhile: still nothing, and nothing on the next evaluation either.
        for key in _keys(spec):
            instance.report_runless_asset_event(dg.AssetMaterialization(key, partition="2026-11-05"))
        fourth = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=third.cursor,
                                                   evaluation_time=dt.datetime(2026, 11, 6, 0, 15, tzinfo=UTC))
        assert _requested(fourth, spec) == nothing


def test_on_missing_over_dynamic_partitions_requests_each_added_key_once(tmp_path: Path) -> None:
    spec = _spec(tmp_path, partitioning={"kind": "dynamic"}, automation={"condition": "on_missing"})
    with dg.instance_for_test() as instance:
        defs = build_definitions([spec])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0
        instance.add_dynamic_partitions(spec.name, ["2026-11-07"])
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert _requested(second, spec) == {stage: {"2026-11-07"} for stage in STAGES}
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
        assert third.total_requested == 0


@pytest.mark.parametrize(("automation", "others", "field", "says"), [
    ({"condition": "on_missing"}, {"sensor": {}}, "automation", "one automatic launcher per pipeline"),
    ({"condition": "on_cron", "cron": "0 2 * * *"}, {"schedule": {}}, "automation", "drop `automation:` or `schedule:`"),
    ({"condition": "on_cron"}, {}, "automation.cron", "on_cron needs a cron string"),
    ({"condition": "on_cron", "cron": "every day"}, {}, "automation.cron", "'every day' is not a cron string"),
    ({"condition": "on_cron", "cron": "0 2 * * *", "timezone": "Mars/Olympus"}, {}, "automation.timezone",
     "unknown timezone"),
    ({"condition": "on_missing", "cron": "0 2 * * *"}, {}, "automation.cron", "cron and timezone are for on_cron"),
    ({"condition": "eager"}, {}, "automation.condition", "on_missing"),
    ({"condition": "on_missing"}, {"partitioning": {"kind": "hash", "count": 2}}, "automation.condition",
     "never launch anything"),
    ({"condition": "on_missing"}, {"partitioning": {"kind": "static", "keys": ["a"]}}, "automation.condition",
     "never launch anything"),
])
def test_spec_refuses_automation_that_cannot_work(tmp_path: Path, automation, others, field, says) -> None:
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, automation=automation, **others)
    assert f" {field}: " in str(err.value) and says in str(err.value), str(err.value)


def test_on_missing_over_files_requests_a_new_file_once_after_the_code_location_reloads(tmp_path: Path) -> None:
    spec = _spec(tmp_path, partitioning={"kind": "static"}, automation={"condition": "on_missing"})
    write_day(tmp_path / "data", "first")
    with dg.instance_for_test() as instance:
        first = dg.evaluate_automation_conditions(defs=build_definitions([spec]), instance=instance)
        assert first.total_requested == 0  # there at switch-on: a backfill's job
        write_day(tmp_path / "data", "second")
        reloaded = build_definitions([spec])  # static partitions from files are listed at definitions load
        second = dg.evaluate_automation_conditions(defs=reloaded, instance=instance, cursor=first.cursor)
        assert _requested(second, spec) == {stage: {"second"} for stage in STAGES}
        third = dg.evaluate_automation_conditions(defs=reloaded, instance=instance, cursor=second.cursor)
        assert third.total_requested == 0


def test_on_cron_requests_the_newest_day_at_each_tick_once(tmp_path: Path) -> None:
    spec = _spec(tmp_path, automation={"condition": "on_cron", "cron": "0 2 * * *"})
    with dg.instance_for_test() as instance:
        defs = build_definitions([spec])
        cursor = None
        seen = []
        for at in (dt.datetime(2026, 11, 5, 1, 0), dt.datetime(2026, 11, 5, 2, 1), dt.datetime(2026, 11, 5, 2, 6),
                   dt.datetime(2026, 11, 6, 2, 1)):
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor,
                                                       evaluation_time=at.replace(tzinfo=UTC))
            cursor = result.cursor
            seen.append(_requested(result, spec))
    nothing = {stage: set() for stage in STAGES}
    assert seen == [nothing, {stage: {"2026-11-04"} for stage in STAGES}, nothing,
                    {stage: {"2026-11-05"} for stage in STAGES}]
