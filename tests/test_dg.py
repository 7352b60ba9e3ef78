"""Dagster's own tooling on this project, through the real `dg` CLI from the project root: `dg check defs`,
`dg list defs` (the component-declared pipeline is listed with its defs.yaml), and a pipeline scaffolded with
`dg scaffold defs` (in a copy of the project under tmp_path) materializes one partition, then a range, with
`dg launch`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.partitions import hash_shard_keys
from tests.conftest import docs_rows, write_jsonl
from tests.daemon_helpers import project_copy

ROOT = Path(__file__).resolve().parents[1]
DG = str(Path(sys.executable).with_name("dg"))
pytestmark = pytest.mark.slow


def _dg(*args: str, env: dict | None = None, timeout: int = 300, project: Path = ROOT) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "BATCH_PIPELINES_DIR"}
    proc = subprocess.run([DG, *args], cwd=project, env={**environment, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"dg {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_dg_check_and_list_defs() -> None:
    assert "All definitions loaded successfully" in _dg("check", "defs").stdout
    listed = json.loads(_dg("list", "defs", "--json").stdout)
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert {"document_embeddings/output", "customer_industry/output"} <= set(assets)
    search = assets["document_search/output"]
    assert search["source"].startswith("batch_assets/defs/document_search/defs.yaml")
    assert "rows_exactly_once" in json.dumps(listed["asset_checks"])
    components = _dg("list", "components", "--json").stdout
    assert "batch_assets.components.BatchInferencePipeline" in components


def test_dg_check_defs_fails_on_a_broken_spec(tmp_path: Path) -> None:
    """A CI gate on `dg check defs` catches a broken pipeline: non-zero exit, the file and the fields named (the UI
    still loads the healthy pipelines; tests/test_spec.py)."""
    shutil.copyfile(ROOT / "batch_assets/pipelines/daily_review_sentiment.yaml", tmp_path / "good.yaml")
    (tmp_path / "broken_one.yaml").write_text("name: broken_one\nsource: {format: csv}\n")
    good = (ROOT / "batch_assets/pipelines/daily_review_sentiment.yaml").read_text()
    assert "    batch_size: 256\n" in good
    (tmp_path / "typo_setting.yaml").write_text(  # a misspelled provider setting must not run on with the default
        good.replace("name: daily_review_sentiment", "name: typo_setting").replace("batch_size: 256", "batch_sise: 256"))
    environment = {k: v for k, v in os.environ.items() if k != "DAGSTER_IS_DEFS_VALIDATION_CLI"}
    proc = subprocess.run([DG, "check", "defs"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**environment, "BATCH_PIPELINES_DIR": str(tmp_path)})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "All definitions loaded successfully" not in out
    assert f"{tmp_path / 'broken_one.yaml'}" in out and "source.columns: Field required" in out
    assert f"{tmp_path / 'typo_setting.yaml'}" in out and "model.config.batch_sise" in out
    assert "did you mean 'batch_size'?" in out


def test_scaffolded_component_pipeline_materializes(tmp_path: Path) -> None:
    name = f"scaffolded_{uuid.uuid4().hex[:8]}"
    project = project_copy(tmp_path / "project")
    folder = project / "batch_assets" / "defs" / name
    data, store, home = tmp_path / "data", tmp_path / "store", tmp_path / "home"
    write_jsonl(data / "a.jsonl", [{**r, "topic": "t", "title": r["doc_id"]} for r in docs_rows("a", 6)])
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    # The copy's package is imported, not the checkout's (the editable install points there).
    env = {"DAGSTER_HOME": str(home), "BATCH_STORAGE_ROOT": str(store), "PYTHONPATH": str(project)}

    _dg("scaffold", "defs", "batch_assets.components.BatchInferencePipeline", name, project=project, env=env)
    assert not (ROOT / "batch_assets" / "defs" / name).exists()
    decl = yaml.safe_load((folder / "defs.yaml").read_text())
    assert decl["type"] == "batch_assets.components.BatchInferencePipeline"
    assert decl["attributes"]["name"] == name
    # Edit the scaffold as a user would: point it at their data.
    decl["attributes"]["source"] = {"format": "jsonl", "path": f"{data}/*.jsonl",
                                    "columns": ["doc_id", "topic", "title", "text"]}
    (folder / "defs.yaml").write_text(yaml.safe_dump(decl, sort_keys=False))

    shards = hash_shard_keys(2)
    # docs/adding-a-pipeline.md's two launch commands: one partition, then a range
    _dg("launch", "--assets", f"group:{name}", "--partition", shards[0], project=project, env=env)
    assert pq.read_table(store / name / "output" / f"{shards[0]}.parquet").num_rows > 0
    assert not (store / name / "output" / f"{shards[1]}.parquet").exists()
    _dg("launch", "--assets", f"group:{name}", "--partition-range", f"{shards[0]}...{shards[1]}", project=project,
        env=env)
    rows = sum(pq.read_table(store / name / "output" / f"{s}.parquet").num_rows for s in shards)
    assert rows == 6
