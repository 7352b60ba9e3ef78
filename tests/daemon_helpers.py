"""Daemon helpers for tests: a code location for the daemon's own tick logic (schedules, sensors and backfills
evaluated by the functions `dagster-daemon` runs, against a test instance, on pipelines written to a temporary
folder), and the real `dagster dev` (webserver + daemon) as a process: start, wait until its GraphQL API serves
the code location, query it, poll for runs, stop it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
TERMINAL_RUN_STATUSES = ("SUCCESS", "FAILURE", "CANCELED")
T = TypeVar("T")

DEFS_TEMPLATE = '''
import dagster as dg

from batch_assets.orchestration.launch.paths import launch_definitions
from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_definitions
from batch_assets.spec import load_spec
from batch_assets.storage import ArrowStorage

specs = [load_spec(p) for p in {spec_paths!r}]
defs = dg.Definitions.merge(
    *[build_pipeline_definitions(s) for s in specs],
    *[launch_definitions(s) for s in specs],
    dg.Definitions(resources={{STORAGE_KEY: ArrowStorage(root={root!r})}}{executor}),
)
'''

LOGGER = logging.getLogger("batch_assets.tests.daemon")


def write_code_location(folder: Path, specs: list[dict[str, Any]], storage_root: Path,
                        in_process_executor: bool = True) -> Path:
    """A definitions file over `specs` (dicts as in a pipeline YAML). The in-process executor keeps tests fast;
    the backfill/schedule/sensor logic under test does not depend on the executor."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in specs:
        path = folder / f"{spec['name']}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        paths.append(str(path))
    defs_file = folder / f"defs_{folder.name}.py"
    defs_file.write_text(DEFS_TEMPLATE.format(
        spec_paths=paths, root=str(storage_root),
        executor=", executor=dg.in_process_executor" if in_process_executor else ""))
    return defs_file


