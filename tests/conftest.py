"""Shared fixtures (temporary pipelines, storage roots, a real S3-protocol server on loopback) and how the suite runs
in parallel.

`make test` runs `pytest -n 3 --dist loadgroup` (pytest-xdist): three worker processes, each its own pytest session.
What that means for a test, and the convention for new ones (tests/README.md says the same in short):

- Session-scoped fixtures (`s3_server`, `llama_server`) start once per worker, so at most twice per run. Nothing may
  depend on being the only process: use `free_port()`, `tmp_path`, a fresh bucket, a fresh DAGSTER_HOME
  (`tests.daemon_helpers.dagster_home`), never a fixed port or a path in the checkout. A test writes nothing under
  the checkout (tests/test_dg.py scaffolds into a copy of the project).
- A test that starts a Dagster daemon or webserver (`dagster dev`, `dg dev`, `make ui`, `dagster-daemon run`) is
  marked `@pytest.mark.xdist_group(DAEMON_GROUP)`; a test whose runs go through the Kubernetes Jobs stand-in
  (real run workers and step pods as local processes) joins `K8S_GROUP` (automatically when it uses the `k8s_stub`
  fixture). Each group runs one test at a time on one worker, so at most one server test and one cluster test run
  at once, each beside the in-process tests of the other worker: two servers never race each other's wall-clock
  deadlines. Such a test uses `tests.daemon_helpers.dagster_home`, whose instance polls its run queue every second
  (the shipped file: 5 s), and `tests.daemon_helpers.dev_server`, under which the backfill daemon iterates every 2 s
  instead of Dagster's fixed 30 s (tests/daemon_site/sitecustomize.py).
- Tests that use a module-scoped fixture (a loaded model) are grouped by module automatically (below), so the model
  loads once per run, not once per worker.
- Heaviest first: tests are handed out longest first, from the measured seconds in tests/durations.json (a group
  counts as the sum of its tests; a test not measured yet counts 20 s if marked `slow`, else 1 s). Refresh the file
  after adding slow tests: `.venv/bin/pytest -n 3 --dist loadgroup --record-durations` (the whole suite).
- `make test` prints the 25 slowest tests (`--durations=25`) so every CI run shows where the time goes.
"""

from __future__ import annotations

import copy
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_ENVIRON_AT_START = dict(os.environ)  # before the product is imported (it sets its telemetry switches: user_env)

# Each xdist worker, and every process it starts (dagster CLI runs, servers), gets an equal share of the cores for
# its OpenMP / MKL pools (torch, onnxruntime, tokenizers). Left alone, every process sizes its pool to all the cores:
# three workers on two cores run six busy threads, and OpenMP's waiting threads spin. Measured on the loaded 2-core
# machine, tests/resources/hf/test_transformers_constrained.py: 79.5 s of CPU with two threads, 25.4 s with one. Set
# before any test module imports torch; a variable the caller set wins.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
SET_FOR_SPEED: set[str] = set()  # the thread variables set here, not by the caller: user_env() takes them out
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    for _var in THREAD_VARIABLES:
        if _var not in os.environ:
            os.environ[_var] = _share
            SET_FOR_SPEED.add(_var)

# Tests run what users run (issue 23): no process of the suite, and so no product process a test starts, sees the
# variables a CI runner sets. Libraries read them and behave more kindly than for a user: `CI=true` switches
# OpenVINO's telemetry off, progress bars and colours change. They are removed here, before any test module is
# imported and before pytest-xdist starts its workers (which inherit the removal). The suite itself still knows it
# runs under CI (RUNNING_IN_CI, passed to the workers as RUNNING_IN_CI_ENV): there a missing real part that is not a
# Python package (the llama.cpp server build, chromium) fails instead of skipping. A test about these variables
# sets them in the environment of the process it starts.
CI_ONLY_VARIABLES = ("CI", "CONTINUOUS_INTEGRATION", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "TF_BUILD",
                     "JENKINS_URL", "CIRCLECI", "TRAVIS", "TEAMCITY_VERSION")
