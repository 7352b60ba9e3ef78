"""The product wired into someone else's Dagster project (issue 24 item 2), and loaded from an installed copy.

- Where relative paths resolve (batch_assets/storage.py `project_root`): $BATCH_PROJECT_ROOT, else the project the
  spec file or defs.yaml belongs to, else the project at or above the cwd, else the cwd; never inside site-packages.
- Every path error names the absolute path it tried.
- A project made like `create-dagster`'s, with two `BatchInferencePipeline` defs.yaml files (templated attributes),
  its own asset, and the product's definitions merged in: `dg check defs` is green with nothing else wired, and
  `dg launch` writes under the user's project, not the checkout or site-packages.
- A copy of the package laid out as a wheel installs it (no pyproject.toml beside it, in a `site-packages` folder)
  loads every built-in pipeline, Components included, and resolves their paths against the cwd's project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.components.pipeline import BatchInferencePipeline
from batch_assets.definitions import defs as product_defs
from batch_assets.definitions import executor_definitions
from batch_assets.errors import PipelineError
from batch_assets.partitions import hash_shard_keys, resolve_partition
from batch_assets.spec import load_spec, parse_spec
from batch_assets.storage import PROJECT_ROOT_ENV, ArrowStorage, project_root, resolve_local
from tests.conftest import docs_rows, user_env, write_jsonl
from tests.daemon_helpers import dagster_home

ROOT = Path(__file__).resolve().parents[1]
DG = str(Path(sys.executable).with_name("dg"))

SPEC = {
    "name": "reviews_embed",
    "source": {"format": "jsonl", "path": "data/reviews/*.jsonl", "columns": ["doc_id", "text"]},
    "partitioning": {"kind": "hash", "count": 2},
    "prepare": {"id_column": "doc_id", "text_column": "text"},
    "task": {"kind": "embed"},
    "model": {"provider": "sentence_transformers", "config": {"batch_size": 16}},
    "sink": {"format": "parquet", "columns": ["doc_id", "embedding", "error"]},
}


def _project(folder: Path, name: str = "shop") -> Path:
    """A folder laid out as `create-dagster project` makes one: pyproject.toml with a [tool.dg] project, the
    package under src/ with definitions.py and a defs/ folder."""
    (folder / "src" / name / "defs").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [project]
        name = "{name}"
        version = "0.1.0"
        requires-python = ">=3.10"
        dependencies = ["dagster", "batch-assets"]

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "{name}"
        registry_modules = ["{name}.components.*"]

        [tool.dg.cli]
        suppress_warnings = ["project_and_activated_venv_mismatch"]
        """))
    (folder / "src" / name / "__init__.py").write_text("")
    (folder / "src" / name / "defs" / "__init__.py").write_text("")
    return folder


def _write_spec(path: Path, spec: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# --- where relative paths resolve ------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_project_of_the_spec_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(PROJECT_ROOT_ENV, raising=False)
    project = _project(tmp_path / "shop")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a CLI started from another folder still reads the project's files
    spec = load_spec(_write_spec(project / "pipelines" / "reviews.yaml", SPEC))
    assert spec.source.path == str(project / "data/reviews/*.jsonl")
    assert project_root(project / "src" / "shop" / "defs" / "x" / "defs.yaml") == project
    # with no project above the spec file: the cwd (the storage root, shared by all pipelines, too)
    loose = load_spec(_write_spec(tmp_path / "loose" / "reviews.yaml", SPEC))
    assert loose.source.path == str(elsewhere / "data/reviews/*.jsonl")
    assert ArrowStorage().resolved_root() == str(elsewhere / "data/storage")
    # BATCH_PROJECT_ROOT overrides both
    monkeypatch.setenv(PROJECT_ROOT_ENV, str(tmp_path / "chosen"))
    assert load_spec(project / "pipelines" / "reviews.yaml").source.path == str(tmp_path / "chosen/data/reviews/*.jsonl")
    assert resolve_local("data/storage") == str(tmp_path / "chosen/data/storage")


def test_an_installed_package_never_resolves_into_site_packages(tmp_path: Path, monkeypatch) -> None:
    """The built-in pipelines of an installed package live in site-packages, under a folder that even holds a
    pyproject.toml (some wheels ship one): their relative paths resolve against the user's project (the cwd's), not
    the package, so outputs never land in the virtualenv."""
    monkeypatch.delenv(PROJECT_ROOT_ENV, raising=False)
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "batch_assets" / "pipelines").mkdir(parents=True)
    (site / "pyproject.toml").write_text("[project]\nname = 'not-a-project'\n")
    (site / "batch_assets" / "pyproject.toml").write_text("[project]\nname = 'not-a-project'\n")
    builtin = _write_spec(site / "batch_assets" / "pipelines" / "reviews.yaml", SPEC)
    project = _project(tmp_path / "shop")
    monkeypatch.chdir(project / "src")  # anywhere inside the user's project
    assert project_root(builtin) == project
    assert load_spec(builtin).source.path == str(project / "data/reviews/*.jsonl")
    assert ArrowStorage().resolved_root() == str(project / "data/storage")
    monkeypatch.chdir(site / "batch_assets")  # run from inside the package: refused, never the package's folder
    with pytest.raises(PipelineError, match="inside an installed package") as err:
        project_root(builtin)
    assert PROJECT_ROOT_ENV in str(err.value)


