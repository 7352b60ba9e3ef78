"""Kubernetes compute for the infer step: the spec's `runtime.resources` policy + a run's partition keys -> what the
step's pod asks for (GPUs, CPU, memory, node selector, tolerations). Named for the pod, not "resources": that word
already means model providers (resources/) and Dagster resources.

Dagster cannot vary a step's resources by partition (dagster issue #20816): `batch_assets/orchestration/execution/k8s_executor.py` calls
`resources_for_keys` for each infer step it launches and merges the result into that step's Kubernetes Job.

One partition's resources: the policy default, then every `by_size` rule the partition reaches (sizes read from the
source's metadata only: file sizes, Parquet footers), then the `partitions` override matching its key.
A run over several partitions (a single-run backfill) asks for the largest need: the neediest partition's profile
(most GPUs, then CPU, then memory: its node selector and tolerations) with CPU and memory raised to the largest
asked by any partition of the run.

A GPU step whose policy names no memory or CPU gets GPU_DEFAULT_MEMORY_PER_GPU / GPU_DEFAULT_CPU_PER_GPU per GPU
(request = limit for memory): never the code server's sizing, which dagster-k8s would otherwise merge into every
step pod (docs/deployment.md, "What a step pod gets").
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from typing import Any

from batch_assets.errors import PipelineError
from batch_assets.partitions import partition_kind, resolve_partition, source_path_for
from batch_assets.spec import (
    InferResources,
    PipelineSpec,
    Toleration,
    parse_quantity,
    replica_providers,
    replicas_problem,
)
from batch_assets.stage_names import INFER
from batch_assets.storage import filesystem_for, parquet_rows, shown_path
from batch_assets.resources.registry import provider_class

GPU_RESOURCE = "nvidia.com/gpu"
# Set on the infer container; providers read it at load (resources/base.py: device; vLLM: tensor_parallel_size).
from batch_assets.resources.base import GPU_STRATEGY_ENV, INFER_GPUS_ENV  # noqa: E402  (one name for the executor and the providers)
# Op tags the factory puts on each infer asset: which pipeline's policy sizes the step (k8s_executor.py reads them).
PIPELINE_TAG = "batch_assets/pipeline"
STAGE_TAG = "batch_assets/stage"
INFER_STAGE = INFER.asset
# What a GPU step gets per GPU when its policy says nothing: vLLM holds the weights in host memory while it loads
# them onto the GPU (a 7-8B model in bf16 is ~16 GB), and tokenisation / data loading want a few cores.
GPU_DEFAULT_MEMORY_PER_GPU_GI = 16
GPU_DEFAULT_CPU_PER_GPU = 4
# Tensor parallelism exchanges activations through /dev/shm (NCCL); Kubernetes gives a container 64 MB there.
# A memory-backed emptyDir of this size is mounted instead; it counts against the pod's memory limit.
TP_SHM_SIZE = "8Gi"
GPU_POD_ANNOTATIONS = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


@dataclass(frozen=True)
class StepResources:
    """Resolved resources of one infer step."""

    gpus: int = 0
    cpu: str | None = None
    memory: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    partitions: tuple[str, ...] = ()  # the partition keys this was resolved for (for the run log)
    gpu_strategy: str | None = None  # tensor_parallel / replicas (only meaningful with gpus > 1)

    @property
    def tensor_parallel(self) -> bool:
        return self.gpus > 1 and (self.gpu_strategy or "tensor_parallel") == "tensor_parallel"

    def need(self) -> tuple[int, Decimal, Decimal]:
        zero = Decimal(0)
        return (
            self.gpus,
            parse_quantity(self.cpu, "cpu") if self.cpu else zero,
            parse_quantity(self.memory, "memory") if self.memory else zero,
        )

    def k8s_config(self) -> dict[str, Any]:
        """A `dagster-k8s/config`-shaped dict (UserDefinedDagsterK8sConfig) for the infer step's Job.

        GPUs: request = limit (extended resources must be equal). Memory: request = limit, so a partition that
        outgrows its estimate fails with OOMKilled instead of starving its neighbours. CPU: request only, since a
        CPU limit throttles tokenisation and data loading on nodes with idle cores.
        """
        requests: dict[str, str] = {}
        limits: dict[str, str] = {}
        if self.gpus:
            requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(self.gpus)
        if self.cpu:
            requests["cpu"] = self.cpu
        if self.memory:
            requests["memory"] = limits["memory"] = self.memory
        env = [{"name": INFER_GPUS_ENV, "value": str(self.gpus)}]
        if self.gpus > 1:
            env.append({"name": GPU_STRATEGY_ENV, "value": "tensor_parallel" if self.tensor_parallel else "replicas"})
        container: dict[str, Any] = {"env": env}
        if requests or limits:
            container["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
        pod: dict[str, Any] = {}
        if self.tensor_parallel:
            container["volume_mounts"] = [{"name": "dshm", "mount_path": "/dev/shm"}]
            pod["volumes"] = [{"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": TP_SHM_SIZE}}]
        if self.node_selector:
            pod["node_selector"] = dict(self.node_selector)
        if self.tolerations:
            pod["tolerations"] = [t.model_dump(exclude_none=True) for t in self.tolerations]
        config: dict[str, Any] = {"container_config": container, "pod_spec_config": pod}
        if self.gpus:
            # Autoscalers must not consolidate a node away under a running GPU step (its work since the last
            # checkpoint would be lost); a spot reclaim still can, and the step's retry resumes from checkpoints.
            config["pod_template_spec_metadata"] = {"annotations": dict(GPU_POD_ANNOTATIONS)}
        return config


def _overlay(base: InferResources, over: InferResources) -> InferResources:
    set_fields = {k: getattr(over, k) for k in InferResources.model_fields if getattr(over, k) is not None}
    return base.model_copy(update=set_fields)


class PartitionSizes:
    """Sizes of partitions from source metadata (no row is read), computed on demand and cached."""

    def __init__(self, spec: PipelineSpec):
        self.spec = spec

    @cached_property
    def _shard_divisor(self) -> int:
        # hash shards split every source row: each is about 1/count of the total
        return partition_kind(self.spec).shards(self.spec)

    def _files(self, key: str) -> list[str]:
        return resolve_partition(self.spec, key).files

    def bytes(self, key: str) -> int:
        total = 0
        for url in self._files(key):
            fs, path = filesystem_for(url)
            total += int(fs.size(path))
        return total // self._shard_divisor

    def rows(self, key: str) -> int:
        return sum(parquet_rows(url) for url in self._files(key)) // self._shard_divisor


def resources_for_key(spec: PipelineSpec, key: str, sizes: PartitionSizes | None = None) -> InferResources:
    policy = spec.runtime.resources
    resolved = spec.runtime.default_resources()
    if policy.by_size:
        sizes = sizes or PartitionSizes(spec)
        try:
            for rule in policy.by_size:
                if rule.min_rows is not None:
                    reached = sizes.rows(key) >= rule.min_rows
                else:
                    reached = sizes.bytes(key) >= parse_quantity(rule.min_bytes, "min_bytes")  # type: ignore[arg-type]
                if reached:
                    resolved = _overlay(resolved, rule)
        except PipelineError as exc:
            raise exc.located(pipeline=spec.name, partition=key) from None
        except OSError as exc:
            raise PipelineError(
                f"could not size the partition for runtime.resources.by_size: {exc}",
                pipeline=spec.name, partition=key, file=shown_path(source_path_for(spec, key)),
                fix="check the source files are readable by the run worker, or use partitions overrides",
            ) from exc
    override = policy.partitions.get(key)
    if override is None:
        override = next((o for pat, o in policy.partitions.items() if fnmatch.fnmatchcase(key, pat)), None)
    if override is not None:
        resolved = _overlay(resolved, override)
    return resolved


def _to_step(res: InferResources, keys: tuple[str, ...]) -> StepResources:
    return StepResources(
        gpus=res.gpus or 0, cpu=res.cpu, memory=res.memory, node_selector=dict(res.node_selector or {}),
        tolerations=tuple(res.tolerations or ()), partitions=keys, gpu_strategy=res.gpu_strategy,
    )


def with_gpu_defaults(step: StepResources) -> StepResources:
    """A GPU step's memory and CPU when the policy names none (module docstring)."""
    if not step.gpus:
        return step
    return replace(
        step,
        memory=step.memory or f"{GPU_DEFAULT_MEMORY_PER_GPU_GI * step.gpus}Gi",
        cpu=step.cpu or str(GPU_DEFAULT_CPU_PER_GPU * step.gpus),
    )


