"""`make k8s-check` (batch_assets/commands/k8s_check.py), step one of docs/deployment.md: the real chart rendered by the
real helm with the values, the instance config loaded by this project's Dagster, every manifest and sample Jobs validated
(kubernetes-validate), every pod checked against PodSecurity `restricted`. And the air-gapped install path: a chart
whose values schema `$ref`s an unreachable host fails `helm template`, `--skip-schema-validation` renders it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from batch_assets.commands import k8s_check
from batch_assets.pod_security import restricted_violations
from tests.conftest import free_port
from tests.k8s.chart import CHART, ROOT, render, require_helm, values


def _make_check(*values_files: Path) -> subprocess.CompletedProcess:
    require_helm()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MAKEFLAGS", "MAKELEVEL")}  # as a user runs it
    env["DAGSTER_CHART"] = str(CHART)
    argv = ["make", "--no-print-directory", "k8s-check"]
    if values_files:
        argv.append(f"K8S_VALUES={' '.join(str(f) for f in values_files)}")
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_make_k8s_check_passes_the_shipped_values() -> None:
    done = _make_check()
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "rendered 17 objects with helm" in out
    assert "instance dagster.yaml (dagster-instance) loads with this Dagster" in out
    assert "validated 19 manifests (a sample run worker Job and infer step Job included)" in out and "0 invalid" in out
    assert "checked 5 pod templates against PodSecurity restricted: 0 violations" in out
    assert "k8s-check passed" in out


def test_make_k8s_check_fails_on_the_values_that_would_crash_loop_and_on_a_pod_restricted_refuses(
        tmp_path: Path) -> None:
    """The values as shipped before issue 22 (run limits under additionalInstanceConfig, the chart's run
    coordinator defaults left in place), and an override that lets the webserver escalate privileges."""
    old = values()
    old["concurrency"] = {"enabled": False}
    old["additionalInstanceConfig"] = {"concurrency": {"runs": {"max_concurrent_runs": 20}}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    done = _make_check(tmp_path / "old.yaml")
    assert done.returncode != 0
    assert "k8s-check FAILED" in done.stderr and "every run and step pod would crash-loop" in done.stderr
    assert "incompatible with the `concurrency > runs` config" in done.stderr, done.stderr

    (tmp_path / "escalate.yaml").write_text(yaml.safe_dump(
        {"dagsterWebserver": {"securityContext": {"allowPrivilegeEscalation": True}}}))
    done = _make_check(ROOT / "k8s" / "values.yaml", tmp_path / "escalate.yaml")
    assert done.returncode != 0
    assert ("PodSecurity restricted: Deployment/dagster-dagster-webserver: container dagster: "
            "securityContext.allowPrivilegeEscalation must be false") in done.stderr, done.stderr


def test_every_pod_of_the_deployment_passes_podsecurity_restricted() -> None:
    """Daemon, webserver, code server (with their init containers) as rendered, and the run worker and infer step
    pods as launched; and the check itself refuses what the profile refuses."""
    rendered = render()
    config = k8s_check.load_instance_config(rendered.instance_yaml)
    jobs = k8s_check.sample_jobs(config, rendered.container_context)
    pods = {**k8s_check.pod_specs(rendered.manifests),
            **{name: job["spec"]["template"]["spec"] for name, job in jobs.items()}}
    assert {"Deployment/dagster-daemon", "Deployment/dagster-dagster-webserver",
            "Deployment/dagster-dagster-user-deployments-batch-assets", "run worker", "infer step"} <= set(pods)
    assert {name: restricted_violations(spec) for name, spec in pods.items()} == {name: [] for name in pods}
    # the chart's defaults alone (no securityContext) break the profile, one rule each
    bare = {"containers": [{"name": "c", "image": "i"}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    found = "\n".join(restricted_violations(bare))
    for rule in ("hostPath", "allowPrivilegeEscalation must be false", "runAsNonRoot must be true",
                 "seccompProfile.type must be RuntimeDefault", "capabilities.drop must include ALL"):
        assert rule in found, (rule, found)


def test_an_air_gapped_install_renders_with_skip_schema_validation(tmp_path: Path) -> None:
    """The published chart's values.schema.json `$ref`s remote schemas, which helm fetches while validating
    values (dagster issues #29629, #33134): without internet access `helm upgrade --install` fails. Reproduced
    with a `$ref` to a loopback port nobody listens on; the documented flag renders the chart."""
    require_helm()
    chart = tmp_path / "dagster"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").write_text(yaml.safe_dump({
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"dagsterWebserver": {"$ref": f"http://127.0.0.1:{free_port()}/_definitions.json#/webserver"}}}))
    values_file = ROOT / "k8s" / "values.yaml"
    with pytest.raises(k8s_check.DeploymentCheckError, match="helm template failed"):
        k8s_check.render([values_file], chart)
    manifests = k8s_check.render([values_file], chart, extra_args=["--skip-schema-validation"])
    k8s_check.load_instance_config(k8s_check.instance_yaml(manifests))
