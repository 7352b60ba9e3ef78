"""Postgres instance storage, for real: a throwaway PostgreSQL cluster (initdb + pg_ctl into a temp dir), a Dagster
instance on it through dagster-postgres (`postgresql+psycopg2`, as in k8s/dagster.yaml), and the whole chain
materialized; the run and the materializations are then read back from the database with SQL."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import EMBED_SPEC, docs_rows, free_port, make_spec, read_output, run_pipeline, write_jsonl

pytestmark = pytest.mark.slow


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        pytest.fail(f"PostgreSQL's {name} is not installed: apt-get install postgresql (15) to run this test")
    return found


def _as_cluster_owner(argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root; CI machines run the suite as root, so drop to the postgres user.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def postgres_port() -> Iterator[int]:
    """A PostgreSQL server on 127.0.0.1 for this module, trust auth, user `postgres`; removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="batch-pg-"))
    data, sockets = workdir / "data", workdir / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(workdir, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    run = lambda argv: subprocess.run(_as_cluster_owner(argv), check=True, capture_output=True, text=True)  # noqa: E731
    try:
        run([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"])
        run([_pg_bin("pg_ctl"), "-D", str(data), "-l", str(workdir / "server.log"), "-w", "-t", "60",
             "-o", f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc.cmd}\n{exc.stdout}\n{exc.stderr}")
    try:
        subprocess.run([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "dagster"],
                       check=True, capture_output=True)
        yield port
    finally:
        subprocess.run(_as_cluster_owner([_pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


def test_chain_materializes_with_postgres_instance_storage(tmp_path: Path, postgres_port: int) -> None:
    import dagster as dg
    import psycopg2

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump({
        "telemetry": {"enabled": False},
        "storage": {"postgres": {"postgres_db": {
            "username": "postgres", "password": "unused-with-trust-auth", "hostname": "127.0.0.1",
            "port": postgres_port, "db_name": "dagster", "scheme": "postgresql+psycopg2"}}},
    }))
    write_jsonl(tmp_path / "data" / "a.jsonl", docs_rows("a", 5))
    write_jsonl(tmp_path / "data" / "b.jsonl", docs_rows("b", 3))
    spec = make_spec(EMBED_SPEC, tmp_path / "data")
    store = tmp_path / "store"

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = run_pipeline(spec, store, ["a", "b"], instance=instance)
        assert result.success
        run_id = result.run_id

    assert read_output(spec, store, "a").num_rows == 5 and read_output(spec, store, "b").num_rows == 3
    with psycopg2.connect(host="127.0.0.1", port=postgres_port, user="postgres", dbname="dagster") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT status, pipeline_name FROM runs WHERE run_id = %s", (run_id,))
            assert cur.fetchall() == [("SUCCESS", "docs_job")]
            cur.execute(
                "SELECT asset_key, partition, count(*) FROM event_logs WHERE run_id = %s "
                "AND dagster_event_type = 'ASSET_MATERIALIZATION' GROUP BY asset_key, partition "
                "ORDER BY asset_key, partition", (run_id,))
            rows = cur.fetchall()
    stages = ("inferred", "output", "prepared", "raw")
    assert rows == [(f'["docs", "{s}"]', k, 1) for s in stages for k in ("a", "b")]
