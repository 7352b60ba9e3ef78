"""The real Dagster CLI: definitions validate, and the full chain for one partition with a temporary DAGSTER_HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import EMBED_SPEC, docs_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
pytestmark = pytest.mark.slow


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    return {**os.environ, "DAGSTER_HOME": str(home), **extra}


def test_definitions_validate_with_shipped_pipelines(tmp_path: Path) -> None:
    proc = subprocess.run([DAGSTER, "definitions", "validate", "-w", "workspace.yaml"], cwd=ROOT,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Validation successful" in proc.stdout + proc.stderr


def test_full_chain_for_one_partition_through_the_cli(tmp_path: Path) -> None:
    data, pipelines, store = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store"
    write_jsonl(data / "a.jsonl", docs_rows("a", 12))
    write_jsonl(data / "b.jsonl", docs_rows("b", 3))
    spec = {**EMBED_SPEC, "source": {**EMBED_SPEC["source"], "path": f"{data}/{{partition}}.jsonl"}}
    pipelines.mkdir()
    (pipelines / "docs.yaml").write_text(yaml.safe_dump(spec))
    env = _env(tmp_path, BATCH_PIPELINES_DIR=str(pipelines), BATCH_STORAGE_ROOT=str(store))

    proc = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "batch_assets.definitions", "--select", "group:docs",
         "--partition", "a"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    table = pq.read_table(store / "docs" / "output" / "a.parquet")
    assert sorted(table.column("doc_id").to_pylist()) == sorted(r["doc_id"] for r in docs_rows("a", 12))
    assert not (store / "docs" / "output" / "b.parquet").exists()
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        for stage in ("raw", "prepared", "inferred", "output"):
            key = dg.AssetKey(["docs", stage])
            assert instance.get_materialized_partitions(key) == {"a"}, stage
