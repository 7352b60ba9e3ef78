"""The messages docs/troubleshooting.md promises, triggered the way a user triggers them: one stage launched alone,
and a LanceDB table whose columns changed under it. Each message says what, where and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from tests.conftest import EMBED_SPEC, docs_rows, make_spec, pipeline_definitions, run_pipeline, write_jsonl
from tests.stages.sinks.test_lancedb import LANCE_SINK

ROOT = Path(__file__).resolve().parents[1]


def _step_failure(result) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "a step must fail"
    error = failures[0].event_specific_data.error
    return error.cause.message if error.cause else error.message


def test_one_stage_launched_alone_says_which_upstream_to_materialize(tmp_path: Path) -> None:
    """The output asset's Materialize button on a partition whose stages never ran."""
    write_jsonl(tmp_path / "data" / "a.jsonl", docs_rows("a", 3))
    spec = make_spec(EMBED_SPEC, tmp_path / "data")
    job = pipeline_definitions(spec, tmp_path / "store").resolve_job_def("docs_job")
    result = job.execute_in_process(partition_key="a", asset_selection=[dg.AssetKey(["docs", "inferred"])],
                                    instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    message = _step_failure(result)
    assert "upstream asset docs/prepared has no data for this partition" in message
    assert "partition 'a'" in message and "What to do: materialize docs/prepared for partition 'a' first" in message
    # the page quotes the message's shape: the same words, for the example pipeline `p`
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    assert re.search(r"upstream asset p/prepared has no data for this partition \.\.\. materialize p/prepared for "
                     r"partition 'x' first", page)


def test_lancedb_table_with_other_columns_is_refused_with_the_fix(tmp_path: Path) -> None:
    """A pipeline's sink columns changed after its LanceDB table was created: the write stage refuses (nothing is
    written to the old table) and names both column lists and the two ways out."""
    write_jsonl(tmp_path / "data" / "a.jsonl", docs_rows("a", 4))
    db = tmp_path / "vectors"
    first = make_spec(EMBED_SPEC, tmp_path / "data", sink={**LANCE_SINK, "path": str(db)})
    assert run_pipeline(first, tmp_path / "store", ["a"]).success
    from batch_assets.stages.sinks import lancedb as lance_sink

    version = lance_sink.connect(str(db)).open_table("docs_vectors").version
    changed = make_spec(EMBED_SPEC, tmp_path / "data",
                        sink={**LANCE_SINK, "path": str(db), "columns": ["doc_id", "embedding", "error"]})
    result = run_pipeline(changed, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    message = _step_failure(result)
    assert "lancedb table 'docs_vectors'" in message and "has columns" in message
    table_has, pipeline_writes = message.split("but this pipeline writes")
    assert "'text'" in table_has and "'text'" not in pipeline_writes  # the column the pipeline no longer writes
    assert "write to a new table (sink.table) or drop the old one" in message
    assert lance_sink.connect(str(db)).open_table("docs_vectors").version == version
