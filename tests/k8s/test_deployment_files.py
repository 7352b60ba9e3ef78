"""The deployment files in k8s/ validate offline: Kubernetes manifests (shipped and generated) with
kubernetes-validate, the Helm values against the official chart's values.schema.json (vendored in k8s/schema/),
the production dagster.yaml against Dagster's instance schema and each configured class's own config schema."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBERNETES_VERSION = "1.31"  # oldest minor version we support; kubernetes-validate ships its schema
MANIFESTS = ["config.yaml", "secrets.example.yaml"]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("name", MANIFESTS)
def test_shipped_manifests_validate(name: str) -> None:
    docs = _documents(K8S / name)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_manifest_in_k8s_is_validated() -> None:
    """A new manifest in k8s/ must be added to MANIFESTS (values.yaml and dagster.yaml are not manifests)."""
    shipped = {p.name for p in K8S.glob("*.yaml")} - {"values.yaml", "dagster.yaml"}
    assert shipped == set(MANIFESTS)


def test_a_validation_failure_is_caught() -> None:
    doc = _documents(K8S / "config.yaml")[0]
    doc["data"] = {"BATCH_EXECUTOR": 1}  # ConfigMap values must be strings
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_generated_infer_step_job_validates(tmp_path: Path) -> None:
    """The Job the batch executor builds for an infer step (policy merged in) is a valid batch/v1 Job."""
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job
    from kubernetes.client import ApiClient

    from batch_assets.resource_policy import resources_for_keys
    from tests.conftest import EMBED_SPEC, make_spec

    spec = make_spec(EMBED_SPEC, tmp_path, runtime={"resources": {
        "default": {"gpus": 2, "cpu": "4", "memory": "16Gi", "node_selector": {"pool": "gpu"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}})
    step = resources_for_keys(spec, ["a"])
    # As the executor does: the launcher's context, then the policy merged on top.
    context = K8sContainerContext(resources={"requests": {"cpu": "250m"}}, env_config_maps=["batch-assets-config"])
    context = context.merge(K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(step.k8s_config())))
    job = construct_dagster_k8s_job(
        job_config=DagsterK8sJobConfig(job_image="registry.example.com/batch-assets:0.1.0-cuda",
                                       dagster_home="/opt/dagster/dagster_home",
                                       instance_config_map="dagster-instance", env_config_maps=["batch-assets-config"]),
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-0123456789abcdef",
        pod_name="dagster-step-0123456789abcdef",
        component="step_worker",
        user_defined_k8s_config=context.run_k8s_config,
        labels={"dagster/op": "docs__inferred"},
    )
    body = ApiClient().sanitize_for_serialization(job)
    kubernetes_validate.validate(body, KUBERNETES_VERSION, strict=True)
    container = body["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"]["cpu"] == "4"  # the policy's CPU over the launcher default
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}


# -- Helm values ----------------------------------------------------------------------------------------------------

def _chart_schema() -> dict[str, Any]:
    return json.loads((K8S / "schema" / "dagster-helm-values.schema.json").read_text())


def _without_required(node: Any) -> Any:
    """Helm validates the chart's defaults merged with our overrides; we ship overrides only, so the schema's
    `required` lists (every key the chart's own values.yaml sets) are dropped. Types, enums and
    additionalProperties still apply."""
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_without_required(v) for v in node]
    return node


def _validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The chart schema's $refs to kubernetesjsonschema.dev resolve offline to kubernetes-validate's definitions."""
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    k8s_definitions = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{kubernetes_validate.utils.latest_version()}-local/_definitions.json",
        kubernetes_validate.utils.latest_version(),
    )

    def retrieve(uri: str) -> Resource:
        if re.match(r"^https://kubernetesjsonschema\.dev/v[\d.]+/_definitions\.json$", uri):
            # the chart points into `definitions`, kubernetes-validate's (2020-12) document names them `$defs`
            return Resource.from_contents({**k8s_definitions, "definitions": k8s_definitions["$defs"]},
                                          default_specification=DRAFT7)
        raise LookupError(f"unexpected remote $ref {uri}")

    return jsonschema.Draft7Validator(schema, registry=Registry(retrieve=retrieve))


def _values() -> dict[str, Any]:
    return yaml.safe_load((K8S / "values.yaml").read_text())


