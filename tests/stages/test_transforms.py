"""The prepare stage as a stage (issue 17): per-column transforms, joins, templates for every text task, the user
function hook, trial runs, and the catalog case from docs/transforms.md run as written with the real MiniLM model.

The unit tests drive `prepare_batches` on Arrow batches (no Dagster, no model); the catalog tests share one module
fixture that runs the docs' spec twice through Dagster (a trial, then the full run) with the real embedder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.errors import PipelineError
from batch_assets.orchestration.assets.lineage import stage_code_version
from batch_assets.spec import SpecError, parse_spec
from batch_assets.stages.prepare import prepare_batches
from batch_assets.stages.trial import TrialSelection
from batch_assets.spec_prepare import TrialSpec
from batch_assets.storage import ArrowStorage
from tests.conftest import EMBED_SPEC, GENERATE_SPEC, run_pipeline, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "transforms.md"


def spec_of(base: dict, **prepare) -> object:
    raw = json.loads(json.dumps(base))
    raw["source"]["path"] = "/data/{partition}.jsonl"
    raw["task"] = prepare.pop("task", raw["task"])
    raw["source"]["columns"] = prepare.pop("columns", raw["source"]["columns"])
    raw["prepare"] = {**raw["prepare"], **prepare}
    return parse_spec(raw)


def prepared(spec, rows: list[dict], key: str = "p") -> list[dict]:
    batch = pa.RecordBatch.from_pylist([{"row_id": str(i), **r} for i, r in enumerate(rows)])
    return [r for b in prepare_batches(spec, iter([batch]), key=key) for r in b.to_pylist()]


# -- transforms -------------------------------------------------------------------------------------------------------
def test_html_whitespace_and_nfc_are_cleaned_in_place_block_elements_stay_apart() -> None:
    spec = spec_of(EMBED_SPEC, columns=["doc_id", "text"], transforms={"text": {"strip_html": True, "normalize": True}})
    out = prepared(spec, [
        {"doc_id": "a", "text": "<p>Mug &amp; <b>saucer</b></p><ul><li>red</li><li>blue</li></ul><script>x()</script>"},
        {"doc_id": "b", "text": "cafe\u0301\u00a0\u00a0 au\tlait\n\n 日本語　テキスト "},
        {"doc_id": "c", "text": "no markup at all"},
    ])
    assert [r["text"] for r in out] == ["Mug & saucer red blue", "café au lait 日本語 テキスト", "no markup at all"]
    assert [r["_text"] for r in out] == [r["text"] for r in out]  # the cleaned column is what the model reads
    assert not any(r["_input_empty"] for r in out)


def test_a_value_that_does_not_cast_is_a_row_error_naming_column_and_value_the_rest_keep_theirs() -> None:
    spec = spec_of(EMBED_SPEC, columns=["doc_id", "text", "price"], transforms={"price": {"cast": "float64"}})
    out = prepared(spec, [{"doc_id": "a", "text": "x", "price": "12.5"}, {"doc_id": "b", "text": "y", "price": "12,99"},
                          {"doc_id": "c", "text": "z", "price": " 3 "}])
    assert [r["price"] for r in out] == [12.5, None, 3.0]
    assert [r["_input_empty"] for r in out] == [False, True, False]
    assert out[1]["_input_problem"] == ("column 'price': value '12,99' does not cast to float64 "
                                        "(prepare.transforms.price.cast)")


def test_fill_null_and_required_and_an_all_html_value_counts_as_missing() -> None:
    spec = spec_of(EMBED_SPEC, columns=["doc_id", "title", "body"], text_column=None, template="{title}: {body}",
                   transforms={"title": {"fill_null": "Untitled"}, "body": {"strip_html": True, "required": True}})
    out = prepared(spec, [{"doc_id": "a", "title": None, "body": "<p>text</p>"},
                          {"doc_id": "b", "title": "T", "body": "<p> </p><br>"}])
    assert out[0]["_text"] == "Untitled: text" and not out[0]["_input_empty"]
    assert out[1]["_input_empty"] and out[1]["_input_problem"] == \
        "column 'body' is empty (prepare.transforms.body.required)"


def test_embed_template_leaves_a_missing_title_out_and_is_empty_only_when_every_field_is() -> None:
    spec = spec_of(EMBED_SPEC, columns=["doc_id", "title", "body"], text_column=None, template="{title}\n\n{body}")
    out = prepared(spec, [{"doc_id": "a", "title": None, "body": "the body"}, {"doc_id": "b", "title": " ", "body": None}])
    assert out[0]["_text"] == "the body" and not out[0]["_input_empty"]
    assert out[1]["_input_problem"] == "empty input: columns 'title', 'body' are empty" and out[1]["_text"] is None


def test_generate_optional_field_renders_empty_and_a_required_one_still_flags_the_row() -> None:
    base = json.loads(json.dumps(GENERATE_SPEC))
    base["source"]["columns"] = ["customer_id", "company", "note"]
    spec = spec_of(base, template="Company: {company}. Note: {note}", transforms={"note": {"required": False}})
    out = prepared(spec, [{"customer_id": "1", "company": "Acme", "note": None},
                          {"customer_id": "2", "company": "", "note": "n"}])
    assert out[0]["_prompt"] == "Company: Acme. Note: " and not out[0]["_input_empty"]
    assert out[1]["_input_problem"] == "empty input: column 'company' is empty"


def test_join_skips_missing_values_and_feeds_text_column() -> None:
    spec = spec_of(EMBED_SPEC, columns=["doc_id", "a", "b", "c"], text_column="all",
                   join={"all": {"columns": ["a", "b", "c"], "separator": " | "}})
    out = prepared(spec, [{"doc_id": "1", "a": "x", "b": None, "c": "z"}, {"doc_id": "2", "a": None, "b": "", "c": None},
                          {"doc_id": "3", "a": "x", "b": "y", "c": "z"}])
    assert [r["all"] for r in out] == ["x | z", None, "x | y | z"]
    assert [r["_input_empty"] for r in out] == [False, True, False]


# -- spec checks ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("base", "prepare", "expected"), [
    (EMBED_SPEC, {"template": "{text}"}, "prepare.template: task 'embed' reads text_column or template, not both"),
    (EMBED_SPEC, {"system": "be brief"}, "prepare.system: task 'embed' does not use it"),
    (GENERATE_SPEC, {"text_column": "company"}, "prepare.text_column: task 'generate' does not use it"),
    (EMBED_SPEC, {"too_long": "skip"}, "prepare.too_long: applies only with prepare.max_input_tokens"),
    (EMBED_SPEC, {"transforms": {"nope": {"normalize": True}}}, "prepare.transforms.nope: column 'nope' is not in"),
    (EMBED_SPEC, {"transforms": {"text": {"cast": "float99"}}}, "unknown Arrow type 'float99'"),
    (EMBED_SPEC, {"transforms": {"text": {"fill_null": "", "required": True}}}, "fill_null gives every row a value"),
    (EMBED_SPEC, {"text_column": "joined"}, "column 'joined' is not in source.columns"),
    (EMBED_SPEC, {"function": "batch_assets.examples.catalog:no_such"}, "has no attribute 'no_such'"),
    (EMBED_SPEC, {"join": {"text": {"columns": ["doc_id", "text"]}}}, "'text' is a source column"),
    (EMBED_SPEC, {"task": {"kind": "embed", "params": {"max_new_tokens": 5}}}, "task.params: task 'embed' does not use"),
    (EMBED_SPEC, {"task": {"kind": "embed", "labels": ["a", "b"]}}, "task.labels: task 'embed' does not use it"),
    (GENERATE_SPEC, {"task": {"kind": "generate", "label_column": "x"}}, "task.label_column: applies only with task.labels"),
    (GENERATE_SPEC, {"task": {"kind": "generate", "structured_column": "x"}}, "task.structured_column: applies only"),
])
def test_spec_refuses_what_would_be_ignored_or_cannot_work(base, prepare, expected) -> None:
    with pytest.raises(SpecError) as err:
        spec_of(base, **prepare)
    assert expected in str(err.value)


def test_template_alone_is_accepted_for_embed_and_classify() -> None:
    for kind, extra in (("embed", {}), ("classify", {"labels": ["a", "b"]})):
        raw = json.loads(json.dumps(EMBED_SPEC))
        raw["source"]["path"] = "/d/{partition}.jsonl"
        raw["task"] = {"kind": kind, **extra}
        raw["prepare"] = {"id_column": "doc_id", "template": "{text}"}
        if kind == "classify":
            raw["model"] = {"provider": "zero_shot"}
        assert parse_spec(raw).prepare.template == "{text}"


# -- the function hook ------------------------------------------------------------------------------------------------
def _hook_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    (tmp_path / "prep_hooks_t.py").write_text("import pyarrow as pa\nimport pyarrow.compute as pc\n\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    import sys

    sys.modules.pop("prep_hooks_t", None)
    return "prep_hooks_t:fn"


def test_function_adds_columns_and_marks_row_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _hook_module(tmp_path, monkeypatch, (
        "def fn(batch):\n"
        "    up = pc.utf8_upper(batch.column('text'))\n"
        "    bad = pc.if_else(pc.equal(batch.column('text'), 'bad'), pa.scalar('no bad words'), pa.scalar(None, pa.string()))\n"
        "    return batch.append_column('loud', up).append_column('_row_error', bad)\n"))
    spec = spec_of(EMBED_SPEC, function=path, function_columns=["loud"], text_column="loud")
    out = prepared(spec, [{"doc_id": "a", "text": "hi"}, {"doc_id": "b", "text": "bad"}])
    assert [r["_text"] for r in out] == ["HI", None]
    assert out[1]["_input_problem"] == "prepare.function prep_hooks_t:fn: no bad words"
    assert "_row_error" not in out[0]


@pytest.mark.parametrize(("body", "expected"), [
    ("def fn(batch):\n    return batch.slice(1)\n", "returned 1 rows for 2"),
    ("def fn(batch):\n    return batch.drop_columns(['row_id'])\n", "dropped, changed or reordered the row_id column"),
    ("def fn(batch):\n    return batch.take(pa.array([1, 0]))\n", "dropped, changed or reordered the row_id column"),
    ("def fn(batch):\n    raise KeyError('price')\n", "raised KeyError: 'price'"),
    ("def fn(batch):\n    return batch.to_pylist()\n", "returned list, not a pyarrow RecordBatch"),
])
def test_a_function_that_breaks_the_contract_fails_naming_pipeline_partition_function_and_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, expected: str) -> None:
    spec = spec_of(EMBED_SPEC, function=_hook_module(tmp_path, monkeypatch, body))
    with pytest.raises(PipelineError) as err:
        prepared(spec, [{"doc_id": "a", "text": "x"}, {"doc_id": "b", "text": "y"}], key="p7")
    message = str(err.value)
    assert expected in message and "prepare.function 'prep_hooks_t:fn'" in message
    assert "rows '0' .. '1'" in message and "pipeline 'docs'" in message and "partition 'p7'" in message


def test_transforms_and_the_function_source_are_in_the_prepare_code_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = spec_of(EMBED_SPEC)
    cleaned = spec_of(EMBED_SPEC, transforms={"text": {"normalize": True}})
    for stage in ("prepared", "inferred", "output"):
        assert stage_code_version(plain, stage) != stage_code_version(cleaned, stage)
    assert stage_code_version(plain, "raw") == stage_code_version(cleaned, "raw")
    path = _hook_module(tmp_path, monkeypatch, "def fn(batch):\n    return batch\n")
    before = stage_code_version(spec_of(EMBED_SPEC, function=path), "prepared")
    path = _hook_module(tmp_path, monkeypatch, "def fn(batch):\n    return batch  # edited\n")
    assert stage_code_version(spec_of(EMBED_SPEC, function=path), "prepared") != before


# -- trial selection --------------------------------------------------------------------------------------------------
def _trial_ids(trial: TrialSpec, batch_rows: int, n: int = 1000) -> list[str]:
    from batch_assets.reliability.row_ids import ROW_HASH, stable_hash64

    ids = [f"sku-{i}" for i in range(n)]
    table = pa.table({"row_id": ids, ROW_HASH: pa.array(stable_hash64(ids), pa.uint64())})
    select = TrialSelection(trial)
    kept = [r for b in select(iter(table.to_batches(max_chunksize=batch_rows))) for r in b.column("row_id").to_pylist()]
    assert select.kept.count == len(kept)
    return kept


def test_trial_sample_is_deterministic_whatever_the_batch_size_and_limit_keeps_read_order() -> None:
    sample = _trial_ids(TrialSpec(sample=0.1, seed=3), 64)
    assert sample == _trial_ids(TrialSpec(sample=0.1, seed=3), 1000)  # same rows, same order
    assert 60 <= len(sample) <= 140  # about 10% of 1,000
    assert sample != _trial_ids(TrialSpec(sample=0.1, seed=4), 64)  # another seed, other rows
    assert _trial_ids(TrialSpec(limit=30), 7) == [f"sku-{i}" for i in range(30)]
    assert _trial_ids(TrialSpec(sample=0.1, seed=3, limit=5), 64) == sample[:5]


# -- the catalog case, from the docs, with the real MiniLM ------------------------------------------------------------
def catalog_rows() -> list[dict]:
    rows = [
        {"sku": "mug", "title": "Mug", "price": "12.99",
         "description": "<p>Mug &amp; saucer</p><ul><li>350 ml</li><li>blue</li></ul><script>track()</script>"},
        {"sku": "kettle", "title": None, "price": "24,50", "description": "A very good kettle"},
        {"sku": "kettle-2", "title": "", "price": "24", "description": "<div>Another   kettle</div>"},
        {"sku": "teapot-jp", "title": "急須", "price": "30", "description": "<p>日本製の急須。</p>"},
        {"sku": "teapot-ar", "title": "إبريق شاي", "price": "31", "description": "إبريق شاي من السيراميك"},
        {"sku": "lamp", "title": "Lamp", "price": "40", "description": "<p> </p>"},
        {"sku": "vase", "title": "Vase", "price": "about 3", "description": "A tall vase"},
        {"sku": "big", "title": "Encyclopedia", "price": "99",
         "description": "<div>" + "<p>Volume one of many, with <b>bold</b> claims.</p>" * 40_000 + "</div>"},
    ]
    rows += [{"sku": f"cup-{i}", "title": f"Cup {i}", "price": f"{i},00", "description": f"<p>Cup number {i}</p>"}
             for i in range(12)]
    return rows


def docs_catalog_spec() -> dict:
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- catalog-spec:[^>]*-->\s*```yaml\n(.*?)```", text, re.S)
    assert block, "docs/transforms.md lost its catalog spec block"
    return yaml.safe_load(block.group(1))


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The docs' catalog spec, run twice with the real MiniLM: a trial (limit 4), then the full run."""
    tmp = tmp_path_factory.mktemp("catalog")
    write_jsonl(tmp / "data" / "catalog" / "p1.jsonl", catalog_rows())
    raw = docs_catalog_spec()
    raw["source"]["path"] = str(tmp / raw["source"]["path"])
    spec = parse_spec(raw)
    trial_raw = json.loads(json.dumps(raw))
    trial_raw["prepare"]["trial"] = {"limit": 4}
    trial_spec = parse_spec(trial_raw)
    store = tmp / "store"
    trial_result = run_pipeline(trial_spec, store, ["p1"])
    full_result = run_pipeline(spec, store, ["p1"])
    return {"spec": spec, "trial_spec": trial_spec, "store": store, "trial": trial_result, "full": full_result}


