"""Secrets: `{env: NAME}` at any depth, literal secrets refused at load, the default OpenAI key kept home, and a key
set in the environment never shows up in logs, metadata, errors or the run config the UI shows."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from batch_assets.spec import SpecError, parse_spec
from tests.conftest import DAEMON_GROUP, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
SECRET = "sk-reliability-" + hashlib.sha256(os.urandom(16)).hexdigest()[:24]  # made up per run: never in the source


def _spec(token_ref, data_dir: Path | str = "/data", fail_loudly: bool = False) -> dict:
    return {
        "name": "secretive",
        "source": {"format": "jsonl", "path": f"{data_dir}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict", "output_column": "length"},
        "model": {"provider": "custom", "config": {
            "class_path": "tests.reliability_models:TokenCheckingModel",
            "init_kwargs": {"auth": {"headers": {"token": token_ref}},
                            "expect_sha256": hashlib.sha256(SECRET.encode()).hexdigest(),
                            "fail_loudly": fail_loudly},
        }},
    }


@pytest.mark.parametrize("config, path", [
    ({"api_key": "sk-live-1234"}, "model.config.api_key"),
    ({"init_kwargs": {"auth": {"headers": {"token": "hunter22"}}}}, "model.config.init_kwargs.auth.headers.token"),
    ({"init_kwargs": {"db": [{"password": "pa55word"}]}}, "model.config.init_kwargs.db[0].password"),
])
def test_literal_secret_is_refused_at_load_with_the_fix(config: dict, path: str) -> None:
    raw = _spec({"env": "X"})
    raw["model"]["config"].update(config)
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    message = str(err.value)
    assert path in message and "{env: NAME}" in message and "literal secret" in message
    for value in ("sk-live-1234", "hunter22", "pa55word"):
        assert value not in message


def test_references_and_empty_values_are_accepted() -> None:
    raw = _spec({"env": "RELIABILITY_TOKEN"})
    raw["model"]["config"]["init_kwargs"]["api_key"] = None
    assert parse_spec(raw).model.config["init_kwargs"]["auth"]["headers"]["token"] == {"env": "RELIABILITY_TOKEN"}


def test_default_openai_key_is_not_sent_to_another_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.resources.openai_api.provider import OpenAICompatibleProvider
    from batch_assets.resources.protocols import GenerationParams
    from tests.resources.openai_api.fault_proxy import Echo, FaultProxy

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    seen = {}
    with FaultProxy(lambda key, n: Echo()) as proxy:
        for label, extra in [("default", {}), ("opted_in", {"send_default_api_key": True}),
                             ("explicit", {"api_key": dg.EnvVar("OPENAI_API_KEY")})]:
            resource = OpenAICompatibleProvider(model="m", base_url=proxy.url, max_attempts=1, **extra)
            with dg.build_resources({"model": resource}) as res:
                res.model.generate([[{"role": "user", "content": label}]], GenerationParams(max_new_tokens=2))
            seen[label] = proxy.attempts_for(label)[0].authorization
    assert SECRET not in (seen["default"] or "")  # a local/third-party server gets the placeholder
    assert seen["opted_in"] == f"Bearer {SECRET}" and seen["explicit"] == f"Bearer {SECRET}"


def _everything_the_instance_shows(home: Path) -> str:
    """Every event (logs, metadata, errors, check results) and every run's config, as text."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        parts = []
        for run in instance.get_runs():
            parts.append(json.dumps(run.run_config, default=str))
            parts.append(repr(run.tags))
            for record in instance.all_logs(run.run_id):
                parts.append(repr(record))
        for stage in ("raw", "prepared", "inferred", "output"):
            event = instance.get_latest_materialization_event(dg.AssetKey(["secretive", stage]))
            parts.append(repr(event))
        return "\n".join(parts)


def _materialize(tmp_path: Path, fail_loudly: bool) -> tuple[subprocess.CompletedProcess, Path]:
    data, pipelines, home = tmp_path / "data", tmp_path / "pipelines", tmp_path / "home"
    write_jsonl(data / "a.jsonl", [{"doc_id": str(i), "text": f"row {i}"} for i in range(5)])
    pipelines.mkdir()
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    (pipelines / "secretive.yaml").write_text(yaml.safe_dump(
        _spec({"env": "RELIABILITY_TOKEN"}, data, fail_loudly=fail_loudly)))
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(tmp_path / "store"), "RELIABILITY_TOKEN": SECRET,
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "batch_assets.definitions", "--select", "group:secretive",
         "--partition", "a"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    return proc, home