def test_helm_values_validate_against_the_chart_schema() -> None:
    errors = sorted(_validator(_without_required(_chart_schema())).iter_errors(_values()), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_helm_values_schema_check_catches_a_wrong_type() -> None:
    values = _values()
    values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["maxConcurrentRuns"] = [20]
    values["dagster-user-deployments"]["deployments"][0]["resources"] = {"requests": {"cpu": {"n": 1}}}
    errors = list(_validator(_without_required(_chart_schema())).iter_errors(values))
    paths = {"/".join(map(str, e.absolute_path)) for e in errors}
    assert any(p.startswith("dagsterDaemon/runCoordinator/config/queuedRunCoordinator") for p in paths)
    assert any(p.startswith("dagster-user-deployments/deployments/0/resources") for p in paths)  # via the k8s defs


def _unknown_keys(values: Any, schema: dict[str, Any], root: dict[str, Any], path: str) -> list[str]:
    """Keys we set that the chart does not define, where the schema lists an object's properties (the schema
    alone lets some objects take any key, and the chart would silently ignore a misspelt one there)."""
    while "$ref" in schema and schema["$ref"].startswith("#/definitions/"):
        schema = {**root["definitions"][schema["$ref"].split("/")[-1]], **{k: v for k, v in schema.items() if k != "$ref"}}
    for option in schema.get("anyOf", []):
        if "$ref" in option and isinstance(values, dict):
            return _unknown_keys(values, option, root, path)
    found: list[str] = []
    props = schema.get("properties") or {}
    if isinstance(values, dict) and props:
        for key, value in values.items():
            if key not in props:
                found.append(f"{path}/{key}")
            else:
                found += _unknown_keys(value, props[key], root, f"{path}/{key}")
    if isinstance(values, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(values):
            found += _unknown_keys(item, schema["items"], root, f"{path}/{i}")
    return found


def test_helm_values_set_no_key_the_chart_does_not_define() -> None:
    schema = _chart_schema()
    assert _unknown_keys(_values(), schema, schema, "") == []
    typo = _values()
    typo["dagster-user-deployments"]["deployments"][0]["envSecret"] = [{"name": "x"}]
    assert _unknown_keys(typo, schema, schema, "") == ["/dagster-user-deployments/deployments/0/envSecret"]


def test_helm_values_keep_the_settings_the_deployment_relies_on() -> None:
    values = _values()
    assert values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    assert values["global"]["postgresqlSecretName"] and values["generatePostgresqlPasswordSecret"] is False
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["runLauncher"]["config"]["k8sRunLauncher"]["loadInclusterConfig"] is True
    daemon = values["dagsterDaemon"]
    assert daemon["enabled"] and daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert daemon["runCoordinator"]["config"]["queuedRunCoordinator"]["maxConcurrentRuns"] > 0
    assert daemon["runRetries"]["enabled"] and daemon["runMonitoring"]["enabled"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "batch_assets.definitions"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True  # run/step pods get env + secrets
    assert {s["name"] for s in deployment["envSecrets"]} == {"batch-assets-s3"}
    assert {c["name"] for c in deployment["envConfigMaps"]} == {"batch-assets-config"}
    # ... and the schema still defines every one of those keys (a chart upgrade that renames one fails here).
    schema = _chart_schema()
    defs = schema["definitions"]
    assert {"postgresqlScheme", "postgresqlHost"} <= set(defs["PostgreSQL"]["properties"])
    assert {"includeConfigInLaunchedRuns", "envSecrets", "envConfigMaps", "dagsterApiGrpcArgs"} <= set(
        defs["UserDeployment"]["properties"])
    assert {"runMonitoring", "runRetries", "runCoordinator"} <= set(defs["Daemon"]["properties"])
    assert "loadInclusterConfig" in defs["K8sRunLauncherConfig"]["properties"]
    assert {"global", "generatePostgresqlPasswordSecret", "telemetry"} <= set(schema["properties"])
    # the secrets and config map the values name are the ones k8s/ ships
    shipped = {(d["kind"], d["metadata"]["name"]) for n in MANIFESTS for d in _documents(K8S / n)}
    assert {("Secret", "batch-assets-s3"), ("Secret", values["global"]["postgresqlSecretName"]),
            ("ConfigMap", "batch-assets-config")} <= shipped


def test_config_map_sets_what_the_executor_reads() -> None:
    data = _documents(K8S / "config.yaml")[0]["data"]
    assert data["BATCH_EXECUTOR"] == "k8s"
    assert isinstance(json.loads(data["BATCH_GPU_NODE_SELECTOR"]), dict)
    assert isinstance(json.loads(data["BATCH_GPU_TOLERATIONS"]), list)


# -- production dagster.yaml ----------------------------------------------------------------------------------------

def test_production_dagster_yaml_validates(tmp_path: Path) -> None:
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes.config_class import ConfigurableClassData, class_from_code_pointer

    (tmp_path / "dagster.yaml").write_text((K8S / "dagster.yaml").read_text())
    config, _ = dagster_instance_config(str(tmp_path))  # the instance schema (storage, retries, monitoring, pools)
    assert config["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert config["run_retries"]["enabled"] and config["run_monitoring"]["enabled"]
    for section in ("run_launcher", "run_coordinator", "compute_logs"):
        # as the instance loads it (ConfigurableClassData maps the public `dagster.core` path to `dagster._core`)
        data = ConfigurableClassData(config[section]["module"], config[section]["class"], "{}")
        cls = class_from_code_pointer(data.module_name, data.class_name)
        result = validate_config(cls.config_type(), config[section].get("config", {}))
        assert result.success, (section, [e.message for e in result.errors])
    assert config["concurrency"]["runs"]["max_concurrent_runs"] > 0
    assert config["concurrency"]["pools"]["granularity"] == "op"


def test_dockerfiles_build_this_project() -> None:
    for name in ("Dockerfile", "Dockerfile.cpu"):
        text = (K8S / name).read_text()
        for line in text.splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (ROOT / src).exists(), f"{name} copies {src}, which is not in the repository"
    assert 'pip install ".[vllm]"' in (K8S / "Dockerfile").read_text()
    assert "torch==2.13.0" in (K8S / "Dockerfile.cpu").read_text()
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("vllm") for r in extras["vllm"])
