"""GPUs per partition on every launch path, end to end through the real Dagster and dagster-k8s code.

`dagster dev` (webserver + daemon) runs with an instance whose run launcher is the real `K8sRunLauncher` and with
BATCH_EXECUTOR=k8s (the batch executor built on `k8s_job_executor`), both talking to the loopback cluster stand-in
(tests/k8s/stub.py), which schedules each Job's pod on a node that fits it (a CPU node, a 1-GPU and a 2-GPU node,
tainted) and runs its `dagster api execute_run` / `execute_step` command here with the environment of its spec.
Partition b is bigger than a, so the policy gives its infer step more GPUs, CPU and memory, another node pool and
another toleration. Launch paths: a partition launched from the UI's GraphQL (as the Materialize button does), a
single-run backfill over a..b (pipeline `docs`, the default policy), and a multi-run backfill of a and b (pipeline
`docs_multi`, the same spec with `backfill: {policy: multi_run, max_partitions_per_run: 1}`).

The stand-in cluster has no GPUs: the model config says `device: cpu`, so MiniLM runs on CPU whatever the Job
asked for (an explicit device wins over BATCH_INFER_GPUS, see resources/base.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import EMBED_SPEC, docs_rows, free_port, write_jsonl
from tests.daemon_helpers import (
    TERMINAL_RUN_STATUSES, dagster_dev_command, dev_server, graphql, log_tail, wait_for, wait_ready,
)
from tests.k8s.conftest import CONFIG_MAP
from tests.k8s.stub import KubernetesJobsStub, Node, RecordedJob

pytestmark = pytest.mark.slow

SMALL_NODES = {"batch.example.com/gpu-pool": "t4"}
LARGE_NODES = {"batch.example.com/gpu-pool": "a100"}
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
BIG_BATCH_TAINT = {"key": "dedicated", "operator": "Equal", "value": "big-batch", "effect": "NoSchedule"}
STAGES = ("raw", "prepared", "inferred", "output")
GPU_NODE_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


RUNS_QUERY = """query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
  runId status tags { key value } } } } }"""
BACKFILL_MUTATION = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message stack } } }"""
BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { status } ... on PythonError { message } } }"""


def _runs(port: int, tags: list[dict]) -> list[dict]:
    return graphql(port, RUNS_QUERY, {"filter": {"tags": tags}})["runsOrError"]["results"]


def _wait_runs_done(port: int, run_ids: list[str], stub: KubernetesJobsStub, log: Path) -> None:
    def finished() -> dict[str, str] | None:
        statuses = {r["runId"]: r["status"] for r in _runs(port, []) if r["runId"] in run_ids}
        done = len(statuses) == len(run_ids) and all(s in TERMINAL_RUN_STATUSES for s in statuses.values())
        return statuses if done else None

    statuses = wait_for(f"runs {run_ids} to finish", finished, log, 420, diagnose=stub.failures)
    assert set(statuses.values()) == {"SUCCESS"}, f"{statuses}\n{stub.failures()}\n{log_tail(log)}"


def _launch_backfill(port: int, params: dict, stub: KubernetesJobsStub, log: Path) -> list[dict]:
    result = graphql(port, BACKFILL_MUTATION, {"params": params})["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    backfill_id = result["backfillId"]

    def finished() -> tuple[str, list[dict]] | None:
        status = graphql(port, BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]["status"]
        runs = _runs(port, [{"key": "dagster/backfill", "value": backfill_id}])
        done = status in ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED") and runs and all(
            r["status"] in TERMINAL_RUN_STATUSES for r in runs)
        return (status, runs) if done else None

    status, runs = wait_for(f"backfill {backfill_id} to finish", finished, log, 420, diagnose=stub.failures)
    assert status in ("COMPLETED", "COMPLETED_SUCCESS") and {r["status"] for r in runs} == {"SUCCESS"}, (
        f"backfill {status}: {runs}\n{stub.failures()}\n{log_tail(log)}")
    return runs


def _assert_needs(job: RecordedJob, gpus: int, cpu: str, memory: str, nodes: dict, tolerations: list[dict]) -> None:
    res = job.resources
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == str(gpus), res
    assert (res["requests"]["cpu"], res["requests"]["memory"], res["limits"]["memory"]) == (cpu, memory, memory)
    assert job.pod_spec.get("nodeSelector") == nodes
    assert job.pod_spec.get("tolerations") == tolerations
    assert job.env["BATCH_INFER_GPUS"] == str(gpus)


def _assert_no_gpu(job: RecordedJob) -> None:
    res = json.dumps(job.resources)
    assert "nvidia.com/gpu" not in res and not job.pod_spec.get("nodeSelector"), (job.step_key, res)
    assert "BATCH_INFER_GPUS" not in job.env


def _assert_run_jobs(stub: KubernetesJobsStub, run_id: str, pipeline: str = "docs") -> dict[str, RecordedJob]:
    run_workers = [j for j in stub.jobs_for_run(run_id) if j.component == "run_worker"]
    assert len(run_workers) == 1, "the run was launched by K8sRunLauncher as one run-worker Job"
    assert "execute_run" in " ".join(run_workers[0].container["args"])
    steps = stub.step_jobs(run_id)
    assert sorted(steps) == sorted(f"{pipeline}__{s}" for s in STAGES), steps.keys()
    for stage in ("raw", "prepared", "output"):
        _assert_no_gpu(steps[f"{pipeline}__{stage}"])
    for job in stub.jobs_for_run(run_id):  # what a real API server would have been sent is a valid Job
        kubernetes_validate.validate(job.body, "1.31", strict=True)
    return steps


def _assert_outputs(store: Path, rows: dict[str, int], pipeline: str = "docs") -> None:
    for key, n in rows.items():
        table = pq.read_table(store / pipeline / "output" / f"{key}.parquet")
        assert sorted(table.column("doc_id").to_pylist()) == sorted(f"{key}{i}" for i in range(n))
        assert all(len(v) == 384 for v in table.column("embedding").to_pylist())


def test_gpu_counts_per_partition_on_every_launch_path(tmp_path: Path, k8s_stub: KubernetesJobsStub,
                                                       k8s_dagster_home: Path) -> None:
    data, pipelines, store = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store"
    write_jsonl(data / "a.jsonl", docs_rows("a", 3))
    write_jsonl(data / "b.jsonl", docs_rows("b", 12))
    threshold = ((data / "a.jsonl").stat().st_size + (data / "b.jsonl").stat().st_size) // 2
    pipelines.mkdir()
    spec = {
        **EMBED_SPEC,
        "source": {**EMBED_SPEC["source"], "path": f"{data}/{{partition}}.jsonl"},
        "model": {"provider": "sentence_transformers", "config": {"batch_size": 16, "device": "cpu"}},
        "runtime": {"chunk_rows": 7, "gpus": 1, "resources": {
            "default": {"cpu": "1", "memory": "2Gi", "node_selector": SMALL_NODES, "tolerations": [GPU_TAINT]},
            "by_size": [{"min_bytes": threshold, "gpus": 2, "cpu": "4", "memory": "8Gi",
                         "node_selector": LARGE_NODES}],
            "partitions": {"b": {"tolerations": [GPU_TAINT, BIG_BATCH_TAINT]}},
        }},
    }
    (pipelines / "docs.yaml").write_text(yaml.safe_dump(spec))
    multi = {**spec, "name": "docs_multi", "backfill": {"policy": "multi_run", "max_partitions_per_run": 1}}
    (pipelines / "docs_multi.yaml").write_text(yaml.safe_dump(multi))
    env = {"DAGSTER_HOME": str(k8s_dagster_home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store), "BATCH_EXECUTOR": "k8s",
           "BATCH_STORAGE_ROOT_SHARED": "1"}  # the stand-in's pods share this machine's disk (a RWX volume's role)
    # Pods read the code location's settings from its ConfigMap (k8s/config.yaml); the GPU nodes fit the policy.
    k8s_stub.config_maps[("batch", CONFIG_MAP)].update(env)
    k8s_stub.nodes += [
        Node("t4-1", cpu="8", memory="30Gi", gpus=1, labels=SMALL_NODES, taints=[GPU_NODE_TAINT]),
        Node("a100-1", cpu="32", memory="120Gi", gpus=2, labels=LARGE_NODES,
             taints=[GPU_NODE_TAINT, {"key": "dedicated", "value": "big-batch", "effect": "NoSchedule"}]),
    ]

    port = free_port()
    log = tmp_path / "dagster-dev.log"
    with dev_server(dagster_dev_command(port), {**os.environ, **env}, log) as proc:
        wait_ready(port, proc, log)
        small = (1, "1", "2Gi", SMALL_NODES, [GPU_TAINT])
        large = (2, "4", "8Gi", LARGE_NODES, [GPU_TAINT, BIG_BATCH_TAINT])

        # 1. One partition at a time from the UI (GraphQL launchRun, as the Materialize button does).
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        ui_runs = {key: client.submit_job_execution("docs_job", tags={"dagster/partition": key}) for key in "ab"}
        _wait_runs_done(port, list(ui_runs.values()), k8s_stub, log)
        for key, needs in (("a", small), ("b", large)):
            steps = _assert_run_jobs(k8s_stub, ui_runs[key])
            _assert_needs(steps["docs__inferred"], *needs)
        _assert_outputs(store, {"a": 3, "b": 12})

        # 2. A single-run asset backfill over a..b: one run, its infer Job sized for the neediest partition.
        assets = [{"path": ["docs", s]} for s in ("raw", "prepared", "inferred", "output")]
        runs = _launch_backfill(port, {"partitionNames": ["a", "b"], "assetSelection": assets}, k8s_stub, log)
        assert len(runs) == 1
        tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
        assert (tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]) == ("a", "b")
        _assert_needs(_assert_run_jobs(k8s_stub, runs[0]["runId"])["docs__inferred"], *large)
        _assert_outputs(store, {"a": 3, "b": 12})

        # 3. A multi-run backfill: one run per partition, each infer Job sized for its own partition.
        assets = [{"path": ["docs_multi", s]} for s in STAGES]
        runs = _launch_backfill(port, {"partitionNames": ["a", "b"], "assetSelection": assets}, k8s_stub, log)
        assert len(runs) == 2
        by_key = {}
        for run in runs:
            tags = {t["key"]: t["value"] for t in run["tags"]}
            key = tags.get("dagster/partition") or tags["dagster/asset_partition_range_start"]
            assert tags.get("dagster/asset_partition_range_end", key) == key
            by_key[key] = run["runId"]
        assert sorted(by_key) == ["a", "b"]
        for key, needs in (("a", small), ("b", large)):
            _assert_needs(_assert_run_jobs(k8s_stub, by_key[key], "docs_multi")["docs_multi__inferred"], *needs)
        _assert_outputs(store, {"a": 3, "b": 12}, "docs_multi")

        # The GPU pool (one slot in this instance) never let two infer steps run at once, across runs.
        from dagster import DagsterEventType, DagsterInstance

        with DagsterInstance.from_config(str(k8s_dagster_home)) as instance:
            # The work of an infer step runs while it holds the slot: on this SQLite instance the step also takes
            # a host lock per slot, since SQLite's slot claim is not exclusive (pool_slots.host_pool_slot), and a step
            # the database let through too early waits there after its STEP_START.
            from batch_assets.orchestration.execution.pool_slots import HOST_SLOT_MESSAGE, HOST_SLOT_RELEASED

            spans = []
            for run_id in [*ui_runs.values(), *[r["runId"] for r in _runs(port, [])]]:
                events = [e for e in instance.all_logs(run_id) if e.step_key and e.step_key.endswith("__inferred")]
                times = {e.dagster_event.event_type: e.timestamp for e in events if e.dagster_event}
                held = [e.timestamp for e in events if HOST_SLOT_MESSAGE in (e.user_message or "")]
                released = [e.timestamp for e in events if HOST_SLOT_RELEASED in (e.user_message or "")]
                assert len(held) == len(released) == 1, [e.user_message for e in events]
                assert times[DagsterEventType.STEP_START] <= held[0] < released[0] <= times[
                    DagsterEventType.STEP_SUCCESS]
                spans.append((held[0], released[0]))
            # the run log says what the policy chose, before the step starts
            messages = [e.message for e in instance.all_logs(ui_runs["b"], of_type=DagsterEventType.ENGINE_EVENT)]
            assert any("Resource policy for docs__inferred over partitions b: 2 GPU(s), cpu 4, memory 8Gi" in m
                       for m in messages), messages
        spans = sorted(set(spans))
        assert len(spans) == 5
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), spans
        assert not k8s_stub.unhandled, k8s_stub.unhandled
