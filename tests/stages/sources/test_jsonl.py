"""The JSON lines source (stages/sources/jsonl.py): every object exactly once, in order, across blocks of any size;
blank lines, a byte-order mark, CRLF and a last line without its newline taken in stride; a line that is not a JSON
object fails the read naming that line, wherever it is in the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_assets.errors import PipelineError
from batch_assets.stages.sources import jsonl as jsonl_source
from batch_assets.stages.sources.jsonl import line_blocks
from tests.conftest import EMBED_SPEC, make_spec


def _spec(tmp_path: Path, columns=("doc_id", "text"), **source):
    return make_spec(EMBED_SPEC, tmp_path, source={"format": "jsonl", "path": str(tmp_path / "{partition}.jsonl"),
                                                  "columns": list(columns), **source})


def _rows(spec, path: Path) -> list[dict]:
    return [r for batch in jsonl_source.batches(spec, str(path)) for r in batch.to_pylist()]


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def test_every_object_is_read_once_in_order_across_small_blocks(tmp_path: Path) -> None:
    rows = [{"doc_id": f"d{i}", "text": ("long " * 2000) if i == 70 else f"text {i} 日本語", "unused": [i] * (i % 3)}
            for i in range(300)]
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines(rows))
    got = _rows(_spec(tmp_path, block_size=1024, batch_rows=16), path)
    assert got == [{"doc_id": r["doc_id"], "text": r["text"]} for r in rows]


def test_blank_lines_a_byte_order_mark_crlf_and_no_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"doc_id": "d1", "text": "caf\xc3\xa9"}\r\n\r\n   \n{"doc_id": "d2", "text": null}\n'
                     b'{"doc_id": "d3"}\n\n{"text": "no newline at the end", "doc_id": "d4"}')
    assert _rows(_spec(tmp_path), path) == [{"doc_id": "d1", "text": "café"}, {"doc_id": "d2", "text": None},
                                            {"doc_id": "d3", "text": None},
                                            {"doc_id": "d4", "text": "no newline at the end"}]
    # the same after a byte-order mark when the first block goes through the line-by-line parser (a kind change)
    path.write_bytes(b'\xef\xbb\xbf{"doc_id": "d1", "text": "caf\xc3\xa9"}\r\n{"doc_id": "d2", "text": 5}\n')
    assert _rows(_spec(tmp_path), path) == [{"doc_id": "d1", "text": "café"}, {"doc_id": "d2", "text": "5"}]


def test_a_text_column_whose_kind_changes_between_blocks_is_text(tmp_path: Path) -> None:
    """`42` in the first block and `"Pan"` later: both are text (as their JSON text), none lost."""
    rows = [{"doc_id": i, "text": 42 if i < 100 else ("Pan" if i % 2 else {"a": 1})} for i in range(200)]
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines(rows))
    got = _rows(_spec(tmp_path, block_size=1024), path)
    assert [r["text"] for r in got] == ["42"] * 100 + ['{"a": 1}' if i % 2 == 0 else "Pan" for i in range(100, 200)]
    assert [r["doc_id"] for r in got] == list(range(200))


@pytest.mark.parametrize("bad, problem", [(b'{"doc_id": "x", "text": "cut', "is not valid JSON"),
                                          (b'["doc_id", "x"]', "holds a JSON list, not an object")])
def test_a_line_that_is_not_an_object_fails_naming_its_line_in_any_block(tmp_path: Path, bad: bytes,
                                                                          problem: str) -> None:
    rows = [{"doc_id": f"d{i}", "text": f"text number {i}"} for i in range(200)]
    data = _lines(rows[:150]) + b"\n" + bad + b"\n" + _lines(rows[150:])  # a blank line before it, line 152
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path, block_size=1024), path)
    assert info.value.row == 152 and f"line 152 {problem}" in str(info.value)
    assert "each line must be one JSON object" in info.value.fix


def test_a_file_that_ends_mid_line_fails_naming_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines([{"doc_id": "d1", "text": "a"}, {"doc_id": "d2", "text": "b"}]) + b'{"doc_id": "d3", "te')
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), path)
    assert info.value.row == 3


def test_invalid_utf8_names_the_line_and_another_encoding_reads_when_declared(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes('{"doc_id": "d1", "text": "plain"}\n{"doc_id": "d2", "text": "Café Müller"}\n'.encode("latin-1"))
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), path)
    assert "not valid utf-8" in str(info.value) and info.value.row == 2
    assert _rows(_spec(tmp_path, encoding="latin-1"), path)[1] == {"doc_id": "d2", "text": "Café Müller"}


def test_a_missing_column_names_it(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines([{"doc_id": "d1", "body": "a"}]))
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path), path)
    assert info.value.column == "text" and "the file has columns: doc_id, body" in str(info.value)


def test_line_blocks_end_at_line_ends_and_hold_every_byte(tmp_path: Path) -> None:
    data = b"".join(b"x" * (i * 37 % 3000) + b"\n" for i in range(200)) + b"tail without newline"
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    with path.open("rb") as f:
        blocks = list(line_blocks(f, 1024))
    assert b"".join(blocks) == data
    assert all(block.endswith(b"\n") for block in blocks[:-1])


def test_a_column_that_first_appears_after_the_first_block_is_read(tmp_path: Path) -> None:
    """Writers leave a null field out, and an export sorted by date has no `title` until the records that got one:
    the read once failed with "input column 'title' not found" when the first block (1 MiB by default) had none."""
    rows = [{"doc_id": f"d{i}", "text": f"text {i}"} for i in range(100)]
    rows += [{"doc_id": f"d{i}", "text": f"text {i}", "title": f"title {i}"} for i in range(100, 120)]
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines(rows))
    got = _rows(_spec(tmp_path, columns=("doc_id", "text", "title"), block_size=1024), path)
    assert [r["doc_id"] for r in got] == [r["doc_id"] for r in rows]
    assert [r["title"] for r in got] == [None] * 100 + [f"title {i}" for i in range(100, 120)]
    # a column no line names still fails the read, naming it
    path.write_bytes(_lines(rows[:100]))
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path, columns=("doc_id", "text", "title"), block_size=1024), path)
    assert info.value.column == "title" and "the file has columns: doc_id, text" in str(info.value)


def test_a_line_the_declared_encoding_cannot_decode_is_named(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines([{"doc_id": "d1", "text": "plain"}, {"doc_id": "d2", "text": "also plain"},
                             {"doc_id": "d3", "text": "café"}]))
    with pytest.raises(PipelineError) as info:
        _rows(_spec(tmp_path, encoding="ascii"), path)
    assert "not valid ascii" in str(info.value) and info.value.row == 3