def _metadata(result, stage: str) -> dict:
    events = [e.event_specific_data.materialization for e in result.all_events
              if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key.path[-1] == stage]
    return {k: v.value for k, v in events[0].metadata.items()}


def test_catalog_from_the_docs_every_row_published_once_or_kept_as_a_row_error_with_its_reason(catalog) -> None:
    from batch_assets.stages.write import sink_url

    spec, store = catalog["spec"], catalog["store"]
    assert catalog["full"].success
    out = pq.read_table(sink_url(spec, ArrowStorage(root=str(store)), "p1")).to_pylist()
    source = [r["sku"] for r in catalog_rows()]
    assert [r["sku"] for r in out] == source  # every row once, in source order
    errors = {r["sku"]: r["error"] for r in out if r["error"]}
    assert errors == {
        "lamp": "column 'description' is empty (prepare.transforms.description.required)",
        "vase": "prepare.function batch_assets.examples.catalog:parse_prices: price is not a number: about 3",
    }
    assert all(len(r["embedding"]) == 384 for r in out if r["sku"] not in errors)
    assert all(r["embedding"] is None for r in out if r["sku"] in errors)
    prices = {r["sku"]: r["price_eur"] for r in out}
    assert prices["kettle"] == 24.5 and prices["mug"] == 12.99 and prices["cup-3"] == 3.0
    dead = pq.read_table(store / "catalog_embeddings" / "dead_letters" / "p1.parquet").to_pylist()
    assert sorted((r["row_id"], r["error_class"]) for r in dead) == [("lamp", "input"), ("vase", "input")]
    prepared_rows = {r["row_id"]: r for r in pq.read_table(
        ArrowStorage(root=str(store)).stage_url(spec.name, "prepared", "p1")).to_pylist()}
    assert prepared_rows["mug"]["_text"] == "Mug\n\nMug & saucer 350 ml blue"
    assert prepared_rows["kettle"]["_text"] == "A very good kettle"  # no title: the description alone
    assert prepared_rows["kettle-2"]["_text"] == "Another kettle"
    assert prepared_rows["teapot-jp"]["_text"] == "急須\n\n日本製の急須。"
    assert prepared_rows["teapot-ar"]["_text"] == "إبريق شاي\n\nإبريق شاي من السيراميك"
    assert prepared_rows["big"]["_text"].startswith("Encyclopedia\n\nVolume one of many, with bold claims. Volume")
    md = _metadata(catalog["full"], "prepared")
    assert md["empty_inputs"] == 0 and md["transform_row_errors"] == 2 and "trial" not in md


