"""Every asset of every example pipeline reports typed metadata that matches the data it wrote.

Each example spec in batch_assets/pipelines runs end to end with its real provider on a tiny sample (a few rows over
two partitions, in ONE run, so each partition's own metadata is checked), then every partition's materialization
of every stage is compared with the file it describes: row counts, error rate, Dagster's column schema. The specs
run as shipped, blocking checks included (their `max_error_fraction` too): only the source path and sample size
change.
The OpenAI-compatible example runs against the real llama.cpp server on loopback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.catalog import PIPELINES_DIR
from batch_assets.partitions import hash_shard_keys, partitions_def_for
from batch_assets.spec import PipelineSpec, parse_spec
from batch_assets.resources.fields import Role, role
from batch_assets.resources.registry import provider_class
from tests.conftest import run_pipeline

pytestmark = pytest.mark.slow

COMPONENTS_DIR = PIPELINES_DIR.parent / "defs"
# Spec files, and pipelines declared as Dagster Components (defs/<name>/defs.yaml, the same fields as `attributes`)
EXAMPLES = sorted([p.stem for p in PIPELINES_DIR.glob("*.yaml")] + [p.parent.name for p in COMPONENTS_DIR.glob("*/defs.yaml")])
STAGES = ("raw", "prepared", "inferred", "output")
# Enough rows to have something in each of two partitions; one row per partition for the CPU LLMs (SmolLM2 via
# transformers), whose load and grammar compilation already take most of their test's time.
SAMPLE_ROWS = {"quote_classification": 2, "customer_industry": 4, "customer_industry_openai": 4}
DEFAULT_ROWS = 8


def example_spec(name: str, data: Path) -> PipelineSpec:
    path = PIPELINES_DIR / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text()) if path.exists() else \
        yaml.safe_load((COMPONENTS_DIR / name / "defs.yaml").read_text())["attributes"]
    raw["source"]["path"] = raw["source"]["path"].replace("data/samples", str(data))
    raw["source"]["sample_rows"] = SAMPLE_ROWS.get(name, DEFAULT_ROWS)
    return parse_spec(raw)


def two_keys(spec: PipelineSpec, instance: dg.DagsterInstance) -> list[str]:
    part = spec.partitioning
    if part.kind == "hash":
        return hash_shard_keys(part.count or 1)[:2]
    if part.kind == "daily":
        return partitions_def_for(spec).get_partition_keys()[:2]
    if part.kind == "dynamic":
        instance.add_dynamic_partitions(spec.name, ["part-0", "part-1"])
        return ["part-0", "part-1"]
    return (part.keys or [])[:2]


def materializations(result, spec: PipelineSpec, stage: str) -> dict[str, dict[str, Any]]:
    return {e.event_specific_data.materialization.partition: e.event_specific_data.materialization.metadata
            for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == dg.AssetKey([spec.name, stage])}


def _is(md: dict[str, Any], key: str, kind: type) -> Any:
    assert key in md, f"metadata {key!r} missing; have {sorted(md)}"
    assert isinstance(md[key], kind), f"{key} is {type(md[key]).__name__}, want {kind.__name__}"
    return md[key].value


def written_table(spec: PipelineSpec, md: dict[str, Any]):
    path = md["path"].value
    if spec.sink.format == "lancedb" and ".lance#partition=" in path:
        from batch_assets.stages.sinks import lancedb as lance_sink

        database, table, key = lance_sink.parse_partition_url(path)
        return lance_sink.connect(database).open_table(table).to_arrow().filter(
            pc.equal(pc.field(lance_sink.PARTITION_COLUMN), key))
    assert Path(path).exists() and path.endswith(".parquet"), path
    return pq.read_table(path)


def check_common(md: dict[str, Any], table, stage: str) -> None:
    rows = _is(md, "dagster/row_count", dg.IntMetadataValue)
    assert rows == table.num_rows == _is(md, "rows_out", dg.IntMetadataValue)
    rows_in = _is(md, "rows_in", dg.IntMetadataValue)
    if stage == "raw":
        assert rows_in >= rows  # a hash shard keeps its share of the rows it scanned
    else:
        assert rows_in == rows  # nothing is dropped after reading
    schema = _is(md, "dagster/column_schema", dg.TableSchemaMetadataValue)
    assert [(c.name, c.type) for c in schema.columns] == [(f.name, str(f.type)) for f in table.schema]
    assert _is(md, "duration_s", dg.FloatMetadataValue) >= 0
    assert _is(md, "rows_per_s", dg.FloatMetadataValue) >= 0
    _is(md, "path", dg.PathMetadataValue)
    preview = _is(md, "preview", dg.MarkdownMetadataValue)
    assert preview.startswith("| ") or (rows == 0 and preview == "_no rows_")
    if stage != "raw":
        errors = _is(md, "rows_with_errors", dg.IntMetadataValue)
        flagged_col = "_input_empty" if stage == "prepared" else "error"
        if flagged_col in table.column_names:
            column = table.column(flagged_col).to_pylist()
            expected = sum(bool(v) for v in column) if stage == "prepared" else sum(v is not None for v in column)
            assert errors == expected
        rate = _is(md, "error_rate", dg.FloatMetadataValue)
        if stage == "prepared":
            assert rate == pytest.approx(errors / rows if rows else 0.0, abs=1e-6)
        elif stage == "inferred":  # the blocking check's figure: rows the model failed on (empty inputs excluded)
            model_errors = sum(e is not None and not empty for e, empty in
                               zip(table.column("error").to_pylist(), table.column("_input_empty").to_pylist()))
            assert rate == pytest.approx(model_errors / rows if rows else 0.0, abs=1e-6)


def check_infer(spec: PipelineSpec, md: dict[str, Any], table) -> None:
    for key in ("model", "provider", "provider_class", "device"):
        assert _is(md, key, dg.TextMetadataValue)
    assert md["provider"].value == spec.model.provider
    if "batch_size" in spec.model.config:
        assert _is(md, "batch_size", dg.IntMetadataValue) == spec.model.config["batch_size"]
    # the settings that can change an answer, as the provider declares its fields (resources/fields.py): the spec's
    # own (away from the defaults), never an operational knob or a secret
    settings = _is(md, "model_settings", dg.JsonMetadataValue)
    cls = provider_class(spec.model.provider)
    assert {k for k in settings if role(cls, k) is not Role.SEMANTIC} == set()
    assert {k for k, v in spec.model.config.items() if role(cls, k) is Role.SEMANTIC
            and v != cls.model_fields[k].get_default(call_default_factory=True)} <= set(settings)
    cost = _is(md, "cost_usd", dg.FloatMetadataValue)
    if spec.task.kind == "generate":
        tokens_in = _is(md, "tokens_in", dg.IntMetadataValue)
        tokens_out = _is(md, "tokens_out", dg.IntMetadataValue)
        assert tokens_in == sum(t or 0 for t in table.column("prompt_tokens").to_pylist()) and tokens_in > 0
        assert tokens_out == sum(t or 0 for t in table.column("completion_tokens").to_pylist()) and tokens_out > 0
        sent = sum(not e for e in table.column("_input_empty").to_pylist())
        assert _is(md, "requests", dg.IntMetadataValue) == sent
        assert cost == pytest.approx(spec.model.pricing.cost(tokens_in, tokens_out))
    else:
        assert cost == 0.0
    if spec.evaluation is not None:
        truth = table.column(spec.evaluation.label_column).to_pylist()
        predicted = table.column(spec.prediction_column()).to_pylist()
        correct = sum(t is not None and p is not None and t.lower() == p.lower() for t, p in zip(truth, predicted))
        assert _is(md, "eval_labelled_rows", dg.IntMetadataValue) == table.num_rows
        assert _is(md, "eval_correct_rows", dg.IntMetadataValue) == correct
        assert _is(md, "eval_accuracy", dg.FloatMetadataValue) == pytest.approx(correct / table.num_rows, abs=1e-4)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_asset_reports_typed_metadata_matching_its_data(name: str, tmp_path: Path, request, monkeypatch) -> None:
    spec = example_spec(name, tmp_path / "samples")
    if spec.model.provider == "openai":
        server = request.getfixturevalue("llama_server")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    instance = dg.DagsterInstance.ephemeral()
    keys = two_keys(spec, instance)

    result = run_pipeline(spec, tmp_path / "store", keys, instance=instance)

    assert result.success
    for stage in STAGES:
        by_partition = materializations(result, spec, stage)
        assert sorted(by_partition) == sorted(keys), f"{stage}: one materialization per partition"
        assert by_partition[keys[0]]["path"].value != by_partition[keys[1]]["path"].value
        for key, md in by_partition.items():
            assert "partitions" not in md  # no run-wide blob on a partition's event
            table = written_table(spec, md)
            check_common(md, table, stage)
            if stage == "inferred":
                check_infer(spec, md, table)
            if stage == "output":  # the same error rate as the partition's inferred rows (and the check)
                inferred_md = materializations(result, spec, "inferred")[key]
                assert md["error_rate"].value == inferred_md["error_rate"].value
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert {"no_row_errors", "rows_exactly_once"} <= set(checks)
    if spec.evaluation is not None:
        evaluation = checks["evaluation"]
        assert evaluation.metadata["labelled_rows"].value == sum(
            materializations(result, spec, "inferred")[k]["eval_labelled_rows"].value for k in keys)
        assert evaluation.metadata["confusion"].value.startswith("| true \\ predicted |")
