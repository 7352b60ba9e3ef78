"""The deployment files in k8s/ validate offline: Kubernetes manifests (shipped and generated) with
kubernetes-validate, the Helm values against the official chart's values.schema.json (vendored in k8s/schema/),
the instance dagster.yaml the chart renders from the values (tests/k8s/chart.py) against Dagster's instance schema
and each configured class's own config schema; what a step pod gets from values.yaml is pinned in
tests/k8s/step_pods.expected.yaml; the Dockerfiles are read for layer order, pins, user and build context."""

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
MANIFESTS = ["config.yaml", "secrets.example.yaml", "model-cache.yaml"]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("name", MANIFESTS)
def test_shipped_manifests_validate(name: str) -> None:
    docs = _documents(K8S / name)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_manifest_in_k8s_is_validated() -> None:
    """A new manifest in k8s/ must be added to MANIFESTS (values.yaml is not a manifest)."""
    shipped = {p.name for p in K8S.glob("*.yaml")} - {"values.yaml"}
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

    from batch_assets.orchestration.execution.pod_compute import resources_for_keys
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


def _unknown_defaults(values: Any, defaults: Any, path: str) -> list[str]:
    """Keys we set that the chart's own values.yaml does not have, where it lists an object's keys."""
    if not (isinstance(values, dict) and isinstance(defaults, dict) and defaults):
        return []
    return [f for key, value in values.items()
            for f in ([f"{path}/{key}"] if key not in defaults else _unknown_defaults(value, defaults[key], f"{path}/{key}"))]


def test_helm_values_set_no_key_the_chart_does_not_define() -> None:
    schema = _chart_schema()
    values = _values()
    # the chart-level `concurrency` block is newer than the vendored schema (k8s/schema/README.md): its keys are
    # checked against the chart's own defaults (the chart the tests render with helm)
    from tests.k8s.chart import CHART

    chart_defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert _unknown_defaults({"concurrency": values.pop("concurrency")}, chart_defaults, "") == []
    assert _unknown_keys(values, schema, schema, "") == []
    typo = values
    typo["dagster-user-deployments"]["deployments"][0]["envSecret"] = [{"name": "x"}]
    assert _unknown_defaults({"concurrency": {"runs": {"maxConcurentRuns": 1}}}, chart_defaults, "") == [
        "/concurrency/runs/maxConcurentRuns"]
    assert _unknown_keys(typo, schema, schema, "") == ["/dagster-user-deployments/deployments/0/envSecret"]


