"""Publishing under concurrency and storage faults, with real processes: two `dagster asset materialize` runs of one
partition at once, and an S3 server (moto_server, its own process) killed in the middle of a run and restarted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.spec import parse_spec
from tests.conftest import free_port, run_pipeline, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
pytestmark = pytest.mark.slow


def _spec(data: str, **model: Any) -> dict[str, Any]:
    return {
        "name": "lengths",
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict", "output_column": "length"},
        "model": {"provider": "custom", "config": {"class_path": "tests.reliability_models:SlowTextLength",
                                                     "init_kwargs": model, "batch_size": 5}},
        "runtime": {"chunk_rows": 5},
    }


def _home(tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    return home


def _materialize(tmp_path: Path, spec: dict, store: str, home: Path, log: Path | None = None,
                 **env: str) -> subprocess.Popen:
    """`dagster asset materialize` of partition a; output piped, or written to `log` (to watch it while it runs)."""
    pipelines = tmp_path / f"pipelines-{home.name}"
    pipelines.mkdir(exist_ok=True)
    (pipelines / "lengths.yaml").write_text(yaml.safe_dump(spec))
    full_env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
                "BATCH_STORAGE_ROOT": store, "PYTHONPATH": str(ROOT), **env}
    command = [DAGSTER, "asset", "materialize", "-m", "batch_assets.definitions", "--select", "group:lengths",
               "--partition", "a"]
    if log is None:
        return subprocess.Popen(command, cwd=tmp_path, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=tmp_path, env=full_env, stdout=out, stderr=subprocess.STDOUT)


def _rows(n: int) -> list[dict[str, str]]:
    return [{"doc_id": f"d{i:03d}", "text": "x" * (i % 17)} for i in range(n)]


def test_two_concurrent_runs_of_one_partition_commit_one_result(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", _rows(40))
    spec = _spec(str(data), seconds=0.05)

    assert run_pipeline(parse_spec(spec), tmp_path / "ref", ["a"]).success  # what one run alone publishes

    store = tmp_path / "shared"  # two deployments (separate Dagster instances) sharing one storage root
    # Run A enters its infer stage and is held there (the model's gate); only then does run B start, and the
    # gate opens once B has said it waits for A's lock: the overlap is certain, whatever the machine's load.
    gate, logs = tmp_path / "gate", [tmp_path / "run-a.log", tmp_path / "run-b.log"]
    gated = {**spec, "model": {**spec["model"], "config": {
        **spec["model"]["config"], "init_kwargs": {"seconds": 0.05, "gate": str(gate)}}}}
    first = _materialize(tmp_path, gated, str(store), _home(tmp_path, "home-0"), log=logs[0])
    _wait_for_file(Path(f"{gate}.entered"), first, logs[0])
    second = _materialize(tmp_path, gated, str(store), _home(tmp_path, "home-1"), log=logs[1])
    deadline = time.monotonic() + 240
    while "another run holds" not in logs[1].read_text():
        assert second.poll() is None and time.monotonic() < deadline, \
            "run B did not wait for run A's lock:\n" + logs[1].read_text()[-3000:]
        time.sleep(0.2)
    gate.touch()
    for run, log in zip((first, second), logs):
        assert run.wait(timeout=300) == 0, log.read_text()[-3000:]

    expected = pq.read_table(tmp_path / "ref" / "lengths" / "output" / "a.parquet")
    published = pq.read_table(store / "lengths" / "output" / "a.parquet")
    assert published.equals(expected)
    assert published.num_rows == 40 and len(set(published.column("doc_id").to_pylist())) == 40
    leftovers = [p.name for p in store.rglob("*") if p.is_file() and (".tmp-" in p.name or p.suffix == ".lock")]
    assert leftovers == []
    assert not (store / "lengths" / "_staging" / "inferred" / "a").exists()


def _wait_for_file(path: Path, run: subprocess.Popen, log: Path, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert run.poll() is None and time.monotonic() < deadline, f"{path.name} never appeared:\n" + \
            log.read_text()[-3000:]
        time.sleep(0.2)


def _start_moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return proc
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def _bucket_objects(endpoint: str, bucket: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t",
                      aws_secret_access_key="t")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def _make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t",
                 aws_secret_access_key="t").create_bucket(Bucket=bucket)


def test_s3_server_killed_mid_run_then_restarted(tmp_path: Path) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t",
           "AWS_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "2", "AWS_RETRY_MODE": "standard"}
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", _rows(40))
    store = "s3://reliability/store"
    moto = _start_moto(port)
    try:
        _make_bucket(endpoint, "reliability")
        # the model kills the S3 server at its 4th call: the infer stage is committing chunks to S3 right then
        spec = _spec(str(data), seconds=0.05, kill_pid_env="MOTO_PID", kill_at_call=4)
        # the step's retries (the default two) still run against the dead server, 1 s apart instead of 15 s and more
        spec["retries"] = {"delay_seconds": 1, "jitter": False}
        run = _materialize(tmp_path, spec, store, _home(tmp_path, "home-1"), MOTO_PID=str(moto.pid), **env)
        log, _ = run.communicate(timeout=400)
        assert run.returncode != 0, "a run whose storage went away must fail, not succeed"
        assert moto.wait(timeout=10) == -signal.SIGKILL
        assert "Could not connect" in log or "Connect" in log or "connection" in log.lower(), log[-3000:]

        moto = _start_moto(port)  # restarted: an S3 server with nothing in it
        _make_bucket(endpoint, "reliability")
        assert _bucket_objects(endpoint, "reliability") == []  # no torn partition, no stray lease or upload
        run = _materialize(tmp_path, _spec(str(data), seconds=0.0), store, _home(tmp_path, "home-2"), **env)
        log, _ = run.communicate(timeout=400)
        assert run.returncode == 0, log[-3000:]
        import pyarrow.fs as pafs

        s3 = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="t", secret_key="t",
                               region="us-east-1")
        table = pq.read_table("reliability/store/lengths/output/a.parquet", filesystem=s3)
        assert sorted(table.column("doc_id").to_pylist()) == [f"d{i:03d}" for i in range(40)]
        assert table.column("length").to_pylist() == [i % 17 for i in range(40)]
        keys = _bucket_objects(endpoint, "reliability")
        assert not [k for k in keys if "_locks/" in k or ".tmp-" in k], keys
    finally:
        moto.kill()
        moto.wait()
