"""The Parquet source (stages/sources/parquet.py): the declared columns with the file's own types, in batches of at
most `source.batch_rows` rows, locally and on S3; a file that is not Parquet, or is cut short or damaged, fails
naming the problem and the fix instead of yielding some of its rows or a bare Arrow traceback."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_assets.errors import PipelineError
from batch_assets.stages.sources import parquet as parquet_source
from tests.conftest import EMBED_SPEC, make_spec

TABLE = pa.table({"doc_id": [f"d{i}" for i in range(1000)], "text": [f"text {i} 日本語" for i in range(1000)],
                  "score": [i / 4 for i in range(1000)], "unused": [[i] for i in range(1000)]})


def _spec(tmp_path: Path, columns=("doc_id", "text"), **source):
    return make_spec(EMBED_SPEC, tmp_path, source={"format": "parquet", "path": str(tmp_path / "{partition}.parquet"),
                                                  "columns": list(columns), **source})


def _batches(spec, url: str) -> list[pa.RecordBatch]:
    return list(parquet_source.batches(spec, url))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_declared_columns_with_the_file_s_types_in_bounded_batches(where: str, tmp_path: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    local = tmp_path / "a.parquet"
    pq.write_table(TABLE, local, row_group_size=300)
    url = str(local)
    if where == "s3":
        import s3fs

        url = f"{request.getfixturevalue('s3_bucket')}/in/a.parquet"
        s3fs.S3FileSystem().put(str(local), url)
    spec = _spec(tmp_path, columns=("doc_id", "text", "score"), batch_rows=128)
    batches = _batches(spec, url)
    assert max(b.num_rows for b in batches) <= 128
    got = pa.Table.from_batches(batches)
    assert sorted(got.schema.names) == ["doc_id", "score", "text"]  # never the columns it was not asked for
    assert got.select(["doc_id", "text", "score"]).equals(TABLE.select(["doc_id", "text", "score"]))


def test_a_file_with_no_rows_still_gives_its_column_types(tmp_path: Path) -> None:
    url = str(tmp_path / "a.parquet")
    pq.write_table(TABLE.slice(0, 0), url)
    spec = _spec(tmp_path, columns=("doc_id", "text", "score"))
    assert sum(b.num_rows for b in _batches(spec, url)) == 0
    assert parquet_source.empty_schema(spec, url).field("score").type == pa.float64()


def test_a_missing_column_names_it(tmp_path: Path) -> None:
    url = str(tmp_path / "a.parquet")
    pq.write_table(TABLE.select(["doc_id", "score"]), url)
    with pytest.raises(PipelineError) as info:
        _batches(_spec(tmp_path), url)
    assert info.value.column == "text" and "the file has columns: doc_id, score" in str(info.value)


def test_a_file_that_is_not_parquet_says_so(tmp_path: Path) -> None:
    url = tmp_path / "a.parquet"
    url.write_text("doc_id,text\nd1,a csv file named .parquet\n")
    with pytest.raises(PipelineError, match="not a readable Parquet file") as info:
        _batches(_spec(tmp_path), str(url))
    assert "source.format" in info.value.fix


def test_a_file_cut_short_fails_naming_the_problem(tmp_path: Path) -> None:
    """An upload that stopped half-way: the footer is missing, and the read must not yield what it can of it."""
    url = tmp_path / "a.parquet"
    pq.write_table(TABLE, url, row_group_size=300)
    data = url.read_bytes()
    url.write_bytes(data[: len(data) // 2])
    with pytest.raises(PipelineError, match="not a readable Parquet file"):
        _batches(_spec(tmp_path), str(url))


def test_a_damaged_row_group_fails_as_a_pipeline_error_naming_the_file_s_problem(tmp_path: Path) -> None:
    """Bytes damaged inside the file (a bad disk, a broken copy): the footer reads, a later row group does not. The
    error is the product's, saying what is wrong and what to do, not a bare Arrow exception."""
    url = tmp_path / "a.parquet"
    pq.write_table(TABLE, url, row_group_size=300, compression="none")
    meta = pq.ParquetFile(url).metadata
    column = meta.row_group(2).column(1)  # `text` of the third row group
    data = bytearray(url.read_bytes())
    start = column.data_page_offset
    data[start:start + 64] = b"\xff" * 64
    url.write_bytes(bytes(data))
    with pytest.raises(PipelineError) as info:
        _batches(_spec(tmp_path), str(url))
    assert "Parquet" in str(info.value) and info.value.fix
