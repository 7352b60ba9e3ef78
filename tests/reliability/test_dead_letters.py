"""Dead letters and the response cache, through the real OpenAI-compatible provider over HTTP.

The endpoint is the fault proxy on loopback answering by itself (`Echo`: the completion is `echo:<prompt>`), so every
model call is counted per row. Two rows are refused (a 400: a row error, not retried; a 5xx that runs out of attempts
is owed an answer instead, never a dead letter: tests/resources/openai_api/test_infer_faults.py) until the endpoint's policy
changes; then the retry command re-runs only those two, merges them in and leaves the good rows untouched; a rerun with the cache on costs no model call at all,
in this pipeline or another one asking the same model the same prompts.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from batch_assets.errors import PipelineError
from batch_assets.orchestration.assets.factory import build_model_resource
from batch_assets.reliability.dead_letters import dead_letter_url
from batch_assets.commands.retry_dead_letters import retry_partition
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage
from tests.conftest import read_output, run_pipeline, write_jsonl
from tests.resources.openai_api.fault_proxy import Echo, FaultProxy, Respond

ROOT = Path(__file__).resolve().parents[2]
FLAKY = {"Say row 3", "Say row 7"}


def _raw_spec(data: Path, base_url: str, name: str = "echoes") -> dict[str, Any]:
    return {
        "name": name,
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "template": "Say {text}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
        "model": {"provider": "openai", "config": {"model": "echo", "base_url": base_url, "max_attempts": 2,
                                                     "backoff_base_s": 0.01, "backoff_max_s": 0.02}},
        "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5, "response_cache": True},
    }


def _metadata(result: dg.ExecuteInProcessResult, name: str) -> dict[str, Any]:
    (mat,) = result.asset_materializations_for_node(f"{name}__inferred")
    return {k: v.value for k, v in mat.metadata.items()}


def test_dead_letters_retry_and_cache(tmp_path: Path) -> None:
    outage = {"on": True}

    def script(key: str, attempt: int):
        return Respond(400, {"error": {"message": "refused by the content policy"}}) if key in FLAKY and outage["on"] else Echo()

    data, store, pipelines = tmp_path / "data", tmp_path / "store", tmp_path / "pipelines"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(10)])
    with FaultProxy(script) as proxy:
        raw = _raw_spec(data, proxy.url)
        spec = parse_spec(raw)
        first = run_pipeline(spec, store, ["a"])
        assert first.success
        out = {r["doc_id"]: r for r in read_output(spec, store, "a").to_pylist()}
        assert sorted(out) == [f"d{i}" for i in range(10)]
        assert {k for k, r in out.items() if r["error"]} == {"d3", "d7"}
        assert out["d1"]["generated_text"] == "echo:Say row 1"
        calls = {k: len(proxy.attempts_for(k)) for k in (f"Say row {i}" for i in range(10))}
        assert calls["Say row 1"] == 1 and calls["Say row 3"] == 1  # a 400 is final: never retried

        dead = pq.read_table(dead_letter_url(ArrowStorage(root=str(store)), "echoes", "a")).to_pylist()
        assert sorted(d["row_id"] for d in dead) == ["d3", "d7"]
        assert all(d["error_class"] == "row" and "400" in d["error"] for d in dead), dead
        assert {d["model_input"] for d in dead} == FLAKY and all(d["_source_file"].endswith("a.jsonl") for d in dead)

        # the outage ends: retry only the dead letters, with the documented command
        outage["on"] = False
        pipelines.mkdir()
        (pipelines / "echoes.yaml").write_text(yaml.safe_dump(raw))
        env = {**os.environ, "BATCH_PIPELINES_DIR": str(pipelines), "PYTHONPATH": str(ROOT)}
        env.pop("DAGSTER_HOME", None)
        proc = subprocess.run([sys.executable, "-m", "batch_assets.commands.retry_dead_letters", "echoes", "a",
                               "--storage-root", str(store)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "retried 2 rows, 0 still failed; 0 dead letters, 10 rows published" in proc.stdout
        after = {r["doc_id"]: r for r in read_output(spec, store, "a").to_pylist()}
        assert after["d3"]["error"] is None and after["d3"]["generated_text"] == "echo:Say row 3"
        assert {k: v for k, v in after.items() if k not in ("d3", "d7")} == \
            {k: v for k, v in out.items() if k not in ("d3", "d7")}  # good rows untouched
        assert [r["doc_id"] for r in read_output(spec, store, "a").to_pylist()] == [f"d{i}" for i in range(10)]
        assert pq.read_table(dead_letter_url(ArrowStorage(root=str(store)), "echoes", "a")).num_rows == 0
        retried_calls = {k: len(proxy.attempts_for(k)) for k in calls}
        assert retried_calls["Say row 3"] == 2 and retried_calls["Say row 1"] == 1  # only dead letters were re-sent

        # re-materialize: already made from the same source and spec (batch_assets/orchestration/assets/lineage.py), no model call at all
        again = run_pipeline(spec, store, ["a"])
        assert again.success
        meta = _metadata(again, "echoes")
        assert meta["skipped"].startswith("skipped: this partition was already made by run")
        assert {k: len(proxy.attempts_for(k)) for k in calls} == retried_calls
        assert read_output(spec, store, "a").to_pylist() == list(after.values())  # the same rows, in order

        # another pipeline asking the same model the same prompts shares the cache
        other = parse_spec({**copy.deepcopy(raw), "name": "echoes_too"})
        third = run_pipeline(other, store, ["a"])
        assert third.success and _metadata(third, "echoes_too")["cache_hits"] == 10
        assert {k: len(proxy.attempts_for(k)) for k in calls} == retried_calls


def test_retry_on_s3_records_its_materialization_and_keeps_what_still_fails(tmp_path: Path, s3_bucket: str) -> None:
    """The documented command with DAGSTER_HOME set, on an s3:// storage root: one dead letter recovers, one still
    fails (its endpoint is still down) and stays a dead letter; the instance holds the output's materialization for
    the partition with the command's counts."""
    from tests.daemon_helpers import dagster_home

    down = {"Say row 3", "Say row 7"}

    def script(key: str, attempt: int):
        return Respond(400, {"error": {"message": "refused by the content policy"}}) if key in down else Echo()

    data, pipelines, store = tmp_path / "data", tmp_path / "pipelines", f"{s3_bucket}/store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(10)])
    home = dagster_home(tmp_path / "home")
    with FaultProxy(script) as proxy:
        raw = {**_raw_spec(data, proxy.url), "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5}}
        spec = parse_spec(raw)
        assert run_pipeline(spec, store, ["a"]).success
        before = {r["doc_id"]: r for r in read_output(spec, store, "a").to_pylist()}
        assert {k for k, r in before.items() if r["error"]} == {"d3", "d7"}

        down.discard("Say row 3")  # row 3's endpoint is back; row 7's is not
        pipelines.mkdir()
        (pipelines / "echoes.yaml").write_text(yaml.safe_dump(raw))
        env = {**os.environ, "BATCH_PIPELINES_DIR": str(pipelines), "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(home)}
        proc = subprocess.run([sys.executable, "-m", "batch_assets.commands.retry_dead_letters", "echoes", "a",
                               "--storage-root", store], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "retried 2 rows, 1 still failed; 1 dead letters, 10 rows published" in proc.stdout

    after = read_output(spec, store, "a").to_pylist()
    assert [r["doc_id"] for r in after] == [f"d{i}" for i in range(10)]  # every row once, in its place
    by_id = {r["doc_id"]: r for r in after}
    assert by_id["d3"]["error"] is None and by_id["d3"]["generated_text"] == "echo:Say row 3"
    assert by_id["d7"]["generated_text"] is None and "400" in by_id["d7"]["error"]
    assert {k: v for k, v in by_id.items() if k not in ("d3", "d7")} == \
        {k: v for k, v in before.items() if k not in ("d3", "d7")}
    dead = pq.read_table(dead_letter_url(ArrowStorage(root=store), "echoes", "a")).to_pylist()
    assert [d["row_id"] for d in dead] == ["d7"] and dead[0]["error_class"] == "row"

    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(["echoes", "output"]))
    assert event is not None, "the retry recorded no materialization in DAGSTER_HOME"
    materialization = event.asset_materialization
    assert materialization.partition == "a"
    assert {k: v.value for k, v in materialization.metadata.items()} == \
        {"retried": 2, "still_failed": 1, "dead_letters": 1, "rows": 10}


def test_retry_goes_through_the_guarded_checkpointed_infer_loop(tmp_path: Path) -> None:
    """The retry is the infer stage's loop: while the endpoint still fails every retried row alike it stops (the
    partition is left as it was, no "retried" merge of the same failures), and a retry stopped half-way resumes
    after the chunks it had committed instead of paying for them again."""
    down = {f"Say row {i}" for i in range(1, 16, 2)}  # every other row: 2 of each chunk of 4, half the partition

    def script(key: str, attempt: int):
        return Respond(400, {"error": {"message": "refused by the content policy"}}) if key in down else Echo()

    data, store = tmp_path / "data", tmp_path / "store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(16)])
    storage = ArrowStorage(root=str(store))
    with FaultProxy(script) as proxy:
        spec = parse_spec({**_raw_spec(data, proxy.url), "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5}})
        assert run_pipeline(spec, store, ["a"]).success
        before = read_output(spec, store, "a").to_pylist()
        assert sum(1 for r in before if r["error"]) == 8

        with dg.build_resources({"model": build_model_resource(spec)}) as resources:
            # still down: the retry's first chunk (4 rows) fails alike, so the step stops; nothing is merged
            with pytest.raises(PipelineError, match="chunk 0 failed the same way"):
                retry_partition(spec, storage, "a", resources.model, log=lambda _: None)
            assert read_output(spec, store, "a").to_pylist() == before

            # rows 1..7 are back, 9..15 are not: the first chunk is committed, the second stops the retry
            down.difference_update({"Say row 1", "Say row 3", "Say row 5", "Say row 7"})
            with pytest.raises(PipelineError, match="chunk 1 failed the same way"):
                retry_partition(spec, storage, "a", resources.model, log=lambda _: None)
            assert read_output(spec, store, "a").to_pylist() == before
            sent = {k: len(proxy.attempts_for(k)) for k in (f"Say row {i}" for i in range(16))}

            down.clear()
            outcome = retry_partition(spec, storage, "a", resources.model, log=lambda _: None)
    assert outcome == {"retried": 8, "still_failed": 0, "dead_letters": 0, "rows": 16}
    resent = {k: len(proxy.attempts_for(k)) - n for k, n in sent.items() if len(proxy.attempts_for(k)) != n}
    assert resent == {f"Say row {i}": 1 for i in (9, 11, 13, 15)}  # rows 1..7 came from the retry's checkpoint
    after = read_output(spec, store, "a").to_pylist()
    assert [r["doc_id"] for r in after] == [f"d{i}" for i in range(16)]
    assert all(r["error"] is None and r["generated_text"] == f"echo:Say row {i}" for i, r in enumerate(after))
    staging = store / "echoes" / "_staging"
    assert not (staging / "retry" / "a").exists() and not (staging / "retry_rows" / "a").exists()  # cleaned up


def test_the_retry_command_finds_a_component_pipeline_in_the_users_project(tmp_path: Path) -> None:
    """The documented command, run from a user's project as they have it, finds a pipeline declared there as a
    Dagster Component (defs.yaml), not only the spec files: it loads the code location as Dagster does."""
    from tests.test_dg import project_copy

    refused = {"Say row 2", "Say row 5"}

    def script(key: str, attempt: int):
        return Respond(400, {"error": {"message": "refused by the content policy"}}) if key in refused else Echo()

    data, store = tmp_path / "data", tmp_path / "store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(8)])
    project = project_copy(tmp_path / "project")
    with FaultProxy(script) as proxy:
        raw = {**_raw_spec(data, proxy.url, name="echo_component"),
               "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5}}
        folder = project / "batch_assets" / "defs" / "echo_component"
        folder.mkdir()
        (folder / "defs.yaml").write_text(yaml.safe_dump(
            {"type": "batch_assets.components.BatchInferencePipeline", "attributes": raw}, sort_keys=False))
        spec = parse_spec(raw)
        assert run_pipeline(spec, store, ["a"]).success  # the same pipeline, run here: two dead letters
        assert {r["doc_id"] for r in read_output(spec, store, "a").to_pylist() if r["error"]} == {"d2", "d5"}

        refused.clear()  # the policy changed: the refused rows are answered now
        env = {k: v for k, v in os.environ.items() if k not in ("BATCH_PIPELINES_DIR", "DAGSTER_HOME")}
        proc = subprocess.run([sys.executable, "-m", "batch_assets.commands.retry_dead_letters", "echo_component", "a",
                               "--storage-root", str(store)], cwd=project, env={**env, "PYTHONPATH": str(project)},
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "retried 2 rows, 0 still failed; 0 dead letters, 8 rows published" in proc.stdout
    assert all(r["error"] is None for r in read_output(spec, store, "a").to_pylist())


def test_the_retry_command_finds_a_component_pipeline_in_a_create_dagster_project(tmp_path: Path) -> None:
    """Issue 27's bug 2: in a project laid out as `create-dagster project` makes it, whose definitions.py is a
    `@dg.definitions` function (not a `Definitions` object), the documented command answered "unknown pipeline" for
    the pipeline its defs.yaml declares. It finds it now, and retries only the refused rows."""
    from tests.test_project_wiring import CREATE_DAGSTER_DEFINITIONS, _project

    refused = {"Say row 1", "Say row 6"}

    def script(key: str, attempt: int):
        return Respond(400, {"error": {"message": "refused by the content policy"}}) if key in refused else Echo()

    data, store = tmp_path / "data", tmp_path / "store"
    write_jsonl(data / "a.jsonl", [{"doc_id": f"d{i}", "text": f"row {i}"} for i in range(8)])
    project = _project(tmp_path / "shop")
    (project / "src" / "shop" / "definitions.py").write_text(CREATE_DAGSTER_DEFINITIONS)
    with FaultProxy(script) as proxy:
        raw = {**_raw_spec(data, proxy.url, name="shop_echoes"), "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5}}
        folder = project / "src" / "shop" / "defs" / "shop_echoes"
        folder.mkdir()
        (folder / "defs.yaml").write_text(yaml.safe_dump(
            {"type": "batch_assets.components.BatchInferencePipeline", "attributes": raw}, sort_keys=False))
        spec = parse_spec(raw)
        assert run_pipeline(spec, store, ["a"]).success
        assert {r["doc_id"] for r in read_output(spec, store, "a").to_pylist() if r["error"]} == {"d1", "d6"}

        refused.clear()
        env = {k: v for k, v in os.environ.items() if k not in ("BATCH_PIPELINES_DIR", "DAGSTER_HOME")}
        proc = subprocess.run([sys.executable, "-m", "batch_assets.commands.retry_dead_letters", "shop_echoes", "a",
                               "--storage-root", str(store)], cwd=project,
                              env={**env, "PYTHONPATH": str(project / "src")}, capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "retried 2 rows, 0 still failed; 0 dead letters, 8 rows published" in proc.stdout
    assert all(r["error"] is None for r in read_output(spec, store, "a").to_pylist())
