"""A spec's typed sections (batch_assets/spec_sections.py) check themselves, each with a message that names the
field and what to write instead: a misspelt field is refused, not ignored; Kubernetes quantities are read with the
Kubernetes client's own parser; a size rule has exactly one threshold; two GPU counts that disagree are refused.
What the sections compute for the stages: a files source's default columns, the GPU count an infer step asks for,
costs at online and batch prices, the output and prediction columns, the template's fields, the model's inputs
without the evaluation label."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from batch_assets.registries import FILE_COLUMNS
from batch_assets.spec_sections import (InferResources, PipelineSections, PrepareSpec, PricingSpec, RuntimeSpec,
                                        SizeRule, SourceSpec, TaskSpec, parse_quantity)


def _error(model: type, data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return str(info.value)


def test_a_misspelt_field_is_refused_by_name_not_ignored() -> None:
    message = _error(SourceSpec, {"format": "jsonl", "path": "x", "columns": ["a"], "batchrows": 10})
    assert "batchrows" in message and "Extra inputs are not permitted" in message
    assert "max_retires" in _error(RuntimeSpec, {"max_retires": 3})


def test_a_files_source_reads_its_four_columns_unless_told_fewer() -> None:
    assert SourceSpec(format="files", path="docs/*.pdf").columns == list(FILE_COLUMNS)
    assert SourceSpec(format="files", path="docs/*.pdf", columns=["file_path"]).columns == ["file_path"]
    assert "columns" in _error(SourceSpec, {"format": "jsonl", "path": "x.jsonl"}), "other formats must list them"
    assert "format" in _error(SourceSpec, {"format": "xlsx", "path": "x", "columns": ["a"]})


@pytest.mark.parametrize(("text", "value"), [("500m", Decimal("0.5")), ("16Gi", Decimal(16 * 2**30)),
                                              ("2", Decimal(2)), ("2G", Decimal(2 * 10**9))])
def test_kubernetes_quantities_are_read_as_kubernetes_reads_them(text: str, value: Decimal) -> None:
    assert parse_quantity(text, "memory") == value


def test_a_bad_quantity_names_the_field_the_value_and_examples() -> None:
    message = _error(InferResources, {"memory": "16 GB"})
    assert "memory '16 GB' is not a Kubernetes quantity (examples: '4', '500m', '16Gi', '2G')" in message
    assert "cpu 'four'" in _error(InferResources, {"cpu": "four"})
    assert "min_bytes 'lots'" in _error(SizeRule, {"min_bytes": "lots", "gpus": 1})


def test_a_size_rule_needs_exactly_one_threshold() -> None:
    assert "exactly one of min_rows or min_bytes" in _error(SizeRule, {"gpus": 2})
    assert "exactly one of min_rows or min_bytes" in _error(SizeRule, {"min_rows": 1, "min_bytes": "1Gi"})
    assert SizeRule(min_bytes="2Gi", gpus=2).min_bytes == "2Gi"


def test_two_gpu_counts_that_disagree_are_refused_and_one_fills_the_other() -> None:
    message = _error(RuntimeSpec, {"gpus": 1, "resources": {"default": {"gpus": 2}}})
    assert "runtime.gpus (1) and runtime.resources.default.gpus (2) disagree: set one" in message
    runtime = RuntimeSpec(gpus=1, resources={"default": {"memory": "8Gi"}})
    assert runtime.default_resources().gpus == 1 and runtime.default_resources().memory == "8Gi"
    assert RuntimeSpec(gpus=2, resources={"default": {"gpus": 2}}).default_resources().gpus == 2


def test_the_most_gpus_any_partition_asks_for_counts_every_override() -> None:
    assert RuntimeSpec().max_gpus() == 0, "a CPU pipeline"
    runtime = RuntimeSpec(gpus=1, resources={"partitions": {"2026-*": {"gpus": 2}},
                                             "by_size": [{"min_rows": 10**6, "gpus": 4}]})
    assert runtime.max_gpus() == 4
    assert RuntimeSpec(resources={"partitions": {"big": {"gpus": 8}}}).max_gpus() == 8


def test_costs_at_online_prices_and_at_half_price_through_a_batch_api_unless_priced() -> None:
    pricing = PricingSpec(input_per_million_tokens=2.0, output_per_million_tokens=8.0)
    assert pricing.cost(1_000_000, 500_000) == pytest.approx(6.0)
    assert pricing.batch_cost(1_000_000, 500_000) == pytest.approx(3.0)
    own = PricingSpec(input_per_million_tokens=2.0, output_per_million_tokens=8.0,
                      batch_input_per_million_tokens=0.5, batch_output_per_million_tokens=0.0)
    assert own.batch_cost(1_000_000, 500_000) == pytest.approx(0.5), "an explicit 0 is a price, not 'unset'"
    assert PricingSpec().cost(10**9, 10**9) == 0.0
    assert "input_per_million_tokens" in _error(PricingSpec, {"input_per_million_tokens": -1})


def test_each_task_writes_its_default_output_column_unless_named() -> None:
    assert TaskSpec(kind="embed").resolved_output_column() == "embedding"
    assert TaskSpec(kind="generate").resolved_output_column() == "generated_text"
    assert TaskSpec(kind="classify").resolved_output_column() == "label"
    assert TaskSpec(kind="transcribe").resolved_output_column() == "text"
    assert TaskSpec(kind="embed", output_column="vec").resolved_output_column() == "vec"
    assert "summarize" in _error(TaskSpec, {"kind": "summarize"})


def test_a_templates_fields_and_the_columns_prepare_makes() -> None:
    prepare = PrepareSpec(template="{subject}\n\n{body} ({subject})", join={"text": {"columns": ["a", "b"]}},
                          function_columns=["price_eur"], documents={"contract": {"column": "file_path"}})
    assert prepare.template_fields() == ["subject", "body", "subject"]
    assert PrepareSpec().template_fields() == []
    assert prepare.derived_columns() == ["contract", "text", "price_eur"]


def _sections(**changes: Any) -> PipelineSections:
    raw: dict[str, Any] = {
        "name": "tickets",
        "source": {"format": "jsonl", "path": "t/{partition}.jsonl", "columns": ["id", "subject", "body", "truth"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom"},
        "evaluation": {"label_column": "truth"},
    }
    raw.update(changes)
    return PipelineSections.model_validate(raw)


def test_the_model_never_gets_the_evaluation_label_as_input() -> None:
    assert _sections().model_input_columns() == ["id", "subject", "body"]
    chosen = _sections(prepare={"input_columns": ["body", "truth"]})
    assert chosen.model_input_columns() == ["body"], "not even when input_columns names it"
    assert _sections(evaluation=None).model_input_columns() == ["id", "subject", "body", "truth"]


def test_the_evaluation_scores_the_tasks_answer_column_unless_told_another() -> None:
    assert _sections().prediction_column() == "prediction"
    assert _sections(evaluation={"label_column": "truth", "prediction_column": "p"}).prediction_column() == "p"
    assert _sections(task={"kind": "embed"}).prediction_column() is None, "an embedding is not a label"
    generate = _sections(task={"kind": "generate", "labels": ["x", "y"], "label_column": "industry"})
    assert generate.prediction_column() == "industry"
    structured = _sections(task={"kind": "generate", "structured": {"choices": ["x", "y"]},
                                 "structured_column": "answer"})
    assert structured.prediction_column() == "answer"
