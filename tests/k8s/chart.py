"""What the pinned Dagster Helm chart renders from k8s/values.yaml, reproduced in Python (no helm binary installs on
the CI machines), for the parts that decide what a run or step pod gets:

- the instance `dagster.yaml` (templates/configmap-instance.yaml and helpers/instance/*.tpl): run launcher, run
  coordinator, run monitoring, run retries, compute logs, telemetry, `additionalInstanceConfig` appended last;
- the user deployment's container context (charts/dagster-user-deployments/templates/helpers/_helpers.tpl,
  `dagsterUserDeployments.k8sContainerContext`), which the chart hands to `dagster api grpc` as
  DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT when `includeConfigInLaunchedRuns.enabled` and which dagster-k8s merges
  into every run and step pod (dagster_k8s/container_context.py `create_for_run`);
- the ConfigMap the chart creates for the user deployment's `env` map, which run and step pods read
  (`<fullname>-<deployment>-user-env`, charts/dagster-user-deployments/templates/configmap-env-user.yaml).

Reproduced from the chart sources in dagster-io/dagster (`helm/dagster`, the files named above, read at commits
a07d616 (_run-launcher.tpl), 835892b (configmap-instance.yaml), 091d841 (_run-coordinator.tpl,
_compute-log-manager.tpl) and 031a3e8 (user-deployments _helpers.tpl); the chart version deployed is pinned in
CHART_VERSION and docs/deployment.md). Where those templates and a later chart could differ (run_retries keys,
the `concurrency` block), values.yaml avoids the difference: those settings go through `additionalInstanceConfig`,
which every chart version appends verbatim. Storage (Postgres) is rendered but tests
replace it with SQLite, and the in-cluster settings (service account token, kubeconfig) with the stand-in's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "k8s" / "values.yaml"
CHART_VERSION = "1.13.27"  # == dagster 1.13.27 / dagster-k8s 0.29.27 (the chart is released with Dagster)
RELEASE = "dagster"  # `helm upgrade --install dagster dagster/dagster` (docs/deployment.md)
CHART_NAME = "dagster"
DAGSTER_HOME = "/opt/dagster/dagster_home"  # the chart's default global.dagsterHome


def values(path: Path = VALUES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def fullname(vals: dict[str, Any]) -> str:
    # `dagster.fullname`: the release name when it contains the chart name
    override = (vals.get("global") or {}).get("fullnameOverride") or vals.get("fullnameOverride")
    if override:
        return override[:63].rstrip("-")
    return RELEASE if CHART_NAME in RELEASE else f"{RELEASE}-{CHART_NAME}"


def service_account(vals: dict[str, Any]) -> str:
    return (vals.get("global") or {}).get("serviceAccountName") or f"{fullname(vals)}-user-deployments"


def user_deployment(vals: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    deployments = vals["dagster-user-deployments"]["deployments"]
    return next(d for d in deployments if name is None or d["name"] == name)


def container_context(vals: dict[str, Any], namespace: str, deployment: str | None = None) -> dict[str, Any] | None:
    """`dagsterUserDeployments.k8sContainerContext` for one deployment, or None when launched runs do not get it."""
    d = user_deployment(vals, deployment)
    if not (d.get("includeConfigInLaunchedRuns") or {"enabled": True}).get("enabled"):
        return None
    k8s: dict[str, Any] = {"image_pull_policy": d["image"].get("pullPolicy")}
    if vals.get("imagePullSecrets"):
        k8s["image_pull_secrets"] = vals["imagePullSecrets"]
    k8s["env_config_maps"] = [f"{fullname(vals)}-{d['name']}-user-env",
                              *[c["name"] for c in d.get("envConfigMaps") or [] if "name" in c]]
    secrets = [s["name"] for s in d.get("envSecrets") or [] if "name" in s]
    if secrets:
        k8s["env_secrets"] = secrets
    for key, out in (("volumeMounts", "volume_mounts"), ("volumes", "volumes"), ("labels", "labels"),
                     ("resources", "resources"), ("schedulerName", "scheduler_name")):
        if d.get(key):
            k8s[out] = copy.deepcopy(d[key])
    k8s["namespace"] = namespace
    k8s["service_account_name"] = service_account(vals)
    if isinstance(d.get("env"), list) and d["env"]:
        k8s["env"] = copy.deepcopy(d["env"])
    pod_spec: dict[str, Any] = {}
    if d.get("sidecarContainers"):
        pod_spec["containers"] = d["sidecarContainers"]
    if d.get("initContainers"):
        pod_spec["init_containers"] = d["initContainers"]
    if pod_spec:
        k8s["run_k8s_config"] = {"pod_spec_config": pod_spec}
    return {"k8s": k8s}


def config_maps(vals: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The ConfigMap the chart renders from each user deployment's `env` map (configmap-env-user.yaml); the
    container context names it first in `env_config_maps`, so every run and step pod reads it."""
    name = fullname(vals)
    found = {}
    for d in vals["dagster-user-deployments"]["deployments"]:
        env = d.get("env")
        found[f"{name}-{d['name']}-user-env"] = {k: str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    return found


def instance(vals: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The instance dagster.yaml of configmap-instance.yaml (the sections this deployment sets)."""
    launcher = vals["runLauncher"]["config"]["k8sRunLauncher"]
    run_launcher_config: dict[str, Any] = {
        "load_incluster_config": launcher["loadInclusterConfig"],
        "job_namespace": launcher.get("jobNamespace") or namespace,
        "image_pull_policy": launcher.get("imagePullPolicy"),
        "service_account_name": service_account(vals),
        "dagster_home": (vals.get("global") or {}).get("dagsterHome") or DAGSTER_HOME,
        "instance_config_map": f"{fullname(vals)}-instance",
        "postgres_password_secret": vals["global"]["postgresqlSecretName"],
    }
    if launcher.get("kubeconfigFile"):
        run_launcher_config["kubeconfig_file"] = launcher["kubeconfigFile"]
    if vals.get("imagePullSecrets"):
        run_launcher_config["image_pull_secrets"] = vals["imagePullSecrets"]
    for key, out in (("envConfigMaps", "env_config_maps"), ("envSecrets", "env_secrets")):
        names = [s["name"] for s in launcher.get(key) or [] if "name" in s]
        if names:
            run_launcher_config[out] = names
    for key, out in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes"),
                     ("labels", "labels"), ("resources", "resources"), ("schedulerName", "scheduler_name"),
                     ("securityContext", "security_context")):
        if launcher.get(key):
            run_launcher_config[out] = copy.deepcopy(launcher[key])
    if launcher.get("failPodOnRunFailure"):
        run_launcher_config["fail_pod_on_run_failure"] = True
    if launcher.get("runK8sConfig"):
        run_launcher_config["run_k8s_config"] = {
            out: copy.deepcopy(launcher["runK8sConfig"][key]) for key, out in (
                ("containerConfig", "container_config"), ("podSpecConfig", "pod_spec_config"),
                ("podTemplateSpecMetadata", "pod_template_spec_metadata"), ("jobSpecConfig", "job_spec_config"),
                ("jobMetadata", "job_metadata")) if launcher["runK8sConfig"].get(key)}
    config: dict[str, Any] = {
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": run_launcher_config},
    }
    daemon = vals["dagsterDaemon"]
    if daemon["enabled"] and daemon["runCoordinator"]["enabled"]:
        queued = daemon["runCoordinator"]["config"].get("queuedRunCoordinator") or {}
        coordinator: dict[str, Any] = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}
        qconfig = {out: queued[key] for key, out in (("maxConcurrentRuns", "max_concurrent_runs"),
                                                     ("tagConcurrencyLimits", "tag_concurrency_limits"),
                                                     ("dequeueIntervalSeconds", "dequeue_interval_seconds"))
                   if queued.get(key)}
        if qconfig:
            coordinator["config"] = qconfig
        config["run_coordinator"] = coordinator
    s3 = vals["computeLogManager"]["config"]["s3ComputeLogManager"]
    config["compute_logs"] = {"module": "dagster_aws.s3.compute_log_manager", "class": "S3ComputeLogManager",
                              "config": {out: s3[key] for key, out in (
                                  ("bucket", "bucket"), ("localDir", "local_dir"), ("prefix", "prefix"),
                                  ("useSsl", "use_ssl"), ("verify", "verify"), ("endpointUrl", "endpoint_url"),
                                  ("skipEmptyFiles", "skip_empty_files")) if s3.get(key)}}
    monitoring = daemon.get("runMonitoring") or {}
    if daemon["enabled"] and monitoring.get("enabled"):
        config["run_monitoring"] = {"enabled": True, "start_timeout_seconds": monitoring["startTimeoutSeconds"],
                                    "poll_interval_seconds": monitoring["pollIntervalSeconds"]}
        if monitoring.get("maxResumeRunAttempts") is not None:
            config["run_monitoring"]["max_resume_run_attempts"] = monitoring["maxResumeRunAttempts"]
    retries = daemon.get("runRetries") or {}
    if daemon["enabled"] and retries.get("enabled"):
        config["run_retries"] = {"enabled": True}
        if retries.get("maxRetries"):
            config["run_retries"]["max_retries"] = retries["maxRetries"]
    config["telemetry"] = {"enabled": vals["telemetry"]["enabled"]}
    extra = vals.get("additionalInstanceConfig") or {}
    duplicated = set(extra) & set(config)
    if duplicated:  # the chart appends the text: a key set twice is a YAML document Dagster cannot trust
        raise ValueError(f"additionalInstanceConfig sets {sorted(duplicated)}, which the chart already renders")
    config.update(copy.deepcopy(extra))
    return config


def grpc_container_context_env(vals: dict[str, Any], namespace: str) -> dict[str, str]:
    """The env var the chart sets on the code server (deployment-user.yaml) for `dagster api grpc`."""
    context = container_context(vals, namespace)
    return {} if context is None else {"DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT": json.dumps(context)}
