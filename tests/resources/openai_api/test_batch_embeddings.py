"""Task embed through OpenAI's Batch API (`batch_api: true`): one /v1/embeddings line per row, the vectors read back
by custom_id from an out-of-order output file into the answer journal, so the partition's vectors are exactly what
the online path writes; a transient failure goes into a new batch; a refused row stops the partition naming it (an
embedding has no per-row error slot, as online); cost at the batch price."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from batch_assets.spec import parse_spec
from tests.resources.conftest import StandinProcess, inferred_metadata, rows, step_error
from tests.resources.openai_api.standin import embedding
from tests.conftest import read_output, run_pipeline, write_jsonl

FAST = 100_000
PRICE_IN = 1000.0  # USD per million tokens, online (large: cost_usd is rounded to 6 digits)


def make_spec(data: Path, standin: StandinProcess, name: str = "vectors", **config) -> dict:
    return {
        "name": name,
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "text_column": "text"},
        "task": {"kind": "embed"},
        "model": {"provider": "openai",
                  "config": {"model": "text-embedding-standin", "base_url": standin.url,
                             "api_key": {"env": "STANDIN_KEY"}, "batch_poll_interval_s": 0.2, "backoff_base_s": 0.1,
                             "embedding_batch_size": 4, **config},
                  "pricing": {"input_per_million_tokens": PRICE_IN, "output_per_million_tokens": 0.0}},
        "runtime": {"chunk_rows": 4},
    }


def vectors(spec, store: Path) -> dict[str, np.ndarray]:
    table = read_output(spec, store, "a")
    column = spec.task.resolved_output_column()
    return {r["doc_id"]: np.asarray(r[column], dtype=np.float32) for r in table.to_pylist()}


def test_vectors_through_batches_equal_the_online_ones_at_the_batch_price(tmp_path: Path, standin: StandinProcess):
    texts = {f"d{i}": f"text number {i}" for i in range(10)}
    texts["d4"] = "flaky [[500-once]] text"
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    batched = parse_spec(make_spec(tmp_path / "data", standin, batch_api=True))
    standin.advance(speed=FAST)
    instance = dg.DagsterInstance.ephemeral()
    assert run_pipeline(batched, tmp_path / "batched", ["a"], instance=instance).success

    got = vectors(batched, tmp_path / "batched")
    assert sorted(got) == sorted(texts)  # every row exactly once
    for doc_id, text in texts.items():
        assert np.array_equal(got[doc_id], np.asarray(embedding(text), dtype=np.float32)), doc_id
    stats = standin.stats()
    # the 500 went into a second batch; both batches are /v1/embeddings ones; nothing was sent online
    assert stats["batches_created"] == 2 and {b["endpoint"] for b in stats["batches"]} == {"/v1/embeddings"}
    assert stats["calls"].get("POST /v1/embeddings", 0) == 0
    md = inferred_metadata(instance, "vectors")
    assert (md["batches_submitted"], md["batch_rows"]) == (2, 10)
    assert md["batch_tokens_in"] > 0
    assert md["cost_usd"] == pytest.approx(md["batch_tokens_in"] * PRICE_IN / 2 / 1e6, abs=1e-6)

    # the same rows online: the very same vectors (the flaky row's marker answered at once now)
    online = parse_spec(make_spec(tmp_path / "data", standin, name="vectors"))
    assert run_pipeline(online, tmp_path / "online", ["a"]).success
    assert {k: v.tolist() for k, v in vectors(online, tmp_path / "online").items()} == \
        {k: v.tolist() for k, v in got.items()}


def test_a_refused_row_stops_the_partition_naming_it(tmp_path: Path, standin: StandinProcess):
    texts = {"d0": "fine", "d1": "refused [[400]] text", "d2": "also fine"}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", standin, batch_api=True)
    raw["retries"] = {"max_retries": 0}
    spec = parse_spec(raw)
    standin.advance(speed=FAST)
    result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    message = step_error(result)
    assert "row 'd1' got no embedding" in message and "HTTP 400" in message, message
    assert standin.stats()["batches_created"] == 1
    with pytest.raises(FileNotFoundError):
        read_output(spec, tmp_path / "store", "a")
