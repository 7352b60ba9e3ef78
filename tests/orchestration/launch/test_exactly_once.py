"""Exactly once across launch paths: a partition whose output was already made from the same source file version,
spec and model is never inferred again, whoever launches it (a UI/CLI run, a backfill, a schedule, a sensor); a
sensor's first tick adopts what a backfill published; a schedule does not run a day another launch path is making
or made; a changed prompt or model makes the stages it touches, and everything after them, stale."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import dagster as dg

from batch_assets.definitions import build_definitions
from batch_assets.orchestration.assets import lineage
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.launch.schedules import schedule_name
from batch_assets.orchestration.launch.sensors import decode_cursor
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage
from tests.conftest import pipeline_definitions, run_pipeline
from tests.daemon_helpers import daily_spec, model_trace, write_day
from tests.orchestration.launch.test_sensors import Ticker

DAYS = ["2026-11-01", "2026-11-02"]
STAGES = ("raw", "prepared", "inferred", "output")


def _spec(tmp_path: Path, **sections) -> dict:
    spec = daily_spec(tmp_path / "days", tmp_path / "model.log", **sections)
    for day in DAYS:
        if not (tmp_path / "days" / f"{day}.jsonl").exists():
            write_day(tmp_path / "days", day)
    return spec


def _old(path: Path) -> None:
    stamp = time.time() - 120
    os.utime(path, (stamp, stamp))


def _latest(instance: dg.DagsterInstance, name: str, stage: str, key: str) -> dict:
    [event] = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey([name, stage]), asset_partitions=[key]), limit=1).records
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def test_a_published_partition_is_not_inferred_again_unless_its_file_changes_or_a_rerun_is_forced(
        tmp_path: Path) -> None:
    raw = _spec(tmp_path)
    spec, store, log = parse_spec(raw), tmp_path / "store", tmp_path / "model.log"
    with dg.instance_for_test() as instance:
        run_pipeline(spec, store, DAYS, instance=instance)  # a single-run backfill of both days
        assert len(model_trace(log)[1]) == 6

        run_pipeline(spec, store, [DAYS[0]], instance=instance)  # a UI / CLI launch of a published day
        assert len(model_trace(log)[1]) == 6, "no row may be inferred twice"
        for stage in STAGES:
            md = _latest(instance, spec.name, stage, DAYS[0])
            assert md["skipped"].startswith("skipped: this partition was already made by run"), md
            assert md["dagster/row_count"] == 3
        assert _latest(instance, spec.name, "inferred", DAYS[0])["model_errors"] == 0

        write_day(tmp_path / "days", DAYS[1], rows=4)  # the day's file is rewritten: it is new input
        run_pipeline(spec, store, DAYS, instance=instance)
        assert model_trace(log)[1][-4:] == [f"doc-{DAYS[1]}-{i}" for i in range(4)]
        assert len(model_trace(log)[1]) == 6 + 4

        job = pipeline_definitions(spec, store).resolve_job_def(f"{spec.name}_job")
        job.execute_in_process(instance=instance, partition_key=DAYS[0], tags={lineage.RERUN_TAG: lineage.FORCE})
        assert len(model_trace(log)[1]) == 6 + 4 + 3, "a forced rerun infers again"


def _schedule_tick(instance: dg.DagsterInstance, spec, store: Path, at: dt.datetime):
    """Evaluate the pipeline's schedule as the daemon would at `at`, against the storage root `store`."""
    defs = build_definitions([spec])
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=at,
                                   repository_def=defs.get_repository_def(),
                                   resources={STORAGE_KEY: ArrowStorage(root=str(store))}) as context:
        return defs.resolve_schedule_def(schedule_name(spec)).evaluate_tick(context)


def test_a_sensor_first_tick_adopts_what_a_backfill_published(tmp_path: Path) -> None:
    raw = _spec(tmp_path, sensor={"min_age_seconds": 0})
    spec, store, log = parse_spec(raw), tmp_path / "store", tmp_path / "model.log"
    for day in DAYS:
        _old(tmp_path / "days" / f"{day}.jsonl")
    with dg.instance_for_test() as instance:
        run_pipeline(spec, store, DAYS, instance=instance)
        write_day(tmp_path / "days", "2026-11-03")  # a new day lands after the backfill
        _old(tmp_path / "days" / "2026-11-03.jsonl")
        ticker = Ticker(instance, raw, storage_root=str(store))
        result = ticker.tick()
        assert [r.partition_key for r in result.run_requests] == ["2026-11-03"]
        assert len(decode_cursor(ticker.cursor)) == 3  # the published days are adopted, not left for later
        assert not result.asset_events  # this instance already shows them materialized
    with dg.instance_for_test() as fresh:  # another instance (a new DAGSTER_HOME) over the same storage
        result = Ticker(fresh, raw, storage_root=str(store)).tick()
        assert [r.partition_key for r in result.run_requests] == ["2026-11-03"]
        adopted = {(e.asset_key.path[-1], e.partition) for e in result.asset_events}
        assert adopted == {(stage, day) for stage in STAGES for day in DAYS}
    assert len(model_trace(log)[1]) == 6


