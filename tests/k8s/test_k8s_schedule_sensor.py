"""GPUs per partition on the schedule and sensor launch paths, through the real K8sRunLauncher and the batch
Kubernetes executor against the loopback cluster stand-in (tests/k8s/stub.py).

The daemon's own tick functions (the scheduler's `launch_scheduled_runs`, the sensor daemon's
`execute_sensor_iteration`) evaluate the pipelines' schedule and sensor and submit runs to an instance whose run
launcher is K8sRunLauncher: each run becomes a run-worker Job, its steps Jobs, all run here by the stub. Two days
(schedule ticks on two dates) and two files (one sensor tick) have different GPU needs in the resource policy; each
infer Job must ask for its own partition's `nvidia.com/gpu` count, and read/prepare/write Jobs for none.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.daemon_helpers import daily_spec, write_day
from tests.k8s.conftest import CONFIG_MAP
from tests.k8s.stub import KubernetesJobsStub, Node, instance_yaml
from tests.orchestration.launch.test_sensors import drop, inbox_spec

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
UTC = dt.timezone.utc
DAY_SMALL, DAY_BIG = "2026-11-03", "2026-11-04"

DEFS = """
from batch_assets.catalog import built_in
from batch_assets.definitions import code_location

defs = code_location(built_in())
"""


def _gpu(job) -> str | None:
    return job.resources.get("limits", {}).get("nvidia.com/gpu")


def _wait_finished(instance: dg.DagsterInstance, stub: KubernetesJobsStub, count: int) -> list[dg.DagsterRun]:
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        runs = instance.get_runs()
        if len(runs) >= count and all(r.is_finished for r in runs):
            assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}, stub.failures()
            return runs
        time.sleep(2)
    raise AssertionError(f"runs did not finish: {[(r.run_id, r.status) for r in instance.get_runs()]}\n"
                         f"{stub.failures()}")


def k8s_code_location(tmp_path: Path, k8s_stub: KubernetesJobsStub, monkeypatch: pytest.MonkeyPatch,
                      specs: list[dict]) -> tuple[Path, Path, Path]:
    """An instance launching runs on the stand-in (K8sRunLauncher, BATCH_EXECUTOR=k8s, a 4-GPU node beside the CPU
    one) and a code location over `specs`: (DAGSTER_HOME, storage root, definitions file)."""
    home, pipelines, store = tmp_path / "home", tmp_path / "pipelines", tmp_path / "store"
    home.mkdir()
    pipelines.mkdir()
    # Runs go straight to K8sRunLauncher (no queue daemon in this test); two GPU-pool slots let two infer steps run.
    extra = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
             "concurrency": {"pools": {"default_limit": 2, "granularity": "op"}}}
    (home / "dagster.yaml").write_text(instance_yaml(k8s_stub, home, extra=extra, env_config_maps=[CONFIG_MAP]))
    k8s_stub.nodes.append(Node("gpu-1", cpu="16", memory="64Gi", gpus=4))
    for spec in specs:
        (pipelines / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    env = {"DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines), "BATCH_STORAGE_ROOT": str(store),
           "BATCH_EXECUTOR": "k8s", "BATCH_STORAGE_ROOT_SHARED": "1"}  # the stand-in's pods share this disk
    # Pods read the settings from the code location's ConfigMap. The test's model class lives in tests/ (a real
    # image would have the user's model package installed), hence PYTHONPATH.
    k8s_stub.create_config_map(CONFIG_MAP, {**env, "PYTHONPATH": str(ROOT)}, namespace="batch")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    defs_file = tmp_path / "code" / "k8s_defs.py"
    defs_file.parent.mkdir()
    defs_file.write_text(DEFS)
    return home, store, defs_file


def test_schedule_ticks_and_sensor_requests_size_each_infer_job(tmp_path: Path, k8s_stub: KubernetesJobsStub,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster._core.test_utils import freeze_time
    from dagster._daemon.sensor import execute_sensor_iteration
    from dagster._scheduler.scheduler import launch_scheduled_runs

    from tests.daemon_helpers import daemon_workspace

    write_day(tmp_path / "days", DAY_SMALL)
    write_day(tmp_path / "days", DAY_BIG)
    gpu_policy = {"gpus": 1, "resources": {"partitions": {DAY_BIG: {"gpus": 2}, "big": {"gpus": 2}}}}
    daily = daily_spec(tmp_path / "days", tmp_path / "daily.log", schedule={"cron": "30 1 * * *"},
                       runtime=gpu_policy)
    inbox = inbox_spec(str(tmp_path / "inbox"), min_age_seconds=0)
    inbox["model"]["config"]["init_kwargs"]["log"] = str(tmp_path / "inbox.log")
    inbox["runtime"] = gpu_policy
    drop(tmp_path / "inbox", "small")
    drop(tmp_path / "inbox", "big")
    home, store, defs_file = k8s_code_location(tmp_path, k8s_stub, monkeypatch, [daily, inbox])

    logger = dg.get_dagster_logger("k8s-launch-paths")
    with dg.DagsterInstance.from_config(str(home)) as instance, daemon_workspace(instance, defs_file) as context:
        times: dict = {}
        for at in (dt.datetime(2026, 11, 4, 0, 0, tzinfo=UTC), dt.datetime(2026, 11, 4, 1, 31, tzinfo=UTC),
                   dt.datetime(2026, 11, 5, 1, 31, tzinfo=UTC)):
            with freeze_time(at):
                list(launch_scheduled_runs(context, logger, at, times))
        list(execute_sensor_iteration(context, logger, None, None))
        runs = _wait_finished(instance, k8s_stub, 4)

        by_partition = {(r.job_name, r.tags["dagster/partition"]): r for r in runs}
        assert set(by_partition) == {("daily_docs_job", DAY_SMALL), ("daily_docs_job", DAY_BIG),
                                     ("inbox_job", "small"), ("inbox_job", "big")}
        expected = {DAY_SMALL: "1", DAY_BIG: "2", "small": "1", "big": "2"}
        for (job_name, key), run in by_partition.items():
            pipeline = job_name.removesuffix("_job")
            launched_by = run.tags["batch/launched_by"]
            steps = k8s_stub.step_jobs(run.run_id)
            assert _gpu(steps[f"{pipeline}__inferred"]) == expected[key], (launched_by, key, steps)
            for stage in ("raw", "prepared", "output"):
                assert _gpu(steps[f"{pipeline}__{stage}"]) is None, (launched_by, key, stage)
        assert {r.tags["batch/launched_by"] for r in runs} == {"schedule", "sensor"}
    for day in (DAY_SMALL, DAY_BIG):
        assert (store / "daily_docs" / "output" / f"{day}.parquet").exists()
    for key in ("small", "big"):
        assert (store / "inbox" / "output" / f"{key}.parquet").exists()