RUNNING_IN_CI_ENV = "BATCH_TESTS_RUNNING_IN_CI"
RUNNING_IN_CI = bool(os.environ.get("CI") or os.environ.get(RUNNING_IN_CI_ENV))
if RUNNING_IN_CI:
    os.environ[RUNNING_IN_CI_ENV] = "1"
for _var in CI_ONLY_VARIABLES:
    os.environ.pop(_var, None)

from batch_assets.spec import PipelineSpec, parse_spec  # noqa: E402
from batch_assets.resources.telemetry import OFF_SWITCHES  # noqa: E402

# The product sets its telemetry switches in os.environ of every process that imports it (resources/telemetry.py),
# this one included; a user's shell has only those the user exported. The controller notes which those were for its
# workers, which start with the switches already set.
USER_SET_SWITCHES_ENV = "BATCH_TESTS_USER_SET_SWITCHES"
os.environ.setdefault(USER_SET_SWITCHES_ENV, ",".join(k for k in OFF_SWITCHES if k in _ENVIRON_AT_START))

DAEMON_GROUP = "daemon"  # xdist_group of tests that start a Dagster daemon or webserver (module docstring)
K8S_GROUP = "k8s"  # xdist_group of tests whose runs go through the Kubernetes Jobs stand-in (module docstring)
DURATIONS_FILE = Path(__file__).with_name("durations.json")
UNMEASURED_SLOW_S, UNMEASURED_S = 20.0, 1.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test's measured seconds to {DURATIONS_FILE.name} (heaviest-first order)")
    parser.addoption("--record-cpu", metavar="FILE", default=None,
                     help="append each test's CPU seconds (the worker's and its reaped children's, user + system) "
                          "to FILE as JSON lines: what the suite costs the machine, unlike wall time not inflated "
                          "by load")


def _group_of(item: pytest.Item) -> str | None:
    marks = [m.args[0] if m.args else m.kwargs.get("name", "default") for m in item.iter_markers("xdist_group")]
    return "_".join(sorted(set(map(str, marks)))) or None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests that share a module-scoped fixture by module; order work units heaviest first. Runs before
    xdist reads the xdist_group marks, and identically on every worker (xdist checks the collections match)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shares_module_fixture = info is not None and any(
            defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())
        if _group_of(item) is not None:
            continue
        if "k8s_stub" in item.fixturenames:  # real run workers launched as Kubernetes Jobs
            item.add_marker(pytest.mark.xdist_group(K8S_GROUP))
        elif shares_module_fixture:
            item.add_marker(pytest.mark.xdist_group(f"module:{item.nodeid.split('::')[0]}"))
    measured: dict[str, float] = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}

    def seconds(item: pytest.Item) -> float:
        if item.nodeid in measured:
            return measured[item.nodeid]
        return UNMEASURED_SLOW_S if item.get_closest_marker("slow") else UNMEASURED_S

    unit_of = {item.nodeid: _group_of(item) or item.nodeid for item in items}
    weight: dict[str, float] = {}
    for item in items:
        weight[unit_of[item.nodeid]] = weight.get(unit_of[item.nodeid], 0.0) + seconds(item)
    first_seen = {unit: n for n, unit in reversed(list(enumerate(unit_of[i.nodeid] for i in items)))}
    items.sort(key=lambda i: (-weight[unit_of[i.nodeid]], first_seen[unit_of[i.nodeid]]))
    units_dir = os.environ.get(UNITS_DIR_ENV)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if units_dir and worker:  # for the controller's scheduler (below)
        (Path(units_dir) / f"{worker}.json").write_text(json.dumps(unit_of))


