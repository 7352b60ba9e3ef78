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
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[1]
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
    from resources.openai_api.provider import OpenAICompatibleProvider
    from resources.protocols import GenerationParams
    from tests.providers.fault_proxy import Echo, FaultProxy

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
