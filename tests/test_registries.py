"""The names a spec may choose (batch_assets/registries.py, at the bottom of the package) and the tables that load
each plug-in by that name (above the spec's sections, because the plug-ins read them) hold the same names in the same
order: a format the spec accepts always has a reader or writer, and every plug-in can be named in a spec."""

from __future__ import annotations

from typing import Any

import pytest

from batch_assets.sample_data import GENERATORS
from batch_assets.registries import FILE_COLUMNS, SAMPLE_DATASETS, SINK_FORMATS, SOURCE_FORMATS
from batch_assets.spec import SpecError, parse_spec
from batch_assets.stages.sinks import SINKS, sink_for
from batch_assets.stages.sources import SOURCES, files, source_module
from batch_assets.stages.sources.common import FORMAT_OPTIONS


@pytest.mark.parametrize(("names", "table"), [(SOURCE_FORMATS, SOURCES), (SINK_FORMATS, SINKS),
                                              (SAMPLE_DATASETS, GENERATORS), (FILE_COLUMNS, files.SCHEMA.names)],
                         ids=["source formats", "sink formats", "sample datasets", "columns of a files source"])
def test_every_name_the_spec_accepts_has_its_plug_in(names: tuple[str, ...], table: Any) -> None:
    assert tuple(table) == names


def test_each_registered_plug_in_loads_with_its_own_spec_rules() -> None:
    for name in SOURCE_FORMATS:
        reader = source_module(name)
        assert callable(getattr(reader, "batches", None)) or callable(getattr(reader, "partition_batches", None))
        assert callable(reader.spec_problems), f"source format {name!r} states its own spec rules"
        assert reader.OPTIONS <= set(FORMAT_OPTIONS), f"source format {name!r} lists the source fields it reads"
    for name in SINK_FORMATS:
        assert callable(sink_for(name).write) and callable(sink_for(name).spec_problems)


def test_a_name_outside_the_registry_is_refused_with_the_choices() -> None:
    spec = {"name": "p", "source": {"format": "xlsx", "path": "d/*.xlsx", "columns": ["t"]},
            "partitioning": {"kind": "hash", "count": 2}, "task": {"kind": "embed"},
            "prepare": {"text_column": "t"}, "model": {"provider": "sentence_transformers"}}
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    assert "source.format" in str(error.value) and all(repr(n) in str(error.value) for n in SOURCE_FORMATS)


@pytest.mark.parametrize(("source", "problem"), [
    ({"format": "parquet", "path": "d/*.parquet", "columns": ["t"], "encoding": "latin-1"},
     "source.encoding: does not apply to a parquet source"),
    ({"format": "parquet", "path": "d/*.parquet", "columns": ["t"], "block_size": 4096},
     "source.block_size: does not apply to a parquet source"),
    ({"format": "files", "path": "d/*.pdf", "encoding": "latin-1"}, "source.encoding: does not apply to a files source"),
])
def test_a_source_option_the_format_does_not_read_is_refused_not_ignored(source: dict, problem: str) -> None:
    spec = {"name": "p", "source": source, "partitioning": {"kind": "hash", "count": 2}, "task": {"kind": "embed"},
            "prepare": {"text_column": source.get("columns", ["file_path"])[0]},
            "model": {"provider": "sentence_transformers"}}
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    assert problem in str(error.value)


def test_a_source_option_left_at_its_default_or_read_by_the_format_is_accepted() -> None:
    base = {"name": "p", "partitioning": {"kind": "hash", "count": 2}, "task": {"kind": "embed"},
            "prepare": {"text_column": "t"}, "model": {"provider": "sentence_transformers"}}
    parse_spec({**base, "source": {"format": "parquet", "path": "d/*.parquet", "columns": ["t"], "encoding": "utf-8"}})
    parse_spec({**base, "source": {"format": "csv", "path": "d/*.csv", "columns": ["t"], "encoding": "latin-1",
                                   "block_size": 4096}})
