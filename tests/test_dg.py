"""Dagster's own tooling on this project, through the real `dg` CLI from the project root: `dg check defs`,
`dg list defs` (the component-declared pipeline is listed with its defs.yaml), and a pipeline scaffolded with
`dg scaffold defs` materializes one partition with `dg launch`."""

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

ROOT = Path(__file__).resolve().parents[1]
DG = str(Path(sys.executable).with_name("dg"))
pytestmark = pytest.mark.slow


def _dg(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "BATCH_PIPELINES_DIR"}
    proc = subprocess.run([DG, *args], cwd=ROOT, env={**environment, **(env or {})}, capture_output=True,
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


def test_scaffolded_component_pipeline_materializes(tmp_path: Path) -> None:
    name = f"scaffolded_{uuid.uuid4().hex[:8]}"
    folder = ROOT / "batch_assets" / "defs" / name
    data, store, home = tmp_path / "data", tmp_path / "store", tmp_path / "home"
    write_jsonl(data / "a.jsonl", [{**r, "topic": "t", "title": r["doc_id"]} for r in docs_rows("a", 6)])
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    try:
        _dg("scaffold", "defs", "batch_assets.components.BatchInferencePipeline", name)
        decl = yaml.safe_load((folder / "defs.yaml").read_text())
        assert decl["type"] == "batch_assets.components.BatchInferencePipeline"
        assert decl["attributes"]["name"] == name
        # Edit the scaffold as a user would: point it at their data.
        decl["attributes"]["source"] = {"format": "jsonl", "path": f"{data}/*.jsonl",
                                        "columns": ["doc_id", "topic", "title", "text"]}
        (folder / "defs.yaml").write_text(yaml.safe_dump(decl, sort_keys=False))

        shards = hash_shard_keys(2)
        env = {"DAGSTER_HOME": str(home), "BATCH_STORAGE_ROOT": str(store)}
        _dg("launch", "--assets", f"group:{name}", "--partition-range", f"{shards[0]}...{shards[1]}", env=env)
        rows = sum(pq.read_table(store / name / "output" / f"{s}.parquet").num_rows for s in shards)
        assert rows == 6
    finally:
        shutil.rmtree(folder, ignore_errors=True)
