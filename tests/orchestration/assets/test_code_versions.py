"""The stages' code versions (orchestration/assets/lineage.py `stage_code_version`) decide what a rerun pays for: a record
whose version no longer matches is made, and inferred, again. So a version may change only when the user changes
what a stage computes, never because the product was upgraded or the project moved:
- the shipped pipelines keep the versions they had at b25b11d, before issue 24 added spec fields (partitioning
  dimensions, source.asset, partition_mapping) and made relative paths absolute at load;
- the same spec file in two project folders has one version (paths are digested as written).
Shown red once each: with `dimensions` left in the digest at its default, and with the anchored (absolute) paths
digested, every shipped pipeline's versions changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from batch_assets.orchestration.assets.lineage import stage_code_version
from batch_assets.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]
STAGES = ("raw", "prepared", "inferred", "output")
# python -c "...stage_code_version(load_spec(p), s)..." at b25b11d, for each batch_assets/pipelines/*.yaml
VERSIONS_BEFORE_ISSUE_24 = {
    "customer_industry": {
        "inferred": "inferred-fc1006164458",
        "output": "output-48b9e388fdfd",
        "prepared": "prepared-912cbe8668b0",
        "raw": "raw-5b08ad4a0247"
    },
    "customer_industry_openai": {
        "inferred": "inferred-8070128bb7f0",
        "output": "output-d9d27973c041",
        "prepared": "prepared-4f6b56d938c1",
        "raw": "raw-5b08ad4a0247"
    },
    "customer_industry_zero_shot": {
        "inferred": "inferred-783d6b24b407",
        "output": "output-30d42cffe991",
        "prepared": "prepared-323aea9f5e73",
        "raw": "raw-5b08ad4a0247"
    },
    "daily_review_sentiment": {
        "inferred": "inferred-3ced5ad53398",
        "output": "output-c026378759dd",
        "prepared": "prepared-c3211b50603e",
        "raw": "raw-0b65546294ae"
    },
    "document_embeddings": {
        "inferred": "inferred-eec5e25f6122",
        "output": "output-ff44d252187a",
        "prepared": "prepared-2f44d92460c9",
        "raw": "raw-be03f37f74b1"
    },
    "quote_classification": {
        "inferred": "inferred-97eaf9349a2d",
        "output": "output-1b0667fee8cf",
        "prepared": "prepared-b84dd136d2e7",
        "raw": "raw-838cb76dc4cb"
    },
    "review_sentiment": {
        "inferred": "inferred-2fc89eb95254",
        "output": "output-a7c3fa562eda",
        "prepared": "prepared-9d63aa0350e4",
        "raw": "raw-9dbc00db9fb9"
    }
}


@pytest.mark.parametrize("name", sorted(VERSIONS_BEFORE_ISSUE_24))
def test_an_upgrade_does_not_make_published_partitions_stale(name: str) -> None:
    spec = load_spec(ROOT / "batch_assets" / "pipelines" / f"{name}.yaml")
    assert {s: stage_code_version(spec, s) for s in STAGES} == VERSIONS_BEFORE_ISSUE_24[name]


def test_moving_the_project_keeps_the_versions(tmp_path: Path) -> None:
    versions = []
    for folder in ("one", "elsewhere/two"):
        project = tmp_path / folder
        (project / "pipelines").mkdir(parents=True)
        (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
        shutil.copy(ROOT / "batch_assets" / "pipelines" / "document_embeddings.yaml", project / "pipelines")
        spec = load_spec(project / "pipelines" / "document_embeddings.yaml")
        assert spec.source.path.startswith(str(project))  # anchored to its own project at load
        versions.append({s: stage_code_version(spec, s) for s in STAGES})
    assert versions[0] == versions[1] == VERSIONS_BEFORE_ISSUE_24["document_embeddings"]


def test_setting_a_new_field_does_change_the_version() -> None:
    spec = load_spec(ROOT / "batch_assets" / "pipelines" / "document_embeddings.yaml")
    edited = spec.model_copy(update={"source": spec.source.model_copy(update={"path": "data/other/*.jsonl"})})
    assert stage_code_version(edited, "raw") != stage_code_version(spec, "raw")
