"""Nasty inputs in every source format (CSV, JSON lines, Parquet; local, and JSON lines on S3): HTML, nulls and empty
strings, Japanese, Arabic and emoji, a 4 MB line, a quoted newline, CRLF line ends, a byte-order mark, a column
whose values change type, a value that does not convert to its declared type. Every row is published exactly once,
in source order, or kept as a row error with its reason (in the output's `error` and in the dead letters, with its
file and row); the real MiniLM embedder runs the rows (loaded once for the module), through the four stages."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_assets.errors import PipelineError
from batch_assets.reliability.dead_letters import dead_letter_url
from batch_assets.stages.infer import InferStats, run_infer
from batch_assets.stages.prepare import run_prepare
from batch_assets.stages.read import run_read
from batch_assets.stages.write import run_write, sink_url
from batch_assets.storage import ArrowStorage
from tests.conftest import EMBED_SPEC, make_spec

BIG = "lorem ipsum dolor sit amet " * 160_000  # 4.3 MB in one value (the `notes` of p08)
ROWS = [  # (id, title, description, price); title 42 is a number in JSON lines, price "12,99" a comma decimal
    ("p01", "Pan", "A plain frying pan.", "12.5"),
    ("p02", "Wok", "<p>Carbon-steel <b>wok</b> &amp; lid</p><script>x()</script>", "30"),
    ("p03", "Lid", None, "4"),
    ("p04", "Mat", "", "7"),
    ("p05", "包丁", "日本製の包丁です。よく切れます。", "99"),
    ("p06", "مقلاة", "مقلاة غير لاصقة بحجم كبير", "15"),
    ("p07", "Chef 🍳", "Hot 🔥 and fast 🚀", " 8.25 "),
    ("p08", "Big", "the line with a 4 MB note", "1"),
    ("p09", "Two lines", "line one\nline two, with \"quotes\"", "2"),
    ("p10", 42, "a title that is a number in JSON lines", "12,99"),
    ("p11", "Bowl", "a bowl", None),
]
IDS = [r[0] for r in ROWS]
EMPTY = {"p03", "p04"}  # empty / null description: an empty input
BAD_PRICE = "p10"  # "12,99" is no float64


def _records() -> list[dict]:
    # the 4 MB value is read and published, not embedded: tokenizing it alone takes MiniLM ~10 s on this machine
    return [{"id": i, "title": t, "description": d, "price": p, "notes": BIG if i == "p08" else "-"}
            for i, t, d, p in ROWS]


def _write(folder: Path, fmt: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":  # a BOM, CRLF line ends, mixed kinds in `title` and `price`
        lines = [json.dumps({**r, "price": (float(r["price"]) if r["price"] and r["id"] in ("p01", "p02") else r["price"])},
                            ensure_ascii=False) for r in _records()]
        (folder / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    elif fmt == "csv":  # a BOM, CRLF line ends, a quoted newline; CSV has no null: the null description is empty
        with open(folder / "a.csv", "w", encoding="utf-8-sig", newline="") as f:
            writer = csv.writer(f, lineterminator="\r\n")
            writer.writerow(["id", "title", "description", "price", "notes"])
            writer.writerows([[r["id"], r["title"], r["description"] or "", r["price"] or "", r["notes"]]
                              for r in _records()])
    else:
        records = [{**r, "title": str(r["title"])} for r in _records()]
        pq.write_table(pa.Table.from_pylist(records), folder / "a.parquet", row_group_size=4)


def _spec(fmt: str, data: Path | str, text_column: str = "description", **source):
    return make_spec(EMBED_SPEC, data, source={
        "format": fmt, "path": f"{data}/{{partition}}.{fmt}", "columns": ["id", "title", "description", "price", "notes"],
        "types": {"price": "float64"}, **source},
        prepare={"id_column": "id", "text_column": text_column},
        partitioning={"kind": "static", "keys": ["a"]}, runtime={"chunk_rows": 64, "max_error_fraction": 0.5})


@pytest.fixture(scope="module")
def embedder():
    from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(device="cpu").load_for_tests()


def _publish(spec, root: Path, embedder) -> tuple[list[dict], list[dict]]:
    """The four stages of partition a, as the job runs them; the published rows and the dead letters."""
    storage = ArrowStorage(root=str(root))
    run_read(spec, storage, "a")
    run_prepare(spec, storage, "a")
    run_infer(spec, storage, "a", embedder, InferStats())
    run_write(spec, storage, "a")
    out = pq.read_table(sink_url(spec, storage, "a")).to_pylist()
    dead = pq.read_table(dead_letter_url(storage, spec.name, "a")).to_pylist()
    return out, dead


def _check(out: list[dict], dead: list[dict], source_file: str) -> None:
    assert [r["id"] for r in out] == IDS, "every row once, in source order"
    rows = {r["id"]: r for r in out}
    for rid, title, description, _ in ROWS:
        row = rows[rid]
        if rid in EMPTY:
            assert row["error"].startswith("empty input: column 'description'"), row["error"]
            assert row["embedding"] is None
        elif rid == BAD_PRICE:
            assert row["error"].startswith("bad value: column 'price' holds '12,99', not double"), row["error"]
            assert f"row {IDS.index(rid) + 1}" in row["error"] and source_file in row["error"]
            assert row["embedding"] is None and row["price"] is None
        else:
            assert row["error"] is None, (rid, row["error"])
            assert len(row["embedding"]) == 384
            assert row["description"] == description, f"{rid}: text changed on the way"
            assert row["title"] == str(title)
    assert rows["p08"]["notes"] == BIG and {r["notes"] for r in out} == {BIG, "-"}
    assert rows["p07"]["price"] == 8.25 and rows["p11"]["price"] is None and rows["p01"]["price"] == 12.5
    assert {r["row_id"]: r["error_class"] for r in dead} == {"p03": "input", "p04": "input", "p10": "input"}
    assert all(r["_source_file"].endswith(source_file) and r["_source_row"] == IDS.index(r["row_id"]) + 1
               for r in dead)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_every_row_is_published_once_or_kept_with_its_reason(tmp_path: Path, fmt: str, embedder) -> None:
    _write(tmp_path / "data", fmt)
    out, dead = _publish(_spec(fmt, tmp_path / "data"), tmp_path / "store", embedder)
    _check(out, dead, f"a.{fmt}")


def test_jsonl_on_s3(tmp_path: Path, s3_bucket: str, embedder) -> None:
    import s3fs

    _write(tmp_path / "data", "jsonl")
    s3fs.S3FileSystem().put(str(tmp_path / "data" / "a.jsonl"), f"{s3_bucket}/in/a.jsonl")
    out, dead = _publish(_spec("jsonl", f"s3://{s3_bucket}/in"), tmp_path / "store", embedder)
    _check(out, dead, "a.jsonl")


def test_unused_columns_never_fail_the_read_and_small_blocks_still_read_big_lines(tmp_path: Path) -> None:
    """`price` changes kind from line to line and is not read; the 4 MB line is 4000 times the 1 KiB block."""
    _write(tmp_path / "data", "jsonl")
    _write(tmp_path / "data", "csv")
    storage = ArrowStorage(root=str(tmp_path / "store"))
    for fmt in ("jsonl", "csv"):
        spec = _spec(fmt, tmp_path / "data", columns=["id", "description", "notes"], types={}, block_size=1024)
        report = run_read(spec, storage, "a")
        raw = pq.read_table(report.path)
        assert raw.column("id").to_pylist() == IDS
        assert raw.column("notes").to_pylist()[7] == BIG
        assert raw.column("_read_error").null_count == len(IDS)


def test_bad_values_over_max_error_fraction_fail_the_read_naming_one(tmp_path: Path) -> None:
    _write(tmp_path / "data", "jsonl")
    spec = _spec("jsonl", tmp_path / "data", types={"price": "float64", "title": "int64"})
    with pytest.raises(PipelineError) as info:
        run_read(spec, ArrowStorage(root=str(tmp_path / "store")), "a")
    msg = str(info.value)
    assert "11 of 11 rows hold a value that does not convert" in msg and "max_error_fraction=0.5" in msg
    assert "column 'title' holds 'Pan', not int64" in msg and "row 1" in msg and "a.jsonl" in msg
    assert "What to do" in msg and "source.types" in msg


def test_empty_files(tmp_path: Path, embedder) -> None:
    """A CSV with a header only and a Parquet file with no rows publish an empty partition; a 0-byte file is a
    clear error naming it (not an empty success)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("id,title,description,price,notes\r\n")
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "title": pa.array([], pa.string()),
                             "description": pa.array([], pa.string()), "price": pa.array([], pa.string()),
                             "notes": pa.array([], pa.string())}),
                   data / "a.parquet")
    for fmt in ("csv", "parquet"):
        out, dead = _publish(_spec(fmt, data), tmp_path / f"store-{fmt}", embedder)
        assert out == [] and dead == []
    (data / "a.jsonl").write_bytes(b"")
    with pytest.raises(PipelineError, match=r"the source file is empty \(0 bytes\).*a\.jsonl"):
        run_read(_spec("jsonl", data), ArrowStorage(root=str(tmp_path / "store")), "a")


def test_a_text_column_whose_first_values_are_numbers_is_text(tmp_path: Path) -> None:
    """JSON lines: `title` is a number in every line of the first parse block, words later: all text, as the model
    reads it, not an int64 column guessed from the first block whose later words fail."""
    from tests.conftest import write_jsonl

    rows = [{"id": f"n{i}", "title": i} for i in range(100)] + [{"id": "t", "title": True}] + [
        {"id": f"w{i}", "title": f"pan number {i}"} for i in range(200)]
    write_jsonl(tmp_path / "data" / "a.jsonl", rows)
    spec = _spec("jsonl", tmp_path / "data", "title", columns=["id", "title"], types={}, block_size=1024)
    raw = pq.read_table(run_read(spec, ArrowStorage(root=str(tmp_path / "store")), "a").path)
    assert raw.column("title").to_pylist() == [str(i) for i in range(100)] + ["true"] + [
        f"pan number {i}" for i in range(200)]
    assert raw.column("_read_error").null_count == len(rows)
