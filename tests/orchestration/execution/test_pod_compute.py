"""The infer step's Kubernetes compute (orchestration/execution/pod_compute.py, what `runtime.resources` asks
for): spec -> per-partition resources -> the step's Kubernetes config."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_assets.orchestration.execution.pool_slots import infer_pool
from batch_assets.orchestration.execution.pod_compute import resources_for_key, resources_for_keys
from batch_assets.spec import SpecError
from batch_assets.resources.base import INFER_GPUS_ENV, resolve_device
from batch_assets.resources.provider_errors import ModelLoadError
from tests.conftest import EMBED_SPEC, docs_rows, make_spec, write_jsonl

GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def policy_spec(tmp_path: Path, **runtime):
    return make_spec(EMBED_SPEC, tmp_path, partitioning={"kind": "static", "keys": ["a", "b", "big-1", "c"]},
                     runtime=runtime)


def test_default_explicit_key_and_pattern(tmp_path: Path) -> None:
    spec = policy_spec(tmp_path, gpus=1, resources={
        "default": {"cpu": "2", "memory": "4Gi", "node_selector": {"pool": "gpu-small"}, "tolerations": [GPU_TAINT]},
        "partitions": {"big-*": {"gpus": 4, "memory": "64Gi", "node_selector": {"pool": "gpu-large"}},
                       "c": {"gpus": 0, "node_selector": {"pool": "cpu"}}, "*": {"cpu": "3"}},
    })
    a = resources_for_key(spec, "a")
    assert (a.gpus, a.cpu, a.memory, a.node_selector) == (1, "3", "4Gi", {"pool": "gpu-small"})
    big = resources_for_key(spec, "big-1")  # the first matching pattern wins; fields it leaves unset stay default
    assert (big.gpus, big.cpu, big.memory, big.node_selector) == (4, "2", "64Gi", {"pool": "gpu-large"})
    assert big.tolerations[0].key == "nvidia.com/gpu"
    c = resources_for_key(spec, "c")  # an exact key wins over every pattern, "*" included
    assert (c.gpus, c.cpu) == (0, "2")


def test_range_takes_the_largest_need(tmp_path: Path) -> None:
    spec = policy_spec(tmp_path, resources={
        "default": {"gpus": 1, "cpu": "8", "memory": "4Gi", "node_selector": {"pool": "small"}},
        "partitions": {"b": {"gpus": 2, "cpu": "1", "memory": "2Gi", "node_selector": {"pool": "large"},
                             "tolerations": [GPU_TAINT]}},
    })
    step = resources_for_keys(spec, ["a", "b"])
    # b's profile (most GPUs: node selector, tolerations), CPU/memory raised to the most any partition asks
    assert (step.gpus, step.cpu, step.memory, step.node_selector) == (2, "8", "4Gi", {"pool": "large"})
    config = step.k8s_config()
    assert config["container_config"]["resources"] == {
        "requests": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "4Gi"},
        "limits": {"nvidia.com/gpu": "2", "memory": "4Gi"},
    }
    assert config["container_config"]["env"] == [{"name": INFER_GPUS_ENV, "value": "2"},
                                                 {"name": "BATCH_GPU_STRATEGY", "value": "tensor_parallel"}]
    # two GPUs sharding one model: NCCL's /dev/shm is a memory-backed volume, not Kubernetes' 64 MB default
    assert config["container_config"]["volume_mounts"] == [{"name": "dshm", "mount_path": "/dev/shm"}]
    assert config["pod_spec_config"] == {
        "node_selector": {"pool": "large"}, "tolerations": [GPU_TAINT],
        "volumes": [{"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": "8Gi"}}]}


def test_size_rules_read_file_sizes_and_parquet_footers(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", docs_rows("a", 2))
    write_jsonl(tmp_path / "b.jsonl", docs_rows("b", 40))
    small, large = (tmp_path / "a.jsonl").stat().st_size, (tmp_path / "b.jsonl").stat().st_size
    spec = make_spec(EMBED_SPEC, tmp_path, runtime={"resources": {
        "default": {"gpus": 1}, "by_size": [{"min_bytes": (small + large) // 2, "gpus": 2, "memory": "8Gi"}]}})
    assert resources_for_key(spec, "a").gpus == 1
    assert (resources_for_key(spec, "b").gpus, resources_for_key(spec, "b").memory) == (2, "8Gi")

    pq.write_table(pa.table({"doc_id": ["x"] * 3, "text": ["t"] * 3}), tmp_path / "p.parquet")
    pq.write_table(pa.table({"doc_id": ["y"] * 30, "text": ["t"] * 30}), tmp_path / "q.parquet")
    pspec = make_spec(EMBED_SPEC, tmp_path, source={"format": "parquet", "path": f"{tmp_path}/{{partition}}.parquet"},
                      partitioning={"kind": "static", "keys": ["p", "q"]},
                      runtime={"resources": {"by_size": [{"min_rows": 10, "gpus": 1}, {"min_rows": 25, "gpus": 3}]}})
    assert [resources_for_key(pspec, k).gpus for k in ("p", "q")] == [0, 3]


def test_missing_source_file_is_a_located_error(tmp_path: Path) -> None:
    spec = make_spec(EMBED_SPEC, tmp_path, runtime={"resources": {"by_size": [{"min_bytes": "1Mi", "gpus": 2}]}})
    with pytest.raises(Exception) as err:
        resources_for_keys(spec, ["a"])
    assert "docs" in str(err.value) and "a" in str(err.value) and "does not exist" in str(err.value)


@pytest.mark.parametrize("runtime, message", [
    ({"resources": {"default": {"memory": "lots"}}}, "not a Kubernetes quantity"),
    ({"resources": {"by_size": [{"gpus": 2}]}}, "exactly one of min_rows or min_bytes"),
    ({"resources": {"by_size": [{"min_rows": 5, "gpus": 2}]}}, "min_rows is read from Parquet footers"),
    ({"gpus": 1, "resources": {"default": {"gpus": 2}}}, "disagree"),
])
def test_invalid_policies_are_spec_errors(tmp_path: Path, runtime, message) -> None:
    with pytest.raises(SpecError, match=message):
        make_spec(EMBED_SPEC, tmp_path, runtime=runtime)


def test_gpu_pipelines_share_the_gpu_pool(tmp_path: Path) -> None:
    assert infer_pool(make_spec(EMBED_SPEC, tmp_path)) is None
    assert infer_pool(make_spec(EMBED_SPEC, tmp_path, runtime={"gpus": 1})) == "gpu"
    override_only = make_spec(EMBED_SPEC, tmp_path, runtime={"resources": {"partitions": {"b": {"gpus": 1}}}})
    assert infer_pool(override_only) == "gpu"
    assert infer_pool(make_spec(EMBED_SPEC, tmp_path, runtime={"gpus": 1, "pool": "a100"})) == "a100"


def test_auto_device_follows_the_gpu_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INFER_GPUS_ENV, "0")
    assert resolve_device("auto") == "cpu"
    monkeypatch.setenv(INFER_GPUS_ENV, "2")
    assert resolve_device("cpu") == "cpu"  # an explicit device is used as given
    import torch

    # Both sides of the grant, whatever this machine has: a pod given GPUs that sees none fails with the fix,
    # one that sees CUDA uses it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="given 2 GPU"):
        resolve_device("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"


def test_vllm_tensor_parallel_follows_the_gpu_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.resources.vllm_engine.provider import VLLMEngineProvider

    monkeypatch.setenv(INFER_GPUS_ENV, "4")
    assert VLLMEngineProvider(model="m").engine_args()["tensor_parallel_size"] == 4
    assert VLLMEngineProvider(model="m", tensor_parallel_size=2).engine_args()["tensor_parallel_size"] == 2


def test_run_partition_keys_from_tags(tmp_path: Path) -> None:
    import dagster as dg

    from batch_assets.orchestration.execution.k8s_executor import run_partition_keys

    spec = policy_spec(tmp_path)
    with dg.instance_for_test() as instance:
        assert run_partition_keys(spec, {"dagster/partition": "b"}, instance) == ["b"]
        range_tags = {"dagster/asset_partition_range_start": "b", "dagster/asset_partition_range_end": "c"}
        assert run_partition_keys(spec, range_tags, instance) == ["b", "big-1", "c"]
        assert run_partition_keys(spec, {}, instance) == []
        dynamic = make_spec(EMBED_SPEC, tmp_path, partitioning={"kind": "dynamic", "keys": None})
        instance.add_dynamic_partitions("docs", ["x", "y", "z"])
        tags = {"dagster/asset_partition_range_start": "x", "dagster/asset_partition_range_end": "y"}
        assert run_partition_keys(dynamic, tags, instance) == ["x", "y"]


def test_gpu_steps_default_to_the_deployments_gpu_node_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.orchestration.execution.k8s_executor import with_gpu_node_pool

    monkeypatch.setenv("BATCH_GPU_NODE_SELECTOR", '{"cloud.google.com/gke-accelerator": "nvidia-l4"}')
    monkeypatch.setenv("BATCH_GPU_TOLERATIONS", '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]')
    spec = policy_spec(tmp_path, resources={"default": {"gpus": 1},
                                            "partitions": {"b": {"node_selector": {"pool": "own"}}, "c": {"gpus": 0}}})
    a = with_gpu_node_pool(resources_for_keys(spec, ["a"])).k8s_config()["pod_spec_config"]
    assert a == {"node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}, "tolerations": [GPU_TAINT]}
    b = with_gpu_node_pool(resources_for_keys(spec, ["b"])).k8s_config()["pod_spec_config"]
    assert b["node_selector"] == {"pool": "own"}  # the spec's own choice wins
    assert with_gpu_node_pool(resources_for_keys(spec, ["c"])).k8s_config()["pod_spec_config"] == {}  # CPU step
    monkeypatch.setenv("BATCH_GPU_TOLERATIONS", '{"key": "x"}')
    with pytest.raises(ValueError, match="BATCH_GPU_TOLERATIONS must be a JSON list"):
        with_gpu_node_pool(resources_for_keys(spec, ["a"]))


def test_gpu_steps_get_gpu_defaults_not_nothing(tmp_path: Path) -> None:
    """A `runtime.gpus: 1` step that names no memory gets the documented GPU default, so nothing else (the code
    server's sizing, a namespace default) decides how much host memory vLLM has while loading weights."""
    from batch_assets.orchestration.execution.pod_compute import with_gpu_defaults

    one = with_gpu_defaults(resources_for_keys(policy_spec(tmp_path, gpus=1), ["a"]))
    assert (one.gpus, one.cpu, one.memory) == (1, "4", "16Gi")
    two = with_gpu_defaults(resources_for_keys(policy_spec(tmp_path, gpus=2, resources={
        "default": {"memory": "40Gi"}}), ["a"]))
    assert (two.cpu, two.memory) == ("8", "40Gi")  # what the policy names wins
    cpu = with_gpu_defaults(resources_for_keys(policy_spec(tmp_path), ["a"]))
    assert (cpu.cpu, cpu.memory) == (None, None)  # a CPU step is left as the policy says


def test_gpu_strategy_is_checked_against_the_provider_and_the_model(tmp_path: Path) -> None:
    import json

    from batch_assets.errors import PipelineError
    from batch_assets.orchestration.execution.pod_compute import check_gpu_strategy

    # a one-GPU provider on two GPUs: allowed, with a warning that one sits idle (the run log shows it)
    local = policy_spec(tmp_path, gpus=2)
    (warning,) = check_gpu_strategy(local, resources_for_keys(local, ["a"]))
    assert "'sentence_transformers' provider runs its model on one GPU: 1 would sit idle" in warning
    # replicas inside one pod: sentence-transformers runs them (its multi-process pool), so no warning
    replicas = policy_spec(tmp_path, resources={"default": {"gpus": 2, "gpu_strategy": "replicas"}})
    assert check_gpu_strategy(replicas, resources_for_keys(replicas, ["a"])) == []
    # the pod tells the provider to run replicas, and gets no /dev/shm volume (no NCCL between replicas)
    config = resources_for_keys(replicas, ["a"]).k8s_config()
    assert config["container_config"]["env"] == [{"name": INFER_GPUS_ENV, "value": "2"},
                                                 {"name": "BATCH_GPU_STRATEGY", "value": "replicas"}]
    assert "volume_mounts" not in config["container_config"] and "volumes" not in config["pod_spec_config"]
    # ... a provider that cannot is refused naming the ones that can (the policy check; the spec load refuses too)
    other = replicas.model_copy(update={"model": replicas.model.model_copy(update={"provider": "transformers"})})
    with pytest.raises(PipelineError, match="gpu_strategy 'replicas', but the 'transformers' provider runs one "
                       "model in one process; replicas are run by the 'sentence_transformers' and 'vllm' providers"):
        check_gpu_strategy(other, resources_for_keys(other, ["a"]))
    vllm_replicas = make_spec(EMBED_SPEC, tmp_path, model={"provider": "vllm", "config": {"model": "org/model"}},
                              runtime={"resources": {"default": {"gpus": 4, "gpu_strategy": "replicas"}}})
    assert check_gpu_strategy(vllm_replicas, resources_for_keys(vllm_replicas, ["a"])) == []
    # vLLM tensor parallelism over a local model whose 14 attention heads 4 GPUs cannot split
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 14}))
    vllm = make_spec(EMBED_SPEC, tmp_path, model={"provider": "vllm", "config": {"model": str(model)}},
                     runtime={"resources": {"default": {"gpus": 4}, "partitions": {"b": {"gpus": 2}}}})
    with pytest.raises(PipelineError, match="14 attention heads, which 4 GPUs cannot split evenly"):
        check_gpu_strategy(vllm, resources_for_keys(vllm, ["a"]))
    assert check_gpu_strategy(vllm, resources_for_keys(vllm, ["b"])) == []  # 2 divides 14
    hub = make_spec(EMBED_SPEC, tmp_path, model={"provider": "vllm", "config": {"model": "org/model"}},
                    runtime={"gpus": 4})
    assert check_gpu_strategy(hub, resources_for_keys(hub, ["a"])) == []  # a hub id cannot be read offline


