"""A run of an OpenAI-compatible pipeline SIGKILLed mid-inference (an OOM kill, a closed laptop) never leaves its
endpoint pool slot held: the rerun, through the real `dg launch` and the project's dagster.yaml (pool limit 1),
frees it, marks the killed run failed, resumes from the committed chunks and completes. The model is SmolLM2 on
the real llama.cpp server, behind the fault proxy that counts requests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import write_jsonl
from tests.daemon_helpers import ROOT, dagster_home
from tests.resources.openai_api.fault_proxy import FaultProxy, Forward
from tests.resources.openai_api.llama_server import LlamaServer

DG = str(Path(sys.executable).with_name("dg"))
ROWS, CHUNK = 24, 4
pytestmark = pytest.mark.slow


def _spec(data: Path, base_url: str) -> dict:
    return {
        "name": "pooled",
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "template": "Repeat the word: {text}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
        "model": {"provider": "openai", "config": {"model": "smollm2", "base_url": base_url, "max_concurrency": 1,
                                                   "timeout_s": 30}},
        "runtime": {"chunk_rows": CHUNK},
        "retries": {"max_retries": 0},
    }


def _launch(env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([DG, "launch", "--assets", "group:pooled", "--partition", "a"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_a_killed_run_never_keeps_its_pool_slot(tmp_path: Path, llama_server: LlamaServer) -> None:
    data, pipelines, store = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"word{i}"} for i in range(ROWS)])
    pipelines.mkdir()
    home = dagster_home(tmp_path / "home")  # the project's dagster.yaml: every pool limited to 1 slot
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store), "OPENAI_API_KEY": "unused-by-llama-cpp"}
    with FaultProxy(lambda key, n: Forward(delay_s=0.2), upstream=llama_server.root) as proxy:
        (pipelines / "pooled.yaml").write_text(yaml.safe_dump(_spec(data, proxy.url)))
        first = _launch(env, tmp_path / "first.log")
        deadline = time.monotonic() + 240
        while len(proxy.attempts) < 2 * CHUNK + 2:  # two chunks committed, the third in the model
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run never reached its third chunk"
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        sent_before_kill = len(proxy.attempts)

        with dg.DagsterInstance.from_config(str(home)) as instance:
            [killed] = instance.get_runs()
            pool = "endpoint:" + proxy.url.split("//")[1].split("/")[0]
            held = instance.event_log_storage.get_concurrency_info(pool).claimed_slots
            assert killed.status == dg.DagsterRunStatus.STARTED and [s.run_id for s in held] == [killed.run_id]

        second = _launch(env, tmp_path / "second.log")
        try:
            second.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
            pytest.fail("the rerun did not finish: " + (tmp_path / "second.log").read_text()[-3000:])
        out = (tmp_path / "second.log").read_text()
        assert second.returncode == 0, out[-3000:]
        assert f"Freed the slot of pool '{pool}' held by run {killed.run_id}" in out, out[-3000:]
        resent = len(proxy.attempts) - sent_before_kill
        assert resent < ROWS, f"the rerun sent {resent} requests: it did not resume from the committed chunks"
        assert sent_before_kill + resent <= ROWS + CHUNK  # at most the chunk in the model when killed, twice

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
        assert not instance.event_log_storage.get_concurrency_info(pool).claimed_slots
    table = pq.read_table(store / "pooled" / "output" / "a.parquet")
    assert table.num_rows == ROWS and sorted(table.column("doc_id").to_pylist()) == sorted(f"d{i}" for i in
                                                                                          range(ROWS))
