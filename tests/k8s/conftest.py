"""Fixtures for Kubernetes tests: the loopback cluster stand-in (tests/k8s/stub.py) and Dagster instances whose run
launcher is the real K8sRunLauncher pointed at it. Reusable from any test folder:
`from tests.k8s.conftest import k8s_stub, k8s_dagster_home` (or move them up when a second folder needs them).

`chart_deployment` sets up what `helm install -f k8s/values.yaml` would, from a real `helm template` of the Dagster
chart (tests/k8s/chart.py): the instance dagster.yaml, the user deployment's container context, and the ConfigMaps
and Secrets the pods read, with only the in-cluster parts replaced (SQLite instead of Postgres, the stand-in's
kubeconfig instead of the service-account token, local compute logs instead of S3, local paths in the
`batch-assets-config` ConfigMap).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import chart
from tests.k8s.stub import CPU_NODE, KubernetesJobsStub, instance_yaml

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "batch"
CONFIG_MAP = "batch-assets-config"  # k8s/config.yaml


@pytest.fixture
def k8s_stub(tmp_path: Path) -> Iterator[KubernetesJobsStub]:
    """A started stand-in cluster with one CPU node; Job commands run in the project root. Pods get their
    environment only from their spec: create the ConfigMaps/Secrets they name (`create_config_map`)."""
    stub = KubernetesJobsStub(tmp_path / "k8s-stub", cwd=ROOT, nodes=[CPU_NODE]).start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture
def k8s_dagster_home(tmp_path: Path, k8s_stub: KubernetesJobsStub) -> Path:
    """DAGSTER_HOME with a dagster.yaml using K8sRunLauncher against the stand-in (a queued run coordinator, so a
    daemon launches runs; pools capped at one slot so the GPU pool is exercised). Run and step pods read the
    ConfigMap `batch-assets-config` (created empty here: put BATCH_* settings in it)."""
    home = tmp_path / "dagster-home"
    home.mkdir()
    extra = {
        "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"},
        "concurrency": {"runs": {"max_concurrent_runs": 2}, "pools": {"default_limit": 1, "granularity": "op"}},
    }
    (home / "dagster.yaml").write_text(instance_yaml(k8s_stub, home, extra=extra, env_config_maps=[CONFIG_MAP]))
    k8s_stub.create_config_map(CONFIG_MAP, {}, namespace="batch")
    return home


@dataclass
class ChartDeployment:
    home: Path
    values: dict[str, Any]
    container_context: dict[str, Any] | None
    settings: dict[str, str]  # the batch-assets-config ConfigMap as created in the stand-in
    rendered: chart.Rendered


# The instance keys a test deployment replaces in the rendered dagster.yaml (everything else is the chart's):
IN_CLUSTER_LAUNCHER_KEYS = ("load_incluster_config", "kubeconfig_file", "dagster_home")
LOCAL_STORAGE_KEYS = ("run_storage", "event_log_storage", "schedule_storage", "compute_logs")


def chart_deployment(stub: KubernetesJobsStub, home: Path, settings: dict[str, str],
                     values: dict[str, Any] | None = None, instance_extra: dict[str, Any] | None = None,
                     secrets: dict[str, dict[str, str]] | None = None) -> ChartDeployment:
    """What `helm install -f values` installs (default k8s/values.yaml, rendered by the real helm), pointed at the
    stand-in. `settings` override k8s/config.yaml's ConfigMap data (local paths); `secrets` are created as given
    (default: every Secret the values name, with placeholder values)."""
    vals = copy.deepcopy(values) if values is not None else chart.values()
    rendered = chart.render(vals, NAMESPACE)
    home.mkdir(parents=True, exist_ok=True)
    config = rendered.instance
    launcher = config["run_launcher"]["config"]
    launcher.update({"load_incluster_config": False, "kubeconfig_file": str(stub.kubeconfig),
                     "dagster_home": str(home)})
    for key in LOCAL_STORAGE_KEYS:  # Postgres and S3 compute logs in production; the instance's SQLite here
        config.pop(key, None)
    for key, value in (instance_extra or {}).items():
        config[key] = value
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))

    for name, data in rendered.config_maps().items():
        stub.create_config_map(name, data, namespace=NAMESPACE)
    shipped = yaml.safe_load((ROOT / "k8s" / "config.yaml").read_text())["data"]
    data = stub.create_config_map(CONFIG_MAP, {**shipped, **settings}, namespace=NAMESPACE)
    if secrets is None:
        secrets = {s["name"]: {} for d in vals["dagster-user-deployments"]["deployments"]
                   for s in d.get("envSecrets") or []}
        secrets[vals["global"]["postgresqlSecretName"]] = {"postgresql-password": "not-used-with-sqlite"}
        for ref in vals.get("imagePullSecrets") or []:  # kubectl create secret docker-registry (deployment.md)
            secrets[ref["name"]] = {".dockerconfigjson": "{}"}
    for name, secret in secrets.items():
        stub.create_secret(name, secret, namespace=NAMESPACE)
    return ChartDeployment(home, vals, rendered.container_context, data, rendered)


@contextmanager
def code_location(instance: Any, defs_file: Path, container_context: dict[str, Any] | None) -> Iterator[Any]:
    """A workspace over `defs_file` as the daemon and webserver hold it, with the container context the chart gives
    the code server (DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT) and its image (DAGSTER_CURRENT_IMAGE)."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.test_utils import InProcessTestWorkspaceLoadTarget, create_test_daemon_workspace_context
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=str(defs_file), attribute="defs", working_directory=str(ROOT)),
        location_name="batch-assets",
        container_image="registry.example.com/batch-assets:test",
        container_context=container_context,
    )
    with create_test_daemon_workspace_context(InProcessTestWorkspaceLoadTarget(origin), instance) as context:
        yield context


