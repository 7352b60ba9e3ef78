"""Two-dimensional partitions (`partitioning.kind: multi`, day x app): refused at load when Dagster could not run
them; through every stage with the real `dg launch` (one partition, then a range as one run); a multi-run backfill
through the backfill daemon's own logic; the schedule's run requests (every app of the newest day); the sensor (one
run per new day x app file, new keys of a dynamic dimension added)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.definitions import build_definitions
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.launch.schedules import schedule_name
from batch_assets.spec import SpecError, parse_spec
from batch_assets.storage import ArrowStorage, partition_file_name
from tests.conftest import user_env
from tests.daemon_helpers import (
    SYNC_LAUNCHER, daemon_workspace, daily_spec, dagster_home, model_trace, run_backfill_daemon, write_code_location,
)
from tests.orchestration.launch.test_sensors import Ticker
from tests.test_docs_commands import documented_commands

ROOT = Path(__file__).resolve().parents[3]
DG = str(Path(sys.executable).with_name("dg"))
UTC = dt.timezone.utc
STAGES = ("raw", "prepared", "inferred", "output")
APPS = ("android", "ios")
DAYS = ("2026-11-01", "2026-11-02")
ROWS = {"android": 3, "ios": 5}  # different per app, so a partition that read the wrong file shows


def multi_spec(data: Path, log: Path, name: str = "app_reviews", app: dict[str, Any] | None = None,
               **sections: Any) -> dict[str, Any]:
    """Day x app over <data>/<date>/<app>.jsonl with the CountingModel (tests/daemon_helpers.py)."""
    return daily_spec(data, log, **{
        "name": name,
        "source": {"format": "jsonl", "path": f"{data}/{{date}}/{{app}}.jsonl", "columns": ["review_id", "text"]},
        "partitioning": {"kind": "multi", "dimensions": [
            {"name": "date", "kind": "daily", "start_date": "2026-11-01", "timezone": "UTC"},
            app or {"name": "app", "kind": "static", "keys": list(APPS)},
        ]},
        "prepare": {"id_column": "review_id", "input_columns": ["text"]},
        **sections,
    })


def write_reviews(data: Path, day: str, app: str, rows: int | None = None, age_s: float = 0) -> list[str]:
    folder = data / day
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"{day}-{app}-{i}" for i in range(ROWS[app] if rows is None else rows)]
    path = folder / f"{app}.jsonl"
    path.write_text("".join(json.dumps({"review_id": i, "text": f"text-{i}"}) + "\n" for i in ids))
    if age_s:
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))
    return ids


def key(app: str, day: str) -> str:
    """Dagster spells a multi key with the dimension keys in the order of the dimension names: app, then date."""
    return f"{app}|{day}"


def output_ids(store: Path, pipeline: str, partition: str) -> list[str]:
    return pq.read_table(store / pipeline / "output" / partition_file_name(partition, "parquet")).column(
        "review_id").to_pylist()


# -- refused at load -----------------------------------------------------------------------------------------------

DAILY = {"name": "date", "kind": "daily", "start_date": "2026-11-01"}
APP = {"name": "app", "kind": "static", "keys": ["android", "ios"]}


@pytest.mark.parametrize("partitioning, path, message", [
    ({"kind": "multi", "dimensions": [DAILY]}, "{date}.jsonl", "needs exactly two dimensions"),
    ({"kind": "multi", "dimensions": [DAILY, APP, {**APP, "name": "store"}]}, "{date}/{app}.jsonl",
     "needs exactly two dimensions"),
    ({"kind": "multi", "dimensions": [DAILY, {**DAILY, "name": "day"}]}, "{date}/{day}.jsonl",
     "at most one daily dimension"),
    ({"kind": "multi", "dimensions": [DAILY, {**APP, "name": "app-id"}]}, "{date}/{app}.jsonl",
     "'app-id' must be an identifier"),
    ({"kind": "multi", "dimensions": [DAILY, {**APP, "keys": ["android|tv", "ios"]}]}, "{date}/{app}.jsonl",
     "key 'android|tv' holds |"),
    ({"kind": "multi", "dimensions": [DAILY, {"name": "app", "kind": "hash", "keys": ["a"]}]}, "{date}/{app}.jsonl",
     "partitioning.dimensions.1.kind: Input should be 'daily', 'static' or 'dynamic'"),
    ({"kind": "multi", "dimensions": [DAILY, {"name": "app", "kind": "static"}]}, "{date}/{app}.jsonl",
     "a static dimension lists its keys"),
    ({"kind": "multi", "dimensions": [DAILY, APP]}, "{date}/all.jsonl", "put {app} in the path"),
    ({"kind": "multi", "dimensions": [DAILY, APP]}, "{date}/{ap}.jsonl", "placeholder(s) {ap} name no dimension"),
    ({"kind": "multi", "start_date": "2026-11-01", "dimensions": [DAILY, APP]}, "{date}/{app}.jsonl",
     "partitioning.start_date: kind: multi sets start_date on its dimension"),
    ({"kind": "daily", "start_date": "2026-11-01", "dimensions": [DAILY, APP]}, "{partition}.jsonl",
     "dimensions are for kind: multi"),
])
def test_a_broken_multi_spec_is_refused_at_load_naming_the_field(tmp_path: Path, partitioning: dict, path: str,
                                                                 message: str) -> None:
    spec = multi_spec(tmp_path, tmp_path / "log", partitioning=partitioning)
    spec["source"]["path"] = f"{tmp_path}/{path}"
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert message in str(err.value), str(err.value)
    assert "pipeline 'app_reviews'" in str(err.value)


@pytest.mark.parametrize("override, message", [
    ("2026-11-04|ios", "'2026-11-04' is not a key of dimension 'app'"),
    ("ios", "'ios' is not a two-dimensional key: write <app>|<date>"),
    ("ios|Nov 4", "'Nov 4' is not a day (YYYY-MM-DD) of dimension 'date'"),
])
def test_a_resource_override_that_could_never_match_is_refused(tmp_path: Path, override: str, message: str) -> None:
    """A Kubernetes override keyed in the spec's dimension order would never match: the step would run on the
    default resources without a word."""
    spec = multi_spec(tmp_path, tmp_path / "log", runtime={"resources": {"partitions": {override: {"gpus": 2}}}})
    with pytest.raises(SpecError, match="runtime.resources.partitions") as err:
        parse_spec(spec)
    assert message in str(err.value), str(err.value)
    for good in ("ios|*", "*|2026-11-04", "android|2026-11-0[1-3]"):
        parse_spec(multi_spec(tmp_path, tmp_path / "log", runtime={"resources": {"partitions": {good: {"gpus": 2}}}}))


def test_schedule_and_sensor_need_what_multi_partitions_give_them(tmp_path: Path) -> None:
    static_x_static = {"kind": "multi", "dimensions": [{"name": "region", "kind": "static", "keys": ["eu"]}, APP]}
    spec = multi_spec(tmp_path, tmp_path / "log", partitioning=static_x_static, schedule={"cron": "30 1 * * *"})
    spec["source"]["path"] = f"{tmp_path}/{{region}}/{{app}}.jsonl"
    with pytest.raises(SpecError, match="multi partitioning with a daily dimension"):
        parse_spec(spec)
    spec = multi_spec(tmp_path, tmp_path / "log", sensor={"min_age_seconds": 0})
    spec["source"]["path"] = f"{tmp_path}/{{partition}}.jsonl"
    with pytest.raises(SpecError, match=r"put \{date\} and \{app\} in it"):
        parse_spec(spec)


# -- every stage, through the real CLI ----------------------------------------------------------------------------

@pytest.mark.slow
def test_day_by_app_partition_then_a_range_through_dg_launch(tmp_path: Path) -> None:
    """`dg launch --partition "android|2026-11-01"` publishes that day's android file and nothing else; a range of
    two days x both apps then runs as ONE run over the four partitions (single_run backfill policy), skipping the
    one already made; rows in = rows out, row ids exactly once, in every partition."""
    data, store, log, pipelines = tmp_path / "data", tmp_path / "store", tmp_path / "model.log", tmp_path / "pipes"
    source_ids = {key(app, day): write_reviews(data, day, app) for day in DAYS for app in APPS}
    pipelines.mkdir()
    (pipelines / "app_reviews.yaml").write_text(yaml.safe_dump(multi_spec(data, log)))
    home = dagster_home(tmp_path / "home")
    # the test's model class is in tests/: on the path as a user's own model package would be
    env = user_env(DAGSTER_HOME=str(home), BATCH_STORAGE_ROOT=str(store), BATCH_PIPELINES_DIR=str(pipelines),
                   PYTHONPATH=str(ROOT))

    # docs/concepts.md's two commands, as written there: one partition, then a range
    one, many = [c for page, c in documented_commands() if page == "docs/concepts.md" and "group:app_reviews" in c]

    def dg_launch(command: str) -> None:
        words = shlex.split(command)
        assert words[0] == ".venv/bin/dg", command
        proc = subprocess.run([DG, *words[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    first = key("android", DAYS[0])
    assert one.endswith(f'--partition "{first}"') and many.endswith(f'"{first}...{key("ios", DAYS[1])}"')
    dg_launch(one)
    assert output_ids(store, "app_reviews", first) == source_ids[first]
    assert sorted((store / "app_reviews" / "output").iterdir()) == [
        store / "app_reviews" / "output" / partition_file_name(first, "parquet")]

    dg_launch(many)
    for partition, ids in source_ids.items():
        assert output_ids(store, "app_reviews", partition) == ids, partition  # rows in = rows out, in order
    loads, inferred = model_trace(log)
    assert loads == 2  # one per run: the range loaded the model once for its four partitions
    assert sorted(inferred) == sorted(f"text-{i}" for ids in source_ids.values() for i in ids)  # none twice

    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        for stage in STAGES:
            assert set(instance.get_materialized_partitions(dg.AssetKey(["app_reviews", stage]))) == set(source_ids)
        event = instance.get_latest_materialization_event(dg.AssetKey(["app_reviews", "output"]))
        assert event is not None


# -- backfill ------------------------------------------------------------------------------------------------------

def _backfill(tmp_path: Path, backfill: dict[str, Any], days: tuple[str, ...]) -> tuple[list[dg.DagsterRun], Path]:
    """A backfill of `days` x both apps through the backfill daemon's own logic (as the UI or
    `python -m batch_assets.commands.backfill` records it): every partition published once, rows in = rows out."""
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id
    from dagster._time import get_current_timestamp

    data, store, log = tmp_path / "data", tmp_path / "store", tmp_path / "model.log"
    source_ids = {key(app, day): write_reviews(data, day, app) for day in days for app in APPS}
    defs_file = write_code_location(tmp_path / "code", [multi_spec(data, log, backfill=backfill)], store)
    with dg.instance_for_test(overrides=SYNC_LAUNCHER) as instance, daemon_workspace(instance, defs_file) as context:
        instance.add_backfill(PartitionBackfill.from_asset_partitions(
            backfill_id=make_new_backfill_id(), asset_graph=context.create_request_context().asset_graph,
            partition_names=list(source_ids), asset_selection=[dg.AssetKey(["app_reviews", s]) for s in STAGES],
            backfill_timestamp=get_current_timestamp(), tags={}, dynamic_partitions_store=instance,
            all_partitions=False, title=None, description=None, run_config=None))
        run_backfill_daemon(context)
        runs = list(instance.get_runs())
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        for stage in STAGES:
            assert set(instance.get_materialized_partitions(dg.AssetKey(["app_reviews", stage]))) == set(source_ids)
    for partition, ids in source_ids.items():
        assert output_ids(store, "app_reviews", partition) == ids, partition
    assert sorted(model_trace(log)[1]) == sorted(f"text-{i}" for ids in source_ids.values() for i in ids)
    return runs, log


@pytest.mark.slow
def test_multi_run_backfill_over_days_and_apps(tmp_path: Path) -> None:
    """multi_run, two partitions per run: four partitions in two runs."""
    runs, _ = _backfill(tmp_path, {"policy": "multi_run", "max_partitions_per_run": 2}, DAYS)
    assert len(runs) == 2


@pytest.mark.slow
def test_single_run_backfill_is_one_run_per_app_over_the_day_range(tmp_path: Path) -> None:
    """single_run over three days x two apps: Dagster splits a multi-partition backfill into ranges of the daily
    dimension, one per app, so two runs (each loading the model once), not six; docs/concepts.md says so."""
    days = (*DAYS, "2026-11-03")
    runs, log = _backfill(tmp_path, {"policy": "single_run"}, days)
    ranges = sorted((r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
                    for r in runs)
    assert ranges == [(key(app, days[0]), key(app, days[-1])) for app in APPS]
    assert model_trace(log)[0] == 2


# -- schedule ------------------------------------------------------------------------------------------------------

def _tick(spec: dict[str, Any], at: dt.datetime, dynamic_apps: list[str] | None = None):
    with dg.instance_for_test() as instance:
        if dynamic_apps:
            instance.add_dynamic_partitions("app_reviews__app", dynamic_apps)
        defs = build_definitions([parse_spec(spec)])
        schedule = defs.resolve_schedule_def(schedule_name(parse_spec(spec)))
        import tempfile

        storage = ArrowStorage(root=tempfile.mkdtemp(prefix="schedule-store-"))
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=at,
                                       repository_def=defs.get_repository_def(),
                                       resources={STORAGE_KEY: storage}) as context:
            return schedule.evaluate_tick(context)


def test_a_tick_requests_every_app_of_the_newest_complete_day(tmp_path: Path) -> None:
    data = tmp_path / "data"
    spec = multi_spec(data, tmp_path / "log", schedule={"cron": "30 1 * * *"})
    write_reviews(data, "2026-11-04", "android")
    # 01:30 on the 5th: the 4th is complete; ios's file has not landed, so only android runs
    result = _tick(spec, dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC))
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [(key("android", "2026-11-04"),) * 2]
    assert result.run_requests[0].tags["batch/launched_by"] == "schedule"
    write_reviews(data, "2026-11-04", "ios")
    result = _tick(spec, dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC))
    assert sorted(r.partition_key for r in result.run_requests) == [key(a, "2026-11-04") for a in APPS]
    early = _tick(spec, dt.datetime(2026, 11, 1, 12, 0, tzinfo=UTC))
    assert not early.run_requests and "no day has ended" in early.skip_message


def test_a_tick_over_a_dynamic_dimension_requests_the_keys_known_then(tmp_path: Path) -> None:
    data = tmp_path / "data"
    spec = multi_spec(data, tmp_path / "log", app={"name": "app", "kind": "dynamic"},
                      schedule={"cron": "30 1 * * *"})
    for app in APPS:
        write_reviews(data, "2026-11-04", app)
    none = _tick(spec, dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC))
    assert not none.run_requests and "has no keys yet" in none.skip_message
    result = _tick(spec, dt.datetime(2026, 11, 5, 1, 30, tzinfo=UTC), dynamic_apps=["ios"])
    assert [r.partition_key for r in result.run_requests] == [key("ios", "2026-11-04")]


# -- sensor --------------------------------------------------------------------------------------------------------

def test_sensor_one_run_per_new_day_and_app_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    spec = multi_spec(data, tmp_path / "log", sensor={"min_age_seconds": 5})
    write_reviews(data, "2026-11-01", "android", age_s=60)
    write_reviews(data, "2026-11-01", "ios", age_s=60)
    write_reviews(data, "2026-10-31", "ios", age_s=60)  # before start_date: no partition
    write_reviews(data, "2026-11-02", "android", age_s=0)  # still being written
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, spec)
        result = ticker.tick()
        assert sorted(r.partition_key for r in result.run_requests) == [key(a, "2026-11-01") for a in APPS]
        assert all(r.tags["batch/launched_by"] == "sensor" for r in result.run_requests)
        again = ticker.tick()
        assert not again.run_requests
        write_reviews(data, "2026-11-02", "android", age_s=60)
        assert [r.partition_key for r in ticker.tick().run_requests] == [key("android", "2026-11-02")]


def test_sensor_adds_new_keys_of_a_dynamic_dimension(tmp_path: Path) -> None:
    data = tmp_path / "data"
    spec = multi_spec(data, tmp_path / "log", app={"name": "app", "kind": "dynamic"}, sensor={"min_age_seconds": 0})
    write_reviews(data, "2026-11-01", "android", age_s=60)
    write_reviews(data, "2026-11-02", "android", age_s=60)
    with dg.instance_for_test() as instance:
        ticker = Ticker(instance, spec)
        result = ticker.tick()
        assert sorted(r.partition_key for r in result.run_requests) == [key("android", d) for d in DAYS]
        assert instance.get_dynamic_partitions("app_reviews__app") == ["android"]  # once, for both days
        write_reviews(data, "2026-11-02", "ios", age_s=60)
        assert [r.partition_key for r in ticker.tick().run_requests] == [key("ios", "2026-11-02")]
        assert sorted(instance.get_dynamic_partitions("app_reviews__app")) == list(APPS)


def test_default_row_ids_are_unique_across_days_of_one_app(tmp_path: Path) -> None:
    """Without prepare.id_column a row's id is '<file>:<row>'; every day has an `android.jsonl`, so the id keeps
    the day's folder: two partitions' outputs never share an id."""
    data, store = tmp_path / "data", tmp_path / "store"
    for day in DAYS:
        write_reviews(data, day, "android")
    spec = multi_spec(data, tmp_path / "model.log")
    spec["prepare"] = {"input_columns": ["text"]}
    defs = build_definitions([parse_spec(spec)])
    with dg.instance_for_test() as instance:
        for day in DAYS:
            result = defs.resolve_job_def("app_reviews_job").execute_in_process(
                instance=instance, partition_key=key("android", day),
                resources={STORAGE_KEY: ArrowStorage(root=str(store))})
            assert result.success
    ids = {day: pq.read_table(store / "app_reviews" / "output" / partition_file_name(key("android", day), "parquet"))
           .column("row_id").to_pylist() for day in DAYS}
    assert ids[DAYS[0]] == [f"{DAYS[0]}/android.jsonl:{r}" for r in range(1, ROWS["android"] + 1)]
    assert not set(ids[DAYS[0]]) & set(ids[DAYS[1]])


@pytest.mark.slow
def test_the_sensor_daemon_runs_each_new_day_x_app_file_once(tmp_path: Path) -> None:
    """The real sensor daemon iteration over a dynamic app dimension: it adds the apps, launches one run per file
    (executed here at once), each publishing its file's rows; a second tick launches nothing."""
    from dagster._daemon.sensor import execute_sensor_iteration

    data, store = tmp_path / "data", tmp_path / "store"
    source_ids = {key(app, DAYS[0]): write_reviews(data, DAYS[0], app, age_s=60) for app in APPS}
    spec = multi_spec(data, tmp_path / "model.log", app={"name": "app", "kind": "dynamic"},
                      sensor={"min_age_seconds": 5})
    defs_file = write_code_location(tmp_path / "code", [spec], store)
    logger = dg.get_dagster_logger("sensor-test")
    with dg.instance_for_test(overrides=SYNC_LAUNCHER) as instance:
        for _ in range(2):
            with daemon_workspace(instance, defs_file) as context:
                list(execute_sensor_iteration(context, logger, None, None))
        runs = instance.get_runs()
        assert sorted(r.tags["dagster/partition"] for r in runs) == sorted(source_ids)
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert sorted(instance.get_dynamic_partitions("app_reviews__app")) == list(APPS)
    for partition, ids in source_ids.items():
        assert output_ids(store, "app_reviews", partition) == ids, partition


def test_an_s3_prefix_of_day_x_app_objects(s3_bucket: str) -> None:
    """On s3:// (moto's server on loopback) the sensor maps each <date>/<app> object to its key, and the partition
    reads exactly that object."""
    import s3fs

    from batch_assets.partitions import resolve_partition

    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    prefix = f"{s3_bucket}/reviews"
    for app in APPS:
        fs.pipe(f"{prefix}/{DAYS[1]}/{app}.jsonl", b'{"review_id": "1", "text": "x"}\n')
    spec = multi_spec(Path("/unused"), Path("/unused.log"), sensor={"min_age_seconds": 0})
    spec["source"]["path"] = f"{prefix}/{{date}}/{{app}}.jsonl"
    with dg.instance_for_test() as instance:
        requests = Ticker(instance, spec).tick().run_requests
        assert sorted(r.partition_key for r in requests) == [key(app, DAYS[1]) for app in APPS]
        assert {r.tags["batch/source_file"] for r in requests} == {f"{prefix}/{DAYS[1]}/{a}.jsonl" for a in APPS}
    assert resolve_partition(parse_spec(spec), key("ios", DAYS[1])).files == [f"{prefix}/{DAYS[1]}/ios.jsonl"]
