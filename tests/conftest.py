"""Shared fixtures: temporary pipelines, storage roots, and a real S3-protocol server on loopback."""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch_assets.spec import PipelineSpec, parse_spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real moto S3 server on loopback (the in-process mock breaks s3fs). Yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
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

    from batch_assets.factory import STORAGE_KEY, build_pipeline_definitions
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

    from batch_assets.sink import sink_url
    from batch_assets.storage import ArrowStorage

    return pq.read_table(sink_url(spec, ArrowStorage(root=str(root)), key))
