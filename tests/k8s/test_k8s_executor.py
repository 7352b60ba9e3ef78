"""The batch executor is selected by configuration, keeps k8s_job_executor's run config, and finds the infer steps."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import EMBED_SPEC, make_spec


def test_selected_by_batch_executor_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.definitions import build_definitions

    spec = make_spec(EMBED_SPEC, tmp_path, runtime={"gpus": 1})
    monkeypatch.delenv("BATCH_EXECUTOR", raising=False)
    assert build_definitions([spec]).resolve_job_def("docs_job").executor_def.name != "batch_k8s"
    monkeypatch.setenv("BATCH_EXECUTOR", "k8s")
    monkeypatch.setenv("BATCH_STORAGE_ROOT", "s3://bucket/batch")
    job = build_definitions([spec]).resolve_job_def("docs_job")
    assert job.executor_def.name == "batch_k8s"


def test_same_run_config_as_k8s_job_executor(tmp_path: Path) -> None:
    from dagster_k8s import k8s_job_executor

    from batch_assets.orchestration.execution.k8s_executor import batch_k8s_executor

    ours = batch_k8s_executor([make_spec(EMBED_SPEC, tmp_path)]).config_schema.config_type.fields
    upstream = k8s_job_executor.config_schema.config_type.fields
    assert set(ours) == set(upstream)


def test_only_the_infer_step_is_tagged_and_pooled(tmp_path: Path) -> None:
    from batch_assets.orchestration.assets.factory import build_pipeline_assets
    from batch_assets.orchestration.execution.pod_compute import INFER_STAGE, PIPELINE_TAG, STAGE_TAG

    assets = {a.key.path[-1]: a for a in build_pipeline_assets(make_spec(EMBED_SPEC, tmp_path, runtime={"gpus": 2}))}
    infer = assets["inferred"]
    assert infer.op.tags[PIPELINE_TAG] == "docs" and infer.op.tags[STAGE_TAG] == INFER_STAGE
    assert infer.op.pool == "gpu"
    for stage in ("raw", "prepared", "output"):
        assert STAGE_TAG not in assets[stage].op.tags and assets[stage].op.pool is None
        assert "dagster-k8s/config" not in assets[stage].op.tags
    assert "dagster-k8s/config" not in infer.op.tags  # the executor sizes it, per partition
    cpu_only = {a.key.path[-1]: a for a in build_pipeline_assets(make_spec(EMBED_SPEC, tmp_path))}
    assert cpu_only["inferred"].op.pool is None
def test_pipelines_built_by_a_component_are_known_to_the_executor(tmp_path: Path) -> None:
    from batch_assets.components.pipeline import BatchInferencePipeline
    from batch_assets.orchestration.assets.factory import pipeline_specs

    spec = make_spec(EMBED_SPEC, tmp_path, name="docs_component", runtime={"gpus": 1})
    defs = BatchInferencePipeline(spec).build_defs(None)  # the component builds through the factory
    assert pipeline_specs(defs) == [spec]  # and its spec travels with its definitions, to the executor


def test_the_code_location_gives_the_executor_every_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """definitions.py hands the executor the specs of the spec-file pipelines and of the component ones (the shipped
    `document_search`), read from their Definitions: no pipeline's infer step is left without its policy."""
    from batch_assets import definitions
    from batch_assets.orchestration.execution import k8s_executor

    given: list = []
    real = k8s_executor.batch_k8s_executor
    monkeypatch.setattr(k8s_executor, "batch_k8s_executor", lambda specs: given.extend(specs) or real(specs))
    monkeypatch.setenv("BATCH_EXECUTOR", "k8s")
    monkeypatch.setenv("BATCH_STORAGE_ROOT", "s3://bucket/batch")
    spec = make_spec(EMBED_SPEC, tmp_path, runtime={"gpus": 1})
    defs = definitions.build_definitions([spec], components=True)
    assert defs.resolve_job_def("document_search_job").executor_def.name == "batch_k8s"
    assert {s.name for s in given} == {"docs", "document_search"}
    assert next(s for s in given if s.name == "docs") == spec


def test_a_local_storage_root_is_refused_on_kubernetes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22: with BATCH_EXECUTOR=k8s every step runs in its own pod; a local storage root is a different disk
    in each, and the outputs would vanish with the pods. Refused when the code location loads and in every step,
    unless the deployment declares the path a volume shared by every pod."""
    from batch_assets.definitions import build_definitions
    from batch_assets.errors import PipelineError
    from batch_assets.storage import ArrowStorage

    spec = make_spec(EMBED_SPEC, tmp_path)
    monkeypatch.setenv("BATCH_EXECUTOR", "k8s")
    monkeypatch.delenv("BATCH_STORAGE_ROOT_SHARED", raising=False)
    monkeypatch.setenv("BATCH_STORAGE_ROOT", str(tmp_path / "store"))
    with pytest.raises(PipelineError, match=r"is a local folder, but BATCH_EXECUTOR=k8s runs every step in its own "
                                            r"pod.*s3://bucket/prefix in k8s/config.yaml.*BATCH_STORAGE_ROOT_SHARED=1"):
        build_definitions([spec])
    with pytest.raises(PipelineError, match="local folder"):  # a step of a run whose config names a local root
        ArrowStorage(root=str(tmp_path / "other")).resolved_root()
    monkeypatch.setenv("BATCH_STORAGE_ROOT", "s3://bucket/batch")
    assert build_definitions([spec]).resolve_job_def("docs_job").executor_def.name == "batch_k8s"
    monkeypatch.setenv("BATCH_STORAGE_ROOT", str(tmp_path / "store"))
    monkeypatch.setenv("BATCH_STORAGE_ROOT_SHARED", "1")  # a ReadWriteMany volume at the same path in every pod
    assert ArrowStorage().resolved_root() == str(tmp_path / "store")
    monkeypatch.delenv("BATCH_EXECUTOR")  # local runs: any root
    monkeypatch.delenv("BATCH_STORAGE_ROOT_SHARED")
    assert ArrowStorage().resolved_root() == str(tmp_path / "store")
