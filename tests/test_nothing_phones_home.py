"""Nothing phones home, and every process exits (issue 23, item 4), with a user's environment.

The product's processes run as a user runs them, in a copy of the project (tests.daemon_helpers.project_copy) with
the user's own pipeline files in its batch_assets/pipelines/ (so the Component pipelines load too), with exactly a
user's environment (tests.conftest.user_env: no `CI`, no thread caps, no test-only daemon patch), a fresh home
folder (no ~/intel consent file: OpenVINO counts that as consent) and a cold ONNX export cache (the export and
OpenVINO's first load run): an embedding run and an API run (`dg launch`), then `make ui` (the webserver and the
daemon) with a sensor tick, a schedule tick and a backfill, each making its run. This is also the end-to-end test of
each launch path with exactly a user's environment (issue 23, item 5): no `CI`, no thread caps, Dagster's own 30 s
backfill-daemon interval and 5 s run queue, Component pipelines on (no BATCH_PIPELINES_DIR). Every Python process
and its forks carry an audit hook (tests/daemon_site/net_audit.py) that records each name look-up of, or connection
to, a host that is not this machine; the test asserts there was none, and that every process exited.

Shown red once: with the line `import batch_assets.resources.telemetry` taken out of batch_assets/__init__.py and
resources/__init__.py, the audit recorded OpenVINO's `www.google-analytics.com` request and look-up from the child
forked in the `dg launch` process and from the code server (`dagster api grpc`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import DAEMON_GROUP, EMBED_SPEC, docs_rows, free_port, user_env, write_csv, write_jsonl
from tests.daemon_helpers import ROOT, graphql, log_tail, project_copy, wait_for, wait_ready, with_net_audit
from batch_assets.resources.telemetry import OFF_SWITCHES
from tests.daemon_site import net_audit

DG = str(Path(sys.executable).with_name("dg"))
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts `make ui`


def _outside(audit: Path) -> list[dict]:
    return [r for r in net_audit.read(str(audit)) if r["kind"] == "outside"]


def _still_running(pids: set[int]) -> dict[int, str]:
    """The pids (of the audit's `start` lines) that are still a live process, with their command lines."""
    alive = {}
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != "Z":  # a zombie has exited; only its parent's bookkeeping is left
            alive[pid] = command
    return alive


def test_no_process_reaches_outside_and_every_process_exits(tmp_path: Path, llama_server) -> None:
    project = project_copy(tmp_path / "project")
    for name in ("Makefile", "constraints.txt"):
        (project / name).symlink_to(ROOT / name)
    pipelines = project / "batch_assets" / "pipelines"
    shutil.rmtree(pipelines)  # the user's own pipelines, not the examples (their sensors would queue LLM runs)
    pipelines.mkdir()
    data = tmp_path / "data"
    write_jsonl(data / "docs" / "a.jsonl", docs_rows("a", 6))
    embed = {**EMBED_SPEC, "source": {**EMBED_SPEC["source"], "path": f"{data}/docs/{{partition}}.jsonl"}}
    write_csv(data / "companies" / "p0.csv", ["customer_id", "company"], [["c1", "Acme Law LLP"], ["c2", "MedCare"]])
    api = {
        "name": "companies_api",
        "source": {"format": "csv", "path": f"{data}/companies/{{partition}}.csv",
                   "columns": ["customer_id", "company"]},
        "partitioning": {"kind": "static", "keys": ["p0"]},
        "prepare": {"id_column": "customer_id", "template": "Industry of {company}? One word."},
        "task": {"kind": "generate", "params": {"max_new_tokens": 4, "temperature": 0}},
        "model": {"provider": "openai", "config": {"model": "smollm2", "base_url": {"env": "OPENAI_BASE_URL"},
                                                   "api_key": {"env": "OPENAI_API_KEY"}}},
    }
    inbox = {
        "name": "inbox_docs",
        "source": {"format": "jsonl", "path": f"{data}/inbox/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "dynamic"},
        "prepare": {"id_column": "doc_id", "text_column": "text"},
        "task": {"kind": "embed"},
        "model": {"provider": "sentence_transformers"},
        "sensor": {"min_age_seconds": 0, "interval_seconds": 5},
    }
    today = dt.datetime.now(dt.timezone.utc).date()
    days = [str(today - dt.timedelta(days=n)) for n in (2, 1, 0)]  # today's too, in case UTC midnight passes
    for day in days:
        write_jsonl(data / "days" / f"{day}.jsonl", docs_rows(f"{day}-", 2))
    daily = {**{k: v for k, v in inbox.items() if k != "sensor"}, "name": "daily_docs",
             "schedule": {"cron": "* * * * *"},  # a tick every minute
             "source": {**inbox["source"], "path": f"{data}/days/{{partition}}.jsonl"},
             "partitioning": {"kind": "daily", "start_date": days[0]}}
    for spec in (embed, api, inbox, daily):
        (pipelines / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    home, dagster_home = tmp_path / "user-home", project / ".dagster_home"
    home.mkdir()
    dagster_home.mkdir()
    shutil.copyfile(project / "dagster.yaml", dagster_home / "dagster.yaml")  # as README says (and `make ui` does)
    audit = tmp_path / "net-audit.jsonl"
    env = with_net_audit(user_env(
        HOME=str(home), DAGSTER_HOME=str(dagster_home),
        BATCH_ONNX_CACHE=str(tmp_path / "onnx-cache"),  # cold: the export and OpenVINO's first compile run here
        XDG_CACHE_HOME=str(home / ".cache"), HF_HOME=str(home / ".cache" / "huggingface"),
        OPENAI_BASE_URL=llama_server.base_url, OPENAI_API_KEY="sk-local"), audit)
    assert not {"CI", *OFF_SWITCHES} & set(env)  # nothing kinder than a user's shell

    # 1. an embedding run and 2. an API run, each through the CLI, in the terminal
    for group, partition in (("docs", "a"), ("companies_api", "p0")):
        cli = subprocess.run([DG, "launch", "--assets", f"group:{group}", "--partition", partition], cwd=project,
                             env=env, capture_output=True, text=True, timeout=600)
        assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    store = project / "data" / "storage"
    assert len(pq.read_table(store / "docs" / "output" / "a.parquet")) == 6
    assert len(pq.read_table(store / "companies_api" / "output" / "p0.parquet")) == 2
    infer = _materialization(dagster_home, ["docs", "inferred"], "a")
    assert infer.metadata["backend"].value in ("openvino", "onnx"), infer.metadata["backend"]  # the export ran
    assert any((tmp_path / "onnx-cache").iterdir())

    # 3. `make ui` (the webserver and the daemon): a new file in the inbox, the sensor's tick, its run
    port, log = free_port(), tmp_path / "make-ui.log"
    with open(log, "w") as out:
        # `-o`: the set-up step is taken as done (it is: the checkout's .venv), never re-run from the copy, which
        # would point the shared .venv's editable install at this temporary folder
        ui = subprocess.Popen(["make", "--no-print-directory", "-o", ".venv/.installed-core", "ui",
                               f"UI_PORT={port}"], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_ready(port, ui, log, seconds=180)
        groups = {n["groupName"] for n in graphql(port, "{ assetNodes { groupName } }")["assetNodes"]}
        # the user's pipeline files and the shipped Component pipeline
        assert {"docs", "companies_api", "inbox_docs", "daily_docs", "document_search"} <= groups, groups
        write_jsonl(data / "inbox" / "drop-1.jsonl", docs_rows("d", 3))
        write_jsonl(data / "docs" / "b.jsonl", docs_rows("b", 4))
        # 4. a backfill through the daemon, which picks it up at Dagster's own interval (30 s: no test patch here)
        backfill = subprocess.run([sys.executable, "-m", "batch_assets.commands.backfill", "docs", "--partitions",
                                   "b"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert backfill.returncode == 0, backfill.stdout[-2000:] + backfill.stderr[-2000:]
        with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            def finished(launched_by: str):
                runs = [r for r in instance.get_runs() if r.tags.get("batch/launched_by") == launched_by
                        or launched_by == "backfill" and r.tags.get("dagster/backfill")]
                return runs[0] if runs and runs[0].is_finished else None

            for launched_by in ("sensor", "schedule", "backfill"):
                run = wait_for(f"the {launched_by}'s run to finish", lambda by=launched_by: finished(by), log, 400, 2)
                assert run.status == dg.DagsterRunStatus.SUCCESS, (launched_by, log_tail(log, 4000))
                if launched_by == "schedule":
                    scheduled_day = run.tags["dagster/partition"]
        assert len(pq.read_table(store / "inbox_docs" / "output" / "drop-1.parquet")) == 3
        assert len(pq.read_table(store / "daily_docs" / "output" / f"{scheduled_day}.parquet")) == 2
        assert len(pq.read_table(store / "docs" / "output" / "b.parquet")) == 4

        # Ctrl-C in the terminal: SIGINT to the foreground process group; every process of it exits
        os.killpg(ui.pid, signal.SIGINT)
        stopped_at = time.monotonic()
        try:
            ui.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("`make ui` still running 120 s after Ctrl-C:\n" + log_tail(log)) from None
        deadline = time.monotonic() + 60
        while _group_alive(ui.pid) and time.monotonic() < deadline:
            time.sleep(1)
        assert not _group_alive(ui.pid), "processes of `make ui` left running after Ctrl-C:\n" + _ps(ui.pid)
        print(f"`make ui` and all its processes exited {time.monotonic() - stopped_at:.1f} s after Ctrl-C")
    finally:
        if _group_alive(ui.pid):
            os.killpg(ui.pid, signal.SIGKILL)
        ui.wait(timeout=30)

    records = net_audit.read(str(audit))
    started = {r["pid"] for r in records if r["kind"] == "start"}
    assert len(started) >= 10, records  # the CLI, step processes, webserver, daemon, code servers, run worker...
    outside = _outside(audit)
    print(f"{len(started)} Python processes (forks included) audited, {len(outside)} attempts to reach other hosts")
    assert not outside, "processes tried to reach other hosts:\n" + "\n".join(
        f"{r['argv']} pid {r['pid']}: {r['event']} {r['host']}\n{''.join(r['stack'][-4:])}" for r in outside[:10])
    assert not (home / "intel").exists(), sorted(p.name for p in (home / "intel").iterdir())
    time.sleep(1)  # a just-killed child is reaped by init within moments
    assert not _still_running(started), json.dumps(_still_running(started), indent=1)


def _materialization(home: Path, key: list[str], partition: str):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [record] = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(key), asset_partitions=[partition]), limit=1).records
        return record.asset_materialization


def _group_alive(sid: int) -> bool:
    """Whether a live process of the session (started with start_new_session) is left."""
    return bool(_ps(sid).strip())


def _ps(sid: int) -> str:
    """The session's live (non-zombie) processes, one `pid stat command` line each."""
    out = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(sid)], capture_output=True, text=True).stdout
    return "\n".join(line for line in out.splitlines() if not line.split()[1].startswith("Z"))