def check_gpu_strategy(spec: PipelineSpec, step: StepResources) -> list[str]:
    """Refuse a GPU layout that cannot run, before a pod is asked for; return warnings for one that wastes GPUs.
    Only multi-GPU steps are checked."""
    if step.gpus <= 1:
        return []
    provider = spec.model.provider
    where = f"partitions {', '.join(step.partitions) or '(default)'}: {step.gpus} GPUs"
    if step.gpu_strategy == "replicas":
        problem = replicas_problem(provider, spec.model.config)
        if problem is not None:
            raise PipelineError(f"{where} with gpu_strategy 'replicas', but {problem}", pipeline=spec.name,
                                fix=replicas_fix())
        return []
    if not provider_class(provider).runs_tensor_parallel:
        return [f"{where}, but the {provider!r} provider runs its model on one GPU: {step.gpus - 1} would sit idle "
                "(give this provider gpus: 1 and run partitions side by side instead)"]
    heads = _attention_heads(spec.model.config.get("model"))
    if heads is not None and heads % step.gpus:
        raise PipelineError(
            f"{where} with tensor parallelism, but the model has {heads} attention heads, which {step.gpus} GPUs "
            "cannot split evenly (vLLM refuses it at load)",
            pipeline=spec.name,
            fix=f"use a GPU count that divides {heads} (for a model that fits one GPU: gpus: 1)",
        )
    return []


