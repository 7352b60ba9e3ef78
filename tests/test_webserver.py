"""The real `dagster dev` (webserver + daemon): the UI's GraphQL API lists the pipeline's assets, and a partition
launched through it (as the UI's Materialize button does) runs to success and lands its output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import EMBED_SPEC, docs_rows, free_port, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        payload = json.loads(resp.read())
    assert "errors" not in payload, payload
    return payload["data"]


def _wait_ready(port: int, proc: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            data = _graphql(port, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }")
            if data["repositoriesOrError"].get("nodes"):
                return
        except (OSError, AssertionError, KeyError):
            pass
        time.sleep(1)
    raise AssertionError("dagster dev did not become ready:\n" + log.read_text()[-3000:])


def test_ui_lists_assets_and_materializes_a_partition(tmp_path: Path) -> None:
    data, pipelines, store, home = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store", tmp_path / "home"
    write_jsonl(data / "a.jsonl", docs_rows("a", 8))
    write_jsonl(data / "b.jsonl", docs_rows("b", 2))
    pipelines.mkdir()
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    spec = {**EMBED_SPEC, "source": {**EMBED_SPEC["source"], "path": f"{data}/{{partition}}.jsonl"}}
    (pipelines / "docs.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store)}
    port = free_port()
    log = tmp_path / "dagster-dev.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster")), "dev", "-m", "batch_assets.definitions",
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_ready(port, proc, log)
        nodes = _graphql(port, "{ assetNodes { assetKey { path } groupName description } }")["assetNodes"]
        keys = {"/".join(n["assetKey"]["path"]): n for n in nodes}
        assert set(keys) == {"docs/raw", "docs/prepared", "docs/inferred", "docs/output"}
        assert {n["groupName"] for n in nodes} == {"docs"}
        assert "Infer" in keys["docs/inferred"]["description"]

        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        run_id = client.submit_job_execution("docs_job", tags={"dagster/partition": "a"})
        deadline = time.monotonic() + 240
        status = None
        while time.monotonic() < deadline:
            status = client.get_run_status(run_id).value
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(2)
        assert status == "SUCCESS", log.read_text()[-3000:]
        assert (store / "docs" / "output" / "a.parquet").exists()
        assert not (store / "docs" / "output" / "b.parquet").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
