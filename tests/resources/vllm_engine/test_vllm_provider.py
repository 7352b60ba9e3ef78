"""VLLMEngineProvider through the `vllm_api` seam, with the recording stand-in engine (no GPU, no vLLM needed).

What the stand-in cannot show (real scheduling, prefix-cache hits, grammar enforcement, LoRA weights, embeddings
of a real pooling model) is covered by tests/gpu/, run on a CUDA node.
"""

from __future__ import annotations

import sys

import dagster as dg
import numpy as np
import pytest

from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.protocols import GenerationParams, TextEmbedder, TextGenerator, supports
from batch_assets.resources.registry import provider_class
from batch_assets.resources.vllm_engine import VLLMEngineProvider
from batch_assets.resources.vllm_engine import provider as provider_module
from tests.resources.vllm_engine.vllm_standin import STANDIN_API, StandInVLLMEngine

SYSTEMS = ["You label industries.", "You write haiku."]


def make(**config) -> VLLMEngineProvider:
    return VLLMEngineProvider(model="Qwen/Qwen2.5-0.5B-Instruct", vllm_api=STANDIN_API, **config).load_for_tests()


def conversations(n: int) -> list[list[dict[str, str]]]:
    # alternate two system prompts so that the caller's order interleaves them
    return [
        [{"role": "system", "content": SYSTEMS[i % 2]}, {"role": "user", "content": f"row {i:02d}"}]
        for i in range(n)
    ]


def test_registered_and_implements_generate_and_embed():
    cls = provider_class("vllm")
    assert cls is VLLMEngineProvider
    assert supports(cls, "generate") and supports(cls, "embed")
    p = make()
    assert isinstance(p, TextGenerator) and isinstance(p, TextEmbedder)
    assert isinstance(p.loaded, StandInVLLMEngine)


def test_engine_arguments_from_config(monkeypatch):
    monkeypatch.setattr(provider_module, "visible_gpu_count", lambda: 4)
    engine = make(
        gpu_memory_utilization=0.8,
        max_model_len=4096,
        enable_prefix_caching=True,
        dtype="bfloat16",
        quantization="awq",
        seed=11,
        engine_kwargs={"enforce_eager": True, "max_num_seqs": 64},
    ).loaded
    assert engine.engine_args == {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "runner": "auto",
        "tensor_parallel_size": 4,  # default: every GPU visible to the process
        "gpu_memory_utilization": 0.8,
        "max_model_len": 4096,
        "enable_prefix_caching": True,
        "dtype": "bfloat16",
        "quantization": "awq",
        "seed": 11,
        "enforce_eager": True,
        "max_num_seqs": 64,
    }
    assert make(tensor_parallel_size=2).loaded.engine_args["tensor_parallel_size"] == 2


def test_engine_kwargs_may_not_repeat_provider_fields():
    with pytest.raises(Exception, match=r"engine_kwargs \['dtype'\] repeat provider fields"):
        make(engine_kwargs={"dtype": "float16"})


def test_one_chat_call_per_chunk_in_prefix_order_mapped_back_to_rows():
    p = make(chat_template_kwargs={"enable_thinking": False})
    rows = conversations(12)
    results = p.generate(rows, GenerationParams(max_new_tokens=16))
    calls = p.loaded.chat_calls
    assert len(calls) == 1  # the whole chunk in one engine call
    sent = calls[0].messages
    assert sorted(map(str, sent)) == sorted(map(str, rows))
    # shared system prompts are adjacent in what the engine received ...
    systems = [c[0]["content"] for c in sent]
    assert systems == sorted(systems) and systems != [c[0]["content"] for c in rows]
    # ... and each result is back on its own row
    assert [r.text for r in results] == [f"echo: row {i:02d}" for i in range(12)]
    assert all(r.error is None and r.completion_tokens for r in results)
    assert calls[0].use_tqdm is False
    assert calls[0].chat_template_kwargs == {"enable_thinking": False}
    assert calls[0].lora_request is None


