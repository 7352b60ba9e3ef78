"""The benchmark harness (`make bench`) runs end to end at tiny sizes: our pipeline through the real Dagster CLI,
the raw script, the loopback API server. It measures; this test only checks that it produces its figures, never
what they are. Daft and Ray (their own virtualenv) are left out here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_bench_harness_at_tiny_sizes(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_PROFILE": "tiny", "BENCH_PEERS": "0", "BENCH_SECTIONS": "api,embed",
           "BENCH_REPEATS": "1", "BENCH_API_REQUESTS": "24", "BENCH_DOCS": "24", "BENCH_WORK": str(tmp_path / "work"),
           "BENCH_RESULTS": str(tmp_path / "results"), "BENCH_DOC": str(tmp_path / "BENCHMARKS.md")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    api = json.loads((tmp_path / "results" / "api.json").read_text())
    ours = api["variants"]["ours (64 in flight)"]
    assert ours["failed_runs"] == 0 and ours["requests"]["median"] == 24  # every row reached the server once
    assert 0 < ours["max_in_flight"]["median"] <= 64
    assert api["ratios"]["ours_vs_ideal"] is not None
    wide = api["variants"]["ours (1000 in flight)"]  # beside Daft: every request of the run may be in flight
    assert wide["failed_runs"] == 0 and wide["requests"]["median"] == 24
    assert api["client_cpu"]["ours"]["cpu_ms_per_request"] > 0  # the infer step alone, in its own process

    embed = json.loads((tmp_path / "results" / "embed.json").read_text())
    assert all(v["failed_runs"] == 0 for v in embed["variants"].values())
    assert embed["variants"]["ours (dagster asset materialize)"]["model_loads"]["median"] == 1
    assert embed["ratios"]["ours_vs_raw_whole_process"] and embed["ratios"]["ours_infer_step_vs_raw_encode"]
    # the declared fast mode beside the raw script, and its vectors compared with the raw script's
    assert embed["ratios"]["ours_fast_vs_raw_whole_process"]
    assert embed["fast_fidelity"]["rows"] == 24 and 0 < embed["fast_fidelity"]["recall_at_10"] <= 1
    assert api["ratios"]["ours_wide_vs_ideal"] is not None

    doc = (tmp_path / "BENCHMARKS.md").read_text()
    assert "#### Targets" in doc and "#### Embeddings" in doc and "#### API path" in doc


def test_bench_transcribe_section_at_tiny_size(tmp_path: Path) -> None:
    """`BENCH_SECTIONS=transcribe make bench` at one rendition of the speech corpus (24 files), without the peers:
    both variants transcribe every file, and each one's word error rate is read back from what it wrote."""
    env = {**os.environ, "BENCH_PROFILE": "tiny", "BENCH_PEERS": "0", "BENCH_SECTIONS": "transcribe",
           "BENCH_REPEATS": "1", "BENCH_SPEECH_COPIES": "1", "BENCH_WORK": str(tmp_path / "work"),
           "BENCH_RESULTS": str(tmp_path / "results"), "BENCH_DOC": str(tmp_path / "BENCHMARKS.md")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = json.loads((tmp_path / "results" / "transcribe.json").read_text())
    assert section["files"] == 24 and section["audio_s"] > 60
    for name, variant in section["variants"].items():
        assert variant["failed_runs"] == 0, (name, variant.get("error_tail"))
        assert variant["wer"]["missing_files"] == 0 and variant["wer"]["value"] < 0.3, (name, variant["wer"])
    assert section["variants"]["ours (dagster asset materialize)"]["model_loads"]["median"] == 1
    assert section["ratios"]["ours_vs_raw_whole_process"]
    assert "#### Transcription" in (tmp_path / "BENCHMARKS.md").read_text()