def test_helm_values_keep_the_settings_the_deployment_relies_on() -> None:
    values = _values()
    assert values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    assert values["global"]["postgresqlSecretName"] and values["generatePostgresqlPasswordSecret"] is False
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["runLauncher"]["config"]["k8sRunLauncher"]["loadInclusterConfig"] is True
    daemon = values["dagsterDaemon"]
    assert daemon["enabled"] and daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert daemon["runMonitoring"]["enabled"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "batch_assets.definitions"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True  # run/step pods get env + secrets
    assert {s["name"] for s in deployment["envSecrets"]} == {"batch-assets-s3", "batch-assets-hf"}
    assert {c["name"] for c in deployment["envConfigMaps"]} == {"batch-assets-config"}
    # the webserver and the daemon read and write compute logs in S3: they need the S3 credentials too
    for service in ("dagsterWebserver", "dagsterDaemon"):
        assert {s["name"] for s in values[service]["envSecrets"]} == {"batch-assets-s3"}, service
    # ... and the schema still defines every one of those keys (a chart upgrade that renames one fails here).
    schema = _chart_schema()
    defs = schema["definitions"]
    assert {"postgresqlScheme", "postgresqlHost"} <= set(defs["PostgreSQL"]["properties"])
    assert {"includeConfigInLaunchedRuns", "envSecrets", "envConfigMaps", "dagsterApiGrpcArgs", "volumes",
            "volumeMounts", "securityContext", "podSecurityContext"} <= set(defs["UserDeployment"]["properties"])
    assert {"runMonitoring", "runRetries", "runCoordinator", "envSecrets"} <= set(defs["Daemon"]["properties"])
    assert "envSecrets" in defs["Webserver"]["properties"]
    assert {"loadInclusterConfig", "securityContext"} <= set(defs["K8sRunLauncherConfig"]["properties"])
    assert {"global", "generatePostgresqlPasswordSecret", "telemetry", "additionalInstanceConfig"} <= set(
        schema["properties"])
    # the secrets, config map and claim the values name are the ones k8s/ ships
    shipped = {(d["kind"], d["metadata"]["name"]) for n in MANIFESTS for d in _documents(K8S / n)}
    claims = {("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) for v in deployment["volumes"]}
    assert {("Secret", "batch-assets-s3"), ("Secret", "batch-assets-hf"),
            ("Secret", values["global"]["postgresqlSecretName"]), ("ConfigMap", "batch-assets-config"),
            *claims} <= shipped


def test_config_map_sets_what_the_executor_reads() -> None:
    data = _documents(K8S / "config.yaml")[0]["data"]
    assert data["BATCH_EXECUTOR"] == "k8s"
    assert isinstance(json.loads(data["BATCH_GPU_NODE_SELECTOR"]), dict)
    assert isinstance(json.loads(data["BATCH_GPU_TOLERATIONS"]), list)


# -- the instance the chart renders from values.yaml -----------------------------------------------------------------

def test_rendered_instance_validates_and_keeps_production_settings(tmp_path: Path) -> None:
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes.config_class import ConfigurableClassData, class_from_code_pointer

    from batch_assets.commands.k8s_check import load_instance_config
    from tests.k8s import chart

    text = chart.render().instance_yaml  # the ConfigMap dagster-instance, as helm renders it
    load_instance_config(text)  # as every Dagster process of the deployment loads it (issue 22: it did not)
    (tmp_path / "dagster.yaml").write_text(text)
    config, _ = dagster_instance_config(str(tmp_path))  # the instance schema (retries, monitoring, pools)
    for section in ("run_launcher", "run_coordinator", "compute_logs"):
        # as the instance loads it (ConfigurableClassData maps the public `dagster.core` path to `dagster._core`)
        data = ConfigurableClassData(config[section]["module"], config[section]["class"], "{}")
        cls = class_from_code_pointer(data.module_name, data.class_name)
        result = validate_config(cls.config_type(), config[section].get("config", {}))
        assert result.success, (section, [e.message for e in result.errors])
    # the run limits are the concurrency block's alone: the chart's default max_concurrent_runs: -1 is not rendered
    assert "max_concurrent_runs" not in (config["run_coordinator"].get("config") or {})
    # item 2 of issue 13: a deterministic step failure is not paid for again by a run retry
    assert config["run_retries"] == {"enabled": True, "max_retries": 2, "retry_on_asset_or_op_failure": False}
    runs = config["concurrency"]["runs"]
    assert runs["max_concurrent_runs"] == 20
    # one run per partition at a time: the second waits queued, without a pod
    assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in runs[
        "tag_concurrency_limits"]
    assert {"key": "dagster/backfill", "limit": 10} in runs["tag_concurrency_limits"]
    # every pool, the `gpu` pool included, has a limit from the values (not unlimited until a CLI call)
    assert config["concurrency"]["pools"] == {"default_limit": 1, "granularity": "op"}
    assert config["run_monitoring"]["enabled"]
    assert config["run_launcher"]["config"]["image_pull_secrets"] == [{"name": "batch-assets-registry"}]


def test_run_limits_beside_the_charts_run_coordinator_defaults_are_refused() -> None:
    """Issue 22: `queuedRunCoordinator: {}` clears none of the chart's defaults (helm merges values over them), so
    run limits under additionalInstanceConfig rendered beside `max_concurrent_runs: -1`, and Dagster refused the
    instance. The check (`make k8s-check`) says so, with Dagster's message."""
    from batch_assets.commands.k8s_check import DeploymentCheckError, load_instance_config
    from tests.k8s import chart

    values = _values()
    values["additionalInstanceConfig"] = {"concurrency": {"runs": {"max_concurrent_runs": 20}}}
    values["concurrency"]["enabled"] = False
    with pytest.raises(DeploymentCheckError, match=r"max_concurrent_runs.*incompatible with the `concurrency > runs`"):
        load_instance_config(chart.render(values).instance_yaml)


# -- what a step pod gets -----------------------------------------------------------------------------------------

EXPECTED_STEP_PODS = Path(__file__).with_name("step_pods.expected.yaml")


def _step_pods(tmp_path: Path, values: dict[str, Any], runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod templates of a `runtime.gpus: 1` pipeline's read and infer step Jobs, as rendered from `values`."""
    from tests.conftest import EMBED_SPEC, make_spec
    from tests.k8s.conftest import chart_deployment, step_job
    from tests.k8s.stub import KubernetesJobsStub

    stub = KubernetesJobsStub(tmp_path / "stub", cwd=tmp_path).start()  # for its kubeconfig; nothing is posted
    try:
        deployment = chart_deployment(stub, tmp_path / "home", settings={}, values=values)
        spec = make_spec(EMBED_SPEC, tmp_path, runtime=runtime or {"gpus": 1})
        bodies = {stage: step_job(deployment, spec, stage, "a") for stage in ("raw", "inferred")}
    finally:
        stub.stop()
    pods = {}
    for stage, body in bodies.items():
        kubernetes_validate.validate(body, KUBERNETES_VERSION, strict=True)
        template = body["spec"]["template"]
        container = template["spec"]["containers"][0]
        # what the chart and the executor decide; the command and Dagster's own env vars are upstream's
        container["env"] = sorted(e["name"] for e in container.get("env") or [])
        container.pop("args", None)
        template["spec"]["containers"] = [container]
        template["metadata"].pop("labels", None)
        pods[stage] = template
    return pods


def test_an_infer_step_pod_gets_the_policy_not_the_code_servers_sizing(tmp_path: Path) -> None:
    """Issue 13 item 1: a `runtime.gpus: 1` infer pod must not inherit a memory limit from the user deployment,
    even from a deployment that sets one (the values shipped before the fix: 250m / 1Gi, limit 2Gi)."""
    values = _values()
    values["dagster-user-deployments"]["deployments"][0]["resources"] = {
        "requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    pods = _step_pods(tmp_path, values)
    infer = pods["inferred"]["spec"]["containers"][0]["resources"]
    assert infer == {"requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
                     "limits": {"nvidia.com/gpu": "1", "memory": "16Gi"}}  # pod_compute's GPU defaults
    # the read step does inherit the deployment's sizing: that is what the shipped values must not give a limit
    assert pods["raw"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "2Gi"}
    # a CPU infer step whose policy names only CPU: no inherited memory limit either; the deployment's memory
    # request stays (issue 22: without requests the pod was BestEffort, evicted first under memory pressure)
    cpu_only = _step_pods(tmp_path / "cpu", values, runtime={"resources": {"default": {"cpu": "2"}}})
    assert cpu_only["inferred"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}}
    # and one with no runtime.resources at all keeps the deployment's requests
    bare = _step_pods(tmp_path / "bare", values, runtime={"gpus": 0})
    assert bare["inferred"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "250m", "memory": "1Gi"}}


def test_infer_resources_merge_by_key_with_what_the_step_was_given() -> None:
    """docs/deployment.md: the policy wins for the keys it sets; requests and limits set for the step through op
    tags or per_step_k8s_config are kept for the others (they were dropped: issue 22)."""
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import UserDefinedDagsterK8sConfig

    from batch_assets.orchestration.execution.k8s_executor import step_container_context
    from batch_assets.orchestration.execution.pod_compute import StepResources

    def merged(inherited: dict, step_limits: dict, policy: StepResources) -> dict:
        context = K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(
            {"container_config": {"resources": inherited}}))
        out = step_container_context(context, policy, step_limits=step_limits)
        return out.run_k8s_config.container_config["resources"]

    # per_step_k8s_config asked for ephemeral storage and a 6Gi memory limit; the policy names only CPU
    step = {"requests": {"cpu": "250m", "memory": "6Gi", "ephemeral-storage": "20Gi"},
            "limits": {"memory": "6Gi", "ephemeral-storage": "20Gi"}}
    assert merged(step, step["limits"], StepResources(cpu="2")) == {
        "requests": {"cpu": "2", "memory": "6Gi", "ephemeral-storage": "20Gi"},
        "limits": {"memory": "6Gi", "ephemeral-storage": "20Gi"}}
    # the policy's memory wins over the step's, request and limit
    assert merged(step, step["limits"], StepResources(memory="32Gi")) == {
        "requests": {"cpu": "250m", "memory": "32Gi", "ephemeral-storage": "20Gi"},
        "limits": {"memory": "32Gi", "ephemeral-storage": "20Gi"}}
    # a deployment-wide limit (not set for this step) is not inherited; an inherited request above a limit set
    # here is dropped (the API server defaults it to the limit instead of refusing the pod)
    assert merged({"requests": {"memory": "8Gi"}, "limits": {"memory": "2Gi"}}, {"memory": "4Gi"},
                  StepResources(cpu="1")) == {"requests": {"cpu": "1"}, "limits": {"memory": "4Gi"}}


def test_values_yaml_changes_to_step_pods_are_reviewed(tmp_path: Path) -> None:
    """What k8s/values.yaml gives a CPU step pod and a GPU step pod, pinned. A change to values.yaml (or to the
    executor) that changes a step pod fails here: review the difference, then regenerate the file with
    UPDATE_STEP_PODS=1."""
    import os

    pods = _step_pods(tmp_path, _values())
    if os.environ.get("UPDATE_STEP_PODS"):
        EXPECTED_STEP_PODS.write_text(yaml.safe_dump(pods, sort_keys=True))
    expected = yaml.safe_load(EXPECTED_STEP_PODS.read_text())
    assert pods == expected, "values.yaml changed what a step pod gets:\n" + yaml.safe_dump(pods, sort_keys=True)
    infer = pods["inferred"]["spec"]
    assert infer["automountServiceAccountToken"] is False and pods["raw"]["spec"]["automountServiceAccountToken"] is False
    assert infer["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert "limits" not in pods["raw"]["spec"]["containers"][0]["resources"]


# -- images -------------------------------------------------------------------------------------------------------

CODE_DIRS = ("batch_assets", "resources")


def _instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in (K8S / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current = f"{current} {line[:-1]}" if line.endswith("\\") else f"{current} {line}"
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def _dockerignore() -> list[str]:
    return [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfiles_build_this_project(name: str) -> None:
    import fnmatch

    steps = _instructions(name)
    ignored = _dockerignore()
    copies = [(i, args.split()[:-1]) for i, (op, args) in enumerate(steps) if op == "COPY"]
    for _, sources in copies:
        for src in sources:
            assert (ROOT / src).exists(), f"{name} copies {src}, which is not in the repository"
            assert not any(fnmatch.fnmatch(src, pat) for pat in ignored), f"{name} copies {src}, but .dockerignore drops it"
    # dependencies before code: the expensive install comes from pyproject.toml alone, then the code is copied
    code_at = min(i for i, sources in copies if set(sources) & set(CODE_DIRS))
    installs = [i for i, (op, args) in enumerate(steps) if op == "RUN" and "pip install -r requirements.txt" in args]
    assert installs and installs[0] < code_at, f"{name}: dependencies must be installed before the code is copied"
    assert all("pyproject.toml" in " ".join(sources) or not set(sources) & set(CODE_DIRS)
               for i, sources in copies if i < installs[0]), f"{name}: only metadata before the dependency layer"
    # the code layer installs the project alone
    assert any(op == "RUN" and "pip install --no-deps ." in args for i, (op, args) in enumerate(steps) if i > code_at)
    # a pinned base image, and a non-root user for everything that runs
    bases = [args for op, args in steps if op == "FROM"]
    assert bases and all(":" in b and not b.endswith(":latest") for b in bases), bases
    users = [(i, args) for i, (op, args) in enumerate(steps) if op == "USER"]
    assert users and users[-1][1] not in ("root", "0") and users[-1][0] > max(
        i for i, (op, _) in enumerate(steps) if op == "RUN"), f"{name} must end as a non-root USER"
    runs = " ".join(args for op, args in steps if op == "RUN")
    if name == "Dockerfile":
        # vLLM pinned exactly (its torch pin decides the CUDA version and so the driver the nodes need)
        assert re.search(r'"vllm==\d+\.\d+\.\d+"', runs), "pin vLLM exactly in k8s/Dockerfile"
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        assert any(r.startswith("vllm") for r in extras["vllm"])
    else:
        assert "torch==2.13.0" in runs and "download.pytorch.org/whl/cpu" in runs


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_the_image_installs_every_package_the_rendered_instance_loads(name: str) -> None:
    """Every class the chart's instance names (run launcher, storage, compute logs, ...) is imported by each run
    worker and step pod of our image when it loads the instance: its distribution must be in what the Dockerfile
    installs (the pyproject extras it names, and the requirements on its pip line). A fresh-clone CI run caught
    S3ComputeLogManager's dagster-aws missing from every extra: each pod would have failed at start."""
    import tomllib
    from importlib.metadata import packages_distributions

    from tests.k8s import chart

    def modules(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["module"]] if isinstance(node.get("module"), str) else []
            return found + [m for v in node.values() for m in modules(v)]
        return [m for v in node for m in modules(v)] if isinstance(node, list) else []

    def name_of(requirement: str) -> str:
        return re.split(r"[\[<>=!~; ]", requirement.strip().strip('"'), maxsplit=1)[0].lower().replace("_", "-")

    runs = " ".join(args for op, args in _instructions(name) if op == "RUN")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.search(r"for e in \(([^)]*)\)", runs)
    assert extras, f"{name}: the requirements step names the extras it installs"
    installed = {name_of(r) for r in project["dependencies"]}
    installed |= {name_of(r) for e in re.findall(r"'(\w+)'", extras.group(1)) for r in project["optional-dependencies"][e]}
    installed |= {name_of(r) for r in re.findall(r'"([A-Za-z][\w.-]*\[?[\w,]*\]?[<>=!~][^"]*)"', runs)}
    wanted = {m for m in modules(chart.render().instance) if m.split(".")[0] != "dagster"}
    assert wanted, "the rendered instance names the classes it loads"
    owners = packages_distributions()
    for module in sorted(wanted):
        dists = {d.lower().replace("_", "-") for d in owners.get(module.split(".")[0], [])}
        assert dists, f"{module}: not importable here either (make install-test installs the extras)"
        assert dists & installed, f"{name} installs none of {sorted(dists)}, which the rendered instance loads ({module})"


def test_the_build_context_leaves_out_what_images_do_not_need() -> None:
    ignored = set(_dockerignore())
    assert {".git", ".venv", "data", "tests", "**/__pycache__"} <= ignored
