"""Each sink format owns its options, as each source format does: a `sink` field that only some formats read
(stages/sinks/base.py SINK_OPTIONS) set on a format that does not read it is refused when the spec loads, with a
message naming the field and the format, instead of being ignored without a word."""

from __future__ import annotations

import pytest

from batch_assets.registries import SINK_FORMATS
from batch_assets.spec import SpecError, parse_spec
from batch_assets.stages.sinks import sink_for
from batch_assets.stages.sinks.base import SINK_OPTIONS


def _spec(sink: dict, task: str = "embed") -> dict:
    prepare = {"text_column": "t", "id_column": "doc_id"}
    return {"name": "p", "source": {"format": "parquet", "path": "d/*.parquet", "columns": ["doc_id", "t"]},
            "partitioning": {"kind": "hash", "count": 2}, "task": {"kind": task}, "prepare": prepare,
            "model": {"provider": "sentence_transformers"}, "sink": sink}


@pytest.mark.parametrize("file_format", ["parquet", "jsonl", "csv"])
def test_a_table_on_a_file_sink_is_refused_naming_the_field_and_the_format(file_format: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(_spec({"format": file_format, "table": "docs_vectors"}), "pipelines/p.yaml")
    message = str(error.value)
    assert f"sink.table: does not apply to a {file_format} sink" in message
    assert "remove it" in message and "pipelines/p.yaml" in message


def test_the_lancedb_sink_reads_its_table_and_a_file_sink_left_at_the_default_is_accepted() -> None:
    spec = parse_spec(_spec({"format": "lancedb", "table": "docs_vectors"}))
    assert sink_for("lancedb").partition_url("s3://b/db", spec, "a").startswith("s3://b/db/docs_vectors.lance#")
    for file_format in ("parquet", "jsonl"):
        assert parse_spec(_spec({"format": file_format, "table": None})).sink.table is None


def test_every_sink_option_is_read_by_some_format_and_each_format_lists_what_it_reads() -> None:
    """An option no format reads would be refused everywhere; a format's `options` outside SINK_OPTIONS would never
    be checked."""
    read = {name: sink_for(name).options for name in SINK_FORMATS}
    assert all(options <= set(SINK_OPTIONS) for options in read.values()), read
    assert set(SINK_OPTIONS) == set().union(*read.values()), read
