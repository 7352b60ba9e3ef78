"""Day x app partitions on Kubernetes: the schedule's tick launches one run per app of the newest day through the
real K8sRunLauncher and the batch executor against the loopback cluster stand-in (tests/k8s/stub.py), which refuses
Job names and labels the API server would refuse; each infer Job asks for what the resource policy gives its multi
partition key (`ios|*`: two GPUs), and every stage publishes its partition."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from batch_assets.storage import partition_file_name
from tests.k8s.stub import KubernetesJobsStub, invalid_names
from tests.k8s.test_k8s_schedule_sensor import _gpu, _wait_finished, k8s_code_location
from tests.orchestration.launch.test_multi_partitions import APPS, key, multi_spec, write_reviews

UTC = dt.timezone.utc
DAY = "2026-11-04"


def test_the_stand_in_refuses_what_the_api_server_refuses() -> None:
    """A partition key is no Kubernetes name: `|` in a Job name or a label value is refused (422)."""
    good = {"metadata": {"name": "dagster-step-0123abcd", "labels": {"dagster/op": "app_reviews__inferred"}},
            "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/component": "step_worker"}}}}}
    assert invalid_names(good) == []
    bad_label = {"metadata": {"name": "dagster-step-0123abcd", "labels": {"batch/partition": "ios|2026-11-04"}}}
    assert "'ios|2026-11-04' (label batch/partition)" in invalid_names(bad_label)[0]
    assert invalid_names({"metadata": {"name": "step-ios|2026-11-04"}})
    assert invalid_names({"metadata": {"name": "x" * 64}})


@pytest.mark.slow
def test_schedule_tick_sizes_each_day_x_app_infer_job(tmp_path: Path, k8s_stub: KubernetesJobsStub,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster._core.test_utils import freeze_time
    from dagster._scheduler.scheduler import launch_scheduled_runs

    from tests.daemon_helpers import daemon_workspace

    data = tmp_path / "data"
    ids = {app: write_reviews(data, DAY, app) for app in APPS}
    spec = multi_spec(data, tmp_path / "model.log", schedule={"cron": "30 1 * * *"},
                      runtime={"gpus": 1, "resources": {"partitions": {"ios|*": {"gpus": 2}}}})
    home, store, defs_file = k8s_code_location(tmp_path, k8s_stub, monkeypatch, [spec])

    logger = dg.get_dagster_logger("k8s-multi-partitions")
    with dg.DagsterInstance.from_config(str(home)) as instance, daemon_workspace(instance, defs_file) as context:
        times: dict = {}
        for at in (dt.datetime(2026, 11, 5, 0, 0, tzinfo=UTC), dt.datetime(2026, 11, 5, 1, 31, tzinfo=UTC)):
            with freeze_time(at):
                list(launch_scheduled_runs(context, logger, at, times))
        runs = _wait_finished(instance, k8s_stub, 2)
        by_partition = {r.tags["dagster/partition"]: r for r in runs}
        assert set(by_partition) == {key(app, DAY) for app in APPS}
        for app, gpus in (("android", "1"), ("ios", "2")):
            run = by_partition[key(app, DAY)]
            assert run.tags["dagster/partition/app"] == app and run.tags["dagster/partition/date"] == DAY
            steps = k8s_stub.step_jobs(run.run_id)
            assert _gpu(steps["app_reviews__inferred"]) == gpus, (app, steps)
            for stage in ("raw", "prepared", "output"):
                assert _gpu(steps[f"app_reviews__{stage}"]) is None, (app, stage)
    assert all(not invalid_names(job.body) for job in k8s_stub.jobs)  # every Job was one the API server accepts
    for app in APPS:
        table = pq.read_table(store / "app_reviews" / "output" / partition_file_name(key(app, DAY), "parquet"))
        assert table.column("review_id").to_pylist() == ids[app]
