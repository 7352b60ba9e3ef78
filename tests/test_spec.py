"""A bad spec fails at definition load with a message naming the pipeline and the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from batch_assets.catalog import built_in, folder_specs
from batch_assets.spec import SpecError, load_spec, parse_spec, provider_config_problems
from batch_assets.resources.base import ModelResource
from batch_assets.resources.registry import PROVIDERS, provider_class
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
    """The first file keeps its name; the second is reported broken, naming the first."""
    import yaml

    for f in ("a.yaml", "b.yaml"):
        (tmp_path / f).write_text(yaml.safe_dump(EMBED_SPEC))
    specs, broken = folder_specs([tmp_path])
    assert [s.name for s in specs] == [EMBED_SPEC["name"]]
    assert [b.origin for b in broken] == [str(tmp_path / "b.yaml")]
    assert "must be unique" in broken[0].error and str(tmp_path / "a.yaml") in broken[0].error


def test_shipped_pipelines_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped pipeline, spec file or Component, is in the catalog, and none is broken."""
    monkeypatch.delenv("BATCH_PIPELINES_DIR", raising=False)
    catalog = built_in()
    assert not catalog.broken
    assert {"customer_industry", "document_embeddings", "document_search"} <= set(catalog.names())


def test_structured_output_is_validated_at_load() -> None:
    msg = _bad(GENERATE_SPEC, lambda r: r["task"].update(structured={"choices": ["a"], "regex": "x"}))
    assert "pipeline 'companies'" in msg and "task.structured" in msg and "exactly one of" in msg
    msg = _bad(GENERATE_SPEC, lambda r: r["task"].update(structured={"pydantic_model": "nope.mod:X"}))
    assert "task.structured" in msg and "nope.mod" in msg
    msg = _bad(EMBED_SPEC, lambda r: r["task"].update(structured={"choices": ["a"]}))
    assert "applies to task 'generate' only" in msg


def test_misspelled_provider_setting_names_the_closest_one() -> None:
    msg = _bad(EMBED_SPEC, lambda r: r["model"]["config"].update(batch_sise=64))
    assert "pipeline 'docs'" in msg and "test.yaml" in msg
    assert "model.config.batch_sise" in msg and "did you mean 'batch_size'?" in msg


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_every_provider_refuses_unknown_settings(provider: str) -> None:
    """Every provider's settings are its resource's fields: a key it does not declare is named, never ignored."""
    name = max(provider_class(provider).model_fields, key=len)
    typo = name[:-1] + ("x" if name[-1] != "x" else "y")  # one valid name, misspelled
    problems = dict(provider_config_problems(provider, {name: None, typo: 1, "zzz_nothing_like": 2}))
    assert set(problems) == {f"model.config.{typo}", "model.config.zzz_nothing_like"}
    assert f"did you mean {name!r}?" in problems[f"model.config.{typo}"]
    assert "did you mean" not in problems["model.config.zzz_nothing_like"]


def test_a_registered_provider_declares_its_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider a project adds to the registry (one line in resources/registry.py) is checked by its own fields."""
    monkeypatch.setitem(PROVIDERS, "my_embedder", "tests.test_spec:_MyEmbedder")
    ok = copy.deepcopy(EMBED_SPEC)
    ok["model"] = {"provider": "my_embedder", "config": {"dimensions": 8}}
    parse_spec(ok)
    msg = _bad(ok, lambda r: r["model"]["config"].update(dimension=8))
    assert "model.config.dimension" in msg and "did you mean 'dimensions'?" in msg


def test_source_types_are_checked_at_load() -> None:
    msg = _bad(EMBED_SPEC, lambda r: r["source"].update(types={"text": "flaot64"}))
    assert "source.types.text" in msg and "unknown Arrow type 'flaot64'" in msg
    msg = _bad(EMBED_SPEC, lambda r: r["source"].update(types={"price": "float64"}))
    assert "source.types.price" in msg and "not in source.columns" in msg


class _MyEmbedder(ModelResource):
    dimensions: int = 4

    def embed(self, texts):  # the capability the spec check looks for
        return [[0.0] * self.dimensions for _ in texts]