@contextmanager
def daemon_workspace(instance, defs_file: Path) -> Iterator[Any]:
    """A WorkspaceProcessContext over the definitions file, as the daemon holds one."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.test_utils import InProcessTestWorkspaceLoadTarget, create_test_daemon_workspace_context
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=str(defs_file), attribute="defs",
                             working_directory=str(Path(__file__).resolve().parents[1])),
        location_name="batch_assets_test",
    )
    with create_test_daemon_workspace_context(InProcessTestWorkspaceLoadTarget(origin), instance) as context:
        yield context


def run_backfill_daemon(context, max_iterations: int = 30) -> None:
    """Run the backfill daemon's iteration until no backfill is in progress (runs execute synchronously when the
    instance uses SyncInMemoryRunLauncher)."""
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._daemon.backfill import execute_backfill_iteration

    instance = context.instance
    for _ in range(max_iterations):
        list(execute_backfill_iteration(context, LOGGER))
        if not [b for b in instance.get_backfills() if b.status == BulkActionStatus.REQUESTED]:
            return
    raise AssertionError(f"backfills still in progress after {max_iterations} daemon iterations")


# Runs launched by the daemon logic execute at once, in the test process (no queue, no run worker process).
SYNC_LAUNCHER = {
    "run_launcher": {"module": "dagster._core.launcher.sync_in_memory_run_launcher",
                     "class": "SyncInMemoryRunLauncher"},
    "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
}


class CountingModel:
    """A user model class (custom provider) that leaves a trace: one 'load' line per instantiation and one
    'rows <ids>' line per batch, in a file, so tests see model loads and which rows were inferred across
    processes. While the file `outage` exists it fails on rows whose text starts with 'POISON', like an
    endpoint that is down for part of a range."""

    def __init__(self, log: str, outage: str | None = None):
        self.log, self.outage = Path(log), Path(outage) if outage else None
        with self.log.open("a") as f:
            f.write("load\n")

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        texts = batch["text"]
        if self.outage is not None and self.outage.exists() and any(t.startswith("POISON") for t in texts):
            raise ConnectionError("model endpoint unavailable (test outage)")
        with self.log.open("a") as f:
            f.write("rows " + " ".join(texts) + "\n")
        return {"prediction": [len(t) for t in texts]}


def model_trace(log: Path) -> tuple[int, list[str]]:
    """(model loads, texts inferred) from a CountingModel log."""
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if line == "load"), [t for line in lines if line.startswith("rows ")
                                                         for t in line.split()[1:]]


def daily_spec(data_dir: Path, log: Path, **sections: Any) -> dict[str, Any]:
    """A daily-partitioned pipeline over <data_dir>/<YYYY-MM-DD>.jsonl with the CountingModel."""
    spec: dict[str, Any] = {
        "name": "daily_docs",
        "source": {"format": "jsonl", "path": f"{data_dir}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "daily", "start_date": "2026-11-01"},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict"},
        "model": {"provider": "custom", "config": {"class_path": "tests.daemon_helpers:CountingModel",
                                                   "init_kwargs": {"log": str(log)}}},
        "retries": {"max_retries": 0},
    }
    spec.update(sections)
    return spec


def write_day(data_dir: Path, day: str, rows: int = 3, poison: bool = False) -> None:
    import json

    data_dir.mkdir(parents=True, exist_ok=True)
    texts = [f"{'POISON' if poison and i == 0 else 'doc'}-{day}-{i}" for i in range(rows)]
    (data_dir / f"{day}.jsonl").write_text("".join(json.dumps({"doc_id": t, "text": t}) + "\n" for t in texts))


class SlowModel(CountingModel):
    """Records when each batch starts and ends ('span <start> <end>'), taking `seconds` per batch. With `gate`, a
    batch first touches `<gate>.entered.<pid>`, then waits until the file `gate` exists: a test holds a run inside
    its infer step for as long as it needs to see what another run does meanwhile."""

    def __init__(self, log: str, seconds: float = 1.0, gate: str | None = None):
        super().__init__(log)
        self.seconds, self.gate = seconds, gate

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        import time

        start = time.time()
        if self.gate:
            Path(f"{self.gate}.entered.{os.getpid()}").touch()
            while not Path(self.gate).exists():
                if time.time() - start > 300:
                    raise TimeoutError(f"gate {self.gate} never opened")
                time.sleep(0.1)
        time.sleep(self.seconds)
        with self.log.open("a") as f:
            f.write(f"span {start} {time.time()}\n")
        return {"prediction": [len(t) for t in batch["text"]]}


# Test instances poll their run queue every second (Dagster's default, and the shipped file's: 5 s), so a queued
# run starts within a second of being queued. Nothing else differs from the shipped dagster.yaml.
TEST_INSTANCE_OVERRIDES: dict[str, Any] = {"run_coordinator": {"config": {"dequeue_interval_seconds": 1}}}


# The backfill daemon's fixed 30 s between iterations is 2 s under dev_server (tests/daemon_site/sitecustomize.py).
DAEMON_SITE = ROOT / "tests" / "daemon_site"
BACKFILL_INTERVAL_ENV, TEST_BACKFILL_INTERVAL_S = "BATCH_TEST_BACKFILL_INTERVAL_S", 2


def dagster_home(home: Path, shipped: bool = False) -> Path:
    """A fresh DAGSTER_HOME with the project's dagster.yaml (run queue, pools) as `make ui` uses it, with the run
    queue polled every second (TEST_INSTANCE_OVERRIDES) unless `shipped`."""
    home.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    if not shipped:
        for key, value in TEST_INSTANCE_OVERRIDES.items():
            config[key] = _merged(config.get(key) or {}, value)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # Create the instance's SQLite storages now: the webserver, the daemon and a CLI started together each create
    # them on first use, and two at once fail with "table jobs already exists" (a sensor never ticks).
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home)):
        pass
    return home


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def dagster_dev_command(port: int) -> list[str]:
    """`dagster dev` over the project's definitions module on loopback."""
    return [DAGSTER, "dev", "-m", "batch_assets.definitions", "-h", "127.0.0.1", "-p", str(port)]