def test_catalog_trial_is_marked_kept_apart_and_redone_in_full_by_the_next_run(catalog) -> None:
    from batch_assets.stages.write import sink_url

    trial_spec, spec, store = catalog["trial_spec"], catalog["spec"], catalog["store"]
    assert catalog["trial"].success
    prep_md, infer_md, out_md = (_metadata(catalog["trial"], s) for s in ("prepared", "inferred", "output"))
    assert prep_md["trial"] is True and prep_md["trial_rows_kept"] == 4 and prep_md["trial_rows_in_partition"] == 20
    assert infer_md["trial"] is True and out_md["trial"] is True
    full_url = sink_url(spec, ArrowStorage(root=str(store)), "p1")
    trial_out = pq.read_table(full_url.replace("/output/", "/output/_trial/")).column("sku").to_pylist()
    assert trial_out == ["mug", "kettle", "kettle-2", "teapot-jp"]
    checks = {e.event_specific_data.check_name: e.event_specific_data.passed
              for e in catalog["trial"].all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert checks["rows_exactly_once"] is True
    # the full run after the trial was not skipped: it read every row and published all 20 in the full location
    full_md = _metadata(catalog["full"], "prepared")
    assert "skipped" not in full_md and full_md["rows_out"] == 20
    assert pq.read_table(full_url).num_rows == 20
    assert stage_code_version(trial_spec, "output") != stage_code_version(spec, "output")


def test_a_joined_text_column_goes_through_the_read_and_prepare_stages(tmp_path: Path) -> None:
    from batch_assets.stages.prepare import run_prepare
    from batch_assets.stages.read import run_read

    write_jsonl(tmp_path / "data" / "a.jsonl", [{"doc_id": "1", "title": "T", "body": "<p>b</p>"},
                                                 {"doc_id": "2", "title": None, "body": None}])
    raw = json.loads(json.dumps(EMBED_SPEC))
    raw["source"].update(path=str(tmp_path / "data" / "{partition}.jsonl"), columns=["doc_id", "title", "body"])
    raw["prepare"] = {"id_column": "doc_id", "text_column": "both", "transforms": {"body": {"strip_html": True}},
                      "join": {"both": {"columns": ["title", "body"], "separator": ". "}}}
    spec, storage = parse_spec(raw), ArrowStorage(root=str(tmp_path / "store"))
    run_read(spec, storage, "a")
    report = run_prepare(spec, storage, "a")
    rows = pq.read_table(storage.stage_url(spec.name, "prepared", "a")).to_pylist()
    assert [r["_text"] for r in rows] == ["T. b", None]
    assert rows[1]["_input_problem"] == "empty input: column 'both' is empty"
    assert report.extra["empty_inputs"] == 1 and report.rows_with_errors == 1


def test_a_function_whose_columns_change_type_between_batches_fails_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _hook_module(tmp_path, monkeypatch, (
        "def fn(batch):\n"
        "    first = batch.column('doc_id')[0].as_py() == 'a'\n"
        "    extra = pa.array([1.5] * batch.num_rows) if first else pa.array([[1]] * batch.num_rows)\n"
        "    return batch.append_column('extra', extra)\n"))
    spec = spec_of(EMBED_SPEC, function=path, function_columns=["extra"])
    batches = [pa.RecordBatch.from_pylist([{"row_id": r, "doc_id": r, "text": "t"}]) for r in ("a", "b")]
    with pytest.raises(PipelineError, match="returned columns or types that differ from its first batch's"):
        list(prepare_batches(spec, iter(batches), key="p"))
