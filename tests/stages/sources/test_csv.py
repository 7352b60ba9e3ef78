"""The CSV source (stages/sources/csv.py): every data row exactly once, in order, its declared columns as text as
written, whatever the file holds (quoted line breaks across blocks, rows longer than a block, a byte-order mark,
CRLF), locally and on S3; what cannot be read fails naming the file's problem, the row and the fix."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from batch_assets.errors import PipelineError
from batch_assets.stages.sources import csv as csv_source
from tests.conftest import EMBED_SPEC, make_spec


def _spec(tmp_path: Path, **source):
    return make_spec(EMBED_SPEC, tmp_path, source={"format": "csv", "path": str(tmp_path / "{partition}.csv"),
                                                  "columns": ["doc_id", "text"], **source})


def _csv(rows: list[list[str]], header: tuple[str, ...] = ("doc_id", "text", "other")) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)  # as Python, Excel and most exporters write CSV: line breaks inside quotes
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def _put(where: str, tmp_path: Path, data: bytes, request: pytest.FixtureRequest) -> str:
    if where == "s3":
        import s3fs

        url = f"{request.getfixturevalue('s3_bucket')}/in/a.csv"
        s3fs.S3FileSystem().pipe(url, data)
        return url
    (tmp_path / "a.csv").write_bytes(data)
    return str(tmp_path / "a.csv")


def _rows(spec, url: str) -> list[dict]:
    return [r for batch in csv_source.batches(spec, url) for r in batch.to_pylist()]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_quoted_line_breaks_are_read_whatever_block_they_fall_in(where: str, tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    """Product descriptions with line breaks, in a file of many blocks: a break inside quotes is part of the value
    (a block boundary inside it once failed the read: "CSV parser got out of sync with chunker"), and a line inside
    a value that looks like a row is not one."""
    rows = [[f"d{i}", f"first line of {i}\nd9{i},looks like a row, \"quoted\"\r\n" if i % 2 == 0 else f"plain {i}",
             "x"] for i in range(400)]
    url = _put(where, tmp_path, _csv(rows), request)
    assert _rows(_spec(tmp_path, block_size=1024), url) == [{"doc_id": r[0], "text": r[1]} for r in rows]


def test_a_row_longer_than_a_block_is_read_and_no_row_is_lost_or_repeated(tmp_path: Path) -> None:
    rows = [[f"d{i}", ("long " * 3000) if i == 150 else f"text {i}", "x"] for i in range(300)]
    url = _put("local", tmp_path, _csv(rows), None)
    got = _rows(_spec(tmp_path, block_size=1024), url)
    assert [r["doc_id"] for r in got] == [r[0] for r in rows]
    assert got[150]["text"] == "long " * 3000


def test_columns_are_text_as_written_with_a_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    data = "\ufeffdoc_id,text\r\n007,1e3\r\n08,\"café, 日本語 🙂\"\r\n09,\r\n10,  padded  ".encode("utf-8")
    url = _put("local", tmp_path, data, None)
    assert _rows(_spec(tmp_path), url) == [{"doc_id": "007", "text": "1e3"}, {"doc_id": "08", "text": "café, 日本語 🙂"},
                                           {"doc_id": "09", "text": ""}, {"doc_id": "10", "text": "  padded  "}]


def test_a_header_only_file_has_no_rows(tmp_path: Path) -> None:
    url = _put("local", tmp_path, b"doc_id,text\n", None)
    assert _rows(_spec(tmp_path), url) == []


def test_a_row_cut_short_fails_naming_the_row(tmp_path: Path) -> None:
    """A file that ends early (an export cut off mid-row): the read fails rather than pad the row, naming it."""
    url = _put("local", tmp_path, _csv([["d1", "a", "x"], ["d2", "b", "x"]]) + b"d3,c", None)
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), url)
    assert info.value.row == 3
    assert "could not be parsed" in str(info.value) and "Expected 3 columns, got 2" in str(info.value)
    assert "column count" in info.value.fix


def test_a_missing_column_names_it_and_the_columns_the_file_has(tmp_path: Path) -> None:
    url = _put("local", tmp_path, b"doc_id,body\nd1,a\n", None)
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), url)
    assert info.value.column == "text" and "the file has columns: doc_id, body" in str(info.value)


def test_another_encoding_is_refused_naming_the_row_and_read_when_declared(tmp_path: Path) -> None:
    data = "doc_id,text\nd1,plain\nd2,Café Müller\n".encode("latin-1")
    url = _put("local", tmp_path, data, None)
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), url)
    assert "not valid utf-8" in str(info.value) and info.value.row == 2 and "source.encoding" in info.value.fix
    assert _rows(_spec(tmp_path, encoding="latin-1"), url)[1] == {"doc_id": "d2", "text": "Café Müller"}


def test_an_empty_file_is_named_as_such(tmp_path: Path) -> None:
    url = _put("local", tmp_path, b"", None)
    with pytest.raises(PipelineError, match="the CSV file is empty"):
        _rows(_spec(tmp_path), url)


@pytest.mark.parametrize("tail", [b'd2,b,"never closed\nd3,c,x\nd4,d,x\n', b'd2,b,"cut off in the middle of a quo'])
def test_a_quote_never_closed_fails_naming_its_row_instead_of_swallowing_the_rows_after_it(tmp_path: Path,
                                                                                            tail: bytes) -> None:
    """A file cut off inside a quoted value of the last column, or a quote left open there: pyarrow reads the rest of
    the file as that one value (d3 and d4 silently became text of d2's `other`: 2 rows read of 4, no error). The
    read fails, naming the row where the quote opened."""
    url = _put("local", tmp_path, _csv([["d1", "a", "x"]]) + tail, None)
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), url)
    assert info.value.row == 2 and "ends inside a quoted value" in str(info.value)


def test_a_stray_quote_inside_an_unquoted_value_is_read_as_it_is(tmp_path: Path) -> None:
    """An odd number of quotes is not always an open quote: 27" is an inch mark, read as text."""
    url = _put("local", tmp_path, b'doc_id,text\nd1,27" monitor\nd2,"quoted, ""twice"""\n', None)
    assert _rows(_spec(tmp_path), url) == [{"doc_id": "d1", "text": '27" monitor'},
                                           {"doc_id": "d2", "text": 'quoted, "twice"'}]