def test_sampling_params_reach_the_engine_once_for_all_rows():
    p = make()
    p.generate(conversations(3), GenerationParams(max_new_tokens=5, temperature=0.5, top_p=0.8, stop=("END",), seed=3))
    sp = p.loaded.chat_calls[0].sampling_params
    assert isinstance(sp, p.api.SamplingParams)
    assert (sp.max_tokens, sp.temperature, sp.top_p, list(sp.stop), sp.seed) == (5, 0.5, 0.8, ["END"], 3)


def test_choices_go_to_structured_outputs_and_are_validated():
    p = make()
    labels = ("Finance", "Retail", "Other")
    # The engine's answers are checked, not trusted: rows 3 and 5 come back off the list (a grammar the engine did
    # not enforce, a label cut short or cased differently).
    wrong = {3: "Fin", 5: "retail"}

    def reply(conversation, sampling):
        row = int(conversation[-1]["content"].split()[-1])
        return wrong.get(row, labels[row % 3]), "stop"

    p.loaded.reply = reply
    results = p.generate(conversations(8), GenerationParams(max_new_tokens=4, choices=labels))
    constraint = getattr(p.loaded.chat_calls[0].sampling_params, p.api.structured_field)
    assert isinstance(constraint, p.api.StructuredOutputsParams) and constraint.choice == list(labels)
    for row, r in enumerate(results):
        if row in wrong:  # a row error with the raw text kept, never a label
            assert r.parsed is None and r.text == wrong[row] and f"'{wrong[row]}' is not one of the labels" in r.error
        else:
            assert r.error is None and r.parsed == r.text == labels[row % 3], (row, r)


def test_json_rows_that_ran_out_of_tokens_are_row_errors_with_raw_text():
    p = make()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def reply(conversation, sampling):
        row = int(conversation[-1]["content"].split()[-1])
        return ('{"n": ' + str(row) + "}", "stop") if row % 2 == 0 else ('{"n": 1', "length")

    p.loaded.reply = reply
    results = p.generate(conversations(4), GenerationParams(max_new_tokens=6, json_schema=schema))
    assert [r.parsed for r in results] == [{"n": 0}, None, {"n": 2}, None]
    assert results[1].text == '{"n": 1' and "max_new_tokens=6" in results[1].error
    assert results[0].error is None and results[2].error is None
    sent = getattr(p.loaded.chat_calls[0].sampling_params, p.api.structured_field)
    assert sent.json == schema


def test_lora_adapter_enables_lora_and_rides_on_every_request():
    p = make(lora_adapters={"sql": "/adapters/sql-lora"}, max_lora_rank=16)
    args = p.loaded.engine_args
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 1, 16)
    p.generate(conversations(2), GenerationParams())
    lora = p.loaded.chat_calls[0].lora_request
    assert isinstance(lora, p.api.LoRARequest)
    assert (lora.lora_name, lora.lora_int_id, lora.lora_path) == ("sql", 1, "/adapters/sql-lora")
    assert p.describe()["lora"] == "sql"


def test_unknown_lora_name_fails_before_the_engine_starts():
    with pytest.raises(Exception, match="lora 'nope' is not in lora_adapters"):
        make(lora_adapters={"a": "/a", "b": "/b"}, lora="nope")


def test_embed_one_call_in_order_float32_and_optionally_normalised():
    p = make(runner="pooling")
    texts = ["alpha", "beta", "gamma"]
    vectors = p.embed(texts)
    assert p.loaded.embed_calls == [texts]
    assert vectors.dtype == np.float32 and vectors.shape == (3, 8)
    assert np.allclose(vectors[1], p.embed(["beta"])[0])  # row i is text i

    unit = make(runner="pooling", normalize_embeddings=True).embed(texts)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0)
    assert p.embed([]).shape[0] == 0 and len(p.generate([], GenerationParams())) == 0


