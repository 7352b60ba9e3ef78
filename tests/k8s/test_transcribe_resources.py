"""A transcription pipeline is sized per partition like every other task: the infer step of a partition the policy
gives a GPU asks Kubernetes for it and tells the provider (BATCH_INFER_GPUS), which then runs Whisper in float16 on
CUDA; a CPU partition's step gets no GPU and runs int8 on CPU."""

from __future__ import annotations

from pathlib import Path

from batch_assets.orchestration.execution.pod_compute import resources_for_keys
from batch_assets.resources.base import INFER_GPUS_ENV
from tests.conftest import make_spec

SPEC = {
    "name": "calls",
    "source": {"format": "jsonl", "path": "PLACEHOLDER/{partition}.jsonl", "columns": ["call_id", "file_path"]},
    "partitioning": {"kind": "static", "keys": ["small", "hours-of-calls"]},
    "prepare": {"id_column": "call_id", "input_columns": ["file_path"]},
    "task": {"kind": "transcribe"},
    "model": {"provider": "faster_whisper", "config": {}},
}


def test_a_transcription_partition_gets_the_gpus_its_policy_gives(tmp_path: Path) -> None:
    spec = make_spec(SPEC, tmp_path, runtime={"resources": {
        "default": {"gpus": 0, "cpu": "2", "memory": "4Gi"},
        "partitions": {"hours-*": {"gpus": 1, "memory": "16Gi"}}}})
    gpu = resources_for_keys(spec, ["hours-of-calls"]).k8s_config()["container_config"]
    assert gpu["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "16Gi"}
    assert {"name": INFER_GPUS_ENV, "value": "1"} in gpu["env"]
    cpu = resources_for_keys(spec, ["small"]).k8s_config()["container_config"]
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]
    assert {"name": INFER_GPUS_ENV, "value": "0"} in cpu["env"]
