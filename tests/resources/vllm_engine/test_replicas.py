"""`runtime.resources.gpu_strategy: replicas`: one model copy per GPU inside the step's pod.

vLLM: one engine per GPU, each in its own worker process started with CUDA_VISIBLE_DEVICES set to its GPU. vLLM
cannot run here (no CUDA), so the engines are the recording stand-in (tests/resources/vllm_engine/vllm_standin.py), which logs
the pid and CUDA_VISIBLE_DEVICES it was built in and every row it was sent; the worker processes, the
CUDA_VISIBLE_DEVICES each is started with, the split and the reassembly are the provider's real code.

sentence-transformers: the library's own multi-process pool, with the real MiniLM model on two CPU workers (on a GPU
pod the devices are cuda:0..N-1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from batch_assets.resources.base import GPU_STRATEGY_ENV, INFER_GPUS_ENV
from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.vllm_engine import VLLMEngineProvider
from batch_assets.resources.vllm_engine.replicas import ReplicaSet
from tests.resources.vllm_engine.vllm_standin import STANDIN_API

SYSTEMS = ["You label industries.", "You write haiku.", "You translate."]


def conversations(n: int, start: int = 0) -> list[list[dict[str, str]]]:
    # three system prompts interleaved, so that the caller's order is not the prefix order
    return [[{"role": "system", "content": SYSTEMS[i % 3]}, {"role": "user", "content": f"row {i:02d}"}]
            for i in range(start, start + n)]


def events(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def replicas_env(monkeypatch, tmp_path):
    """What the batch Kubernetes executor sets on a 3-GPU pod with gpu_strategy replicas (the device plugin leaves
    CUDA_VISIBLE_DEVICES unset), plus the stand-in's log folder."""
    log = tmp_path / "engines"
    log.mkdir()
    monkeypatch.setenv(INFER_GPUS_ENV, "3")
    monkeypatch.setenv(GPU_STRATEGY_ENV, "replicas")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("VLLM_STANDIN_LOG", str(log))
    return log


def test_vllm_replicas_one_engine_process_per_gpu_rows_split_and_returned_in_order(replicas_env):
    provider = VLLMEngineProvider(model="Qwen/Qwen2.5-0.5B-Instruct", vllm_api=STANDIN_API).load_for_tests()
    replicas = provider.loaded
    assert isinstance(replicas, ReplicaSet)
    described = provider.describe()  # recorded on the infer asset
    assert (described["replicas"], described["replica_gpus"], described["tensor_parallel_size"]) == (3, "0,1,2", 1)
    chunks = [conversations(12, 0), conversations(12, 12), conversations(5, 24)]  # a multi-chunk partition
    results = [provider.generate(chunk, GenerationParams(max_new_tokens=8)) for chunk in chunks]
    for chunk, generated in zip(chunks, results):  # every row answered, on its own row
        assert [g.text for g in generated] == [f"echo: {c[-1]['content']}" for c in chunk]
        assert all(g.error is None for g in generated)

    log = events(replicas_env)
    builds = [e for e in log if e["event"] == "build"]
    assert len(builds) == 3  # one engine build per replica for the whole partition, not per chunk
    pids = {b["pid"] for b in builds}
    assert len(pids) == 3 and os.getpid() not in pids and set(replicas.pids) == pids
    assert sorted(b["cuda_visible_devices"] for b in builds) == ["0", "1", "2"]  # each exactly one distinct GPU
    assert {b["engine_args"]["tensor_parallel_size"] for b in builds} == {"1"}
    gpu_of = {b["pid"]: b["cuda_visible_devices"] for b in builds}
    chats = [e for e in log if e["event"] == "chat"]
    assert all(gpu_of[c["pid"]] == c["cuda_visible_devices"] for c in chats)  # calls served by the built engine
    sent = sorted(row for c in chats for row in c["rows"])
    assert sent == sorted(f"row {i:02d}" for i in range(29))  # every row sent exactly once
    first_chunk = [c for c in chats if all(int(r.split()[1]) < 12 for r in c["rows"])]
    assert len(first_chunk) == 3 and {len(c["rows"]) for c in first_chunk} == {4}  # an even split ...
    assert all(len(set(c["systems"])) == 1 for c in first_chunk)  # ... keeping rows that share a prompt together
    assert {gpu_of[c["pid"]] for c in first_chunk} == {"0", "1", "2"}

    provider.teardown_after_execution(dg.build_init_resource_context())
    assert all(gone(pid) for pid in pids)  # the workers exited at teardown


def test_vllm_replicas_embed_in_order_equal_to_one_engine(replicas_env, monkeypatch):
    texts = [f"text number {i}" for i in range(10)]
    provider = VLLMEngineProvider(model="m", runner="pooling", vllm_api=STANDIN_API).load_for_tests()
    try:
        vectors = provider.embed(texts)
    finally:
        provider.teardown_after_execution(dg.build_init_resource_context())
    monkeypatch.delenv(GPU_STRATEGY_ENV)
    single = VLLMEngineProvider(model="m", runner="pooling", vllm_api=STANDIN_API).load_for_tests()
    assert not isinstance(single.loaded, ReplicaSet)
    assert vectors.dtype == np.float32 and np.array_equal(vectors, single.embed(texts))
    embeds = [e for e in events(replicas_env) if e["event"] == "embed" and e["pid"] != os.getpid()]
    assert len({e["pid"] for e in embeds}) == 3 and sorted(r for e in embeds for r in e["rows"]) == sorted(texts)


