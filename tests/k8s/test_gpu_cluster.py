"""A GPU pipeline on the cluster stand-in, deployed as the pinned Helm chart renders k8s/values.yaml
(tests/k8s/chart.py): the instance dagster.yaml, the user deployment's container context, the chart's ConfigMaps and
the Secrets the values name. Runs are launched as the UI does (GraphQL) and dequeued by the daemon's own run-queue
iteration; their run-worker and step Jobs are scheduled by the stand-in onto a CPU node and a tainted 1-GPU node,
with the environment of their spec only, and run here.

What a platform engineer would meet on first contact, each checked here:
- an infer step of a `runtime.gpus: 1` spec gets the policy's GPU defaults (16Gi), not the code server's sizing;
- a spot reclaim (eviction) of the infer pod mid-partition: the step is retried and resumes from its chunk
  checkpoints (rows paid for <= 1.1x the rows), and the run succeeds;
- a second run of the same partition waits in the queue, without a pod;
- a step pod's environment holds only what its spec gives (ConfigMaps, Secrets, literal env), never this process's;
- an infer pod no node can take (2 GPUs asked, 1-GPU nodes only) fails its step within the configured time, saying
  what it asked for and why no node fit, frees its `gpu` pool slot, is not retried, and the failed run is not
  retried by the daemon (retry_on_asset_or_op_failure: false); an infer pod naming a missing Secret fails its step
  at once, naming the Secret.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.commands import k8s_check
from tests.conftest import K8S_GROUP, write_jsonl
from tests.daemon_helpers import wait_for
from tests.k8s.conftest import NAMESPACE, ROOT, chart_deployment, code_location, dequeue, launch
from tests.k8s.models import rows_paid
from tests.k8s.stub import CPU_NODE, IMAGE_ENV, KubernetesJobsStub, Node

# real run workers and step pods launched as Kubernetes Jobs, with wall-clock waits: the k8s group (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(K8S_GROUP)]

GPU_NODE = Node("gpu-1", cpu="8", memory="32Gi", gpus=1, labels={"batch.example.com/node-pool": "gpu"},
                taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
ROWS = 40
DEFS = "from batch_assets.catalog import built_in\nfrom batch_assets.definitions import code_location\n\ndefs = code_location(built_in())\n"


@pytest.fixture
def cluster(tmp_path: Path) -> KubernetesJobsStub:
    stub = KubernetesJobsStub(tmp_path / "k8s", cwd=ROOT, nodes=[CPU_NODE, GPU_NODE]).start()
    yield stub
    stub.stop()


def _pipeline(tmp_path: Path, runtime: dict, seconds: float = 0.0, rows: int = ROWS) -> dict:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"a{i}", "text": f"a{i}"} for i in range(rows)])
    return {
        "name": "gpu_docs",
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a", "b"]},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": "tests.k8s.models:PacedCountingModel",
                                                   "init_kwargs": {"log": str(tmp_path / "model.log"),
                                                                   "seconds": seconds}}},
        "runtime": runtime,
        "retries": {"max_retries": 2, "delay_seconds": 0, "jitter": False},
    }


def _deploy(tmp_path: Path, cluster: KubernetesJobsStub, spec: dict, monkeypatch: pytest.MonkeyPatch,
            settings: dict[str, str] | None = None):
    pipelines, store = tmp_path / "pipelines", tmp_path / "store"
    pipelines.mkdir()
    (pipelines / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    local = {"BATCH_PIPELINES_DIR": str(pipelines), "BATCH_STORAGE_ROOT": str(store), "BATCH_EXECUTOR": "k8s",
             # the stand-in's pods all run on this machine: the local root is one disk, as a ReadWriteMany volume
             # mounted at the same path in every pod would be (a deployment uses s3:// or declares such a volume)
             "BATCH_STORAGE_ROOT_SHARED": "1",
             # the test's model class lives in tests/ (a real image has the user's model package installed)
             "PYTHONPATH": str(ROOT), **(settings or {})}
    deployment = chart_deployment(cluster, tmp_path / "home", settings=local)
    for key in ("BATCH_PIPELINES_DIR", "BATCH_STORAGE_ROOT", "BATCH_EXECUTOR", "BATCH_STORAGE_ROOT_SHARED"):
        monkeypatch.setenv(key, local[key])
    defs = tmp_path / "code" / "defs.py"
    defs.parent.mkdir()
    defs.write_text(DEFS)
    return deployment, defs, store


def _wait(what: str, check, cluster: KubernetesJobsStub, timeout: float = 300):
    return wait_for(what, check, None, timeout, interval=0.5, diagnose=cluster.failures)


def _finished(instance: dg.DagsterInstance, run_id: str, cluster: KubernetesJobsStub) -> dg.DagsterRun:
    return _wait(f"run {run_id} to finish", lambda: (r := instance.get_run_by_id(run_id)) and r.is_finished and r,
                 cluster)


def _step_failures(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.dagster_event.event_specific_data.error.message
            for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)]


def test_an_evicted_infer_pod_resumes_and_a_second_run_of_the_partition_waits_queued(
        tmp_path: Path, cluster: KubernetesJobsStub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGKILL loses the chunk in the model and any answered chunk whose commit the write-behind thread had not
    finished (at most 2 queued, docs/RELIABILITY.md): up to 4 chunks on a loaded machine, milliseconds' worth on an
    idle one. With chunks of 2.5% of the partition (2 of 80 rows) even that worst case stays within 1.1x; with 4 of 40
    a loaded CI machine paid 48."""
    rows = 80
    monkeypatch.setenv("TEST_PROCESS_ONLY_SECRET", "must-not-reach-a-pod")
    spec = _pipeline(tmp_path, {"gpus": 1, "chunk_rows": 2}, seconds=0.2, rows=rows)
    deployment, defs, store = _deploy(tmp_path, cluster, spec, monkeypatch)
    log = tmp_path / "model.log"
    with dg.DagsterInstance.from_config(str(deployment.home)) as instance, \
            code_location(instance, defs, deployment.container_context) as context:
        first, second = launch(context, "gpu_docs_job", "a"), launch(context, "gpu_docs_job", "a")
        dequeue(context)
        # one run per partition: the second waits in the queue, with no run worker and no step pod
        assert instance.get_run_by_id(first).status != dg.DagsterRunStatus.QUEUED
        assert instance.get_run_by_id(second).status == dg.DagsterRunStatus.QUEUED
        assert cluster.jobs_for_run(second) == []

        infer = _wait("the infer pod to be a third through", lambda: len(rows_paid(log)) >= rows // 3 and
                      cluster.step_jobs(first).get("gpu_docs__inferred"), cluster)
        assert infer.node == "gpu-1"
        cluster.evict(infer)  # a spot reclaim
        run = _finished(instance, first, cluster)
        assert run.status == dg.DagsterRunStatus.SUCCESS, cluster.failures()
        dequeue(context)  # the first run is over: now the second may start
        assert instance.get_run_by_id(second).status != dg.DagsterRunStatus.QUEUED
        cluster.stop()  # the second run is not needed further

    # the retried step resumed from its checkpoints: every row once in the output, rows paid <= 1.1x
    table = pq.read_table(store / "gpu_docs" / "output" / "a.parquet")
    assert sorted(table.column("doc_id").to_pylist()) == sorted(f"a{i}" for i in range(rows))
    paid = rows_paid(log)
    print(f"rows sent to the model: {len(paid)} for {rows} rows (one eviction)")
    assert set(paid) == {f"a{i}" for i in range(rows)} and len(paid) <= 1.1 * rows, (len(paid), paid)
    attempts = [j for j in cluster.jobs_for_run(first) if j.step_key == "gpu_docs__inferred"]
    assert [j.terminated_reason for j in attempts] == ["Evicted", None]
    (retry,) = instance_logs(deployment.home, first, dg.DagsterEventType.STEP_UP_FOR_RETRY)
    reason = retry.dagster_event.event_specific_data.error.message
    assert "gpu_docs__inferred" in reason and "Its pod was disrupted (TerminationByKubelet" in reason, reason

    # the infer pod: the policy's GPU defaults, not the code server's sizing; on the GPU node pool
    retried = attempts[-1]
    assert retried.resources == {"requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
                                 "limits": {"nvidia.com/gpu": "1", "memory": "16Gi"}}
    assert retried.pod_spec["nodeSelector"] == {"batch.example.com/node-pool": "gpu"}
    # every pod's environment: the image's, its ConfigMaps and Secrets, and its literal env; nothing else
    for job in cluster.jobs_for_run(first):
        assert job.pod_env is not None and "TEST_PROCESS_ONLY_SECRET" not in job.pod_env
        allowed = set(IMAGE_ENV) | {e["name"] for e in job.container.get("env") or []}
        for source in job.container.get("envFrom") or []:
            ref = source.get("configMapRef") or source.get("secretRef")
            store_ = cluster.config_maps if "configMapRef" in source else cluster.secrets
            allowed |= set(store_[(NAMESPACE, ref["name"])])
        assert set(job.pod_env) <= allowed, set(job.pod_env) - allowed
        assert job.pod_spec["automountServiceAccountToken"] is False or job.component == "run_worker"


