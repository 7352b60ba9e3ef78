"""Which executor runs a pipeline's steps locally (batch_assets/orchestration/execution/executors.py), chosen with
$BATCH_EXECUTOR: in-process by default (the steps of a run share one process, so the model loads once); the
multiprocess executor starts steps from a forkserver that has the code location (and torch) imported already, and
every module it preloads exists (a forkserver that cannot import one fails every step); a misspelt choice is
refused with the choices. A real run with BATCH_EXECUTOR=multiprocess: tests/reliability/test_stop_and_crash_cli.py."""

from __future__ import annotations

import importlib.util
import os

import dagster as dg
import pytest

from batch_assets.orchestration.execution.executors import local_executor


def test_in_process_by_default_so_the_steps_of_a_run_share_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCH_EXECUTOR", raising=False)
    executor = local_executor()
    assert executor is dg.in_process_executor
    pids = {}

    @dg.asset
    def first() -> int:
        pids["first"] = os.getpid()
        return 1

    @dg.asset
    def second(first: int) -> int:
        pids["second"] = os.getpid()
        return first + 1

    job = dg.Definitions(assets=[first, second], executor=executor,
                         jobs=[dg.define_asset_job("both")]).resolve_job_def("both")
    assert job.execute_in_process().success
    assert pids == {"first": os.getpid(), "second": os.getpid()}


def test_batch_executor_chooses_and_an_explicit_choice_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_EXECUTOR", "multiprocess")
    assert local_executor().name == "multiprocess_forkserver"
    assert local_executor("in_process") is dg.in_process_executor


def test_the_multiprocess_executor_forks_steps_from_a_server_with_the_code_location_imported() -> None:
    resolved = local_executor("multiprocess").config_schema.resolve_config({})  # as Dagster resolves it for a run
    assert resolved.success, resolved.errors  # Dagster's own multiprocess schema accepts it
    preload = resolved.value["config"]["start_method"]["forkserver"]["preload_modules"]
    assert preload[0] == "batch_assets.definitions"
    assert ("torch" in preload) == (importlib.util.find_spec("torch") is not None)
    missing = [m for m in preload if importlib.util.find_spec(m) is None]
    assert missing == [], f"the forkserver would fail to import {missing}"


def test_a_misspelt_executor_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_EXECUTOR", "multiproces")
    with pytest.raises(ValueError) as info:
        local_executor()
    assert str(info.value) == ("BATCH_EXECUTOR='multiproces' is not a local executor; choose in_process or "
                               "multiprocess (or k8s on Kubernetes, docs/deployment.md)")