@pytest.mark.parametrize(("fault", "message"), [
    ("raise:1", r"the vLLM replica on GPU 1 \(worker pid \d+\) failed on its share of the chunk: RuntimeError: "
                r"CUDA error: an illegal memory access"),
    ("exit:2", r"the vLLM replica on GPU 2 \(worker pid \d+\) exited while it worked"),
])
def test_a_failing_replica_fails_the_call_naming_its_gpu(replicas_env, monkeypatch, fault, message):
    monkeypatch.setenv("VLLM_STANDIN_FAULT", fault)
    provider = VLLMEngineProvider(model="m", vllm_api=STANDIN_API).load_for_tests()
    try:
        with pytest.raises(RuntimeError, match=message) as info:
            provider.generate(conversations(6), GenerationParams())
        assert "GPU 0" not in str(info.value)  # only the replica that failed is named
    finally:
        provider.teardown_after_execution(dg.build_init_resource_context())


def test_replicas_refuse_a_tensor_parallel_size(replicas_env):
    with pytest.raises(Exception, match="tensor_parallel_size is 2: remove it"):
        VLLMEngineProvider(model="m", vllm_api=STANDIN_API, tensor_parallel_size=2).load_for_tests()


@pytest.mark.slow
def test_vllm_replicas_through_the_pipeline(replicas_env, tmp_path):
    """A whole partition on 3 replicas: 10 rows in chunks of 4, output rows in source order, 3 engine builds."""
    from tests.conftest import GENERATE_SPEC, make_spec, read_output, run_pipeline, write_csv

    companies = [f"Company {i}" for i in range(10)]
    write_csv(tmp_path / "data" / "p0.csv", ["customer_id", "company"], [[f"c{i}", n] for i, n in enumerate(companies)])
    unconstrained = {**GENERATE_SPEC, "task": {k: v for k, v in GENERATE_SPEC["task"].items()
                                               if k not in ("structured", "structured_column")}}
    spec = make_spec(unconstrained, tmp_path / "data",
                     model={"provider": "vllm", "config": {"model": "m", "vllm_api": STANDIN_API}})
    assert run_pipeline(spec, tmp_path / "store", ["p0"]).success
    rows = read_output(spec, tmp_path / "store", "p0").to_pylist()
    assert [r["customer_id"] for r in rows] == [f"c{i}" for i in range(10)]
    assert all(r["error"] is None and f"Company {i}?" in r["generated_text"] for i, r in enumerate(rows)), rows
    log = events(replicas_env)
    builds = [e for e in log if e["event"] == "build"]
    assert len(builds) == 3 and sorted(b["cuda_visible_devices"] for b in builds) == ["0", "1", "2"]
    chats = [e for e in log if e["event"] == "chat"]
    assert len(chats) >= 3 and all(e["pid"] in {b["pid"] for b in builds} for e in chats)
    assert sorted(r for e in chats for r in e["rows"]) == sorted(f"Industry of {c}? Choose from: Law Firm, "
                                                                 "Healthcare, Technology, Other." for c in companies)
    assert all(gone(b["pid"]) for b in builds)  # Dagster's resource teardown stopped the workers


@pytest.mark.slow
def test_sentence_transformers_replicas_pool_vectors_equal_one_process(monkeypatch):
    """The real MiniLM model in sentence-transformers' multi-process pool (two CPU workers standing in for
    cuda:0 and cuda:1): the same vectors, in the same order, as one model in this process."""
    from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder

    texts = [f"{topic} number {i}" for i, topic in enumerate(["the moon", "pasta water", "stock prices",
                                                              "a goalkeeper", "rain in spain"] * 8)]
    single = SentenceTransformerEmbedder(device="cpu").load_for_tests()
    expected = single.embed(texts)
    monkeypatch.setenv(INFER_GPUS_ENV, "2")
    monkeypatch.setenv(GPU_STRATEGY_ENV, "replicas")
    assert SentenceTransformerEmbedder().pool_devices() == ["cuda:0", "cuda:1"]  # what a 2-GPU pod runs
    pooled = SentenceTransformerEmbedder(replica_devices=["cpu", "cpu"]).load_for_tests()
    try:
        workers = pooled._pool["processes"]
        pids = [p.pid for p in workers]
        assert len(workers) == 2 and all(p.is_alive() and p.pid != os.getpid() for p in workers)
        # the vectors must come from the workers: this process's copy of the model refuses to encode
        monkeypatch.setattr(pooled.loaded, "_inference", lambda *a, **k: pytest.fail("encoded in the step's process"))
        vectors = pooled.embed(texts)
        assert pooled.chunks_in_flight(64) == 1 and pooled.describe()["replica_devices"] == "cpu,cpu"
    finally:
        pooled.teardown_after_execution(dg.build_init_resource_context())
    assert all(gone(pid) for pid in pids)  # the workers stopped at teardown
    assert vectors.shape == expected.shape and vectors.dtype == np.float32
    cosine = np.sum(vectors * expected, axis=1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= 0.9999