def test_replicas_with_a_provider_that_cannot_run_them_is_refused_at_spec_load(tmp_path: Path) -> None:
    from tests.conftest import GENERATE_SPEC

    with pytest.raises(SpecError, match=r"runtime.resources.gpu_strategy.*'replicas', but the 'transformers' "
                       r"provider runs one model in one process; replicas are run by the 'sentence_transformers' "
                       r"and 'vllm' providers"):
        make_spec(GENERATE_SPEC, tmp_path, model={"provider": "transformers", "config": {}},
                  runtime={"resources": {"default": {"gpus": 2}, "partitions": {"b": {"gpu_strategy": "replicas"}}}})
    with pytest.raises(SpecError, match="tensor_parallel_size is 2: each vLLM replica runs on one GPU"):
        make_spec(EMBED_SPEC, tmp_path, model={"provider": "vllm", "config": {"model": "m", "tensor_parallel_size": 2}},
                  runtime={"resources": {"default": {"gpus": 4, "gpu_strategy": "replicas"}}})


def test_a_failed_step_pod_says_why_it_ended() -> None:
    """The step failure of a failed Job names OOMKilled or a disruption (kubernetes client objects, as the
    executor reads them from the API)."""
    from kubernetes.client import (
        V1ContainerState, V1ContainerStateTerminated, V1ContainerStatus, V1Pod, V1PodCondition, V1PodStatus)

    from batch_assets.orchestration.execution.k8s_executor import _pod_end

    def pod(conditions=(), terminated=None) -> V1Pod:
        state = V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=137, reason=terminated))
        return V1Pod(status=V1PodStatus(phase="Failed", conditions=list(conditions), container_statuses=[
            V1ContainerStatus(name="dagster", image="i", image_id="", ready=False, restart_count=0, state=state)]))

    assert "OOMKilled" in _pod_end(pod(terminated="OOMKilled")) and "raise `memory`" in _pod_end(
        pod(terminated="OOMKilled"))
    disrupted = _pod_end(pod([V1PodCondition(type="DisruptionTarget", status="True", reason="PreemptionByScheduler")]))
    assert "disrupted (PreemptionByScheduler" in disrupted and "resumes from its committed chunks" in disrupted
    assert _pod_end(pod(terminated="Error")) == ""


