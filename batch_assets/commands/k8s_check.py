"""Check a Kubernetes deployment before it is installed: `make k8s-check` (python -m batch_assets.commands.k8s_check).

It renders the real Dagster Helm chart with your values through a real `helm template`, then:
1. loads the instance `dagster.yaml` the chart renders (ConfigMap `<release>-instance`) with this project's Dagster,
   as the webserver, the daemon and every run and step pod load it at start: a config Dagster refuses
   (`DagsterInvalidConfigError`) would crash-loop all of them on first contact;
2. validates every rendered manifest, and a sample run worker Job and infer step Job built as the rendered run
   launcher and the batch executor build them (with the code location's container context), against the
   Kubernetes API schemas (kubernetes-validate, offline);
3. checks every pod template and the sample Jobs against the PodSecurity `restricted` profile, which many clusters
   enforce on namespaces (batch_assets/pod_security.py).

Helm merges your values over the chart's defaults, so only a real render shows what the chart makes of them
(`queuedRunCoordinator: {}` clears nothing). Nothing here talks to a cluster or the network.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from batch_assets.orchestration.execution.k8s_executor import step_container_context, with_gpu_node_pool
from batch_assets.orchestration.execution.pod_compute import check_gpu_strategy, resources_for_keys, with_gpu_defaults
from batch_assets.pod_security import restricted_violations
from batch_assets.spec import PipelineSpec

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "k8s" / "values.yaml"
RELEASE = "dagster"  # `helm upgrade --install dagster dagster/dagster` (docs/deployment.md)
NAMESPACE = "batch"
KUBERNETES_VERSION = "1.35.0"  # the API schemas manifests are validated against (kubectl 1.35 ships with our helm)
# Where the chart is found, first match: $DAGSTER_CHART; `helm pull dagster/dagster --version 1.13.27 --untar -d
# k8s/chart` (docs/deployment.md); the reference copy on this project's CI machines (../shared/dagster-chart).
CHART_CANDIDATES = (ROOT / "k8s" / "chart" / "dagster", ROOT.parent / "shared" / "dagster-chart" / "dagster")


class DeploymentCheckError(Exception):
    """The deployment would not start, or a tool the check needs is missing; the message says which and the fix."""


def helm_binary() -> Path:
    """$HELM, else the pinned helm `make install-test` / `make k8s-check` put in the virtualenv, else PATH's."""
    for candidate in (os.environ.get("HELM"), Path(sys.prefix) / "tools" / "helm", shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise DeploymentCheckError(
        f"no helm binary: run `make k8s-tools` (installs the pinned helm v4.1.4 into {Path(sys.prefix) / 'tools'}), "
        "or set HELM=/path/to/helm")


def chart_path() -> Path:
    raw = os.environ.get("DAGSTER_CHART")
    candidates = (Path(raw),) if raw else CHART_CANDIDATES
    for candidate in candidates:
        if (candidate / "Chart.yaml").is_file():
            return candidate
    raise DeploymentCheckError(
        f"no Dagster chart at {', '.join(str(c) for c in candidates)}: run `helm repo add dagster "
        "https://dagster-io.github.io/helm && helm pull dagster/dagster --version 1.13.27 --untar -d k8s/chart`, "
        "or set DAGSTER_CHART to the chart folder")


def render(values_files: Sequence[Path] = (VALUES,), chart: Path | None = None, namespace: str = NAMESPACE,
           release: str = RELEASE, set_values: Sequence[str] = (),
           extra_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """`helm template <release> <chart> -n <namespace> -f <values>...`: the manifests the chart installs."""
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        # helm's own cache/config/data in a throwaway folder: the user's repositories and plugins play no part
        env = {**os.environ, "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_DATA_HOME": f"{home}/data"}
        argv = [str(helm_binary()), "template", release, str(chart or chart_path()), "-n", namespace,
                *[a for f in values_files for a in ("-f", str(f))], *[a for s in set_values for a in ("--set", s)],
                *extra_args]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise DeploymentCheckError(f"helm template failed ({' '.join(argv[1:])}):\n{done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(manifests: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in manifests:
        if doc.get("kind") == kind and doc["metadata"]["name"] == name:
            return doc
    names = sorted(f"{d.get('kind')}/{d['metadata']['name']}" for d in manifests)
    raise DeploymentCheckError(f"the chart rendered no {kind} {name!r} (it rendered {names})")


def instance_config_map(manifests: Sequence[dict[str, Any]], release: str = RELEASE) -> dict[str, Any]:
    return find(manifests, "ConfigMap", f"{release}-instance")


def instance_yaml(manifests: Sequence[dict[str, Any]], release: str = RELEASE) -> str:
    """The `dagster.yaml` every Dagster process of the deployment loads (mounted at $DAGSTER_HOME)."""
    return instance_config_map(manifests, release)["data"]["dagster.yaml"]


def load_instance_config(text: str) -> dict[str, Any]:
    """Load an instance dagster.yaml as Dagster does at process start (`InstanceRef.from_dir`), without connecting
    to its storage. Raises DeploymentCheckError with Dagster's own message when Dagster refuses it."""
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.instance.ref import InstanceRef

    with tempfile.TemporaryDirectory(prefix="dagster-home-") as home:
        Path(home, "dagster.yaml").write_text(text)
        try:
            InstanceRef.from_dir(home)
        except DagsterInvalidConfigError as exc:
            raise DeploymentCheckError(
                "the chart renders an instance dagster.yaml that Dagster refuses: the webserver, the daemon and "
                f"every run and step pod would crash-loop at start.\n{exc}") from None
    return yaml.safe_load(text)


def user_deployments(manifests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The code-server Deployments (the chart's user-deployments subchart)."""
    return [d for d in manifests if d.get("kind") == "Deployment"
            and (d["metadata"].get("labels") or {}).get("component") == "user-deployments"]


def container_context(manifests: Sequence[dict[str, Any]], deployment: str | None = None) -> dict[str, Any] | None:
    """The container context the chart hands the code server (DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT), which
    dagster-k8s merges into every run and step pod; None when `includeConfigInLaunchedRuns` is off."""
    for doc in user_deployments(manifests):
        if deployment and (doc["metadata"].get("labels") or {}).get("deployment") != deployment:
            continue
        for entry in doc["spec"]["template"]["spec"]["containers"][0].get("env") or []:
            if entry["name"] == "DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT":
                return json.loads(entry["value"])
        return None
    raise DeploymentCheckError(f"the chart rendered no user-code Deployment {deployment or ''}".strip())


def pod_specs(manifests: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`Kind/name` -> pod spec of every rendered workload."""
    return {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"] for d in manifests
            if d.get("kind") in ("Deployment", "Job", "StatefulSet", "DaemonSet")}


def sample_jobs(instance_config: dict[str, Any], context: dict[str, Any] | None, spec: Any = None,
                partition: str | None = None, image: str = "registry.example.com/batch-assets:sample",
                ) -> dict[str, dict[str, Any]]:
    """The Jobs a run of `spec` (default: a one-GPU pipeline) would post, without a cluster: the run worker's, as the
    rendered run launcher builds it from the code location's `context`, and the infer step's, as the batch
    executor builds it (policy resources, GPU node pool)."""
    import dagster as dg
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import construct_dagster_k8s_job
    from dagster_k8s.launcher import K8sRunLauncher
    from kubernetes.client import ApiClient

    if spec is None:
        spec = PipelineSpec.model_validate({
            "name": "sample_gpu", "source": {"format": "jsonl", "path": "s3://bucket/{partition}.jsonl",
                                             "columns": ["id", "text"]},
            "partitioning": {"kind": "static", "keys": ["a"]}, "prepare": {"id_column": "id", "text_column": "text"},
            "task": {"kind": "embed"}, "model": {"provider": "sentence_transformers", "config": {"model": "m"}},
            "runtime": {"gpus": 1}})
    partition = partition or "a"
    launcher_config = dict(instance_config["run_launcher"]["config"])
    with tempfile.TemporaryDirectory(prefix="kubeconfig-") as folder:
        # outside a cluster the launcher cannot log in as in one: a kubeconfig it never uses (no call is made)
        kubeconfig = Path(folder, "config")
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "none",
            "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "none", "user": {}}],
            "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}))
        launcher_config.update({"load_incluster_config": False, "kubeconfig_file": str(kubeconfig)})
        launcher = K8sRunLauncher.from_config_value(None, launcher_config)  # type: ignore[arg-type]
    origin = JobPythonOrigin(f"{spec.name}_job", RepositoryPythonOrigin(
        executable_path=sys.executable, code_pointer=ModuleCodePointer("batch_assets.definitions", "defs", None),
        container_image=image, container_context=context))
    run = dg.DagsterRun(job_name=f"{spec.name}_job", run_id="0" * 36, job_code_origin=origin,
                        tags={"dagster/partition": partition})
    run_context = K8sContainerContext.create_for_run(run, launcher, include_run_tags=True)
    run_job = construct_dagster_k8s_job(
        job_config=run_context.get_k8s_job_config(image, launcher), args=["dagster", "api", "execute_run"],
        job_name="dagster-run-sample", pod_name="dagster-run-sample", component="run_worker",
        user_defined_k8s_config=run_context.run_k8s_config)
    merged = K8sContainerContext.create_for_run(run, launcher, include_run_tags=False)
    resources = with_gpu_defaults(with_gpu_node_pool(resources_for_keys(spec, [partition])))
    check_gpu_strategy(spec, resources)
    merged = step_container_context(merged, resources)
    job_config = merged.get_k8s_job_config(None, launcher)
    step_job = construct_dagster_k8s_job(
        job_config=job_config.with_image(image), args=["dagster", "api", "execute_step"],
        job_name="dagster-step-sample", pod_name="dagster-step-sample", component="step_worker", user_defined_k8s_config=merged.run_k8s_config,
        labels={"dagster/op": f"{spec.name}__inferred"})
    return {name: ApiClient().sanitize_for_serialization(job)
            for name, job in (("run worker", run_job), ("infer step", step_job))}


def validate(manifests: Sequence[dict[str, Any]], version: str = KUBERNETES_VERSION) -> list[str]:
    """kubernetes-validate (strict: unknown fields are errors), offline: one line per invalid manifest."""
    import kubernetes_validate

    errors = []
    for doc in manifests:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc.get('kind')}/{doc['metadata']['name']}: {exc.message} at "
                          f"{'.'.join(str(p) for p in exc.path)}")
    return errors


def check(values_files: Sequence[Path], chart: Path | None = None, namespace: str = NAMESPACE,
          release: str = RELEASE, out=print) -> None:
    """The whole pre-deploy check; raises DeploymentCheckError listing every problem found."""
    manifests = render(values_files, chart, namespace, release)
    kinds: dict[str, int] = {}
    for doc in manifests:
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    out(f"rendered {len(manifests)} objects with helm: {', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}")
    config = load_instance_config(instance_yaml(manifests, release))
    out(f"instance dagster.yaml ({release}-instance) loads with this Dagster: {', '.join(sorted(config))}")
    jobs = sample_jobs(config, container_context(manifests))
    problems = [f"invalid manifest: {e}" for e in validate([*manifests, *jobs.values()])]
    out(f"validated {len(manifests) + len(jobs)} manifests (a sample run worker Job and infer step Job included) "
        f"against Kubernetes {KUBERNETES_VERSION}: {len(problems)} invalid")
    pods = {**pod_specs(manifests), **{f"Job/sample {name}": job["spec"]["template"]["spec"]
                                       for name, job in jobs.items()}}
    security = [f"PodSecurity restricted: {name}: {v}" for name, spec in pods.items()
                for v in restricted_violations(spec)]
    out(f"checked {len(pods)} pod templates against PodSecurity restricted: {len(security)} violations")
    if problems or security:
        raise DeploymentCheckError("\n".join([*problems, *security]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make k8s-check", description=__doc__.split("\n")[0])
    parser.add_argument("values", nargs="*", type=Path, default=[VALUES], help="values files (default k8s/values.yaml)")
    parser.add_argument("--chart", type=Path, default=None,
                        help="chart folder (default: $DAGSTER_CHART, else k8s/chart/dagster)")
    parser.add_argument("--namespace", default=NAMESPACE)
    parser.add_argument("--release", default=RELEASE)
    args = parser.parse_args(argv)
    try:
        check(args.values, args.chart, args.namespace, args.release)
    except DeploymentCheckError as exc:
        print(f"k8s-check FAILED:\n{exc}", file=sys.stderr)
        return 1
    print("k8s-check passed: the chart renders a deployment this project's Dagster and Kubernetes accept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
