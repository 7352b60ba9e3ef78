"""What one partition's materialization says about its own rows, through the real pipeline (MiniLM, zero-shot):
error samples per partition, an empty partition published with its typed columns, error_rate equal to the blocking
check's figure, requests that exclude response-cache hits, predicted-label counts per partition.
(issue 14, findings 5, 10, 12, 13)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from batch_assets.partitions import hash_shard_keys
from tests.conftest import EMBED_SPEC, make_spec, read_output, run_pipeline, write_jsonl

pytestmark = pytest.mark.slow


def materializations(result, spec, stage: str) -> dict[str, dict[str, Any]]:
    return {e.event_specific_data.materialization.partition: e.event_specific_data.materialization.metadata
            for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == dg.AssetKey([spec.name, stage])}


def checks_by_name(result) -> dict[str, Any]:
    return {c.check_name: c for c in result.get_asset_check_evaluations()}


def test_each_partition_of_a_multi_partition_run_shows_its_own_error_samples(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for key in ("a", "b"):
        write_jsonl(data / f"{key}.jsonl", [{"doc_id": f"{key}-ok", "text": "the moon orbits the earth"},
                                            {"doc_id": f"{key}-empty", "text": "  "}])
    spec = make_spec(EMBED_SPEC, data, runtime={"max_error_fraction": 1.0})

    result = run_pipeline(spec, tmp_path / "store", ["a", "b"])

    assert result.success
    inferred = materializations(result, spec, "inferred")
    for key, other in (("a", "b"), ("b", "a")):
        samples = inferred[key]["error_samples"].value
        assert f"{key}-empty" in samples and f"{other}-" not in samples, (key, samples)
    # the run-wide warning check names each sample's partition
    assert "[a] a-empty" in checks_by_name(result)["no_row_errors"].metadata["samples"].value


def test_an_empty_hash_shard_publishes_an_empty_typed_output_and_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "docs.jsonl", [{"doc_id": f"d{i}", "text": f"document number {i}"} for i in range(5)])
    spec = make_spec(EMBED_SPEC, data, source={"path": str(data / "*.jsonl")},
                     partitioning={"kind": "hash", "count": 16, "keys": None},
                     sink={"columns": ["doc_id", "embedding", "error"]})
    keys = hash_shard_keys(16)

    result = run_pipeline(spec, tmp_path / "store", keys)  # one run: the shards share one read

    assert result.success
    outputs = {k: read_output(spec, tmp_path / "store", k) for k in keys}
    assert sum(t.num_rows for t in outputs.values()) == 5  # every row once, over the shards that got rows
    empty = [k for k, t in outputs.items() if t.num_rows == 0]
    assert len(empty) >= 11  # 5 rows over 16 shards
    full = next(t for t in outputs.values() if t.num_rows)
    for k in empty:
        assert outputs[k].schema == full.schema  # the declared columns and types, no rows
        assert outputs[k].schema.field("embedding").type == full.schema.field("embedding").type
        md = materializations(result, spec, "output")[k]
        assert md["dagster/row_count"].value == 0 and md["empty_partition"].value is True
    checks = checks_by_name(result)
    assert all(checks[name].passed for name in ("rows_exactly_once", "error_rate", "output_schema"))

    # one empty shard in a run of its own (the read of one partition, not the shared one)
    alone = run_pipeline(spec, tmp_path / "store", [empty[0]])
    assert alone.success
    assert read_output(spec, tmp_path / "store", empty[0]).schema == full.schema


def test_error_rate_metadata_is_the_blocking_checks_figure(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rows = [{"doc_id": f"d{i}", "text": "" if i < 3 else f"text {i}"} for i in range(10)]
    write_jsonl(data / "a.jsonl", rows)
    spec = make_spec(EMBED_SPEC, data, partitioning={"kind": "static", "keys": ["a"]})

    result = run_pipeline(spec, tmp_path / "store", ["a"])

    assert result.success
    md = materializations(result, spec, "inferred")["a"]
    facts = checks_by_name(result)["error_rate"].metadata["partitions"].value["a"]
    # three empty inputs are row errors (dead letters), none is the model's: the check's fraction is 0
    assert md["rows_with_errors"].value == 3
    assert md["error_rate"].value == facts["error_fraction"] == 0.0
    assert materializations(result, spec, "output")["a"]["error_rate"].value == 0.0


# -- duplicate ids (finding 7) ---------------------------------------------------------------------------------------
def _tickets(data: Path) -> None:
    from tests.conftest import write_csv

    write_csv(data / "2025-01-01.csv", ["ticket_id", "body"],
              [["T1", "printer is on fire"], ["T2", "cannot log in"], ["T1", "printer is on fire, update"],
               ["T3", "refund please"], ["T2", "cannot log in (again)"]])
    write_csv(data / "2025-01-02.csv", ["ticket_id", "body"], [["T4", "thanks"], ["T5", "where is my order"]])


def _ticket_spec(data: Path, **changes):
    return make_spec(EMBED_SPEC, data, source={"format": "csv", "path": str(data / "{partition}.csv"),
                                               "columns": ["ticket_id", "body"]},
                     partitioning={"kind": "static", "keys": ["2025-01-01", "2025-01-02"]},
                     prepare={"id_column": "ticket_id", "text_column": "body", **changes})


@pytest.mark.parametrize("policy, kept", [("keep_first", {"T1": "printer is on fire", "T2": "cannot log in"}),
                                          ("keep_last", {"T1": "printer is on fire, update",
                                                         "T2": "cannot log in (again)"})])
def test_duplicate_ids_policy_keeps_one_row_per_id_and_reports_what_it_dropped(tmp_path: Path, policy: str,
                                                                               kept: dict[str, str]) -> None:
    data = tmp_path / "data"
    _tickets(data)
    spec = _ticket_spec(data, duplicate_ids=policy)

    result = run_pipeline(spec, tmp_path / "store", ["2025-01-01", "2025-01-02"])

    assert result.success
    out = read_output(spec, tmp_path / "store", "2025-01-01").to_pylist()
    assert [r["ticket_id"] for r in out] == (["T1", "T2", "T3"] if policy == "keep_first" else ["T1", "T3", "T2"])
    assert {r["ticket_id"]: r["body"] for r in out if r["ticket_id"] in kept} == kept
    raw = materializations(result, spec, "raw")
    assert raw["2025-01-01"]["duplicate_ids"].value == 2 and raw["2025-01-01"]["duplicate_rows_dropped"].value == 2
    assert "'T1': kept" in raw["2025-01-01"]["duplicate_samples"].value
    assert raw["2025-01-02"]["duplicate_rows_dropped"].value == 0  # plottable on every day, 0 included
    assert checks_by_name(result)["rows_exactly_once"].passed


def test_duplicate_ids_fail_by_default_naming_the_id_column_and_the_policy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _tickets(data)
    spec = _ticket_spec(data)

    result = run_pipeline(spec, tmp_path / "store", ["2025-01-01"], raise_on_error=False)

    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.event_specific_data.error.message
    assert "row id 'T1' appears more than once" in message and "2025-01-01.csv" in message
    assert "make the id column 'ticket_id' unique" in message and "prepare.duplicate_ids" in message


def test_duplicate_ids_policy_applies_to_hash_shards_read_together(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _tickets(data)
    spec = make_spec(EMBED_SPEC, data, source={"format": "csv", "path": str(data / "*.csv"),
                                               "columns": ["ticket_id", "body"]},
                     partitioning={"kind": "hash", "count": 3, "keys": None},
                     prepare={"id_column": "ticket_id", "text_column": "body", "duplicate_ids": "keep_last"})
    keys = hash_shard_keys(3)

    result = run_pipeline(spec, tmp_path / "store", keys)

    assert result.success
    rows = [r for k in keys for r in read_output(spec, tmp_path / "store", k).to_pylist()]
    assert sorted(r["ticket_id"] for r in rows) == ["T1", "T2", "T3", "T4", "T5"]
    assert {r["ticket_id"]: r["body"] for r in rows}["T1"] == "printer is on fire, update"
    assert sum(md["duplicate_rows_dropped"].value for md in materializations(result, spec, "raw").values()) == 2


# -- classify over several columns (finding 8) and predicted-label counts (finding 10) -------------------------------
URGENCY: dict = {
    "name": "ticket_urgency",
    "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["ticket_id", "subject", "body"]},
    "partitioning": {"kind": "static", "keys": ["day1", "day2"]},
    "prepare": {"id_column": "ticket_id", "template": "{subject}\n\n{body}"},
    "task": {"kind": "classify", "output_column": "urgency", "labels": ["urgent", "normal", "legal"]},
    "model": {"provider": "zero_shot", "config": {"label_descriptions": {
        "urgent": "an outage: production is down, the site is broken, nothing works, emergency",
        "normal": "a routine question: how do I change my password, thanks, a small request",
        "legal": "a subpoena, litigation hold or court order from a law firm's attorneys",
    }}},
    "runtime": {"max_error_fraction": 0.5},
}


def test_classify_reads_a_template_of_several_columns_and_reports_label_counts(tmp_path: Path) -> None:
    from tests.conftest import write_csv

    data = tmp_path / "data"
    write_csv(data / "day1.csv", ["ticket_id", "subject", "body"],
              [["T1", "Production DOWN", ""], ["T2", "", "how do I change my password?"],
               ["T3", "", ""], ["T4", "Site broken", "nothing works since the deploy, emergency"]])
    write_csv(data / "day2.csv", ["ticket_id", "subject", "body"],
              [["T5", "Thanks", "just a small request about my password"]])
    spec = make_spec(URGENCY, data)
    instance = dg.DagsterInstance.ephemeral()

    result = run_pipeline(spec, tmp_path / "store", ["day1", "day2"], instance=instance)

    assert result.success
    day1 = {r["ticket_id"]: r for r in read_output(spec, tmp_path / "store", "day1").to_pylist()}
    assert day1["T1"]["urgency"] == "urgent" and day1["T1"]["error"] is None  # subject alone is enough
    assert day1["T2"]["urgency"] is not None and day1["T2"]["error"] is None  # body alone too
    assert day1["T3"]["urgency"] is None and "'subject', 'body' are empty" in day1["T3"]["error"]
    inferred = materializations(result, spec, "inferred")
    for key in ("day1", "day2"):
        out = read_output(spec, tmp_path / "store", key).column("urgency").to_pylist()
        counts = {label: inferred[key][f"label_count/{label}"].value for label in ("urgent", "normal", "legal")}
        assert counts == {label: out.count(label) for label in counts}  # one int per label, 0 included
        never = [label for label, n in counts.items() if n == 0]
        assert inferred[key]["labels_never_predicted"].value == ", ".join(never)
    assert "legal" in inferred["day1"]["labels_never_predicted"].value
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if "never predicted" in e.user_message]
    assert any("'day1'" in w and "legal" in w for w in warnings)


def test_a_quiet_day_with_a_header_only_file_publishes_an_empty_output(tmp_path: Path) -> None:
    from tests.conftest import write_csv

    data = tmp_path / "data"
    write_csv(data / "2025-01-01.csv", ["ticket_id", "body"], [["T1", "printer is on fire"]])
    write_csv(data / "2025-01-02.csv", ["ticket_id", "body"], [])  # a quiet day: the export has its header only
    spec = make_spec(EMBED_SPEC, data, source={"format": "csv", "path": str(data / "{partition}.csv"),
                                               "columns": ["ticket_id", "body"]},
                     partitioning={"kind": "daily", "start_date": "2025-01-01", "end_date": "2025-01-03"},
                     prepare={"id_column": "ticket_id", "text_column": "body"},
                     sink={"columns": ["ticket_id", "embedding", "error"]})

    result = run_pipeline(spec, tmp_path / "store", ["2025-01-02"])

    assert result.success
    quiet = read_output(spec, tmp_path / "store", "2025-01-02")
    assert quiet.num_rows == 0 and quiet.schema.names == ["ticket_id", "embedding", "error"]
    vectors = quiet.schema.field("embedding").type  # MiniLM's declared 384 floats, though no row was embedded
    assert vectors.list_size == 384 and str(vectors.value_type) == "float"
    assert materializations(result, spec, "output")["2025-01-02"]["empty_partition"].value is True