@contextmanager
def dev_server(command: list[str], env: Mapping[str, str], log: Path,
               backfill_interval_s: float | None = TEST_BACKFILL_INTERVAL_S) -> Iterator[subprocess.Popen]:
    """The command (dagster dev, or `make ui`) in its own session with output to `log`; on exit its whole process
    group (webserver, daemon, code servers, run workers) gets SIGTERM, then SIGKILL if it lingers.
    `backfill_interval_s=None`: the daemon as a user runs it (Dagster's own 30 s), for a test of exactly what a user
    has (tests.conftest.user_env)."""
    env = dict(env)
    if backfill_interval_s is not None:
        env[BACKFILL_INTERVAL_ENV] = str(backfill_interval_s)  # tests/daemon_site/sitecustomize.py
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(DAEMON_SITE), env.get("PYTHONPATH")) if p)
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        try:  # the group may be gone already (a server that died on start): its own error is the one to see
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


class GraphQLError(AssertionError):
    """The webserver answered, with GraphQL errors: a wrong query or a server-side failure, never "not ready"."""


def with_net_audit(env: Mapping[str, str], audit_file: Path) -> dict[str, str]:
    """`env` plus the audit of every attempt to reach another host, in every Python process started with it and
    their forks (tests/daemon_site/net_audit.py; read it back with `net_audit.read`)."""
    return {**env, "BATCH_TEST_NET_AUDIT": str(audit_file),
            "PYTHONPATH": os.pathsep.join(p for p in (str(DAEMON_SITE), env.get("PYTHONPATH")) if p)}


def project_copy(dest: Path) -> Path:
    """The project as a user has it, in `dest`: its package copied (so a scaffold or a user's own pipeline file lands
    in the copy's batch_assets/, never in the checkout other tests load), the rest linked."""
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "batch_assets", dest / "batch_assets", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "dagster.yaml", "workspace.yaml"):
        shutil.copyfile(ROOT / name, dest / name)
    for name in ("resources", ".venv"):
        (dest / name).symlink_to(ROOT / name)
    return dest


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    """The `data` of a query to the webserver's GraphQL API; GraphQL errors fail the test (GraphQLError, with the
    server's messages)."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        payload = json.loads(resp.read())
    if payload.get("errors"):
        raise GraphQLError(f"GraphQL errors for {query[:200]!r}: {payload['errors']}")
    return payload["data"]


def log_tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


LOCATIONS_QUERY = """{ workspaceOrError { __typename ... on PythonError { message }
  ... on Workspace { locationEntries { name loadStatus locationOrLoadError { __typename
    ... on PythonError { message } ... on RepositoryLocation { repositories { name } } } } } } }"""


def wait_ready(port: int, proc: subprocess.Popen, log: Path, seconds: float = 120, interval: float = 0.5) -> str:
    """Wait until the webserver serves a loaded code location; its name. Fails at once if the server exited, a
    query is refused with GraphQL errors, or the code location failed to load (with the load error)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited:\n" + log_tail(log)
        try:
            data = graphql(port, LOCATIONS_QUERY)
        except (OSError, ValueError):  # not listening yet (connection refused, reset, or a half-written answer)
            time.sleep(interval)
            continue
        workspace = data["workspaceOrError"]
        assert workspace["__typename"] == "Workspace", workspace
        for entry in workspace["locationEntries"]:
            loaded = entry["locationOrLoadError"] or {}
            if loaded.get("__typename") == "PythonError":
                raise AssertionError(f"code location {entry['name']!r} failed to load: {loaded['message']}\n"
                                     + log_tail(log))
            if entry["loadStatus"] == "LOADED" and loaded.get("repositories"):
                return entry["name"]
        time.sleep(interval)
    raise AssertionError("dagster dev did not become ready:\n" + log_tail(log))


def wait_for(what: str, check: Callable[[], T], log: Path | None, seconds: float, interval: float = 1,
             diagnose: Callable[[], str] = str) -> T:
    """Poll `check` until it returns something truthy; that. On timeout fail with `diagnose()` (say, the failed
    Kubernetes Jobs' output) and the server log's tail (when there is a server log)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}:\n{diagnose()}\n" + (log_tail(log, 4000) if log else ""))
