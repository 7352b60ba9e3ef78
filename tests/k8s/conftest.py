"""Fixtures for Kubernetes tests: the loopback Jobs API stub (tests/k8s/stub.py) and a Dagster instance whose
run launcher is the real K8sRunLauncher pointed at it. Reusable from any test folder:
`from tests.k8s.conftest import k8s_stub, k8s_dagster_home` (or move them up when a second folder needs them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.stub import KubernetesJobsStub, environment_for_jobs, instance_yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def k8s_stub(tmp_path: Path) -> Iterator[KubernetesJobsStub]:
    """A started stub; Job commands run in the project root with this process's environment. Set what the Jobs
    need (DAGSTER_HOME, BATCH_PIPELINES_DIR, BATCH_STORAGE_ROOT, BATCH_EXECUTOR=k8s) in `stub.base_env`."""
    stub = KubernetesJobsStub(tmp_path / "k8s-stub", environment_for_jobs(), cwd=ROOT).start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture
def k8s_dagster_home(tmp_path: Path, k8s_stub: KubernetesJobsStub) -> Path:
    """DAGSTER_HOME with a dagster.yaml using K8sRunLauncher against the stub (a queued run coordinator, so a
    daemon launches runs; pools capped at one slot so the GPU pool is exercised). Jobs get DAGSTER_HOME too."""
    home = tmp_path / "dagster-home"
    home.mkdir()
    extra = {
        "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"},
        "concurrency": {"runs": {"max_concurrent_runs": 2}, "pools": {"default_limit": 1, "granularity": "op"}},
    }
    (home / "dagster.yaml").write_text(instance_yaml(k8s_stub, home, extra=extra))
    k8s_stub.base_env["DAGSTER_HOME"] = str(home)
    return home
