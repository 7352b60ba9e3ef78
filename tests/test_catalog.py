"""The pipeline catalog (batch_assets/catalog.py): where every entry point finds a pipeline.

Spec files and Components of this package, $BATCH_PIPELINES_DIR instead of both, a user's `create-dagster` project
(its Components read without building anything; a pipeline its definitions.py declares in Python found by loading
the code location as Dagster does), and an unknown name answered with the names that are known.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from batch_assets import catalog
from batch_assets.catalog import UnknownPipelineError, built_in, for_project
from tests.conftest import EMBED_SPEC
from tests.test_project_wiring import CREATE_DAGSTER_DEFINITIONS, _project

COMPONENT_TYPE = "batch_assets.components.BatchInferencePipeline"


def _component(project: Path, package: str, name: str) -> None:
    folder = project / "src" / package / "defs" / name
    folder.mkdir(parents=True)
    (folder / "defs.yaml").write_text(yaml.safe_dump({"type": COMPONENT_TYPE, "attributes": {**EMBED_SPEC, "name": name}}))


def test_the_built_in_catalog_has_the_spec_files_and_the_components(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCH_PIPELINES_DIR", raising=False)
    found = built_in()
    assert not found.broken
    assert {p.stem for p in catalog.PIPELINES_DIR.glob("*.yaml")} | {"document_search"} == set(found.names())
    assert found.get("document_search").sink.format == "lancedb"  # the Component's spec, as its defs.yaml says


def test_pipelines_dir_replaces_both_built_in_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**EMBED_SPEC, "name": "mine"}))
    monkeypatch.setenv("BATCH_PIPELINES_DIR", str(tmp_path))
    found = built_in()
    assert found.names() == ["mine"]
    with pytest.raises(UnknownPipelineError, match=r"unknown pipeline 'document_search' in .*; known: mine"):
        found.get("document_search")


def test_a_name_declared_as_a_file_and_as_a_component_is_reported(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Dagster builds the component folder as one unit: the Component keeps the name, the spec file of the same name
    is a broken pipeline saying why, and the code location loads with both in it."""
    from batch_assets.definitions import BROKEN_GROUP, code_location

    (tmp_path / "search.yaml").write_text(yaml.safe_dump({**EMBED_SPEC, "name": "document_search"}))
    monkeypatch.setattr(catalog, "spec_folders", lambda: [tmp_path])
    monkeypatch.delenv("BATCH_PIPELINES_DIR", raising=False)
    found = built_in()
    assert found.names() == ["document_search"] and found.get("document_search").sink.format == "lancedb"
    assert [b.origin for b in found.broken] == [str(tmp_path / "search.yaml")]
    assert "also declared as a Component" in found.broken[0].error
    with pytest.warns(UserWarning, match="also declared as a Component"):
        keys = {k.to_user_string() for k in code_location(found).resolve_all_asset_keys()}
    assert {"document_search/output", f"{BROKEN_GROUP}/search"} <= keys


def test_a_create_dagster_project_is_read_without_building_its_code_location(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Component pipeline of the project is found from its defs.yaml: the project's definitions.py (a
    `@dg.definitions` function) is not even imported."""
    project = _project(tmp_path / "cat_a", "cat_a")
    (project / "src" / "cat_a" / "definitions.py").write_text(CREATE_DAGSTER_DEFINITIONS)
    _component(project, "cat_a", "cat_embed")
    monkeypatch.syspath_prepend(str(project / "src"))
    monkeypatch.delenv("BATCH_PIPELINES_DIR", raising=False)
    assert for_project(project / "src").get("cat_embed").name == "cat_embed"
    assert "cat_a.definitions" not in sys.modules


def test_a_pipeline_declared_in_python_is_found_through_the_code_location(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline built in the project's definitions.py (no defs.yaml) is found by loading the code location as
    Dagster does; a name nowhere is answered with every name the code location has."""
    project = _project(tmp_path / "cat_b", "cat_b")
    _component(project, "cat_b", "cat_component")
    (project / "src" / "cat_b" / "definitions.py").write_text(textwrap.dedent("""\
        from pathlib import Path

        import dagster as dg

        from batch_assets.orchestration.assets.factory import build_pipeline_definitions
        from batch_assets.spec import parse_spec


        @dg.definitions
        def defs():
            return dg.Definitions.merge(dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
                                        build_pipeline_definitions(parse_spec(SPEC)))
        """) + f"\n\nSPEC = {{**{EMBED_SPEC!r}, 'name': 'cat_python'}}\n")
    monkeypatch.syspath_prepend(str(project / "src"))
    monkeypatch.delenv("BATCH_PIPELINES_DIR", raising=False)
    assert for_project(project).get("cat_python").name == "cat_python"
    with pytest.raises(UnknownPipelineError, match="known: cat_component, cat_python$"):
        for_project(project).get("nowhere")
