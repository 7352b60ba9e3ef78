"""What the Dagster Helm chart renders from k8s/values.yaml, rendered for real: a real `helm template` (v4.1.4, the
pinned binary `make install-test` extracts into .venv/tools) of the chart in ../shared/dagster-chart/dagster (a
reconstruction of upstream `helm/dagster` 1.13.27; its README lists what differs from the released package), with the
chart's own defaults under our values, as `helm upgrade --install` merges them. No Python reproduction of templates:
a test that needs chart output reads it from these manifests (batch_assets/commands/k8s_check.py does the rendering).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_assets.commands import k8s_check

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "k8s" / "values.yaml"
CHART = ROOT.parent / "shared" / "dagster-chart" / "dagster"
RELEASE = k8s_check.RELEASE
NAMESPACE = "batch"


def values(path: Path = VALUES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def require_helm() -> None:
    """helm and the chart are real parts `make install-test` sets up: skipped on a workstation without them, a
    failure on CI (CI set), as for the llama.cpp server."""
    try:
        k8s_check.helm_binary()
        missing = None if (CHART / "Chart.yaml").is_file() else f"the Dagster chart at {CHART}"
    except k8s_check.DeploymentCheckError as exc:
        missing = str(exc)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"missing on CI: {missing} (make install-test)")
        pytest.skip(f"missing: {missing} (make install-test)")


@dataclass
class Rendered:
    manifests: list[dict[str, Any]]

    @property
    def instance_yaml(self) -> str:
        return k8s_check.instance_yaml(self.manifests)

    @property
    def instance(self) -> dict[str, Any]:
        return yaml.safe_load(self.instance_yaml)

    @property
    def container_context(self) -> dict[str, Any] | None:
        return k8s_check.container_context(self.manifests)

    def config_maps(self) -> dict[str, dict[str, str]]:
        return {d["metadata"]["name"]: dict(d.get("data") or {}) for d in self.manifests if d["kind"] == "ConfigMap"}

    def find(self, kind: str, name: str) -> dict[str, Any]:
        return k8s_check.find(self.manifests, kind, name)


_CACHE: dict[str, Rendered] = {}


def render(vals: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> Rendered:
    """helm template of the chart with `vals` (default: k8s/values.yaml as shipped)."""
    require_helm()
    text = yaml.safe_dump(vals if vals is not None else values())
    key = f"{namespace}\n{text}"
    if key not in _CACHE:  # one helm call per distinct values in a test process
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "values.yaml")
            path.write_text(text)
            _CACHE[key] = Rendered(k8s_check.render([path], CHART, namespace, RELEASE))
    return Rendered(json.loads(json.dumps(_CACHE[key].manifests)))  # a copy the caller may change
