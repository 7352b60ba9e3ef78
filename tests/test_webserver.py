"""The real `dagster dev` (webserver + daemon): the UI's GraphQL API lists the pipeline's assets, and a partition
launched through it (as the UI's Materialize button does) runs to success and lands its output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import DAEMON_GROUP, EMBED_SPEC, docs_rows, free_port, write_jsonl
from tests.daemon_helpers import (
    TERMINAL_RUN_STATUSES, dagster_dev_command, dagster_home, dev_server, graphql, log_tail, wait_for, wait_ready,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(DAEMON_GROUP)]  # starts dagster dev


def test_ui_lists_assets_and_materializes_a_partition(tmp_path: Path) -> None:
    data, pipelines, store = tmp_path / "data", tmp_path / "pipelines", tmp_path / "store"
    home = dagster_home(tmp_path / "home")
    write_jsonl(data / "a.jsonl", docs_rows("a", 8))
    write_jsonl(data / "b.jsonl", docs_rows("b", 2))
    pipelines.mkdir()
    spec = {**EMBED_SPEC, "source": {**EMBED_SPEC["source"], "path": f"{data}/{{partition}}.jsonl"}}
    (pipelines / "docs.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(store)}
    port = free_port()
    log = tmp_path / "dagster-dev.log"
    with dev_server(dagster_dev_command(port), env, log) as proc:
        wait_ready(port, proc, log)
        nodes = graphql(port, "{ assetNodes { assetKey { path } groupName description } }")["assetNodes"]
        keys = {"/".join(n["assetKey"]["path"]): n for n in nodes}
        assert set(keys) == {"docs/raw", "docs/prepared", "docs/inferred", "docs/output"}
        assert {n["groupName"] for n in nodes} == {"docs"}
        assert "Infer" in keys["docs/inferred"]["description"]

        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        run_id = client.submit_job_execution("docs_job", tags={"dagster/partition": "a"})
        status = wait_for("the run to finish", lambda: (
            s if (s := client.get_run_status(run_id).value) in TERMINAL_RUN_STATUSES else None), log, 240)
        assert status == "SUCCESS", log_tail(log)
        assert (store / "docs" / "output" / "a.parquet").exists()
        assert not (store / "docs" / "output" / "b.parquet").exists()