@pytest.mark.slow
def test_nested_secret_reaches_the_model_and_nothing_shows_it(tmp_path: Path) -> None:
    proc, home = _materialize(tmp_path, fail_loudly=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # the model got the real token
    shown = proc.stdout + proc.stderr + _everything_the_instance_shows(home)
    assert "Materialized value secretive output" in shown
    assert SECRET not in shown
    stored = "".join(p.read_bytes().decode("latin-1") for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert SECRET not in stored


@pytest.mark.slow
def test_a_secret_in_an_error_message_is_masked(tmp_path: Path) -> None:
    proc, home = _materialize(tmp_path, fail_loudly=True)
    assert proc.returncode != 0
    shown = proc.stdout + proc.stderr + _everything_the_instance_shows(home)
    assert "could not log in with token ***" in shown  # the error is there, and says what happened
    assert SECRET not in shown


NESTED_SECRET = "tok-nested-" + hashlib.sha256(os.urandom(16)).hexdigest()[:24]

# What the UI's run page, asset page and resource page ask the webserver for (dagster-webserver's GraphQL API).
UI_QUERIES = """
query RunPage($runId: ID!) {
  runOrError(runId: $runId) { ... on Run { runId status runConfigYaml tags { key value } } }
  logsForRun(runId: $runId, limit: 100000) {
    __typename
    ... on EventConnection { events {
      __typename
      ... on MessageEvent { message }
      ... on MaterializationEvent { metadataEntries { ...metadataEntryFragment } }
      ... on ObservationEvent { metadataEntries { ...metadataEntryFragment } }
      ... on ExecutionStepOutputEvent { metadataEntries { ...metadataEntryFragment } }
      ... on ExecutionStepFailureEvent { error { ...errorFragment } }
      ... on RunFailureEvent { pipelineFailureError: error { ...errorFragment } }
      ... on EngineEvent { metadataEntries { ...metadataEntryFragment } engineError: error { ...errorFragment } }
      ... on HookErroredEvent { hookError: error { ...errorFragment } }
      ... on AssetCheckEvaluationEvent { evaluation { metadataEntries { ...metadataEntryFragment } } }
    } }
  }
}
"""

ASSET_AND_RESOURCE_QUERIES = """
query AssetAndResourcePages($repo: RepositorySelector!, $job: PipelineSelector!) {
  assetNodes { assetKey { path } description metadataEntries { ...metadataEntryFragment }
    requiredResources { resourceKey }
    assetMaterializations(limit: 10) { runId metadataEntries { ...metadataEntryFragment } } }
  allTopLevelResourceDetailsOrError(repositorySelector: $repo) {
    __typename
    ... on ResourceDetailsList { results { name description resourceType
      configFields { name description isRequired configType { key description } defaultValueAsJson }
      configuredValues { key value type } } }
  }
  runConfigSchemaOrError(selector: $job) { __typename ... on RunConfigSchema { rootDefaultYaml } }
}
"""


def _ask_ui(port: int, query: str, variables: dict | None = None) -> dict:
    """The webserver's answer; a query it refuses fails with the reason it gives (not a bare HTTP 400)."""
    import urllib.error

    from tests.daemon_helpers import graphql

    try:
        return graphql(port, query, variables)
    except urllib.error.HTTPError as err:
        raise AssertionError(f"webserver refused the query: {err.read()[:2000]!r}") from None


def _ui_fragments(errors: bool = True) -> str:
    from dagster_graphql.client.query import ERROR_FRAGMENT, METADATA_ENTRY_FRAGMENT

    return (ERROR_FRAGMENT if errors else "") + METADATA_ENTRY_FRAGMENT


def _openai_spec(data_dir: Path, base_url: str) -> dict:
    return {
        "name": "keyed",
        "source": {"format": "jsonl", "path": f"{data_dir}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "template": "Say {text}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
        "model": {"provider": "openai", "config": {
            "model": "echo", "base_url": base_url, "max_attempts": 1,
            "api_key": {"env": "RELIABILITY_API_KEY"},
            "extra_body": {"gateway": {"session_token": {"env": "RELIABILITY_NESTED_TOKEN"}}},
        }},
    }


@pytest.mark.slow
@pytest.mark.xdist_group(DAEMON_GROUP)  # starts the webserver
def test_the_ui_shows_env_references_never_the_secrets(tmp_path: Path) -> None:
    """A real run with a top-level and a nested secret, then the real webserver asked what the UI shows."""
    from tests.resources.openai_api.fault_proxy import Echo, FaultProxy

    from tests.daemon_helpers import dagster_home

    data, pipelines, home = tmp_path / "data", tmp_path / "pipelines", dagster_home(tmp_path / "home")
    write_jsonl(data / "a.jsonl", [{"doc_id": str(i), "text": f"row {i}"} for i in range(3)])
    pipelines.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "BATCH_PIPELINES_DIR": str(pipelines),
           "BATCH_STORAGE_ROOT": str(tmp_path / "store"), "RELIABILITY_API_KEY": SECRET,
           "RELIABILITY_NESTED_TOKEN": NESTED_SECRET, "PYTHONPATH": str(ROOT)}
    with FaultProxy(lambda key, n: Echo()) as proxy:
        (pipelines / "keyed.yaml").write_text(yaml.safe_dump(_openai_spec(data, proxy.url)))
        proc = subprocess.run(
            [DAGSTER, "asset", "materialize", "-m", "batch_assets.definitions", "--select", "group:keyed",
             "--partition", "a"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        sent = proxy.attempts_for("Say row 0")[0]
    # both secrets reached the endpoint, so the run really used them
    assert sent.authorization == f"Bearer {SECRET}"
    assert sent.body["gateway"]["session_token"] == NESTED_SECRET

    from tests.conftest import free_port
    from tests.daemon_helpers import dev_server, wait_ready

    port, log = free_port(), tmp_path / "webserver.log"
    webserver = [str(Path(sys.executable).with_name("dagster-webserver")), "-m", "batch_assets.definitions",
                 "-h", "127.0.0.1", "-p", str(port)]
    with dev_server(webserver, env, log) as server:
        location = wait_ready(port, server, log)
        repos = _ask_ui(port, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }")
        repo = {"repositoryName": repos["repositoriesOrError"]["nodes"][0]["name"], "repositoryLocationName": location}
        runs = _ask_ui(port, "{ runsOrError { ... on Runs { results { runId } } } }")["runsOrError"]["results"]
        assert len(runs) == 1
        run_page = _ask_ui(port, UI_QUERIES + _ui_fragments(), {"runId": runs[0]["runId"]})
        other_pages = _ask_ui(port, ASSET_AND_RESOURCE_QUERIES + _ui_fragments(errors=False),
                              {"repo": repo, "job": {**repo, "pipelineName": "keyed_job"}})

    events = run_page["logsForRun"]["events"]
    assert run_page["runOrError"]["status"] == "SUCCESS"
    assert any(e["__typename"] == "MaterializationEvent" and e["metadataEntries"] for e in events)
    assert any(e["__typename"] == "AssetCheckEvaluationEvent" for e in events)
    (details,) = [r for r in other_pages["allTopLevelResourceDetailsOrError"]["results"]
                  if any(v["key"] == "api_key" for v in r["configuredValues"])]
    configured = {v["key"]: v for v in details["configuredValues"]}
    # the pages do show the config, as references: the checks below look where a secret would be
    assert configured["api_key"]["type"] == "ENV_VAR" and configured["api_key"]["value"] == "RELIABILITY_API_KEY"
    assert "RELIABILITY_NESTED_TOKEN" in configured["extra_body"]["value"]
    assert {f["name"] for f in details["configFields"]} >= {"api_key", "extra_body"}
    materialized = [m for n in other_pages["assetNodes"] for m in n["assetMaterializations"]]
    assert len(materialized) == 4 and all(m["metadataEntries"] for m in materialized)

    shown = json.dumps(run_page) + json.dumps(other_pages)
    for secret in (SECRET, NESTED_SECRET):
        assert secret not in shown
    assert SECRET not in log.read_text() and NESTED_SECRET not in log.read_text()