def launch(context: Any, job_name: str, partition: str, run_config: dict[str, Any] | None = None) -> str:
    """Launch a partition of a job as the UI's Materialize button does (GraphQL launchPipelineExecution)."""
    from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
    from dagster_graphql.test.utils import execute_dagster_graphql, infer_job_selector

    request = context.create_request_context()
    result = execute_dagster_graphql(request, LAUNCH_PIPELINE_EXECUTION_MUTATION, {"executionParams": {
        "selector": infer_job_selector(request, job_name),
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
        **({"runConfigData": run_config} if run_config else {}),
    }})
    launched = result.data["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def dequeue(context: Any) -> None:
    """One iteration of the daemon's run queue (QueuedRunCoordinatorDaemon), as `dagster-daemon run` does."""
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    with QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
        list(daemon.run_iteration(context))


def step_job(deployment: ChartDeployment, spec: Any, stage: str, partition: str) -> dict[str, Any]:
    """The Job the batch executor posts for one step of a run of `partition`, composed as
    `PartitionAwareK8sStepHandler.launch_step` does it (upstream's create_for_run merge of the launcher's and the
    code location's container context, the executor's defaults, then step_container_context), without running."""
    import sys

    import dagster as dg
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import construct_dagster_k8s_job
    from kubernetes.client import ApiClient

    from batch_assets.orchestration.execution.k8s_executor import step_container_context, with_gpu_node_pool
    from batch_assets.orchestration.execution.pod_compute import check_gpu_strategy, resources_for_keys, with_gpu_defaults

    origin = JobPythonOrigin(f"{spec.name}_job", RepositoryPythonOrigin(
        executable_path=sys.executable, code_pointer=ModuleCodePointer("batch_assets.definitions", "defs", None),
        container_image="registry.example.com/batch-assets:0.1.0-cuda",
        container_context=deployment.container_context))
    run = dg.DagsterRun(job_name=f"{spec.name}_job", run_id="0" * 36, job_code_origin=origin,
                        tags={"dagster/partition": partition})
    with dg.DagsterInstance.from_config(str(deployment.home)) as instance:
        launcher = instance.run_launcher
        context = K8sContainerContext.create_for_run(run, launcher, include_run_tags=False)  # type: ignore[arg-type]
        resources = None
        if stage == "inferred":
            import os
            from unittest import mock

            with mock.patch.dict(os.environ, deployment.settings):  # the run worker's env: the ConfigMap
                resources = with_gpu_defaults(with_gpu_node_pool(resources_for_keys(spec, [partition])))
            check_gpu_strategy(spec, resources)
        context = step_container_context(context, resources)
        job_config = context.get_k8s_job_config(None, launcher)
        job = construct_dagster_k8s_job(
            job_config=job_config.with_image(origin.repository_origin.container_image),
            args=["dagster", "api", "execute_step"], job_name="dagster-step-x", pod_name="dagster-step-x",
            component="step_worker", user_defined_k8s_config=context.run_k8s_config,
            labels={"dagster/op": f"{spec.name}__{stage}"})
    return ApiClient().sanitize_for_serialization(job)
