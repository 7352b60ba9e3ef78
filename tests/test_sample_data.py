"""Demo data (`source.sample`) is written only where no data is: a pipeline copied from an example and pointed at
the user's own files reads exactly those files, and none of them is ever replaced."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_assets
from batch_assets.partitions import hash_shard_keys
from batch_assets.spec import PipelineSpec, parse_spec
from batch_assets.storage import ArrowStorage
from tests.conftest import docs_rows, write_csv, write_jsonl

# What `dg scaffold defs batch_assets.components.BatchInferencePipeline` writes, with `path` pointed elsewhere
# and `sample: documents` left in (the edit a user makes first).
SCAFFOLD = {
    "name": "my_docs",
    "source": {"format": "jsonl", "path": "PLACEHOLDER", "columns": ["doc_id", "text"], "sample": "documents",
               "sample_rows": 40},
    "partitioning": {"kind": "hash", "count": 2},
    "prepare": {"id_column": "doc_id", "text_column": "text"},
    "task": {"kind": "embed"},
    "model": {"provider": "sentence_transformers"},
}


def _spec(path: str, changes: dict | None = None, **source) -> PipelineSpec:
    return parse_spec({**SCAFFOLD, "source": {**SCAFFOLD["source"], "path": path, **source}, **(changes or {})})


def _read(spec: PipelineSpec, root: Path, keys: list[str]) -> tuple[dg.ExecuteInProcessResult, list[str]]:
    """Materialize the raw asset for `keys` (one run each, as the UI launches them); the row ids it read."""
    raw = build_pipeline_assets(spec)[0]
    storage = ArrowStorage(root=str(root))
    ids: list[str] = []
    result = None
    for key in keys:
        result = dg.materialize([raw], partition_key=key, resources={STORAGE_KEY: storage}, raise_on_error=False)
        if result.success:
            ids += pq.read_table(storage.stage_url(spec.name, "raw", key), columns=["doc_id"]).column(0).to_pylist()
    assert result is not None
    return result, sorted(ids)


def test_a_folder_of_the_users_files_is_read_as_it_is(tmp_path: Path) -> None:
    mine = tmp_path / "my_docs"
    write_jsonl(mine / "week1.jsonl", docs_rows("w1-", 3))
    write_jsonl(mine / "week2.jsonl", docs_rows("w2-", 2))

    result, ids = _read(_spec(f"{mine}/*.jsonl"), tmp_path / "store", hash_shard_keys(2))

    assert result.success
    assert ids == sorted(f"w1-{i}" for i in range(3)) + sorted(f"w2-{i}" for i in range(2))  # no generated rows
    assert sorted(p.name for p in mine.iterdir()) == ["week1.jsonl", "week2.jsonl"]


def test_a_file_of_the_users_is_never_replaced(tmp_path: Path) -> None:
    # The user's file for partition `a` lacks a declared column: the read says so, and the file stays theirs.
    theirs = write_csv(tmp_path / "customers" / "a.csv", ["customer_id", "company"], [["c1", "Acme"]])
    before = theirs.read_bytes()
    spec = _spec(f"{tmp_path}/customers/{{partition}}.csv", format="csv", sample="customers",
                 columns=["customer_id", "company", "city"],
                 changes={"partitioning": {"kind": "static", "keys": ["a", "b"]},
                          "prepare": {"id_column": "customer_id", "text_column": "company"}})

    result, _ = _read(spec, tmp_path / "store", ["a"])

    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "city" in str(failure.event_specific_data.error)  # the missing column is named
    assert theirs.read_bytes() == before
    assert sorted(p.name for p in theirs.parent.iterdir()) == ["a.csv"]  # and no sample file for `b` beside it


def test_where_nothing_is_the_sample_is_generated_once(tmp_path: Path) -> None:
    spec = _spec(f"{tmp_path}/samples/*.jsonl", columns=["doc_id", "topic", "title", "text"])

    result, ids = _read(spec, tmp_path / "store", hash_shard_keys(2))

    assert result.success
    assert len(ids) == 40 and len(set(ids)) == 40  # sample_rows, each once, over the generated files
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [f"part-{i}.jsonl" for i in range(4)]
