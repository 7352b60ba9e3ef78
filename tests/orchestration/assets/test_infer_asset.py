"""The infer asset's body (batch_assets/orchestration/assets/infer_asset.py) as a user sees it in a run's metadata
and failures: every partition says which model and provider made it, on which device, with a preview that starts
with the row id; tokens, requests (less cache hits) and the estimated cost at online and batch prices; a model that
could not load on its preload thread fails the step once, naming the pipeline, instead of being retried into the
same error, while any other failure is left to the step's retry policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from batch_assets.orchestration.assets.infer_asset import (InferredAsset, id_column,
                                                           infer_partition_metadata)
from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.spec import parse_spec
from tests.conftest import GENERATE_SPEC, make_spec, run_pipeline
from tests.daemon_helpers import daily_spec, write_day

DAYS = ["2026-11-01", "2026-11-02"]


class PreloadFailed:
    """Stand-in for a provider whose model loads on a thread from the run's start (resources/base.py `preload`,
    e.g. sentence_transformers) and failed there: waiting for it raises what the load raised."""

    def __init__(self, error: BaseException):
        self.error, self.waits = error, 0

    def wait_for_preload(self) -> None:
        self.waits += 1
        raise self.error


def _inferred(instance: dg.DagsterInstance, run_id: str) -> dict[str, dict]:
    found = {}
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        m = record.asset_materialization
        if m.asset_key.path[-1] == "inferred":
            found[m.partition] = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
    return found


def test_each_partition_says_what_made_it_where_and_shows_its_rows_id_first(tmp_path: Path) -> None:
    """(Each partition's own error samples: tests/stages/test_partition_outcomes.py.)"""
    for day in DAYS:
        write_day(tmp_path / "days", day, rows=3)
    spec = parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log"))
    with dg.instance_for_test() as instance:
        result = run_pipeline(spec, tmp_path / "store", DAYS, instance=instance)
        md = _inferred(instance, result.run_id)
    assert set(md) == set(DAYS)
    for day in DAYS:
        assert md[day]["model"] == "tests.daemon_helpers:CountingModel" and md[day]["provider"] == "custom"
        assert md[day]["provider_class"] == "CustomModelProvider" and md[day]["device"] == "cpu"
        assert md[day]["cost_usd"] == 0.0 and "tokens_in" not in md[day], "a local model counts no tokens"
        preview = md[day]["preview"].splitlines()
        assert preview[0] == "| doc_id | text | prediction | error |", preview
        assert preview[2] == f"| doc-{day}-0 | doc-{day}-0 | 16 |  |", preview


@pytest.mark.parametrize("error", [ModelLoadError("SentenceTransformerEmbedder could not load model '/models/x': "
                                                   "no such folder"),
                                    ImportError("No module named 'sentence_transformers'")], ids=["load", "import"])
def test_a_model_that_could_not_load_fails_the_step_without_retries_naming_the_pipeline(
        tmp_path: Path, error: BaseException) -> None:
    spec = parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log"))
    model = PreloadFailed(error)
    with pytest.raises(dg.Failure) as info:
        InferredAsset(spec, None, None, model).wait_for_model()
    assert info.value.description == f"pipeline 'daily_docs': {error}"
    assert info.value.allow_retries is False, "a retry would load and fail the same way"
    assert info.value.metadata["pipeline"].value == "daily_docs"


def test_any_other_failure_while_waiting_is_left_to_the_retry_policy(tmp_path: Path) -> None:
    spec = parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log"))
    with pytest.raises(ConnectionError):  # e.g. weights fetched from a store that was briefly unreachable
        InferredAsset(spec, None, None, PreloadFailed(ConnectionError("reset by peer"))).wait_for_model()


def test_tokens_requests_and_cost_at_online_and_batch_prices(tmp_path: Path) -> None:
    spec = make_spec(GENERATE_SPEC, tmp_path, model={
        "provider": "openai", "config": {"model": "gpt-4o-mini", "batch_api": True},
        "pricing": {"input_per_million_tokens": 2.0, "output_per_million_tokens": 8.0}})
    delta = {"prompt_tokens": 3_000_000, "completion_tokens": 1_000_000, "rows_sent": 120, "cache_hits": 20,
             "cache_misses": 100, "batch_prompt_tokens": 2_000_000, "batch_completion_tokens": 500_000,
             "batch_rows": 80, "batches_submitted": 2, "batch_rows_online": 20}
    md = infer_partition_metadata(spec, {"model": "gpt-4o-mini", "provider": "OpenAIProvider"}, "remote (HTTP API)",
                                  delta)
    assert md["tokens_in"] == 3_000_000 and md["tokens_out"] == 1_000_000
    assert md["requests"] == 100, "rows the response cache answered were not sent"
    assert md["cache_hits"] == 20 and md["cache_misses"] == 100
    # online: 1M in x $2 + 0.5M out x $8 = $6; batch (half price): 2M x $1 + 0.5M x $4 = $4
    assert md["cost_usd"] == 10.0
    assert md["batches_submitted"] == 2 and md["batch_rows"] == 80 and md["batch_tokens_in"] == 2_000_000
    online = make_spec(GENERATE_SPEC, tmp_path, model={
        "provider": "openai", "config": {"model": "gpt-4o-mini"},
        "pricing": {"input_per_million_tokens": 2.0, "output_per_million_tokens": 8.0}})
    md = infer_partition_metadata(online, {"model": "gpt-4o-mini"}, "remote (HTTP API)",
                                  {"prompt_tokens": 1_000_000, "completion_tokens": 0, "rows_sent": 5})
    assert md["cost_usd"] == 2.0 and "batches_submitted" not in md and md["requests"] == 5


def test_previews_start_with_the_rows_id(tmp_path: Path) -> None:
    assert id_column(make_spec(GENERATE_SPEC, tmp_path)) == "customer_id"
    raw = daily_spec(tmp_path, tmp_path / "log")
    raw["prepare"].pop("id_column")
    assert id_column(parse_spec(raw)) == "row_id"
