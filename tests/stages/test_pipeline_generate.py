"""The generate pipeline with the real SmolLM2 model: constrained labels, token counts, row ids, one load."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from batch_assets.resources import LOAD_COUNTS
from tests.conftest import GENERATE_SPEC, make_spec, read_output, run_pipeline, write_csv

pytestmark = pytest.mark.slow

COMPANIES = ["Baker & Chen LLP", "Harbor Medical Center", "Nova Software Inc", "Quinn Law Group", "", "Apex Technologies"]


def test_generate_pipeline_several_partitions_one_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for p, names in (("p0", COMPANIES[:3]), ("p1", COMPANIES[3:]), ("p2", [])):
        write_csv(data / f"{p}.csv", ["customer_id", "company"], [[f"{p}-{i}", n] for i, n in enumerate(names)])
    spec = make_spec(GENERATE_SPEC, data)
    before = LOAD_COUNTS["TransformersGenerator"]
    instance = dg.DagsterInstance.ephemeral()

    result = run_pipeline(spec, tmp_path / "store", ["p0", "p1", "p2"], instance=instance)

    assert result.success
    assert LOAD_COUNTS["TransformersGenerator"] == before + 1  # three partitions, one load
    labels = {"Law Firm", "Healthcare", "Technology", "Other"}
    rows = read_output(spec, tmp_path / "store", "p0").to_pylist() + read_output(spec, tmp_path / "store", "p1").to_pylist()
    assert sorted(r["customer_id"] for r in rows) == ["p0-0", "p0-1", "p0-2", "p1-0", "p1-1", "p1-2"]
    assert read_output(spec, tmp_path / "store", "p2").num_rows == 0  # header only: an empty partition, not an error
    for r in rows:
        if r["customer_id"] == "p1-1":  # blank company: flagged, not sent, not dropped
            assert r["error"].startswith("empty input") and r["generated_text"] is None and r["industry"] is None
        else:
            assert r["error"] is None and r["industry"] in labels  # constrained decoding: always a label
            assert r["generated_text"] == r["industry"]
            assert r["prompt_tokens"] > 10 and 1 <= r["completion_tokens"] <= 6
    md = {e.event_specific_data.materialization.partition: e.event_specific_data.materialization.metadata
          for e in result.all_events
          if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == dg.AssetKey(["companies", "inferred"])}
    assert set(md) == {"p0", "p1", "p2"}  # metadata per partition, not one blob for the run
    assert md["p0"]["rows_with_errors"].value == 0 and md["p1"]["rows_with_errors"].value == 1
    assert md["p0"]["tokens_in"].value > 25 and md["p1"]["tokens_in"].value > 15  # p1 sends two rows, not three
    assert md["p0"]["tokens_out"].value >= 3 and md["p1"]["tokens_out"].value >= 2
    assert md["p2"]["tokens_in"].value == 0 and md["p2"]["dagster/row_count"].value == 0