def test_missing_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as on a CPU machine
    provider = VLLMEngineProvider(model="Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(MissingExtraError) as info:
        provider.load_for_tests()
    assert 'pip install "batch-assets[vllm]"' in str(info.value)
    assert info.value.extra == "vllm"


def test_works_as_a_dagster_resource():
    """The seam is plain config, so it survives Dagster building the resource for a run."""

    @dg.asset
    def labels(llm: VLLMEngineProvider) -> dict:
        llm.loaded.reply = lambda conversation, sampling: ("b" if conversation[-1]["content"] == "row 01" else "c",
                                                           "stop")
        generated = llm.generate(conversations(3), GenerationParams(choices=("a", "b")))
        texts = [g.parsed if g.error is None else "error" for g in generated]
        return {"texts": texts, "engine_args": llm.loaded.engine_args, "lora": llm.lora_request().lora_name}

    provider = VLLMEngineProvider(
        model="m",
        vllm_api=STANDIN_API,
        tensor_parallel_size=1,
        engine_kwargs={"enforce_eager": True, "max_num_seqs": 4},
        lora_adapters={"sql": "/adapters/sql"},
        chat_template_kwargs={"enable_thinking": False},
    )
    result = dg.materialize([labels], resources={"llm": provider})
    assert result.success
    out = result.output_for_node("labels")
    assert out["texts"] == ["error", "b", "error"]  # "c" is not a choice: a row error, not an answer
    assert out["engine_args"]["max_num_seqs"] == 4 and out["engine_args"]["enable_lora"] is True
    assert out["lora"] == "sql"


def test_calls_match_the_installed_vllm_signatures():
    """On a machine with vLLM: the engine arguments and the chat/embed keywords the provider uses exist there."""
    vllm = pytest.importorskip("vllm", reason="vLLM not installed (CUDA-only); the GPU node runs this check")
    import inspect

    from vllm.engine.arg_utils import EngineArgs

    provider = VLLMEngineProvider(
        model="m", max_model_len=2048, quantization="awq", lora_adapters={"a": "/a"}, max_lora_rank=8
    )
    EngineArgs(**provider.engine_args())  # raises TypeError on an unknown argument
    chat = inspect.signature(vllm.LLM.chat).parameters
    embed = inspect.signature(vllm.LLM.embed).parameters
    assert {"sampling_params", "use_tqdm", "lora_request", "chat_template_kwargs"} <= set(chat)
    assert {"use_tqdm", "lora_request"} <= set(embed)


def test_generate_pipeline_with_json_schema_unnested(tmp_path):
    """The whole read -> prepare -> infer -> write pipeline on the vLLM provider (stand-in engine): rows out equal
    rows in, the JSON answer spread into its own column, a blank input flagged and not sent."""
    from tests.conftest import GENERATE_SPEC, make_spec, read_output, run_pipeline, write_csv

    companies = ["Baker & Chen LLP", "", "Nova Software Inc"]
    write_csv(tmp_path / "data" / "p0.csv", ["customer_id", "company"], [[f"c{i}", n] for i, n in enumerate(companies)])
    task = {
        **GENERATE_SPEC["task"],
        "params": {"max_new_tokens": 32},
        "structured": {
            "json_schema": {"type": "object", "properties": {"echo": {"type": "string"}}, "required": ["echo"]},
            "unnest": True,
        },
    }
    spec = make_spec(
        GENERATE_SPEC,
        tmp_path / "data",
        task=task,
        model={"provider": "vllm", "config": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "vllm_api": STANDIN_API}},
    )
    assert run_pipeline(spec, tmp_path / "store", ["p0"]).success
    rows = {r["customer_id"]: r for r in read_output(spec, tmp_path / "store", "p0").to_pylist()}
    assert sorted(rows) == ["c0", "c1", "c2"]
    assert rows["c0"]["error"] is None and "Baker & Chen LLP" in rows["c0"]["echo"]
    assert rows["c2"]["echo"].startswith("Industry of Nova Software Inc?")
    assert rows["c1"]["error"].startswith("empty input") and rows["c1"]["echo"] is None
