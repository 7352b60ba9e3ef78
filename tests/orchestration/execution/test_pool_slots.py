"""Pools: the infer step of every run against one external endpoint takes turns, so runs never add up past the
endpoint's rate limit; the pool is named once (batch_assets/orchestration/execution/pool_slots.py)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from batch_assets.orchestration.execution.pool_slots import endpoint_pool, infer_pool
from batch_assets.spec import parse_spec
from tests.conftest import GENERATE_SPEC, make_spec, pipeline_definitions
from tests.daemon_helpers import daily_spec, write_day
from tests.test_postgres import postgres_port  # noqa: F401 - the module-scoped PostgreSQL fixture

DAYS = ["2026-11-01", "2026-11-02"]


def test_endpoint_pools_are_named_per_endpoint(tmp_path: Path) -> None:
    def pool_for(config: dict) -> str | None:
        spec = make_spec(GENERATE_SPEC, tmp_path, model={"provider": "openai", "config": {"model": "m", **config}})
        return infer_pool(spec)

    assert pool_for({"base_url": "http://127.0.0.1:8080/v1"}) == "endpoint:127.0.0.1:8080"
    assert pool_for({"base_url": {"env": "OPENAI_BASE_URL"}}) == "endpoint:$OPENAI_BASE_URL"  # never the value
    assert pool_for({}) == "endpoint:api.openai.com"
    assert endpoint_pool(make_spec(GENERATE_SPEC, tmp_path)) is None  # a local model holds no endpoint
    assert infer_pool(make_spec(GENERATE_SPEC, tmp_path, runtime={"gpus": 1})) == "gpu"
    assert infer_pool(make_spec(GENERATE_SPEC, tmp_path, runtime={"pool": "shared-api"})) == "shared-api"


def _run_day(spec_raw: dict, store: str, instance_ref, day: str) -> None:
    """One run in its own process, as two run workers of a deployment would be."""
    instance = dg.DagsterInstance.from_ref(instance_ref)
    job = pipeline_definitions(parse_spec(spec_raw), store).resolve_job_def("daily_docs_job")
    assert job.execute_in_process(instance=instance, partition_key=day).success


def _blocked_runs(instance, pool: str) -> set[str]:
    """Runs whose step logged that it waited for a slot of `pool`."""
    return {run.run_id for run in instance.get_runs() for entry in instance.all_logs(run.run_id)
            if entry.message == f"Step blocked by limit for pool {pool}"}


@pytest.mark.slow
def test_two_runs_in_one_pool_take_turns_at_the_infer_step(tmp_path: Path) -> None:
    import multiprocessing
    import time

    data, log, gate = tmp_path / "data", tmp_path / "model.log", tmp_path / "gate"
    for day in DAYS:
        write_day(data, day)
    raw = daily_spec(data, log, runtime={"pool": "endpoint:test-api"})
    raw["model"]["config"] = {"class_path": "tests.daemon_helpers:SlowModel",
                              "init_kwargs": {"log": str(log), "seconds": 0.2, "gate": str(gate)}}
    job = pipeline_definitions(parse_spec(raw), tmp_path / "store").resolve_job_def("daily_docs_job")
    assert job.graph.node_named("daily_docs__inferred").definition.pool == "endpoint:test-api"
    overrides = {"concurrency": {"pools": {"default_limit": 1, "granularity": "op"}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        spawn = multiprocessing.get_context("spawn")
        workers = [spawn.Process(target=_run_day, args=(raw, str(tmp_path / "store"), instance.get_ref(), day))
                   for day in DAYS]
        for w in workers:
            w.start()
        try:
            # One run's infer step holds the pool's slot (held at the model's gate) until the other run's infer
            # step has reported that it is blocked on the pool: the runs overlap whatever the machine's speed.
            deadline = time.monotonic() + 240
            while not _blocked_runs(instance, "endpoint:test-api"):
                assert time.monotonic() < deadline, "no run waited for the endpoint pool's slot"
                assert all(w.is_alive() for w in workers), [w.exitcode for w in workers]
                entered = list(tmp_path.glob("gate.entered.*"))
                assert len(entered) < 2, "both runs are inside their infer steps at once"
                time.sleep(0.5)
        finally:
            gate.touch()
            for w in workers:
                w.join(timeout=240)
        assert [w.exitcode for w in workers] == [0, 0]
        assert len(_blocked_runs(instance, "endpoint:test-api")) == 1
    spans = sorted(tuple(map(float, line.split()[1:])) for line in log.read_text().splitlines()
                   if line.startswith("span "))
    assert len(spans) == 2
    assert spans[0][1] <= spans[1][0], f"infer steps of the two runs overlapped: {spans}"


def test_slots_of_runs_that_are_gone_are_freed_and_a_live_holder_is_named(tmp_path: Path) -> None:
    """Before an infer step asks for its slot: a slot held by a killed run (its process gone) or by a run that has
    ended is freed and the killed run marked failed; a live holder is named, with how to free it."""
    import logging
    import subprocess

    from dagster._core.test_utils import create_run_for_test

    from batch_assets.orchestration.execution.pool_slots import PROCESS_TAG, process_identity, release_dead_slots

    pool = "endpoint:test-api"
    doomed = subprocess.Popen(["sleep", "60"])
    dead_identity = process_identity(doomed.pid)
    doomed.kill()
    doomed.wait()
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(f"{record.levelname} {record.getMessage()}")

    log = logging.getLogger("pool-test")
    log.addHandler(Collect())
    with dg.instance_for_test() as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots(pool, 3)
        killed = create_run_for_test(instance, job_name="a_job", status=dg.DagsterRunStatus.STARTED,
                                     tags={PROCESS_TAG: dead_identity})
        ended = create_run_for_test(instance, job_name="a_job", status=dg.DagsterRunStatus.SUCCESS)
        alive = create_run_for_test(instance, job_name="b_job", status=dg.DagsterRunStatus.STARTED,
                                    tags={PROCESS_TAG: process_identity()})
        for run in (killed, ended, alive):
            assert storage.claim_concurrency_slot(pool, run.run_id, "p__inferred").is_claimed
        freed = release_dead_slots(instance, pool, own_run_id="me", log=log)
        assert sorted(freed) == sorted([killed.run_id, ended.run_id])
        assert [s.run_id for s in storage.get_concurrency_info(pool).claimed_slots] == [alive.run_id]
        failed = instance.get_run_by_id(killed.run_id)
        assert failed.status == dg.DagsterRunStatus.FAILURE
        assert any("its process" in r and killed.run_id in r for r in records), records
        assert not any("is held by" in r for r in records)  # two free slots left: nobody waits

        storage.set_concurrency_slots(pool, 1)
        release_dead_slots(instance, pool, own_run_id="me", log=log)
        [held] = [r for r in records if "is held by" in r]
        assert held.startswith("WARNING") and alive.run_id in held and "b_job" in held
        assert "python -m batch_assets.commands.pools free" in held


def test_the_pools_command_shows_and_frees_a_held_slot(tmp_path: Path) -> None:
    """`python -m batch_assets.commands.pools status` names who holds a slot; `free <run id>` frees it and marks the
    run
    failed (what troubleshooting.md tells a user whose run waits on a holder from another machine)."""
    import os
    import subprocess
    import sys

    from dagster._core.test_utils import create_run_for_test

    from tests.daemon_helpers import ROOT, dagster_home

    home = dagster_home(tmp_path / "home")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    pool = "endpoint:test-api"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = create_run_for_test(instance, job_name="a_job", status=dg.DagsterRunStatus.STARTED)
        instance.event_log_storage.set_concurrency_slots(pool, 1)
        assert instance.event_log_storage.claim_concurrency_slot(pool, run.run_id, "a__inferred").is_claimed

    def pools(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "batch_assets.commands.pools", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert f"{pool}: 1 slot(s), held by: {run.run_id} (a__inferred)" in pools("status")
    pools("free", run.run_id)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert not instance.event_log_storage.get_concurrency_info(pool).claimed_slots
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
    assert "held by: none" in pools("status", pool)


def _hold_slot(instance_ref, pool: str, folder: str, name: str) -> None:
    """One infer step's use of the pool, in its own process: says it is trying, then that it holds the slot, and
    holds it until the test writes `release`."""
    import time

    from batch_assets.orchestration.execution.pool_slots import host_pool_slot

    instance = dg.DagsterInstance.from_ref(instance_ref)
    (Path(folder) / f"trying-{name}").touch()
    with host_pool_slot(instance, pool):
        (Path(folder) / f"holding-{name}").touch()
        while not (Path(folder) / "release").exists():
            time.sleep(0.05)
        (Path(folder) / f"holding-{name}").unlink()
        (Path(folder) / f"done-{name}").touch()


@pytest.mark.parametrize("slots", [1, 2])
def test_sqlite_instance_never_runs_more_infer_steps_than_the_pool_has_slots(tmp_path: Path, slots: int) -> None:
    """Dagster's slot claim is not exclusive on SQLite (FOR UPDATE is ignored: two claims milliseconds apart can
    both get the last slot), so on SQLite the infer step also holds a host lock per slot (pool_slots.host_pool_slot).
    Three processes ask at once: `slots` of them get in, the rest wait until one lets go, and all finish."""
    import multiprocessing
    import time

    from tests.daemon_helpers import wait_for

    folder = tmp_path / "marks"
    folder.mkdir()

    def marks(kind: str) -> list[str]:
        return sorted(p.name for p in folder.glob(f"{kind}-*"))

    with dg.DagsterInstance.from_config(str(_home(tmp_path))) as instance:
        instance.event_log_storage.set_concurrency_slots("gpu", slots)
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_hold_slot, args=(instance.get_ref(), "gpu", str(folder), str(i)))
                 for i in range(3)]
        for p in procs:
            p.start()
        try:
            wait_for("all three to ask for the slot", lambda: len(marks("trying")) == 3, None, 120, interval=0.1)
            wait_for(f"{slots} to hold it", lambda: len(marks("holding")) >= slots, None, 60, interval=0.1)
            time.sleep(2)  # the others asked already: without the host lock they would be in by now
            assert len(marks("holding")) == slots, marks("holding")
            (folder / "release").touch()
            for p in procs:
                p.join(60)
                assert p.exitcode == 0
            assert len(marks("done")) == 3
        finally:
            for p in procs:
                p.kill()


def test_every_sqlite_event_log_gets_the_host_slots(tmp_path: Path) -> None:
    """The consolidated SQLite event log (a dagster.yaml choice) claims pool slots the same way as the default."""
    from batch_assets.orchestration.execution.pool_slots import _sqlite_lock_dir

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nevent_log_storage:\n  module: dagster._core.storage.event_log\n"
        f"  class: ConsolidatedSqliteEventLogStorage\n  config:\n    base_dir: {home / 'events'}\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert _sqlite_lock_dir(instance) == str(home / "batch_pool_locks")


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return home


def _claim_all_at_once(storages: list, pool: str, round_: int) -> list[int]:
    """Every storage (a process's own connection to the instance) claims a slot of `pool` at the same moment, as
    run workers whose infer steps become ready together do; returns which ones were given a slot."""
    import threading

    barrier, claimed = threading.Barrier(len(storages)), []

    def claim(i: int) -> None:
        barrier.wait()
        if storages[i].claim_concurrency_slot(pool, f"run-{round_}-{i}", "docs__inferred").is_claimed:
            claimed.append(i)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(storages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return claimed


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_steps_claiming_a_pool_at_the_same_moment_never_exceed_its_slots(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str, slots: int) -> None:
    """Dagster's claim is SELECT-then-UPDATE on an autocommit connection: unguarded, 4 claimers at once on a pool of
    1 slot were all given it in 18 of 40 rounds on PostgreSQL and 14 of 40 on SQLite (dagster 1.13.27), and the
    rehearsal's two GPU infer steps ran side by side. Defining a pipeline installs the compare-and-set claim; with
    it, never more than `slots` (each claimer a storage of its own, as each run worker has)."""
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    from batch_assets.orchestration.execution.pool_slots import guard_slot_claims

    guard_slot_claims()  # as build_pipeline_definitions does in every process that defines pipelines
    assert getattr(SqlEventLogStorage._claim_concurrency_slot, "batch_assets_guard", False)

    if backend == "postgres":
        from dagster_postgres import PostgresEventLogStorage

        url = f"postgresql+psycopg2://postgres:unused@127.0.0.1:{request.getfixturevalue('postgres_port')}/dagster"
        storages = [PostgresEventLogStorage(url) for _ in range(4)]
    else:
        from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

        storages = [SqliteEventLogStorage(str(tmp_path / "events")) for _ in range(4)]
    pool = f"gpu-{slots}"
    storages[0].set_concurrency_slots(pool, slots)
    given = []
    for round_ in range(40):
        claimed = _claim_all_at_once(storages, pool, round_)
        given.append(len(claimed))
        holders = storages[0].get_concurrency_info(pool).claimed_slots
        assert len(holders) == len(claimed), (round_, holders, claimed)  # every claimant holds a row of its own
        for i in range(len(storages)):
            storages[0].free_concurrency_slots_for_run(f"run-{round_}-{i}")
    assert max(given) == slots and min(given) >= 1, given  # never more than the pool has, and never none
    for storage in storages:
        storage.dispose()


def test_defining_a_pipeline_installs_the_guarded_claim_in_a_fresh_process(tmp_path: Path) -> None:
    """A run worker only loads the code location: defining the pipelines there must be enough."""
    import json
    import subprocess
    import sys

    spec = make_spec(GENERATE_SPEC, tmp_path, runtime={"gpus": 1})
    code = ("import json, sys\n"
            "from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage as S\n"
            "from batch_assets.orchestration.assets.factory import build_pipeline_definitions\n"
            "from batch_assets.spec import PipelineSpec\n"
            "before = getattr(S._claim_concurrency_slot, 'batch_assets_guard', False)\n"
            "build_pipeline_definitions(PipelineSpec.model_validate(json.loads(sys.argv[1])))\n"
            "print(before, getattr(S._claim_concurrency_slot, 'batch_assets_guard', False))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(spec.model_dump(mode="json"))], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"], out.stdout


def _postgres_instance(home: Path, port: int, default_limit: int) -> dg.DagsterInstance:
    """A process's instance on the deployment's PostgreSQL, with `concurrency.pools.default_limit` as values.yaml
    renders it."""
    import yaml

    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump({
        "telemetry": {"enabled": False},
        "storage": {"postgres": {"postgres_url": f"postgresql+psycopg2://postgres:unused@127.0.0.1:{port}/dagster"}},
        "concurrency": {"pools": {"default_limit": default_limit, "granularity": "op"}}}))
    return dg.DagsterInstance.from_config(str(home))


@pytest.mark.slow
def test_a_new_pool_reached_by_run_workers_at_once_and_a_raised_default_limit_never_fail_a_claim(
        tmp_path: Path, postgres_port: int) -> None:  # noqa: F811 - the module's fixture
    """Unguarded (dagster 1.13.27), Dagster's duplicate-key UPDATE runs in the transaction PostgreSQL has aborted:
    3 of 4 run workers reaching a new pool together failed with InFailedSqlTransaction, and after the default limit
    was raised every claim on a pool still on the default failed the same way."""
    import threading

    from batch_assets.orchestration.execution.pool_slots import guard_slot_claims

    guard_slot_claims()
    workers = [_postgres_instance(tmp_path / f"worker{i}", postgres_port, 1) for i in range(4)]
    errors: list[str] = []
    for round_ in range(10):
        barrier = threading.Barrier(len(workers))

        def first_claim(instance: dg.DagsterInstance, pool: str) -> None:
            barrier.wait()
            try:  # what InstanceConcurrencyContext.claim does first for a pool without a limit of its own
                instance.event_log_storage.initialize_concurrency_limit_to_default(pool)
                instance.event_log_storage.claim_concurrency_slot(pool, f"run-{id(instance)}", "docs__inferred")
            except Exception as exc:  # noqa: BLE001 - every failure is reported
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

        threads = [threading.Thread(target=first_claim, args=(w, f"endpoint:api-{round_}")) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        info = workers[0].event_log_storage.get_concurrency_info(f"endpoint:api-{round_}")
        assert info.slot_count == 1 and len(info.claimed_slots) == 1, (round_, info)
    assert not errors, errors

    # values.yaml's defaultLimit raised to 2: the next run worker brings the pools still on the default up to it
    raised = _postgres_instance(tmp_path / "raised", postgres_port, 2)
    storage = raised.event_log_storage
    assert storage.get_pool_limits()[0].from_default
    assert storage.initialize_concurrency_limit_to_default("endpoint:api-0")
    assert storage.get_concurrency_info("endpoint:api-0").slot_count == 2
    assert storage.claim_concurrency_slot("endpoint:api-0", "run-after-raise", "docs__inferred").is_claimed
    for instance in [*workers, raised]:
        instance.dispose()