def replicas_fix() -> str:
    """What to do when a pipeline asks for replicas its provider cannot run."""
    return (f"use a provider that runs replicas ({', '.join(replica_providers())}), or give each partition gpus: 1 "
            "and run partitions side by side (multi_run backfills; the `gpu` pool limit sets how many at once), or "
            "use gpu_strategy: tensor_parallel")


def _attention_heads(model: Any) -> int | None:
    """num_attention_heads from a local model folder's config.json (a hub id cannot be read offline)."""
    import json
    from pathlib import Path

    if not isinstance(model, str) or not (Path(model) / "config.json").is_file():
        return None
    config = json.loads((Path(model) / "config.json").read_text())
    heads = config.get("num_attention_heads") or (config.get("text_config") or {}).get("num_attention_heads")
    return int(heads) if heads else None


def resources_for_keys(spec: PipelineSpec, keys: Sequence[str]) -> StepResources:
    """The infer step's resources for a run over `keys` (one key, or a range: the largest need)."""
    if not keys:
        return _to_step(spec.runtime.default_resources(), ())
    sizes = PartitionSizes(spec)
    per_key = [_to_step(resources_for_key(spec, k, sizes), (k,)) for k in keys]
    neediest = max(per_key, key=StepResources.need)
    cpu = max((r for r in per_key if r.cpu), key=lambda r: r.need()[1], default=None)
    memory = max((r for r in per_key if r.memory), key=lambda r: r.need()[2], default=None)
    return StepResources(
        gpus=neediest.gpus,
        cpu=cpu.cpu if cpu else None,
        memory=memory.memory if memory else None,
        node_selector=neediest.node_selector,
        tolerations=neediest.tolerations,
        partitions=tuple(keys),
        gpu_strategy=neediest.gpu_strategy,
    )