# xdist's own `--dist loadgroup` marks a grouped test by appending "@group" to its nodeid, which pytest 9.2's
# structured node ids ignore: every test became its own unit. Instead each worker writes the unit of each test
# (a group, or the test itself) to a file, and the controller schedules whole units from it, in collection order
# (heaviest first). Same flags (`-n 3 --dist loadgroup`); only the grouping is read differently.
UNITS_DIR_ENV = "BATCH_TESTS_XDIST_UNITS"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    import tempfile

    os.environ[UNITS_DIR_ENV] = tempfile.mkdtemp(prefix="xdist-units-")  # inherited by the workers it starts


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.get(UNITS_DIR_ENV):
        import shutil

        shutil.rmtree(os.environ.pop(UNITS_DIR_ENV), ignore_errors=True)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """Whole units (an xdist_group, or one test) to one worker each, in collection order."""

        _units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._units is None:
                found = sorted(Path(os.environ[UNITS_DIR_ENV]).glob("*.json"))
                assert found, f"no worker wrote its test units to {os.environ[UNITS_DIR_ENV]}"
                self._units = json.loads(found[0].read_text())
            return self._units.get(nodeid, nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


_recorded: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    cpu_file = item.config.getoption("--record-cpu")
    if not cpu_file:
        yield
        return
    before = os.times()
    yield
    after = os.times()
    spent = {"self": (after.user - before.user) + (after.system - before.system),
             "children": (after.children_user - before.children_user)
             + (after.children_system - before.children_system)}
    with open(cpu_file, "a") as out:  # one short line per write: appends from several workers do not interleave
        out.write(json.dumps({"test": item.nodeid, **{k: round(v, 2) for k, v in spent.items()}}) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = report.nodeid.split("@")[0] if "@" in report.nodeid.rsplit("]", 1)[-1] else report.nodeid
    _recorded[nodeid] = _recorded.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("--record-durations") or hasattr(session.config, "workerinput"):
        return  # only the controller (or a run without -n) writes the file
    merged = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    merged.update({k: round(v, 1) for k, v in _recorded.items()})
    DURATIONS_FILE.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def user_env(**extra: str) -> dict[str, str]:
    """Exactly the environment a user's shell has, for the end-to-end test of a launch path: this process's, less
    what the suite adds for its own sake (the thread caps above, pytest's and pytest-xdist's variables, the suite's
    own `BATCH_TESTS_*`, the telemetry switches the product set in this process); the CI variables are gone
    already (above). `extra` is the test's own settings (a DAGSTER_HOME, a storage root), as a user exports them."""
    user_set = set(os.environ[USER_SET_SWITCHES_ENV].split(","))
    suite_only = SET_FOR_SPEED | {RUNNING_IN_CI_ENV, UNITS_DIR_ENV} | (set(OFF_SWITCHES) - user_set)
    env = {k: v for k, v in os.environ.items()
           if k not in suite_only and not k.startswith(("PYTEST_", "BATCH_TEST"))}
    return {**env, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real moto S3 server on loopback (the in-process mock breaks s3fs). Yields its endpoint URL.

    `moto_server` runs as its own process: in the test's process (ThreadedMotoServer) every S3 request waited for the
    GIL behind the pipeline it served, about a second per request on the loaded 2-core machine."""
    import subprocess
    import sys
    import tempfile
    import time
    import urllib.request

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1",
                                   "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"{url}/moto-api/", timeout=5).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"moto_server did not start on {url}: {log.read()[-2000:]!r}")
                    time.sleep(0.2)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.fixture(scope="session")
def llama_server():
    """A real llama.cpp OpenAI-compatible server with SmolLM2-135M on loopback, one per worker, shared by every test
    that asks for it (provider tests, the example pipelines' metadata test, ...).

    Missing llama-cpp-python skips the tests on a workstation but fails them under CI, where it must be installed."""
    from tests.resources.openai_api.llama_server import LlamaServerUnavailable, check_available, start_llama_server

    try:
        check_available()
    except LlamaServerUnavailable as exc:
        if RUNNING_IN_CI:
            pytest.fail(f"CI is set and the llama.cpp server cannot start: {exc}")
        pytest.skip(f"llama.cpp server unavailable: {exc}")
    server = start_llama_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A fresh bucket; the environment points s3fs/boto at the loopback server. Yields 's3://bucket'."""
    import boto3

    for key, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    name = "t-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + f"-{free_port()}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path: Path, header: list[str], rows: list[list[Any]], encoding: str = "utf-8") -> Path:
    import csv
    import io

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    path.write_bytes(buf.getvalue().encode(encoding))
    return path


EMBED_SPEC: dict[str, Any] = {
    "name": "docs",
    "source": {"format": "jsonl", "path": "PLACEHOLDER/{partition}.jsonl", "columns": ["doc_id", "text"]},
    "partitioning": {"kind": "static", "keys": ["a", "b"]},
    "prepare": {"id_column": "doc_id", "text_column": "text"},
    "task": {"kind": "embed"},
    "model": {"provider": "sentence_transformers", "config": {"batch_size": 16}},
    "runtime": {"chunk_rows": 7},
}

GENERATE_SPEC: dict[str, Any] = {
    "name": "companies",
    "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["customer_id", "company"]},
    "partitioning": {"kind": "static", "keys": ["p0", "p1", "p2"]},
    "prepare": {
        "id_column": "customer_id",
        "system": "Answer with one industry name only.",
        "template": "Industry of {company}? Choose from: Law Firm, Healthcare, Technology, Other.",
    },
    "task": {
        "kind": "generate",
        "params": {"max_new_tokens": 6},
        "structured": {"choices": ["Law Firm", "Healthcare", "Technology", "Other"]},
        "structured_column": "industry",
    },
    "model": {"provider": "transformers", "config": {"batch_size": 8}},
    "runtime": {"chunk_rows": 4},
}


def make_spec(base: dict[str, Any], data_dir: Path | str, **changes: Any) -> PipelineSpec:
    """A spec from a template with its source path under `data_dir`; `changes` replace top-level sections."""
    raw = copy.deepcopy(base)
    raw["source"]["path"] = raw["source"]["path"].replace("PLACEHOLDER", str(data_dir))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    return parse_spec(raw)


def docs_rows(prefix: str, n: int) -> list[dict[str, Any]]:
    topics = ["the moon orbits the earth", "pasta needs salted water", "stocks fell on monday", "the goalkeeper saved it"]
    return [{"doc_id": f"{prefix}{i}", "text": f"{topics[i % 4]} ({prefix}{i})"} for i in range(n)]


def pipeline_definitions(spec: PipelineSpec, root: Path | str):
    """The pipeline's Definitions with its storage rooted at `root`."""
    import dagster as dg

    from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_definitions
    from batch_assets.storage import ArrowStorage

    return dg.Definitions.merge(
        build_pipeline_definitions(spec), dg.Definitions(resources={STORAGE_KEY: ArrowStorage(root=str(root))})
    )


def run_pipeline(spec: PipelineSpec, root: Path | str, keys: list[str], instance=None, raise_on_error: bool = True):
    """Materialize all four stages for `keys` in ONE run (a partition range), like a single-run backfill."""
    import dagster as dg

    defs = pipeline_definitions(spec, root)
    job = defs.resolve_job_def(f"{spec.name}_job")
    tags = (
        {"dagster/partition": keys[0]}
        if len(keys) == 1
        else {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    )
    return job.execute_in_process(instance=instance or dg.DagsterInstance.ephemeral(), tags=tags,
                                  raise_on_error=raise_on_error)


def read_output(spec: PipelineSpec, root: Path | str, key: str):
    import pyarrow.parquet as pq

    from batch_assets.stages.write import sink_url
    from batch_assets.storage import ArrowStorage

    return pq.read_table(sink_url(spec, ArrowStorage(root=str(root)), key))
