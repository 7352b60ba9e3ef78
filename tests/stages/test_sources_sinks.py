"""Sources and sinks plug in the same way as providers: one module per format, one registry line. Every registered
format reads (sources) or publishes (sinks) the same rows, the spec accepts exactly the registered names, and what a
provider needs from orchestration is declared on its class (a new hosted API gets its endpoint pool without any
table of provider names)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from batch_assets.orchestration.execution.pool_slots import infer_pool
from batch_assets.spec import SpecError
from batch_assets.stages.sinks import SINKS, sink_for
from batch_assets.stages.sources import SOURCES, source_module
from batch_assets.resources.base import ModelResource
from batch_assets.resources.registry import PROVIDERS
from tests.conftest import EMBED_SPEC, GENERATE_SPEC, make_spec

ROWS = [{"doc_id": "d1", "text": "first"}, {"doc_id": "d2", "text": "second, with a comma"}]


def _write_source(fmt: str, path: Path) -> None:
    if fmt == "csv":
        path.write_text("doc_id,text\n" + "".join(f'{r["doc_id"]},"{r["text"]}"\n' for r in ROWS))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        raise AssertionError(f"source format {fmt!r} is registered: give it a sample file here")


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_every_registered_source_reads_the_declared_columns(fmt: str, tmp_path: Path) -> None:
    if fmt == "files":  # the rows are the files themselves: one per file, its declared columns (files.py)
        url = tmp_path / "a.txt"
        url.write_text("hello")
        spec = make_spec(EMBED_SPEC, tmp_path, source={"format": "files", "path": str(tmp_path / "{partition}.txt"),
                                                      "columns": ["file_path", "file_size"]},
                         prepare={"id_column": None, "text_column": "file_path"})
        reader = source_module(fmt)
        assert [row for batch in reader.batches(spec, str(url)) for row in batch.to_pylist()] == [
            {"file_path": str(url), "file_size": 5}]
        assert reader.empty_schema(spec, str(url)).names == ["file_path", "file_size"]
        return
    spec = make_spec(EMBED_SPEC, tmp_path, source={**EMBED_SPEC["source"], "format": fmt,
                                                  "path": str(tmp_path / f"{{partition}}.{fmt}")})
    url = str(tmp_path / f"a.{fmt}")
    _write_source(fmt, Path(url))
    reader = source_module(fmt)
    rows = [row for batch in reader.batches(spec, url) for row in batch.to_pylist()]
    assert rows == ROWS
    empty = reader.empty_schema(spec, url)
    assert empty is None or empty.names == ["doc_id", "text"]


@pytest.mark.parametrize("fmt", sorted(SINKS))
def test_every_registered_sink_publishes_the_rows(fmt: str, tmp_path: Path) -> None:
    spec = make_spec(GENERATE_SPEC, tmp_path, sink={"format": fmt, "path": str(tmp_path / "out")})
    sink = sink_for(fmt)
    assert sink.spec_problems(spec) == []
    url = sink.partition_url(str(tmp_path / "out"), spec, "p0")
    table = pa.Table.from_pylist([{"customer_id": "c1", "company": "Acme, Inc.", "industry": "Other", "row_id": "c1"},
                                  {"customer_id": "c2", "company": "Beta", "industry": None, "row_id": "c2"}])
    assert sink.write(spec, url, iter(table.to_batches()), table.schema) == 2
    assert set(table.schema.names) <= set(sink.written_schema(url, table.schema).names)
    if fmt == "lancedb":
        from batch_assets.stages.sinks.lancedb import partition_rows

        assert partition_rows(url) == 2
    else:
        assert Path(url).name == f"p0.{fmt}"
        assert _read_back(fmt, Path(url)) == [["c1", "Acme, Inc.", "Other"], ["c2", "Beta", None]]


def _read_back(fmt: str, path: Path) -> list[list]:
    if fmt == "parquet":
        rows = pq.read_table(path).to_pylist()
    elif fmt == "jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    elif fmt == "csv":
        rows = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=True)).to_pylist()
    else:
        raise AssertionError(f"sink format {fmt!r} is registered: read its file back here")
    return [[r["customer_id"], r["company"], r["industry"]] for r in rows]


def test_the_spec_takes_exactly_the_registered_formats(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="sink.format") as sink_error:
        make_spec(EMBED_SPEC, tmp_path, sink={"format": "xlsx"})
    assert all(repr(name) in str(sink_error.value) for name in SINKS)
    with pytest.raises(SpecError, match="source.format") as source_error:
        make_spec(EMBED_SPEC, tmp_path, source={**EMBED_SPEC["source"], "format": "xlsx"})
    assert all(repr(name) in str(source_error.value) for name in SOURCES)
    # a sink's own limits are checked at load, from the sink's module
    with pytest.raises(SpecError, match="csv cannot hold embedding vectors"):
        make_spec(EMBED_SPEC, tmp_path, sink={"format": "csv"})


class HostedApi(ModelResource):
    """A provider calling a hosted HTTP API, declared as such on its class and nowhere else."""

    default_endpoint = "api.example.com"
    model: str = "m"
    base_url: str | None = None

    def generate(self, conversations, params):  # the capability the spec checks (resources/protocols.py)
        raise NotImplementedError


def test_a_provider_declares_its_endpoint_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROVIDERS, "hosted_api", f"{__name__}:HostedApi")
    spec = make_spec(GENERATE_SPEC, tmp_path, model={"provider": "hosted_api", "config": {}})
    assert infer_pool(spec) == "endpoint:api.example.com"
    spec = make_spec(GENERATE_SPEC, tmp_path, model={"provider": "hosted_api",
                                                    "config": {"base_url": "http://10.0.0.5:9000/v1"}})
    assert infer_pool(spec) == "endpoint:10.0.0.5:9000"


class StrictApi(HostedApi):
    unparseable_hint = "turn on strict mode in the endpoint's settings"


def test_a_provider_declares_what_to_check_when_answers_do_not_parse(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix of the error that stops a run of unparseable structured answers names the provider's own hint."""
    from batch_assets.stages.infer_guards import unparseable_fix

    monkeypatch.setitem(PROVIDERS, "strict_api", f"{__name__}:StrictApi")
    fix = unparseable_fix(make_spec(GENERATE_SPEC, tmp_path, model={"provider": "strict_api", "config": {}}),
                          None, "not JSON")
    assert "turn on strict mode in the endpoint's settings" in fix
    openai = make_spec(GENERATE_SPEC, tmp_path, model={"provider": "openai", "config": {"model": "m"}})
    assert "constraint_backend" in unparseable_fix(openai, None, "not JSON")
    assert "docs/structured-outputs.md" in unparseable_fix(make_spec(GENERATE_SPEC, tmp_path), None, "not JSON")