def test_a_schedule_does_not_run_a_day_another_launch_path_is_making_or_made(tmp_path: Path) -> None:
    from dagster._core.test_utils import create_run_for_test

    raw = _spec(tmp_path, schedule={"cron": "30 1 * * *"})
    spec, store = parse_spec(raw), tmp_path / "store"
    at = dt.datetime(2026, 11, 3, 1, 30, tzinfo=dt.timezone.utc)  # the newest complete day is DAYS[1]
    with dg.instance_for_test() as instance:

        def tick():
            return _schedule_tick(instance, spec, store, at)

        sensor_run = create_run_for_test(instance, job_name=f"{spec.name}_job", status=dg.DagsterRunStatus.STARTED,
                                         tags={"dagster/partition": DAYS[1], "batch/launched_by": "sensor"})
        busy = tick()
        assert not busy.run_requests and f"is being made by run {sensor_run.run_id[:8]} (sensor" in \
            busy.skip_message
        instance.report_run_failed(sensor_run)
        run_pipeline(spec, store, DAYS, instance=instance)  # a backfill published both days
        done = tick()
        assert not done.run_requests and "already published from the same source and spec" in done.skip_message
        write_day(tmp_path / "days", DAYS[1], rows=5)  # a corrected file: the schedule runs the day again
        [request] = tick().run_requests
        assert request.partition_key == DAYS[1]


def test_a_prompt_or_model_change_makes_every_stage_after_it_stale(tmp_path: Path) -> None:
    """Dagster's own stale-status resolver (what the UI shows) over the new definitions after a spec change."""
    from dagster._core.definitions.data_version import StaleStatus
    from dagster._utils.test.data_versions import get_stale_status_resolver

    raw = _spec(tmp_path)
    store = tmp_path / "store"

    def statuses(instance, spec_dict) -> dict[str, StaleStatus]:
        assets = list(pipeline_definitions(parse_spec(spec_dict), store).resolve_asset_graph().assets_defs)
        resolver = get_stale_status_resolver(instance, assets)
        return {stage: resolver.get_status(dg.AssetKey([spec_dict["name"], stage]), DAYS[0]) for stage in STAGES}

    with dg.instance_for_test() as instance:
        run_pipeline(parse_spec(raw), store, [DAYS[0]], instance=instance)
        assert set(statuses(instance, raw).values()) == {StaleStatus.FRESH}
        new_prompt = json.loads(json.dumps(raw))
        new_prompt["prepare"]["input_columns"] = ["doc_id", "text"]  # what the model is given changed
        assert statuses(instance, new_prompt) == {"raw": StaleStatus.FRESH, "prepared": StaleStatus.STALE,
                                                  "inferred": StaleStatus.STALE, "output": StaleStatus.STALE}
        new_model = json.loads(json.dumps(raw))
        new_model["model"]["config"]["init_kwargs"]["log"] = str(tmp_path / "other.log")
        assert statuses(instance, new_model) == {"raw": StaleStatus.FRESH, "prepared": StaleStatus.FRESH,
                                                 "inferred": StaleStatus.STALE, "output": StaleStatus.STALE}


def test_the_latest_materialization_of_a_sharded_run_describes_the_whole_run(tmp_path: Path) -> None:
    """A hash-sharded run writes four shards; the asset's latest materialization (one shard's event) also says it
    was one of four, with the run's total rows and the folder that holds them all."""
    from batch_assets.partitions import hash_shard_keys
    from tests.conftest import write_jsonl

    write_jsonl(tmp_path / "docs" / "all.jsonl", [{"doc_id": f"d{i}", "text": f"t{i}"} for i in range(20)])
    raw = daily_spec(tmp_path / "docs", tmp_path / "model.log")
    raw["source"]["path"] = f"{tmp_path}/docs/*.jsonl"
    raw["partitioning"] = {"kind": "hash", "count": 4}
    spec, store = parse_spec(raw), tmp_path / "store"
    with dg.instance_for_test() as instance:
        run_pipeline(spec, store, hash_shard_keys(4), instance=instance)
        [latest] = instance.fetch_materializations(dg.AssetKey([spec.name, "output"]), limit=1).records
        md = {k: v.value for k, v in latest.asset_materialization.metadata.items()}
    assert md["run_partitions"] == 4 and md["run_rows_out"] == 20
    assert md["run_partition_keys"] == ", ".join(hash_shard_keys(4))
    assert md["run_output_folder"] == str(store / spec.name / "output")
    assert md["dagster/row_count"] < 20  # its own shard's rows, as the partition view shows


