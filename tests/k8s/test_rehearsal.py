"""A production rehearsal: the processes users deploy, started from what the real helm renders from k8s/values.yaml.

- The rendered instance `dagster.yaml` (ConfigMap `dagster-instance`), its Postgres host pointed at a real PostgreSQL
  on loopback, loaded by a real `dagster-daemon run` and a real `dagster-webserver`, each started with the command,
  env and envFrom of its rendered Deployment (ConfigMaps and Secrets resolved as the kubelet does, by the stand-in).
- The rendered workspace (`dagster-workspace-yaml`) pointing at a real gRPC code server of this project, started
  with the command and env of the rendered user-code Deployment (its container context included); only the
  Service's name becomes 127.0.0.1 and a free port.
- K8sRunLauncher (the rendered run launcher config) talking to the Jobs API stand-in (tests/k8s/stub.py): a
  partition launched through the webserver's GraphQL, as the UI's Materialize button launches it, runs as run pod ->
  step Jobs (the infer step on the GPU node with its GPU) -> outputs, its events in Postgres; a second run of the
  same partition waits in the queue while the first runs; a sensor on a folder launches a run of its own.

Red with the values shipped before issue 22: every process refuses the rendered instance (max_concurrent_runs).
The storage root and the compute logs are on S3 (a real S3-protocol server on loopback, moto), as in production.
What is still a stand-in: the cluster (tests/k8s/stub.py, enforcing PodSecurity `restricted` and the chart's
service accounts), the instance ConfigMap mount (DAGSTER_HOME is a folder holding the rendered dagster.yaml), and
the pipelines' source files (local paths every "pod" on this machine can read).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import K8S_GROUP, free_port, write_jsonl
from tests.daemon_helpers import dev_server, graphql, wait_for, wait_ready
from tests.k8s import chart
from tests.k8s.stub import CPU_NODE, KubernetesJobsStub, Node, RecordedJob
from tests.orchestration.launch.test_sensors import drop, inbox_spec
from tests.test_postgres import _pg_bin, postgres_port  # noqa: F401 - the module-scoped PostgreSQL fixture

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(K8S_GROUP)]

ROOT = Path(__file__).resolve().parents[2]
NS = chart.NAMESPACE
GPU_NODES = [Node(f"gpu-{i}", cpu="8", memory="32Gi", gpus=1, labels={"batch.example.com/node-pool": "gpu"},
                  taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]) for i in (1, 2)]
ROWS = 12

LAUNCH = """mutation($params: ExecutionParams!) { launchPipelineExecution(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
RUNS = """{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"""


def _rendered_env(stub: KubernetesJobsStub, deployment: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet gives the Deployment's first container: its env and envFrom, resolved against
    the ConfigMaps and Secrets in the stand-in (a missing one fails here, as the pod would not start), once the
    pod passed the namespace's admission (PodSecurity, its service account)."""
    job = RecordedJob(NS, {"metadata": {"name": deployment["metadata"]["name"]},
                           "spec": {"template": deployment["spec"]["template"]}}, Path("/dev/null"))
    refused = stub._admission(job)
    assert refused is None, refused
    return stub._container_env(job)


def _command(deployment: dict[str, Any], replace: dict[str, str]) -> list[str]:
    """The Deployment's command line, with the in-cluster host, port and paths replaced."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if argv[:2] == ["/bin/bash", "-c"]:
        argv = shlex.split(argv[2])
    return [replace.get(a, a) for a in argv]


def _runs(port: int) -> list[dict[str, Any]]:
    results = graphql(port, RUNS)["runsOrError"]["results"]
    return [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in results]


def _launch(port: int, job: str, partition: str) -> str:
    """As the UI's Materialize button: launchPipelineExecution with the partition tag (the queue takes it)."""
    result = graphql(port, LAUNCH, {"params": {
        "selector": {"repositoryLocationName": "batch-assets", "repositoryName": "__repository__", "jobName": job},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}})["launchPipelineExecution"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


@pytest.fixture
def rehearsal(tmp_path: Path, postgres_port: int, s3_bucket: str,  # noqa: F811 - the fixture above
              s3_server: str) -> Iterator[dict[str, Any]]:
    import boto3

    rendered = chart.render()  # k8s/values.yaml as shipped, through the real helm
    # the namespace enforces PodSecurity `restricted` and holds the chart's service accounts only: a pod of the
    # deployment that breaks the profile or names another account is refused, as the API server would
    accounts = {d["metadata"]["name"] for d in rendered.manifests if d["kind"] == "ServiceAccount"}
    stub = KubernetesJobsStub(tmp_path / "k8s", cwd=ROOT, nodes=[CPU_NODE, *GPU_NODES], pod_security="restricted",
                              service_accounts=accounts).start()
    home, pipelines, data = tmp_path / "home", tmp_path / "pipelines", tmp_path / "data"
    for folder in (home, pipelines, data):
        folder.mkdir()
    subprocess.run([_pg_bin("createuser"), "-h", "127.0.0.1", "-p", str(postgres_port), "-U", "postgres", "-s",
                    "dagster"], check=True, capture_output=True)

    # the instance every process loads: the rendered ConfigMap, with the in-cluster addresses replaced
    instance = rendered.instance
    for key in ("run_storage", "event_log_storage", "schedule_storage"):
        db = instance[key]["config"]["postgres_db"]
        db.update({"hostname": "127.0.0.1", "port": postgres_port, "params": {}})  # no TLS on loopback
    instance["run_launcher"]["config"].update({"load_incluster_config": False, "kubeconfig_file": str(stub.kubeconfig),
                                               "dagster_home": str(home)})
    # compute logs in the rendered bucket, on the S3-protocol server (an S3-compatible store: its endpoint)
    logs = instance["compute_logs"]["config"]
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=logs["bucket"])
    logs["endpoint_url"] = s3_server
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance))
    workspace = yaml.safe_load(rendered.config_maps()["dagster-workspace-yaml"]["workspace.yaml"])
    (grpc,) = [entry["grpc_server"] for entry in workspace["load_from"]]
    grpc_port = free_port()
    assert (grpc["host"], grpc["port"], grpc["location_name"]) == ("batch-assets", 3030, "batch-assets")
    grpc.update({"host": "127.0.0.1", "port": grpc_port})  # the Service's DNS name, on loopback
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "workspace.yaml").write_text(yaml.safe_dump(workspace))

    # what `kubectl apply` of the chart and of k8s/ leaves in the namespace
    for name, cm in rendered.config_maps().items():
        stub.create_config_map(name, cm, namespace=NS)
    # the storage root on S3, as k8s/config.yaml has it (no BATCH_STORAGE_ROOT_SHARED: every pod is on its own)
    store = f"{s3_bucket}/batch"
    settings = {**yaml.safe_load((ROOT / "k8s" / "config.yaml").read_text())["data"],
                "BATCH_PIPELINES_DIR": str(pipelines), "BATCH_STORAGE_ROOT": store,
                "AWS_ENDPOINT_URL": s3_server, "AWS_REGION": "us-east-1",  # an S3-compatible store
                "PYTHONPATH": str(ROOT)}  # the tests' model classes (a real image has the user's package)
    stub.create_config_map("batch-assets-config", settings, namespace=NS)
    stub.create_secret("batch-assets-s3", {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                           "AWS_REGION": "us-east-1"}, namespace=NS)
    stub.create_secret("batch-assets-hf", {}, namespace=NS)
    stub.create_secret("dagster-postgresql-secret", {"postgresql-password": "trust-auth-ignores-it"}, namespace=NS)
    stub.create_secret("batch-assets-registry", {".dockerconfigjson": "{}"}, namespace=NS)

    gpu_spec = {"name": "gpu_docs",
                "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
                "partitioning": {"kind": "static", "keys": ["a", "b"]},
                "prepare": {"id_column": "doc_id", "input_columns": ["text"]}, "task": {"kind": "predict"},
                "model": {"provider": "custom", "config": {"class_path": "tests.k8s.models:PacedCountingModel",
                                                           "init_kwargs": {"log": str(tmp_path / "model.log"),
                                                                           "seconds": 0.5}}},
                "runtime": {"gpus": 1, "chunk_rows": 4}}
    for key in ("a", "b"):
        write_jsonl(data / f"{key}.jsonl", [{"doc_id": f"{key}{i}", "text": f"{key}{i}"} for i in range(ROWS)])
    inbox = inbox_spec(str(tmp_path / "inbox"), min_age_seconds=0, interval_seconds=5)
    inbox["model"]["config"]["init_kwargs"]["log"] = str(tmp_path / "inbox.log")
    drop(tmp_path / "inbox", "first", rows=3)
    for spec in (gpu_spec, inbox):
        (pipelines / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))

    deployments = {d["metadata"]["name"]: d for d in rendered.manifests if d["kind"] == "Deployment"}
    # docs/deployment.md step 9, before the first run: the `gpu` pool's limit, set in the instance (Postgres)
    daemon_env = {**_rendered_env(stub, deployments["dagster-daemon"]), "DAGSTER_HOME": str(home)}
    subprocess.run(["dagster", "instance", "concurrency", "set", "gpu", "1"], env=daemon_env, cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    web_port = free_port()
    paths = {"/dagster-workspace/workspace.yaml": str(tmp_path / "workspace" / "workspace.yaml"),
             "0.0.0.0": "127.0.0.1", "3030": str(grpc_port), "80": str(web_port)}
    with ExitStack() as stack:
        processes = {}
        for name, short in (("dagster-dagster-user-deployments-batch-assets", "code-server"),
                            ("dagster-daemon", "daemon"), ("dagster-dagster-webserver", "webserver")):
            env = {**_rendered_env(stub, deployments[name]), "DAGSTER_HOME": str(home)}  # the mounted ConfigMap
            log = tmp_path / f"{short}.log"
            processes[short] = (stack.enter_context(dev_server(_command(deployments[name], paths), env, log)), log)
            if short == "code-server":  # the webserver and daemon connect to it: start it first
                wait_for("the code server to listen", lambda: _listening(grpc_port), log, 120, interval=0.5)
        proc, log = processes["webserver"]
        wait_ready(web_port, proc, log, seconds=180)
        yield {"stub": stub, "port": web_port, "home": home, "store": store, "postgres": postgres_port,
               "logs": {k: v[1] for k, v in processes.items()}, "rendered": rendered,
               "compute_logs": (logs["bucket"], logs["prefix"]), "s3": s3_server,
               "model_log": tmp_path / "model.log"}
    stub.stop()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_deployment_runs_a_partition_a_queued_rerun_and_a_sensor_run_from_the_rendered_chart(
        rehearsal: dict[str, Any]) -> None:
    import boto3
    import psycopg2
    import s3fs

    stub, port, store = rehearsal["stub"], rehearsal["port"], rehearsal["store"]
    fs = s3fs.S3FileSystem()  # the test's environment points at the S3-protocol server (s3_bucket)

    def output(pipeline: str, partition: str):
        return pq.read_table(f"{store}/{pipeline}/output/{partition}.parquet".removeprefix("s3://"), filesystem=fs)

    daemon_log = rehearsal["logs"]["daemon"]

    def diagnose() -> str:
        return (f"{stub.failures()}\n--- daemon ---\n{daemon_log.read_text(errors='replace')[-3000:]}\n"
                f"--- code server ---\n{rehearsal['logs']['code-server'].read_text(errors='replace')[-2000:]}")

    def status(run_id: str) -> str:
        return next(r["status"] for r in _runs(port) if r["runId"] == run_id)

    first = _launch(port, "gpu_docs_job", "a")
    second = _launch(port, "gpu_docs_job", "a")
    other = _launch(port, "gpu_docs_job", "b")  # runs beside the first: the `gpu` pool (limit 1) serializes infer
    wait_for("the first run to start", lambda: status(first) in ("STARTING", "STARTED"), None, 180,
             diagnose=diagnose)
    wait_for("the first run's infer step Job", lambda: stub.step_jobs(first).get("gpu_docs__inferred"), None, 300,
             diagnose=diagnose)
    # one run per partition: the second waits in the queue, with no pod, while the first runs its infer step
    assert status(second) == "QUEUED" and status(first) in ("STARTING", "STARTED")
    assert not stub.jobs_for_run(second)
    wait_for("the first run to succeed", lambda: status(first) == "SUCCESS", None, 420, interval=2, diagnose=diagnose)
    infer = stub.step_jobs(first)["gpu_docs__inferred"]
    assert infer.node in ("gpu-1", "gpu-2") and infer.resources["limits"]["nvidia.com/gpu"] == "1"
    assert {j.component for j in stub.jobs_for_run(first)} == {"run_worker", "step_worker"}
    assert not [j.create_error for j in stub.jobs if j.create_error]  # every pod admitted under `restricted`
    assert sorted(output("gpu_docs", "a").column("doc_id").to_pylist()) == sorted(f"a{i}" for i in range(ROWS))
    wait_for("the queued run to run and succeed", lambda: status(second) == "SUCCESS", None, 420, interval=2,
             diagnose=diagnose)
    wait_for("partition b's run to succeed", lambda: status(other) == "SUCCESS", None, 420, interval=2,
             diagnose=diagnose)
    # Two GPU nodes had room for both infer pods at once: the `gpu` pool's one slot, claimed in Postgres, kept the
    # two infer steps apart (the model's calls of one partition never interleave with the other's)
    calls = [line.split()[1][0] for line in (rehearsal["model_log"]).read_text().splitlines()]
    assert sorted(calls) == ["a"] * 3 + ["b"] * 3 and calls in (["a"] * 3 + ["b"] * 3, ["b"] * 3 + ["a"] * 3), calls

    # the sensor on the inbox folder launched its own run through the queue and the launcher
    sensor_run = wait_for("a sensor run to succeed", lambda: next(
        (r for r in _runs(port) if r["tags"].get("dagster/sensor_name") == "inbox_new_files_sensor"
         and r["status"] == "SUCCESS"), None), None, 420, interval=2, diagnose=diagnose)
    assert sensor_run["tags"]["dagster/partition"] == "first"
    assert output("inbox", "first").num_rows == 3
    assert stub.jobs_for_run(sensor_run["runId"])

    # the runs' events are in the deployment's Postgres, written by the run and step pods
    with psycopg2.connect(host="127.0.0.1", port=rehearsal["postgres"], user="dagster", dbname="dagster") as db:
        cursor = db.cursor()
        cursor.execute("SELECT dagster_event_type, count(*) FROM event_logs WHERE run_id = %s "
                       "GROUP BY dagster_event_type", (first,))
        events = dict(cursor.fetchall())
    # (the run's own events keep their legacy names in the table: PIPELINE_SUCCESS is RUN_SUCCESS)
    assert events.get("PIPELINE_SUCCESS") == 1 and events.get("STEP_SUCCESS") == 4, events
    assert events.get("ASSET_MATERIALIZATION", 0) >= 4, events
    # and the step logs in the S3 compute log manager's bucket, uploaded by the step pods
    bucket, prefix = rehearsal["compute_logs"]
    listed = boto3.client("s3", endpoint_url=rehearsal["s3"], region_name="us-east-1").list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/storage/{first}/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    # one .out and one .err per step (LOGS_CAPTURED 4), uploaded by the step pods, not left on their disks
    assert len([k for k in keys if k.endswith(".out")]) == 4 and len([k for k in keys if k.endswith(".err")]) == 4, keys
    print(json.dumps({"runs": len(_runs(port)), "jobs": len(stub.jobs), "events of the first run": events,
                      "compute log objects": keys}))
