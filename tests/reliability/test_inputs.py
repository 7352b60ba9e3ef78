"""Bad input, as a table: each case fails with an error naming what, where (pipeline / partition / file / column /
row) and what to do, and leaves nothing visible; a broken spec beside good ones does not stop them loading."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any, Callable

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.spec import parse_spec
from tests.bad_input_helpers import assert_nothing_published, failure_message
from tests.conftest import read_output, run_pipeline, write_csv, write_jsonl

LENGTH_SPEC: dict[str, Any] = {
    "name": "lengths",
    "source": {"format": "jsonl", "path": "DATA/{partition}.jsonl", "columns": ["doc_id", "text"]},
    "partitioning": {"kind": "static", "keys": ["a"]},
    "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
    "task": {"kind": "predict", "output_column": "length"},
    "model": {"provider": "custom", "config": {"class_path": "tests.reliability_models:TextLength"}},
    "runtime": {"chunk_rows": 4},
}
EMBED_LIKE = {**LENGTH_SPEC, "prepare": {"id_column": "doc_id", "text_column": "text"},
              "task": {"kind": "embed"}, "model": {"provider": "sentence_transformers", "config": {}}}


def _spec(base: dict, data: Path, fmt: str = "jsonl", **source: Any):
    raw = copy.deepcopy(base)
    raw["source"].update(format=fmt, path=f"{data}/{{partition}}.{fmt}", **source)
    return parse_spec(raw)


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _case_missing_column(d: Path):
    write_jsonl(d / "a.jsonl", [{"doc_id": "1", "body": "x"}])
    return _spec(LENGTH_SPEC, d), ["'text' not found", "column 'text'", "a.jsonl", "doc_id, body"]


def _case_misspelled_column_csv(d: Path):
    write_csv(d / "a.csv", ["doc_id", "Text"], [["1", "x"]])
    return _spec(LENGTH_SPEC, d, "csv"), ["'text' not found", "column 'text'", "a.csv", "Text"]


def _case_wrong_type(d: Path):
    _write_parquet(d / "a.parquet", pa.table({"doc_id": ["1", "2"], "text": [[1, 2], [3]]}))
    return _spec(EMBED_LIKE, d, "parquet"), ["values, not text", "column 'text'", "row 1", "a.parquet"]


def _case_corrupt_parquet(d: Path):
    d.mkdir(parents=True)
    (d / "a.parquet").write_bytes(b"PAR1 this is not really parquet")
    return _spec(LENGTH_SPEC, d, "parquet"), ["not a readable Parquet file", "a.parquet", "source.format"]


def _case_bad_encoding_jsonl(d: Path):
    d.mkdir(parents=True)
    (d / "a.jsonl").write_bytes('{"doc_id": "1", "text": "ok"}\n{"doc_id": "2", "text": "caf\u00e9"}\n'.encode("latin-1"))
    return _spec(LENGTH_SPEC, d), ["not valid utf-8", "a.jsonl", "row 2", "source.encoding"]


def _case_missing_path(d: Path):
    return _spec(LENGTH_SPEC, d / "nowhere"), ["does not exist", "nowhere/a.jsonl", "source.path"]


def _case_duplicate_ids(d: Path):
    write_jsonl(d / "a.jsonl", [{"doc_id": "7", "text": "x"}, {"doc_id": "8", "text": "y"}, {"doc_id": "7", "text": "z"}])
    return _spec(LENGTH_SPEC, d), ["row id '7' appears more than once", "a.jsonl", "row 3", "unique"]


def _case_truncated_jsonl(d: Path):
    d.mkdir(parents=True)
    (d / "a.jsonl").write_text('{"doc_id": "1", "text": "ok"}\n{"doc_id": "2", "te')
    return _spec(LENGTH_SPEC, d), ["could not be parsed", "a.jsonl", "one JSON object"]


CASES: dict[str, Callable[[Path], tuple[Any, list[str]]]] = {
    "missing column": _case_missing_column,
    "misspelled column (csv)": _case_misspelled_column_csv,
    "wrong type (list as text)": _case_wrong_type,
    "corrupt parquet": _case_corrupt_parquet,
    "unreadable encoding (jsonl)": _case_bad_encoding_jsonl,
    "path that does not exist": _case_missing_path,
    "duplicate row ids": _case_duplicate_ids,
    "truncated jsonl": _case_truncated_jsonl,
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_clear_error_and_nothing_is_published(tmp_path: Path, case: str) -> None:
    spec, expected = CASES[case](tmp_path / "data")
    msg = failure_message(spec, tmp_path / "store", "a")
    for part in [*expected, f"pipeline '{spec.name}'", "partition 'a'", "What to do"]:
        assert part in msg, f"{case}: {part!r} not in {msg!r}"
    assert_nothing_published(spec, tmp_path / "store", "a")


def test_null_and_empty_text_are_kept_as_row_errors_not_lost(tmp_path: Path) -> None:
    rows = [{"doc_id": "1", "text": "fine"}, {"doc_id": "2", "text": None}, {"doc_id": "3", "text": "  "}]
    write_jsonl(tmp_path / "data" / "a.jsonl", rows)
    spec = _spec(EMBED_LIKE, tmp_path / "data")
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    out = {r["doc_id"]: r for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    assert sorted(out) == ["1", "2", "3"]
    assert out["1"]["error"] is None and len(out["1"]["embedding"]) == 384
    assert "empty input" in out["2"]["error"] and "empty input" in out["3"]["error"]


def test_missing_bucket_names_it(tmp_path: Path, s3_bucket: str) -> None:
    spec = _spec(LENGTH_SPEC, "s3://no-such-bucket-reliability/in")  # type: ignore[arg-type]
    msg = failure_message(spec, tmp_path / "store", "a")
    assert "does not exist" in msg and "s3://no-such-bucket-reliability/in/a.jsonl" in msg and "bucket" in msg


def _write_specs(folder: Path, data: Path) -> None:
    write_jsonl(data / "a.jsonl", [{"doc_id": "1", "text": "hello"}])
    good = copy.deepcopy(LENGTH_SPEC)
    good["source"]["path"] = f"{data}/{{partition}}.jsonl"
    folder.mkdir(parents=True)
    (folder / "good.yaml").write_text(yaml.safe_dump(good))
    (folder / "typo.yaml").write_text(yaml.safe_dump({**good, "name": "typo", "task": {"kind": "embedd"}}))
    (folder / "not_yaml.yaml").write_text("name: x\nsource: [unclosed\n")
    (folder / "same_name.yaml").write_text(yaml.safe_dump(good))
    (data / "twins").mkdir()
    (data / "twins" / "k.jsonl").write_text('{"doc_id": "1", "text": "a"}\n')
    (data / "twins" / "k.old.jsonl").write_text('{"doc_id": "1", "text": "a"}\n')
    twins = {**good, "name": "twins", "partitioning": {"kind": "static"},
             "source": {**good["source"], "path": f"{data}/twins/*.jsonl"}}
    (folder / "twins.yaml").write_text(yaml.safe_dump(twins))


def test_broken_specs_do_not_stop_the_good_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets import catalog, definitions

    _write_specs(tmp_path / "pipelines", tmp_path / "data")
    monkeypatch.setenv("BATCH_PIPELINES_DIR", str(tmp_path / "pipelines"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        defs = definitions.code_location(catalog.built_in())
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"lengths/raw", "lengths/output"} <= keys
    broken = sorted(k for k in keys if k.startswith("broken_pipelines/"))
    assert broken == ["broken_pipelines/not_yaml", "broken_pipelines/same_name", "broken_pipelines/twins",
                      "broken_pipelines/typo"], broken
    texts = [str(w.message) for w in caught if issubclass(w.category, definitions.BrokenPipelineWarning)]
    assert any("typo.yaml" in t and "task.kind" in t for t in texts)
    assert any("same partition key 'k'" in t and "k.old.jsonl" in t and "twins" in t for t in texts)
    assert any("already defined" in t and "good.yaml" in t for t in texts)
    # the broken one fails loudly with its error when someone tries to run it
    result = dg.materialize([defs.get_assets_def(dg.AssetKey(["broken_pipelines", "typo"]))], raise_on_error=False)
    assert not result.success
    # the good one runs
    store = tmp_path / "store"
    monkeypatch.setenv("BATCH_STORAGE_ROOT", str(store))
    assert defs.resolve_job_def("lengths_job").execute_in_process(partition_key="a").success
    assert json.dumps(pq.read_table(store / "lengths" / "output" / "a.parquet").to_pylist()) == \
        json.dumps([{"doc_id": "1", "text": "hello", "row_id": "1", "length": 5, "error": None}])


@pytest.fixture(scope="module")
def s3_checking_keys():
    from tests.s3_auth import authenticated_s3

    with authenticated_s3() as s3:
        s3.client().put_object(Bucket=s3.bucket, Key="in/a.jsonl",
                               Body=b'{"doc_id": "1", "text": "x"}\n{"doc_id": "2", "text": "yy"}\n')
        yield s3


WRONG_KEYS = {"unknown access key id": ("AKIAWRONGWRONGWRONG1", None), "wrong secret for a real key id": (None, "w" * 40)}


@pytest.mark.parametrize("where", ["source", "storage root"])
@pytest.mark.parametrize("wrong", list(WRONG_KEYS))
def test_bad_s3_credentials_name_the_place_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       s3_checking_keys, where: str, wrong: str) -> None:
    s3 = s3_checking_keys
    key_id, secret = WRONG_KEYS[wrong]
    for name, value in {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": s3.region,
                        "AWS_ACCESS_KEY_ID": key_id or s3.key_id,
                        "AWS_SECRET_ACCESS_KEY": secret or s3.secret}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    if where == "source":
        spec, root, place = _spec(LENGTH_SPEC, f"s3://{s3.bucket}/in"), tmp_path / "store", f"s3://{s3.bucket}/in"
    else:
        write_jsonl(tmp_path / "data" / "a.jsonl", [{"doc_id": "1", "text": "x"}])
        spec, root, place = _spec(LENGTH_SPEC, tmp_path / "data"), f"s3://{s3.bucket}/store", f"s3://{s3.bucket}/store"
    msg = failure_message(spec, root, "a")
    for part in [place, "refused", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", f"pipeline '{spec.name}'",
                 "partition 'a'", "What to do"]:
        assert part in msg, f"{where}, {wrong}: {part!r} not in {msg!r}"
    assert s3.secret not in msg and (secret or s3.secret) not in msg
    assert s3.keys("store/") == []  # nothing published (or left behind) under an S3 storage root
    if where == "source":
        assert_nothing_published(spec, root, "a")