def test_a_schedule_and_a_sensor_evaluated_at_the_same_moment_request_a_day_once(tmp_path: Path) -> None:
    """The race the daemon's scheduler and sensor threads run: one evaluation returns its RunRequest, and before the
    daemon has created that run the other evaluates. Without a claim both request the day (two runs of it)."""
    from dagster._core.test_utils import create_run_for_test

    raw = _spec(tmp_path, schedule={"cron": "30 1 * * *"}, sensor={"min_age_seconds": 0})
    spec, store = parse_spec(raw), tmp_path / "store"
    for day in DAYS:
        _old(tmp_path / "days" / f"{day}.jsonl")
    at = dt.datetime(2026, 11, 3, 1, 30, tzinfo=dt.timezone.utc)  # the schedule's newest complete day is DAYS[1]
    job = f"{spec.name}_job"
    with dg.instance_for_test() as instance:

        def schedule_tick():
            return _schedule_tick(instance, spec, store, at)

        # the sensor first: it requests both days; the schedule, a moment later, sees no run yet, only the claim
        ticker = Ticker(instance, raw, storage_root=str(store))
        assert sorted(r.partition_key for r in ticker.tick().run_requests) == DAYS
        held = schedule_tick()
        assert not held.run_requests and "the sensor claimed it" in held.skip_message, held.skip_message
        # the daemon creates the sensor's run, which fails: the claim is spent, the schedule may run the day
        run = create_run_for_test(instance, job_name=job, status=dg.DagsterRunStatus.STARTED,
                                  tags={"dagster/partition": DAYS[1], "batch/launched_by": "sensor"})
        assert not schedule_tick().run_requests
        instance.report_run_failed(run)
        [request] = schedule_tick().run_requests
        assert request.partition_key == DAYS[1]

    # the other order, on a fresh instance and storage: the schedule first, then the sensor leaves the day alone,
    # keeps its file unseen, and adopts it once the schedule's run has published it
    store = tmp_path / "store2"
    with dg.instance_for_test() as instance:
        [request] = _schedule_tick(instance, spec, store, at).run_requests
        ticker = Ticker(instance, raw, storage_root=str(store))
        assert [r.partition_key for r in ticker.tick().run_requests] == [DAYS[0]]
        assert str(tmp_path / "days" / f"{DAYS[1]}.jsonl") not in "".join(decode_cursor(ticker.cursor))
        run_pipeline(spec, store, [DAYS[1]], instance=instance)  # the schedule's run
        after = ticker.tick()
        assert not after.run_requests and "adopted" in (after.skip_message or ""), after.skip_message


def test_a_touched_day_is_not_inferred_again_and_records_from_before_content_versions_are_kept(
        tmp_path: Path) -> None:
    """Versions by content: a day re-written with the same bytes (a new mtime) is skipped at every stage. Records
    written before versions were by content (an mtime-based digest) still match while the file is as it was,
    and are rewritten with the content version, so upgrading pays nothing, then or after a later touch."""
    raw = _spec(tmp_path)
    spec, store, log = parse_spec(raw), tmp_path / "store", tmp_path / "model.log"
    storage = ArrowStorage(root=str(store))
    day_file = tmp_path / "days" / f"{DAYS[0]}.jsonl"
    with dg.instance_for_test() as instance:
        run_pipeline(spec, store, DAYS, instance=instance)
        assert len(model_trace(log)[1]) == 6
        day_file.write_bytes(day_file.read_bytes())  # the upstream re-materialized the day: same bytes
        run_pipeline(spec, store, [DAYS[0]], instance=instance)
        assert len(model_trace(log)[1]) == 6, "a touched file was inferred again"

        legacy = lineage.legacy_source_version(spec, DAYS[1])  # records as the previous release wrote them
        for stage in STAGES:
            record = lineage.read_record(storage, spec.name, stage, DAYS[1])
            lineage.write_record(storage, spec.name, stage, DAYS[1], {**record, "source_version": legacy})
        run_pipeline(spec, store, [DAYS[1]], instance=instance)  # the first launch after upgrading
        assert len(model_trace(log)[1]) == 6, "an upgrade re-inferred a day made from the same file"
        current = lineage.source_version(spec, DAYS[1], storage)
        assert {lineage.read_record(storage, spec.name, s, DAYS[1])["source_version"] for s in STAGES} == {current}
        later = time.time() + 5
        os.utime(tmp_path / "days" / f"{DAYS[1]}.jsonl", (later, later))  # and a touch after the upgrade
        run_pipeline(spec, store, [DAYS[1]], instance=instance)
        assert len(model_trace(log)[1]) == 6
