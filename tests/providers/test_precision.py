"""The encoders' declared fast mode (`precision: fast`, resources/hf/precision.py): exact stays the default and
torch's vectors; fast runs bfloat16 only where the retrieval probe keeps recall@10 >= 0.99 against the exact vectors,
says so (and the measured fidelity) in the metadata, never shares checkpoints with exact, and is refused where the
probe finds neighbours reordered."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from batch_assets.reliability.checkpoint import fingerprint
from batch_assets.resources.hf import precision
from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder
from batch_assets.resources.hf.onnx_encoder import min_cosine
from batch_assets.spec import parse_spec

# Documents a user would search: near neighbours by topic, different wording (not the probe's corpus).
DOCS = [f"{subject} {verb} {obj}" for subject in ("The bank", "A startup", "The city council", "Our team",
                                                  "The hospital", "A farmer")
        for verb in ("raised money for", "cut the budget of", "opened a new office for", "hired staff for")
        for obj in ("solar panels.", "a football club.", "cancer research.", "public libraries.", "river cleanup.")]


@pytest.fixture(scope="module")
def exact_and_fast() -> tuple[SentenceTransformerEmbedder, SentenceTransformerEmbedder]:
    exact = SentenceTransformerEmbedder(device="cpu").load_for_tests()
    fast = SentenceTransformerEmbedder(device="cpu", precision="fast").load_for_tests()
    return exact, fast


def spec_for(config: dict) -> object:
    return parse_spec({
        "name": "precision",
        "source": {"format": "jsonl", "path": "/nowhere/{partition}.jsonl", "columns": ["id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "id", "text_column": "text"}, "task": {"kind": "embed"},
        "model": {"provider": "sentence_transformers", "config": config},
    })


def test_exact_is_the_default_and_fast_runs_bf16_only_where_the_probe_passes(exact_and_fast) -> None:
    exact, fast = exact_and_fast
    assert exact.describe()["precision"] == "exact" and exact.backend_used in ("openvino", "onnx")
    torch_ = SentenceTransformerEmbedder(device="cpu", backend="torch").load_for_tests()
    assert min_cosine(exact.embed(DOCS), torch_.embed(DOCS)) >= 0.9999  # the default is torch's vectors

    md = fast.describe()
    if not precision.cpu_has_bf16():  # a CPU without bfloat16: nothing to gain, exact it is, and it says why
        assert fast.backend_used == exact.backend_used and md["precision"] == "exact (fast refused)"
        assert "no bfloat16" in md["precision_reason"]
        return
    assert fast.backend_used == "openvino-bf16"
    assert md["precision"] == "fast (bf16)" and md["backend"] == "openvino-bf16"
    # the fidelity the decision rests on is in the metadata
    assert md["precision_recall_at_10"] >= precision.RECALL_MIN and md["precision_probe_texts"] >= 500
    assert 0.99 < md["precision_min_cosine"] < 1.0  # really another precision, and close
    # on documents the probe never saw, retrieval is what exact gives
    ours, reference = fast.embed(DOCS), exact.embed(DOCS)
    assert precision.recall_at_k(reference, ours) >= 0.95
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-3)
    # chunks computed fast are never reused by an exact run, nor the other way round
    assert fingerprint(spec_for({"device": "cpu"}), exact) != fingerprint(spec_for({"device": "cpu"}), fast)


def test_a_probe_below_the_bar_keeps_exact_and_says_why(exact_and_fast, monkeypatch) -> None:
    exact, _ = exact_and_fast
    encoder = exact.loaded
    if not precision.cpu_has_bf16():
        pytest.skip("this CPU computes no bfloat16: fast is refused before any probe (the test above)")
    # bf16 keeps recall@10 near 0.994 on every corpus tried (prose, numbers, ids, codes); a bar above that is one it
    # cannot meet: the real probe, measured, must then say no
    monkeypatch.setattr(precision, "RECALL_MIN", 0.999)
    twins = [f"Invoice number {i} for order {i * 7 % 101} was paid." for i in range(400)]
    found = precision.measure(encoder.exported, twins)
    assert found.recall_at_10 is not None and found.recall_at_10 < 0.999 and not found.usable
    monkeypatch.setattr(precision, "verdict", lambda exported: found)
    chosen, backend, why, verdict = precision.choose(encoder, exact.backend_used, "auto", "auto")
    assert chosen is encoder and backend == exact.backend_used and verdict is found  # the exact encoder, as loaded
    md = precision.describe(verdict, "fast")
    assert md["precision"] == "exact (fast refused)" and md["precision_recall_at_10"] == found.recall_at_10
    assert "recall@10" in md["precision_reason"] and "< 0.999" in md["precision_reason"]


def test_the_probe_is_measured_once_and_kept_beside_the_export(exact_and_fast, tmp_path: Path) -> None:
    exact, _ = exact_and_fast
    if not precision.cpu_has_bf16():
        pytest.skip("this CPU computes no bfloat16: no probe runs")
    # a copy of the export, so this test measures into its own folder
    exported = exact.loaded.exported
    shutil.copytree(exported.folder, tmp_path / "export", ignore=shutil.ignore_patterns("precision-*"))
    copy = dataclasses.replace(exported, folder=tmp_path / "export")
    first = precision.verdict(copy)
    kept = list((tmp_path / "export").glob("precision-*.json"))
    assert len(kept) == 1 and first.usable and first.probe_texts >= 500
    written = kept[0].stat().st_mtime_ns
    again = precision.verdict(copy)  # read back, not measured again
    assert again == first and kept[0].stat().st_mtime_ns == written
    assert list((tmp_path / "export").glob(".precision-*")) == []  # no temporary file left


def test_fast_with_a_pinned_torch_or_onnx_backend_is_a_load_error() -> None:
    for backend in ("torch", "onnx"):
        with pytest.raises(Exception, match="precision 'fast' runs the OpenVINO export"):
            SentenceTransformerEmbedder(device="cpu", backend=backend, precision="fast").load_for_tests()