def test_a_replicas_step_pod_rendered_from_the_chart_tells_the_provider(tmp_path: Path) -> None:
    """The infer Job of a 2-GPU `gpu_strategy: replicas` vLLM spec, as the chart's container context and the
    executor compose it: 2 GPUs, BATCH_INFER_GPUS=2 and BATCH_GPU_STRATEGY=replicas reach the container (the vLLM
    provider starts one engine per GPU from them), and no /dev/shm volume is mounted."""
    import yaml

    from tests.k8s.conftest import chart_deployment, step_job
    from tests.k8s.stub import KubernetesJobsStub

    values = yaml.safe_load((Path(__file__).parents[3] / "k8s" / "values.yaml").read_text())
    spec = make_spec(EMBED_SPEC, tmp_path, model={"provider": "vllm", "config": {"model": "org/model"}},
                     runtime={"resources": {"default": {"gpus": 2, "gpu_strategy": "replicas"}}})
    stub = KubernetesJobsStub(tmp_path / "stub", cwd=tmp_path).start()  # for its kubeconfig; nothing is posted
    try:
        body = step_job(chart_deployment(stub, tmp_path / "home", settings={}, values=values), spec, "inferred", "a")
    finally:
        stub.stop()
    pod = body["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env[INFER_GPUS_ENV], env["BATCH_GPU_STRATEGY"]) == ("2", "replicas")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "/dev/shm" not in [m["mountPath"] for m in container.get("volumeMounts") or []]
    assert "dshm" not in [v["name"] for v in pod.get("volumes") or []]
