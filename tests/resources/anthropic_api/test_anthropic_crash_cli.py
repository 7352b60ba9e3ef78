"""Message Batches never submitted twice, and a user's stop, through the real `dg launch` with a user's environment
against the Anthropic stand-in (its own process, its clock held still by the test):

- SIGKILL while the batch runs, with the ledger then missing the batch id (as a kill right after `create` would
  leave it): Anthropic batches carry no token, so the rerun finds it by its request count among the batches created
  since the intent, re-attaches, and every row comes back once from the one batch;
- Ctrl-C while the batch runs: the run ends CANCELED and the batch is canceled at the provider; the rerun submits
  only the requests the canceled batch never ran.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import dagster as dg
import pytest

from tests.resources.anthropic_api.anthropic_standin import PER_REQUEST_S
from tests.resources.conftest import StandinProcess
from tests.resources.openai_api.test_batch_crash_cli import ROWS, _finish, _kill, _launch, _output_ids, _submissions, \
    _wait_observed
from tests.resources.openai_api.test_batch_crash_cli import _setup as setup
from tests.daemon_helpers import wait_for

pytestmark = pytest.mark.slow


def _setup(tmp_path: Path, standin: StandinProcess, name: str, shipped: bool = False) -> tuple[dict, dict, Path]:
    return setup(tmp_path, standin, name, shipped, model={"provider": "anthropic", "config": {
        "model": "claude-standin", "base_url": standin.root, "api_key": {"env": "STANDIN_KEY"}, "batch_api": True,
        "batch_poll_interval_s": 0.2}})


def test_sigkill_with_the_batch_id_lost_then_a_rerun_finds_it_and_never_submits_twice(tmp_path: Path,
                                                                                      anthropic_standin) -> None:
    standin = anthropic_standin
    name = "claude_killed"
    raw, env, ledger = _setup(tmp_path, standin, name)
    log = tmp_path / "first.log"
    proc = _launch(name, env, log)
    wait_for("the batch to be submitted and written down",
             lambda: proc.poll() is None and any(s["batch_id"] for s in _submissions(ledger)), log, 240, 0.1)
    standin.advance(ROWS / 2 * PER_REQUEST_S)  # half of the requests done: the batch is in progress
    _kill(proc)
    [batch] = standin.stats()["batches"]
    assert batch["processing_status"] == "in_progress"
    [path] = sorted(ledger.glob("submission-*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "batch_id": None}))

    standin.advance(speed=100_000)
    log = tmp_path / "rerun.log"
    rerun = _launch(name, env, log)
    out = _finish(rerun, log)
    assert rerun.returncode == 0, out[-3000:]
    stats = standin.stats()
    print(f"SIGKILL in progress, batch id lost, rerun: {stats['batches_created']} batch(es), "
          f"{stats['calls'].get('GET /v1/messages/batches', 0)} list call(s)")
    assert stats["batches_created"] == 1, "rows were submitted twice"
    assert stats["calls"].get("GET /v1/messages/batches", 0) >= 1  # found by listing, not by its id
    assert stats["messages"] == 0
    assert _output_ids(raw, Path(env["BATCH_STORAGE_ROOT"])) == sorted(f"d{i}" for i in range(ROWS))
    assert not ledger.exists()


def test_ctrl_c_cancels_the_message_batch_and_the_rerun_asks_only_for_what_never_ran(tmp_path: Path,
                                                                                    anthropic_standin) -> None:
    standin = anthropic_standin
    name = "claude_stopped"
    raw, env, ledger = _setup(tmp_path, standin, name, shipped=True)
    log = tmp_path / "first.log"
    proc = _launch(name, env, log)
    wait_for("the batch to be submitted", lambda: standin.stats()["batches_created"] == 1, log, 240, 0.1)
    standin.advance(4.5 * PER_REQUEST_S)  # 4 of 12 requests done
    _wait_observed(name, env["DAGSTER_HOME"], log)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    out = _finish(proc, log, timeout=120)
    assert proc.returncode != 0, out[-3000:]
    [batch] = standin.stats()["batches"]
    assert batch["processing_status"] == "canceling" and batch["cancel_initiated_at"], batch
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.CANCELED, out[-3000:]

    standin.advance(speed=100_000)  # the cancel completes; the rerun's batch runs through
    log = tmp_path / "rerun.log"
    rerun = _launch(name, env, log)
    out = _finish(rerun, log)
    assert rerun.returncode == 0, out[-3000:]
    stats = standin.stats()
    counts = sorted((b["request_counts"]["succeeded"], b["request_counts"]["canceled"]) for b in stats["batches"])
    assert counts == [(4, ROWS - 4), (ROWS - 4, 0)], counts  # the rerun asked only for the 8 never run
    assert _output_ids(raw, Path(env["BATCH_STORAGE_ROOT"])) == sorted(f"d{i}" for i in range(ROWS))
