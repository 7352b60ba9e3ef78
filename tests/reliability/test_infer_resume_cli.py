"""SIGKILL of a real `dagster asset materialize` mid-inference, then a rerun: committed chunks are not recomputed
(the model's calls are counted in a file by the model class itself) and the output equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.spec import parse_spec
from tests.conftest import docs_rows, run_pipeline, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
pytestmark = pytest.mark.slow

MODEL = textwrap.dedent(
    '''
    import json, os, time


    class CountingModel:
        """Appends the ids of every call to `calls_path` before answering, slowly enough to be killed mid-way."""

        def __init__(self, calls_path, delay_s=0.0):
            self.calls_path, self.delay_s = calls_path, delay_s

        def __call__(self, batch):
            with open(self.calls_path, "a") as f:
                f.write(json.dumps(batch["doc_id"]) + "\\n")
                f.flush()
                os.fsync(f.fileno())
            time.sleep(self.delay_s)
            return [f"{d}:{len(t)}" for d, t in zip(batch["doc_id"], batch["text"])]
    '''
)
ROWS, CHUNK = 40, 5


def _spec(data: Path, calls: Path, delay_s: float) -> dict:
    return {
        "name": "resume",
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id"},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": "counting_model:CountingModel",
                                                   "init_kwargs": {"calls_path": str(calls), "delay_s": delay_s}}},
        "runtime": {"chunk_rows": CHUNK},
    }


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sigkill_mid_inference_then_rerun_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, pipelines, store, user = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store", tmp_path / "user"
    write_jsonl(data / "a.jsonl", docs_rows("a", ROWS))
    user.mkdir()
    (user / "counting_model.py").write_text(MODEL)
    pipelines.mkdir()
    calls = tmp_path / "calls.jsonl"
    (pipelines / "resume.yaml").write_text(yaml.safe_dump(_spec(data, calls, delay_s=0.5)))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store), "PYTHONPATH": os.pathsep.join([str(user), str(ROOT)])}
    command = [DAGSTER, "asset", "materialize", "-m", "batch_assets.definitions", "--select", "group:resume",
               "--partition", "a"]

    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(_calls(calls)) < 4 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        assert first.poll() is None, "the run ended before it could be killed"
        os.killpg(first.pid, signal.SIGKILL)  # the CLI and its step processes, mid-inference
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    (staged,) = list((store / "resume" / "_staging" / "inferred" / "a").iterdir())
    committed = {int(k) for k in json.loads((staged / "manifest.json").read_text())["chunks"]}
    calls_before = _calls(calls)
    assert committed and len(committed) < ROWS // CHUNK
    assert not (store / "resume" / "output" / "a.parquet").exists()

    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]

    chunk_of = {f"a{i}": i // CHUNK for i in range(ROWS)}
    rerun_chunks = [chunk_of[ids[0]] for ids in _calls(calls)[len(calls_before):]]
    assert not set(rerun_chunks) & committed  # committed chunks were not recomputed
    assert sorted(rerun_chunks) == sorted(set(range(ROWS // CHUNK)) - committed)  # the rest, once each
    repeated = len(calls_before) - len(committed)  # calls the kill interrupted before their commit
    assert repeated <= 2

    resumed = pq.read_table(store / "resume" / "output" / "a.parquet")
    monkeypatch.syspath_prepend(str(user))
    uninterrupted_spec = parse_spec(_spec(data, tmp_path / "calls-uninterrupted.jsonl", delay_s=0.0))
    assert run_pipeline(uninterrupted_spec, tmp_path / "store2", ["a"]).success
    uninterrupted = pq.read_table(tmp_path / "store2" / "resume" / "output" / "a.parquet")
    assert resumed.equals(uninterrupted)
    assert resumed.num_rows == ROWS and len(set(resumed.column("doc_id").to_pylist())) == ROWS
    assert not (store / "resume" / "_staging" / "inferred" / "a").exists()  # removed after publish
    print(f"SIGKILL resume: {len(committed)} of {ROWS // CHUNK} chunks committed before the kill, "
          f"{len(rerun_chunks)} computed by the rerun, {repeated} model calls repeated, 0 rows lost or repeated")