def test_a_drained_infer_pod_is_retried_and_resumes(tmp_path: Path, cluster: KubernetesJobsStub,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A graceful eviction (a drain, a spot interruption handler: SIGTERM, then SIGKILL after the grace period)
    ends the same way as a node lost without notice: the step is retried and resumes from its chunks. Measured:
    the SIGTERM path re-sends up to two chunks (8 of 40 rows with chunk_rows 4), the SIGKILL path one; with chunks
    of at most 5% of a partition that stays within 1.1x (chunk_rows 2 here)."""
    spec = _pipeline(tmp_path, {"gpus": 1, "chunk_rows": 2}, seconds=0.3)
    deployment, defs, store = _deploy(tmp_path, cluster, spec, monkeypatch)
    log = tmp_path / "model.log"
    with dg.DagsterInstance.from_config(str(deployment.home)) as instance, \
            code_location(instance, defs, deployment.container_context) as context:
        run_id = launch(context, "gpu_docs_job", "a")
        dequeue(context)
        infer = _wait("the infer pod to be a third through", lambda: len(rows_paid(log)) >= ROWS // 3 and
                      cluster.step_jobs(run_id).get("gpu_docs__inferred"), cluster)
        cluster.evict(infer, grace_seconds=30)
        assert _finished(instance, run_id, cluster).status == dg.DagsterRunStatus.SUCCESS, cluster.failures()
    attempts = [j for j in cluster.jobs_for_run(run_id) if j.step_key == "gpu_docs__inferred"]
    assert [j.terminated_reason for j in attempts] == ["Evicted", None]
    table = pq.read_table(store / "gpu_docs" / "output" / "a.parquet")
    assert sorted(table.column("doc_id").to_pylist()) == sorted(f"a{i}" for i in range(ROWS))
    paid = rows_paid(log)
    print(f"rows sent to the model: {len(paid)} for {ROWS} rows (one graceful eviction)")
    assert set(paid) == {f"a{i}" for i in range(ROWS)} and len(paid) <= 1.1 * ROWS, (len(paid), paid)


def instance_logs(home: Path, run_id: str, event_type: dg.DagsterEventType) -> list:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return list(instance.all_logs(run_id, of_type=event_type))


def test_an_infer_pod_no_node_can_take_fails_its_step_in_time_and_frees_its_slot(
        tmp_path: Path, cluster: KubernetesJobsStub, monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import consume_new_runs_for_automatic_reexecution

    spec = _pipeline(tmp_path, {"gpus": 1, "resources": {"partitions": {"a": {"gpus": 2}}}})
    write_jsonl(tmp_path / "data" / "b.jsonl", [{"doc_id": "b0", "text": "b0"}])
    deployment, defs, _ = _deploy(tmp_path, cluster, spec, monkeypatch,
                                  settings={"BATCH_STEP_PENDING_TIMEOUT_SECONDS": "2"})
    # partition b's infer pod names a Secret nobody created (through the executor's per-step config)
    missing_secret = {"execution": {"config": {"per_step_k8s_config": {"gpu_docs__inferred": {
        "container_config": {"env_from": [{"secret_ref": {"name": "batch-assets-extra"}}]}}}}}}
    with dg.DagsterInstance.from_config(str(deployment.home)) as instance, \
            code_location(instance, defs, deployment.container_context) as context:
        run_id = launch(context, "gpu_docs_job", "a")
        other = launch(context, "gpu_docs_job", "b", run_config=missing_secret)
        dequeue(context)
        run = _finished(instance, run_id, cluster)
        assert run.status == dg.DagsterRunStatus.FAILURE
        (message,) = _step_failures(instance, run_id)  # failed once: not retried by the step's RetryPolicy
        assert "gpu_docs__inferred" in message and "its pod never started" in message
        assert "asked for 2 GPU(s) (nvidia.com/gpu)" in message
        assert "node selector {'batch.example.com/node-pool': 'gpu'}" in message
        assert "tolerations ['nvidia.com/gpu:NoSchedule']" in message
        assert ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
                "affinity/selector.") in message, message
        (infer,) = [j for j in cluster.jobs_for_run(run_id) if j.step_key == "gpu_docs__inferred"]
        assert infer.deleted and infer.process is None  # never ran, and cannot start later
        # the step's `gpu` pool slot (limit 1) was freed: the other run's infer step got it, and its pod, whose
        # Secret is missing, failed its step at once, naming the Secret
        assert _finished(instance, other, cluster).status == dg.DagsterRunStatus.FAILURE
        (config_error,) = _step_failures(instance, other)
        assert "its pod never started" in config_error and "gpu_docs__inferred" in config_error
        assert 'CreateContainerConfigError: secret "batch-assets-extra" not found' in config_error, config_error
        info = instance.event_log_storage.get_concurrency_info("gpu")
        assert info.slot_count == 1 and info.active_slot_count == 0, info
        # and the daemon's run retries do not re-run a step failure (values: retry_on_asset_or_op_failure false)
        record = instance.get_run_records(dg.RunsFilter(run_ids=[run_id]))[0]
        list(consume_new_runs_for_automatic_reexecution(context, [record], dg.get_dagster_logger()))
        assert sorted(r.run_id for r in instance.get_runs()) == sorted([run_id, other])
        assert instance.get_run_by_id(run_id).tags.get("dagster/will_retry") == "false"


def test_an_infer_pod_whose_image_or_volume_never_comes_fails_its_step_and_frees_its_slot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22: a step pod bound to a node but never started (an image that does not pull, a volume that does not
    mount) held its GPUs, the run and the `gpu` pool slot forever; so did a Job whose pod the namespace's
    PodSecurity level refuses (no pod at all). Now each fails its step after BATCH_STEP_START_GRACE_SECONDS,
    naming the image, the volume and object, or the rule, its Job deleted, not retried. The namespace enforces
    PodSecurity `restricted` and has only the chart's service account: every other pod of these runs is admitted."""
    image = "registry.example.com/batch-assets:test"  # the code location's image (tests/k8s/conftest.py)
    cluster = KubernetesJobsStub(tmp_path / "k8s", cwd=ROOT, nodes=[CPU_NODE, GPU_NODE],
                                 images={image: "batch-assets-registry"}, pod_security="restricted",
                                 service_accounts={"dagster"}).start()
    try:
        spec = _pipeline(tmp_path, {"gpus": 1})
        spec["partitioning"]["keys"] = ["a", "b", "c"]
        write_jsonl(tmp_path / "data" / "b.jsonl", [{"doc_id": "b0", "text": "b0"}])
        write_jsonl(tmp_path / "data" / "c.jsonl", [{"doc_id": "c0", "text": "c0"}])
        deployment, defs, _ = _deploy(tmp_path, cluster, spec, monkeypatch,
                                      settings={"BATCH_STEP_START_GRACE_SECONDS": "2"})
        typo = {"execution": {"config": {"per_step_k8s_config": {"gpu_docs__inferred": {
            "container_config": {"image": "registry.example.com/batch-assets:tset"}}}}}}
        volume = {"execution": {"config": {"per_step_k8s_config": {"gpu_docs__inferred": {
            "pod_spec_config": {"volumes": [{"name": "prompts", "config_map": {"name": "batch-assets-prompts"}}]},
            "container_config": {"volume_mounts": [{"name": "prompts", "mount_path": "/prompts"}]}}}}}}
        with dg.DagsterInstance.from_config(str(deployment.home)) as instance, \
                code_location(instance, defs, deployment.container_context) as context:
            escalate = {"execution": {"config": {"per_step_k8s_config": {"gpu_docs__inferred": {
                "container_config": {"security_context": {"allow_privilege_escalation": True}}}}}}}
            bad_image = launch(context, "gpu_docs_job", "a", run_config=typo)
            bad_volume = launch(context, "gpu_docs_job", "b", run_config=volume)
            refused = launch(context, "gpu_docs_job", "c", run_config=escalate)
            dequeue(context)
            for run_id in (bad_image, bad_volume, refused):
                assert _finished(instance, run_id, cluster).status == dg.DagsterRunStatus.FAILURE
            (pull,) = _step_failures(instance, bad_image)  # once: not retried by the step's RetryPolicy
            assert "its pod never started" in pull and "gpu_docs__inferred" in pull, pull
            assert "its image registry.example.com/batch-assets:tset cannot be pulled: ImagePullBackOff" in pull
            assert 'Failed to pull image "registry.example.com/batch-assets:tset"' in pull
            assert "imagePullSecrets" in pull  # the fix
            (mount,) = _step_failures(instance, bad_volume)
            assert "its pod never started" in mount and "a volume never mounted" in mount, mount
            assert 'volume "prompts" : configmap "batch-assets-prompts" not found' in mount
            (admission,) = _step_failures(instance, refused)
            assert "its pod never started" in admission and "Kubernetes refused to create it" in admission, admission
            assert 'violates PodSecurity "restricted:latest"' in admission
            assert "allowPrivilegeEscalation must be false" in admission
            # the run workers and the read/prepare steps of these runs were admitted: the values pass restricted
            assert all(j.create_error is None for j in cluster.jobs if j.step_key != "gpu_docs__inferred")
            for run_id in (bad_image, bad_volume, refused):
                (infer,) = [j for j in cluster.jobs_for_run(run_id) if j.step_key == "gpu_docs__inferred"]
                assert infer.deleted and infer.pod_gone and infer.process is None
            # the `gpu` slot (limit 1) was freed each time: the second run's infer step got it, and nothing holds it
            info = instance.event_log_storage.get_concurrency_info("gpu")
            assert info.slot_count == 1 and info.active_slot_count == 0, info
    finally:
        cluster.stop()


def test_the_rendered_deployment_is_what_the_tests_run(tmp_path: Path, cluster: KubernetesJobsStub,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance and container context these tests run under are helm's rendering of k8s/values.yaml, with only
    the in-cluster parts replaced (a guard against the fixtures drifting from the chart), and every ConfigMap and
    Secret a run or step pod names exists in the stand-in, as `kubectl apply` of the chart and k8s/ would leave it."""
    from tests.k8s import chart
    from tests.k8s.conftest import IN_CLUSTER_LAUNCHER_KEYS, LOCAL_STORAGE_KEYS

    deployment, _, _ = _deploy(tmp_path, cluster, _pipeline(tmp_path, {"gpus": 1}), monkeypatch)
    rendered = chart.render()
    production = rendered.instance
    used = yaml.safe_load((deployment.home / "dagster.yaml").read_text())
    # every production section the tests keep is the chart's, key for key
    assert set(used) == set(production) - set(LOCAL_STORAGE_KEYS), sorted(set(used) ^ set(production))
    for section, config in used.items():
        if section != "run_launcher":
            assert config == production[section], section
    launcher, rendered_launcher = used["run_launcher"]["config"], production["run_launcher"]["config"]
    assert {k: v for k, v in launcher.items() if k not in IN_CLUSTER_LAUNCHER_KEYS} == {
        k: v for k, v in rendered_launcher.items() if k not in IN_CLUSTER_LAUNCHER_KEYS}
    assert launcher["kubeconfig_file"] == str(cluster.kubeconfig) and launcher["load_incluster_config"] is False
    # the code server's container context is the one in the rendered user Deployment's env, as the chart sets it
    (user,) = [d for d in rendered.manifests if d["kind"] == "Deployment" and d["metadata"]["name"].endswith(
        "-batch-assets")]
    (grpc_env,) = [e for e in user["spec"]["template"]["spec"]["containers"][0]["env"]
                   if e["name"] == "DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT"]
    assert deployment.container_context == json.loads(grpc_env["value"])
    k8s = deployment.container_context["k8s"]
    assert k8s["env_config_maps"][0] == "dagster-dagster-user-deployments-batch-assets-user-env"  # the real name
    assert k8s["image_pull_secrets"] == [{"name": "batch-assets-registry"}]
    # the private image pulls everywhere: code server, webserver, daemon (the run launcher gives run pods theirs)
    for name, pod in k8s_check.pod_specs(rendered.manifests).items():
        assert pod.get("imagePullSecrets") == [{"name": "batch-assets-registry"}], name
    assert launcher["image_pull_secrets"] == [{"name": "batch-assets-registry"}]
    # what a pod names exists where the pod looks: the chart's ConfigMaps, k8s/config.yaml, the values' Secrets
    for name in [*k8s["env_config_maps"], *launcher.get("env_config_maps", [])]:
        assert (NAMESPACE, name) in cluster.config_maps, name
    for name in [*k8s["env_secrets"], launcher["postgres_password_secret"]]:
        assert (NAMESPACE, name) in cluster.secrets, name
