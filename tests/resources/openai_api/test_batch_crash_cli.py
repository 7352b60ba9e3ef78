"""Never submitted twice, and waiting that holds nothing, through the real `dg launch` with a user's environment
against the Batch API stand-in (a process of its own, its clock held still by the test):

- SIGKILL while the batch is validating (and the ledger then loses the batch id, as a kill right after `create`
  would leave it), in_progress and finalizing, each followed by a rerun that re-attaches: one batch and one upload
  in all, every row once;
- Ctrl-C while the batch runs: the run ends CANCELED and its batch is cancelled at the provider; while it waited,
  the infer asset showed the batch's status in the UI (observations) and held no endpoint pool slot; the rerun
  submits only what the cancelled batch never ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.resources.conftest import API_KEY, StandinProcess
from tests.resources.openai_api.standin import FINALIZE_S, PER_REQUEST_S, VALIDATE_S
from tests.conftest import read_output, user_env, write_jsonl
from tests.daemon_helpers import ROOT, dagster_home, wait_for

DG = str(Path(sys.executable).with_name("dg"))
ROWS = 12
pytestmark = pytest.mark.slow


def _setup(tmp_path: Path, standin: StandinProcess, name: str, shipped: bool = False,
           model: dict | None = None) -> tuple[dict, dict, Path]:
    """A pipeline of ROWS rows in batch mode (`model`: the spec's model section; OpenAI's stand-in by default), its
    Dagster home and a user's environment; returns (spec, env, the partition's ledger folder)."""
    data, pipelines, store = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(ROWS)])
    raw = {
        "name": name,
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "template": "Say {text}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": 8}},
        "model": model or {"provider": "openai", "config": {
            "model": "gpt-standin", "base_url": standin.url, "api_key": {"env": "STANDIN_KEY"}, "batch_api": True,
            "batch_poll_interval_s": 0.2}},
        "runtime": {"chunk_rows": 4},
    }
    pipelines.mkdir()
    (pipelines / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    home = dagster_home(tmp_path / "home", shipped=shipped)
    env = user_env(DAGSTER_HOME=str(home), BATCH_PIPELINES_DIR=str(pipelines), BATCH_STORAGE_ROOT=str(store),
                   STANDIN_KEY=API_KEY)
    return raw, env, store / name / "_staging" / "inferred-batches" / "a"


def _launch(name: str, env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([DG, "launch", "--assets", f"group:{name}", "--partition", "a"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail(f"the run did not end within {timeout:.0f}s:\n{log.read_text()[-3000:]}")
    return log.read_text()


def _submissions(ledger: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(ledger.glob("submission-*.json"))] if ledger.exists() else []


def _wait_observed(name: str, home: str, log: Path) -> list[dict]:
    """The infer asset's observations (the batch's progress in the UI), once one shows a batch in progress."""
    key = dg.AssetKey([name, "inferred"])

    def observed() -> list[dict]:
        with dg.DagsterInstance.from_config(home) as instance:
            records = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key), limit=20).records
            return [{k: v.value for k, v in r.asset_observation.metadata.items()} for r in records]

    return wait_for("the batch's progress in the UI", lambda: [o for o in observed() if "in_progress" in
                                                               str(o.get("status"))], log, 240, 0.2)


def _output_ids(raw: dict, store: Path) -> list[str]:
    from batch_assets.spec import parse_spec

    return sorted(read_output(parse_spec(raw), store, "a").column("doc_id").to_pylist())


def test_sigkill_at_each_status_then_a_rerun_reattaches_and_never_submits_twice(tmp_path: Path,
                                                                               standin: StandinProcess) -> None:
    name = "batch_killed"
    raw, env, ledger = _setup(tmp_path, standin, name)
    store = Path(env["BATCH_STORAGE_ROOT"])

    log = tmp_path / "validating.log"
    proc = _launch(name, env, log)
    wait_for("the batch to be submitted and written down",
             lambda: proc.poll() is None and any(s["batch_id"] for s in _submissions(ledger)), log, 240, 0.1)
    [batch] = standin.stats()["batches"]
    assert batch["status"] == "validating"
    _kill(proc)
    # as if the kill had come between `create` and the ledger write: the rerun must find the batch by its token
    [path] = sorted(ledger.glob("submission-*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "batch_id": None}))

    polls = f"GET /v1/batches/{{batch_id}}"
    for status, advance_s in (("in_progress", VALIDATE_S + 1), ("finalizing", ROWS * PER_REQUEST_S)):
        standin.advance(advance_s)
        assert [b["status"] for b in standin.stats()["batches"]] == [status]
        before = standin.calls(polls)
        log = tmp_path / f"{status}.log"
        proc = _launch(name, env, log)
        wait_for(f"the rerun to re-attach at {status}", lambda: standin.calls(polls) >= before + 2, log, 240, 0.1)
        assert proc.poll() is None, log.read_text()[-3000:]
        _kill(proc)

    standin.advance(FINALIZE_S)
    log = tmp_path / "last.log"
    last = _launch(name, env, log)
    out = _finish(last, log)
    assert last.returncode == 0, out[-3000:]
    stats = standin.stats()
    print(f"SIGKILL at validating, in_progress and finalizing, then a rerun: {stats['batches_created']} batch(es), "
          f"{stats['files_uploaded']} upload(s), {stats['calls'].get('GET /v1/batches', 0)} lookups by token")
    assert (stats["batches_created"], stats["files_uploaded"]) == (1, 1), "rows were submitted twice"
    assert stats["calls"].get("GET /v1/batches", 0) >= 1  # the lost batch id was found by its token
    assert stats["calls"].get("POST /v1/chat/completions", 0) == 0
    assert _output_ids(raw, store) == sorted(f"d{i}" for i in range(ROWS))
    assert not ledger.exists()  # every row committed: the ledger is gone


def test_ctrl_c_cancels_the_batch_and_the_wait_showed_progress_without_a_pool_slot(tmp_path: Path,
                                                                                 standin: StandinProcess) -> None:
    name = "batch_stopped"
    raw, env, ledger = _setup(tmp_path, standin, name, shipped=True)  # the shipped instance: pools, run retries
    store = Path(env["BATCH_STORAGE_ROOT"])
    home = env["DAGSTER_HOME"]
    log = tmp_path / "first.log"
    proc = _launch(name, env, log)
    wait_for("the batch to be submitted", lambda: standin.stats()["batches_created"] == 1, log, 240, 0.1)
    standin.advance(VALIDATE_S + 4.5 * PER_REQUEST_S)  # 4 of 12 requests done
    seen = _wait_observed(name, home, log)
    assert seen[0]["requests_completed"] == 4 and seen[0]["requests_total"] == ROWS, seen
    with dg.DagsterInstance.from_config(home) as instance:
        pool = "endpoint:" + standin.url.split("//")[1].split("/")[0]
        assert not instance.event_log_storage.get_concurrency_info(pool).claimed_slots  # waiting holds no slot

    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    out = _finish(proc, log, timeout=120)
    assert proc.returncode != 0, out[-3000:]
    [batch] = standin.stats()["batches"]
    assert batch["status"] in ("cancelling", "cancelled"), batch
    with dg.DagsterInstance.from_config(home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.CANCELED, out[-3000:]

    standin.advance(speed=100_000)  # the cancel completes; the rerun's batch runs through
    log = tmp_path / "rerun.log"
    rerun = _launch(name, env, log)
    out = _finish(rerun, log)
    assert rerun.returncode == 0, out[-3000:]
    stats = standin.stats()
    assert stats["statuses"] == {"cancelled": 1, "completed": 1}, stats["statuses"]
    totals = sorted(b["request_counts"]["total"] for b in stats["batches"])
    assert totals == [ROWS - 4, ROWS], totals  # the rerun asked only for the rows the cancelled batch never ran
    assert _output_ids(raw, store) == sorted(f"d{i}" for i in range(ROWS))
