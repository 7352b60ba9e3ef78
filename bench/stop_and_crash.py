"""What a stop and a crash cost, from the real CLI (issue 23): one 2,000-row partition of an OpenAI-compatible
pipeline against a loopback endpoint answering after 0.1 s (tests/resources/openai_api/fault_proxy.py), max_concurrency 16,
launched with `dg launch` in a user's environment (no CI). Ctrl-C and SIGTERM at 40%, SIGKILL at 50%; for each:
requests that reached the server after the stop (watched for 15 s), the process's exit time, the run's status, and
the requests of the first run plus a rerun. One JSON line per case.

    .venv/bin/python bench/stop_and_crash.py /tmp/stop-bench   # a new folder; ~2 min
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.resources.openai_api.fault_proxy import Echo, FaultProxy  # noqa: E402  (the checkout on the path first)
from tests.daemon_helpers import dagster_home
from tests.conftest import write_jsonl
import dagster as dg

DG = str(ROOT / ".venv/bin/dg")
ROWS = 2000
def run_case(tmp: Path, how: str, frac: float):
    tmp.mkdir(parents=True)
    data, pipes, store = tmp / "data", tmp / "pipes", tmp / "store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(ROWS)])
    pipes.mkdir()
    home = dagster_home(tmp / "home", shipped=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CI",)}
    env.update(DAGSTER_HOME=str(home), BATCH_PIPELINES_DIR=str(pipes), BATCH_STORAGE_ROOT=str(store), OPENAI_API_KEY="x")
    with FaultProxy(lambda k, n: Echo(delay_s=0.1)) as proxy:
        spec = {"name": "m", "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
                "partitioning": {"kind": "static", "keys": ["a"]}, "prepare": {"id_column": "doc_id", "template": "Say {text}"},
                "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
                "model": {"provider": "openai", "config": {"model": "echo", "base_url": proxy.url, "max_concurrency": 16}}}
        (pipes / "m.yaml").write_text(yaml.safe_dump(spec))
        def launch(log):
            return subprocess.Popen([DG, "launch", "--assets", "group:m", "--partition", "a"], cwd=ROOT, env=env,
                                    stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        p = launch(tmp / "first.log")
        while len(proxy.attempts) < frac * ROWS:
            assert p.poll() is None, (tmp / "first.log").read_text()[-2000:]
            time.sleep(0.02)
        t0 = time.time()
        {"ctrl_c": lambda: os.killpg(p.pid, signal.SIGINT), "sigterm": lambda: os.kill(p.pid, signal.SIGTERM),
         "sigkill": lambda: os.killpg(p.pid, signal.SIGKILL)}[how]()
        p.wait(); exit_s = time.time() - t0
        time.sleep(15)  # the issue counted requests 10-15 s after the stop
        after = [a for a in proxy.attempts if a.arrived > t0]
        first = len(proxy.attempts)
        with dg.DagsterInstance.from_config(str(home)) as inst:
            status = inst.get_runs()[0].status.value
        t1 = time.time(); q = launch(tmp / "second.log"); q.wait(); rerun_s = time.time() - t1
        total = len(proxy.attempts)
    print(json.dumps({"case": how, "at": frac, "requests_after_stop": len(after),
                      "last_after_s": round(max((a.arrived - t0 for a in after), default=0), 2),
                      "exit_s": round(exit_s, 2), "status": status, "first_run_requests": first,
                      "rerun_rc": q.returncode, "total_requests": total, "rows": ROWS}), flush=True)

base = Path(sys.argv[1])
for how, frac in (("ctrl_c", 0.4), ("sigterm", 0.4), ("sigkill", 0.5)):
    run_case(base / how, how, frac)