def test_a_missing_source_names_the_absolute_path_it_tried(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(PROJECT_ROOT_ENV, raising=False)
    project = _project(tmp_path / "shop")
    monkeypatch.chdir(project)
    daily = {**SPEC, "source": {**SPEC["source"], "path": "data/raw_app_reviews/{partition}.jsonl"},
             "partitioning": {"kind": "daily", "start_date": "2026-11-01"}}
    for spec in (parse_spec(daily), load_spec(_write_spec(project / "pipelines" / "daily.yaml", daily))):
        with pytest.raises(PipelineError) as err:
            resolve_partition(spec, "2026-11-01")
        assert f"file '{project}/data/raw_app_reviews/2026-11-01.jsonl'" in str(err.value)


# --- a Component in a user's project -----------------------------------------------------------------------------


def test_component_definitions_bring_their_resources_and_merge(tmp_path: Path) -> None:
    """Two pipeline Components, the user's own Definitions with their own executor, all in one code location:
    each Component brings the storage and its model, the same storage object, and no executor."""
    one = BatchInferencePipeline(parse_spec(SPEC)).build_defs(None)
    two = BatchInferencePipeline(parse_spec({**SPEC, "name": "other_embed"})).build_defs(None)
    assert one.executor is None and two.executor is None
    assert one.resources["storage"] is two.resources["storage"]

    @dg.asset
    def users_own() -> None:
        return None

    users = dg.Definitions(assets=[users_own], executor=dg.multiprocess_executor)
    merged = dg.Definitions.merge(users, one, two)
    assert merged.executor is dg.multiprocess_executor  # the project's executor, not replaced
    # the product's own definitions (built-in pipelines, their executor) merge with Components and a project's
    # own Definitions that has none, and the product's executor is one call away for a project that has none
    assert dg.Definitions.merge(dg.Definitions(assets=[users_own]), one, two, product_defs).executor is not None
    assert dg.Definitions.merge(dg.Definitions(assets=[users_own]), one, executor_definitions()).executor \
        is dg.in_process_executor
    repo = merged.get_repository_def()
    for name in ("reviews_embed", "other_embed"):  # every resource a pipeline's assets need is there
        assert repo.get_job(f"{name}_job").resource_defs.keys() >= {"storage", f"{name}_model"}


CREATE_DAGSTER_DEFINITIONS = textwrap.dedent("""\
    from pathlib import Path

    from dagster import definitions, load_from_defs_folder


    @definitions
    def defs():
        return load_from_defs_folder(path_within_project=Path(__file__).parent)
    """)
MERGING_PRODUCT_DEFINITIONS = textwrap.dedent("""\
    from pathlib import Path

    import dagster as dg

    import batch_assets.definitions


    @dg.definitions
    def defs():
        return dg.Definitions.merge(dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
                                    batch_assets.definitions.defs)
    """)


@pytest.mark.slow
def test_a_users_project_needs_one_defs_yaml(tmp_path: Path) -> None:
    """As a user wires it: a create-dagster project (its definitions.py untouched), two defs.yaml files (one reading
    `{{ env.REVIEWS_DIR }}`, one reading `{{ context.project_root }}/data` and writing to
    `{{ project_root }}/published`) and their own asset. `dg check defs` is
    green with nothing else wired, and `dg launch` from the project writes under the project (the default storage
    root `data/storage` resolves there), nothing under the checkout. Then the product's own definitions merge in."""
    project = _project(tmp_path / "shop")
    package = project / "src" / "shop"
    reviews = tmp_path / "incoming"
    write_jsonl(reviews / "a.jsonl", docs_rows("a", 5))
    write_jsonl(reviews / "b.jsonl", docs_rows("b", 4))
    templated = {**SPEC, "source": {**SPEC["source"], "path": "{{ env.REVIEWS_DIR }}/*.jsonl"}}
    published = {**SPEC, "name": "reviews_published",
                 "source": {**SPEC["source"], "path": "{{ context.project_root }}/data/raw_reviews/*.jsonl"},
                 "sink": {**SPEC["sink"], "path": "{{ project_root }}/published/reviews"}}
    write_jsonl(project / "data" / "raw_reviews" / "c.jsonl", docs_rows("c", 3))
    for folder, attributes in (("reviews_embed", templated), ("reviews_published", published)):
        _write_spec(package / "defs" / folder / "defs.yaml",
                    {"type": "batch_assets.components.BatchInferencePipeline", "attributes": attributes})
    (package / "defs" / "own.py").write_text(textwrap.dedent("""\
        import dagster as dg


        @dg.asset
        def raw_app_reviews() -> None:
            return None
        """))
    (package / "definitions.py").write_text(CREATE_DAGSTER_DEFINITIONS)
    (project / ".venv").symlink_to(ROOT / ".venv")
    env = user_env(DAGSTER_HOME=str(dagster_home(tmp_path / "home")), PYTHONPATH=str(project / "src"),
                   REVIEWS_DIR=str(reviews))
    for name in ("BATCH_STORAGE_ROOT", "BATCH_PIPELINES_DIR", PROJECT_ROOT_ENV, "BATCH_EXECUTOR"):
        env.pop(name, None)

    def dg_cli(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([DG, *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"dg {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
        return proc

    assert "All definitions loaded successfully" in dg_cli("check", "defs").stdout
    listed = json.loads(dg_cli("list", "defs", "--json").stdout)
    assert {"raw_app_reviews", "reviews_embed/output", "reviews_published/output"} <= {
        a["asset_key"] for a in listed["assets"]}

    shards = hash_shard_keys(2)
    checkout_store = ROOT / "data" / "storage"
    before = set(checkout_store.rglob("*")) if checkout_store.exists() else set()
    for name in ("reviews_embed", "reviews_published"):
        dg_cli("launch", "--assets", f"group:{name}", "--partition-range", f"{shards[0]}...{shards[1]}")
    embedded = sum(pq.read_table(project / "data/storage/reviews_embed/output" / f"{s}.parquet").num_rows
                   for s in shards)
    assert embedded == 9  # every row of {{ env.REVIEWS_DIR }}, in the project's default storage root
    published_rows = sum(pq.read_table(project / "published/reviews" / f"{s}.parquet").num_rows for s in shards)
    assert published_rows == 3  # {{ project_root }} rendered to the project folder
    assert not (checkout_store / "reviews_embed").exists() and not (checkout_store / "reviews_published").exists()
    assert (set(checkout_store.rglob("*")) if checkout_store.exists() else set()) == before

    # The product's own definitions (its built-in pipelines, its executor) merge into the same project too.
    (package / "definitions.py").write_text(MERGING_PRODUCT_DEFINITIONS)
    assert "All definitions loaded successfully" in dg_cli("check", "defs").stdout
    assert {"reviews_embed/output", "document_search/output", "document_embeddings/output"} <= {
        a["asset_key"] for a in json.loads(dg_cli("list", "defs", "--json").stdout)["assets"]}


# --- an installed copy -----------------------------------------------------------------------------------------


def _installed_copy(site: Path) -> Path:
    """The package as a wheel lays it out (setup.py: resources/ installs as batch_assets.resources), in a folder
    named site-packages, with no pyproject.toml beside it."""
    shutil.copytree(ROOT / "batch_assets", site / "batch_assets", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "resources", site / "batch_assets" / "resources",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if "__pycache__" not in p.parts}


INSTALLED_CHECK = textwrap.dedent("""\
    import json, sys
    import dagster as dg
    import batch_assets, batch_assets.definitions as d
    from batch_assets.orchestration.assets.factory import pipeline_specs
    from batch_assets.storage import DEFAULT_STORAGE

    defs = d.defs
    specs = {s.name: s for s in pipeline_specs(defs)}
    raw = defs.get_assets_def(dg.AssetKey(["document_embeddings", "raw"]))
    key = raw.partitions_def.get_partition_keys()[0]
    result = dg.materialize([raw], partition_key=key, resources={"storage": DEFAULT_STORAGE})
    print(json.dumps({
        "package": batch_assets.__file__,
        "groups": sorted({k.path[0] for k in defs.resolve_asset_graph().get_all_asset_keys()}),
        "sources": {n: s.source.path for n, s in specs.items()},
        "storage_root": DEFAULT_STORAGE.resolved_root(),
        "raw_ok": result.success,
    }))
    """)


@pytest.mark.slow
def test_the_definitions_load_from_an_installed_copy(tmp_path: Path) -> None:
    """Inside a wheel there is no pyproject.toml: the built-in Component pipelines loaded through
    dg.load_from_defs_folder failed on every load ("Could not find config file"). From an installed copy, every
    built-in pipeline loads, and a relative path (sources, sample data, the storage root) resolves against the
    project the code runs in, not site-packages: materializing a stage writes nothing into the package."""
    site = _installed_copy(tmp_path / "venv" / "lib" / "python3.11" / "site-packages")
    project = _project(tmp_path / "shop")
    before = _files(site)
    env = user_env(PYTHONPATH=str(site), DAGSTER_HOME=str(dagster_home(tmp_path / "home")))
    for name in ("BATCH_STORAGE_ROOT", "BATCH_PIPELINES_DIR", PROJECT_ROOT_ENV, "BATCH_EXECUTOR"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", INSTALLED_CHECK], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["package"].startswith(str(site))  # the copy was imported, not the checkout's editable install
    shipped = {p.stem for p in (ROOT / "batch_assets/pipelines").glob("*.yaml")} | {
        p.parent.name for p in (ROOT / "batch_assets/defs").glob("*/defs.yaml")}
    assert shipped <= set(out["groups"]) and "document_search" in out["groups"]
    assert "broken_pipelines" not in out["groups"]
    for name, path in out["sources"].items():
        assert "site-packages" not in path, (name, path)
    assert out["sources"]["document_embeddings"].startswith(str(project / "data"))
    assert out["storage_root"] == str(project / "data" / "storage")
    assert out["raw_ok"]
    assert any((project / "data" / "samples").rglob("*.jsonl"))  # the sample data, generated in the project
    assert any((project / "data" / "storage" / "document_embeddings" / "raw").glob("*.parquet"))
    assert _files(site) == before  # nothing written into site-packages


@pytest.mark.slow
def test_an_unset_template_variable_fails_the_load_naming_it(tmp_path: Path) -> None:
    """`{{ env.REVIEWS_DIR }}/*.jsonl` with REVIEWS_DIR unset: Dagster's own rendering gives None, and the path would
    silently become `None/*.jsonl` in the project. `dg check defs` fails instead, naming the variable and the line."""
    project = _project(tmp_path / "shop")
    package = project / "src" / "shop"
    templated = {**SPEC, "source": {**SPEC["source"], "path": "{{ env.REVIEWS_DIR }}/*.jsonl"}}
    _write_spec(package / "defs" / "reviews_embed" / "defs.yaml",
                {"type": "batch_assets.components.BatchInferencePipeline", "attributes": templated})
    (package / "definitions.py").write_text(CREATE_DAGSTER_DEFINITIONS)
    (project / ".venv").symlink_to(ROOT / ".venv")
    env = user_env(DAGSTER_HOME=str(dagster_home(tmp_path / "home")), PYTHONPATH=str(project / "src"))
    env.pop("REVIEWS_DIR", None)
    proc = subprocess.run([DG, "check", "defs"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "environment variable REVIEWS_DIR is not set" in out
    assert "attributes.source.path = '{{ env.REVIEWS_DIR }}/*.jsonl' could not be rendered" in out
    assert "environment variable REVIEWS_DIR is not set" in out
    assert not (project / "None").exists()
