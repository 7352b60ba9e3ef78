"""A bad spec fails at definition load with a message naming the pipeline and the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from batch_assets.spec import SpecError, load_spec, load_specs, parse_spec
from tests.conftest import EMBED_SPEC, GENERATE_SPEC


def _bad(base: dict, mutate) -> str:
    raw = copy.deepcopy(base)
    mutate(raw)
    with pytest.raises(SpecError) as info:
        parse_spec(raw, origin="test.yaml")
    return str(info.value)


def test_unknown_template_column_names_pipeline_and_field() -> None:
    msg = _bad(GENERATE_SPEC, lambda r: r["prepare"].update(template="Industry of {compnay}?"))
    assert "pipeline 'companies'" in msg
    assert "prepare.template" in msg and "{compnay}" in msg and "customer_id, company" in msg


def test_missing_source_is_named() -> None:
    msg = _bad(EMBED_SPEC, lambda r: r.pop("source"))
    assert "pipeline 'docs'" in msg and "source" in msg and "Field required" in msg


def test_unknown_task_is_named() -> None:
    msg = _bad(EMBED_SPEC, lambda r: r["task"].update(kind="summarize"))
    assert "pipeline 'docs'" in msg and "task.kind" in msg and "summarize" in msg


def test_unknown_provider_lists_known_ones() -> None:
    msg = _bad(EMBED_SPEC, lambda r: r["model"].update(provider="nope"))
    assert "model.provider" in msg and "sentence_transformers" in msg


def test_provider_must_support_the_task() -> None:
    msg = _bad(EMBED_SPEC, lambda r: r["model"].update(provider="transformers"))
    assert "task.kind" in msg and "cannot run task 'embed'" in msg


def test_cross_field_rules() -> None:
    assert "text_column" in _bad(EMBED_SPEC, lambda r: r["prepare"].update(text_column="body"))
    assert "partitioning.count" in _bad(EMBED_SPEC, lambda r: r.update(partitioning={"kind": "hash"}))
    assert "{partition}" in _bad(
        EMBED_SPEC, lambda r: r.update(partitioning={"kind": "dynamic"}) or r["source"].update(path="x/*.jsonl")
    )
    assert "csv cannot hold embedding" in _bad(EMBED_SPEC, lambda r: r.update(sink={"format": "csv"}))
    assert "overwrite source columns" in _bad(EMBED_SPEC, lambda r: r["task"].update(output_column="text"))
    assert "extra_field" in _bad(EMBED_SPEC, lambda r: r.update(extra_field=1))


def test_yaml_file_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: x\nsource: [unclosed\n")
    with pytest.raises(SpecError, match="broken.yaml"):
        load_spec(tmp_path / "broken.yaml")


def test_duplicate_pipeline_names_rejected(tmp_path: Path) -> None:
    import yaml

    for f in ("a.yaml", "b.yaml"):
        (tmp_path / f).write_text(yaml.safe_dump(EMBED_SPEC))
    with pytest.raises(SpecError, match="unique"):
        load_specs(tmp_path)


def test_shipped_pipelines_are_valid() -> None:
    specs = load_specs(Path(__file__).parents[1] / "batch_assets" / "pipelines")
    assert {"customer_industry", "document_embeddings"} <= {s.name for s in specs}


def test_structured_output_is_validated_at_load() -> None:
    msg = _bad(GENERATE_SPEC, lambda r: r["task"].update(structured={"choices": ["a"], "regex": "x"}))
    assert "pipeline 'companies'" in msg and "task.structured" in msg and "exactly one of" in msg
    msg = _bad(GENERATE_SPEC, lambda r: r["task"].update(structured={"pydantic_model": "nope.mod:X"}))
    assert "task.structured" in msg and "nope.mod" in msg
    msg = _bad(EMBED_SPEC, lambda r: r["task"].update(structured={"choices": ["a"]}))
    assert "applies to task 'generate' only" in msg
