"""The Kubernetes executor that sizes each infer step's pod by the partitions of its run.

Built on dagster-k8s's own `k8s_job_executor` machinery: the same config schema, the same `K8sStepHandler` building
and watching one Kubernetes Job per step. The only difference is `_get_container_context`: for an infer step it
merges the pipeline's resource policy (batch_assets/resource_policy.py), resolved for the run's partition keys,
into the step's container config (GPU / CPU / memory, the BATCH_INFER_GPUS env var) and pod spec (node selector,
tolerations). It runs inside the run worker, so it sees every launch path's partitions the same way: the
`dagster/partition` tag (UI, CLI, multi-run backfill, schedule, sensor) or the
`dagster/asset_partition_range_start/end` tags (single-run backfill, `--partition-range`). Run-level
`dagster-k8s/config` tags do not reach step pods and backfills skip a job's PartitionedConfig, which is why the
policy is applied here.

Read / prepare / write steps get no policy (no GPU); the infer asset carries the op tags that name its pipeline.

Which nodes carry GPUs is the cluster's business, not each pipeline's: BATCH_GPU_NODE_SELECTOR (a JSON object) and
BATCH_GPU_TOLERATIONS (a JSON list of core/v1 tolerations), set on the code location (k8s/values.yaml), are given
to every infer step that asks for a GPU and whose spec names no node selector / tolerations of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import cast

import dagster as dg
from dagster import _check as check
from dagster._core.definitions.executor_definition import multiple_process_executor_requirements
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.retries import RetryMode
from dagster._core.execution.step_dependency_config import StepDependencyConfig
from dagster._core.executor.base import Executor
from dagster._core.executor.init import InitExecutorContext
from dagster._core.executor.step_delegating import StepDelegatingExecutor, StepHandlerContext
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.executor import _K8S_EXECUTOR_CONFIG_SCHEMA, K8sStepHandler
from dagster_k8s.job import UserDefinedDagsterK8sConfig
from dagster_k8s.launcher import K8sRunLauncher

from batch_assets.partitions import partitions_def_for
from batch_assets.resource_policy import (
    INFER_STAGE,
    PIPELINE_TAG,
    STAGE_TAG,
    StepResources,
    built_spec,
    resources_for_keys,
)
from batch_assets.spec import PipelineSpec, Toleration

GPU_NODE_SELECTOR_ENV = "BATCH_GPU_NODE_SELECTOR"
GPU_TOLERATIONS_ENV = "BATCH_GPU_TOLERATIONS"


def _env_json(name: str, kind: type) -> object | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON ({exc}): set it to a JSON {kind.__name__}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def with_gpu_node_pool(resources: StepResources) -> StepResources:
    """GPU steps without a node selector / tolerations of their own go to the deployment's GPU node pool."""
    if not resources.gpus:
        return resources
    node_selector = resources.node_selector or _env_json(GPU_NODE_SELECTOR_ENV, dict) or {}
    tolerations = resources.tolerations or tuple(
        Toleration.model_validate(t) for t in (_env_json(GPU_TOLERATIONS_ENV, list) or [])
    )
    return replace(resources, node_selector=dict(node_selector), tolerations=tuple(tolerations))



def run_partition_keys(spec: PipelineSpec, tags: Mapping[str, str], instance: dg.DagsterInstance) -> list[str]:
    """The partition keys a run covers, from its tags (a range is expanded with the pipeline's partitions)."""
    if PARTITION_NAME_TAG in tags:
        return [tags[PARTITION_NAME_TAG]]
    start, end = tags.get(ASSET_PARTITION_RANGE_START_TAG), tags.get(ASSET_PARTITION_RANGE_END_TAG)
    if start is None or end is None:
        return []
    with dg.partition_loading_context(dynamic_partitions_store=instance):  # dynamic pipelines' keys live there
        return list(partitions_def_for(spec).get_partition_keys_in_range(dg.PartitionKeyRange(start, end)))


class PartitionAwareK8sStepHandler(K8sStepHandler):
    """`K8sStepHandler` whose infer steps ask for what their partitions need."""

    def __init__(self, specs: Mapping[str, PipelineSpec], **kwargs):
        super().__init__(**kwargs)
        self._specs = dict(specs)
        # _get_container_context runs on launch and on every health check: size partitions once per step.
        self._resolved: dict[tuple[str, str], StepResources] = {}

    @property
    def name(self) -> str:
        return "PartitionAwareK8sStepHandler"

    def step_resources(self, step_handler_context: StepHandlerContext) -> StepResources | None:
        step_key = self._get_step_key(step_handler_context)
        tags = step_handler_context.step_tags[step_key]
        if tags.get(STAGE_TAG) != INFER_STAGE or PIPELINE_TAG not in tags:
            return None
        run = step_handler_context.dagster_run
        cache_key = (run.run_id, step_key)
        if cache_key not in self._resolved:
            spec = self._specs.get(tags[PIPELINE_TAG]) or built_spec(tags[PIPELINE_TAG])
            if spec is None:
                raise check.CheckError(
                    f"step {step_key} names pipeline {tags[PIPELINE_TAG]!r}, which was not built in this process "
                    f"(known: {sorted(self._specs)}): its infer step cannot be sized; build the pipeline with "
                    "batch_assets.factory in the same code location as the executor"
                )
            keys = run_partition_keys(spec, run.tags, step_handler_context.instance)
            self._resolved[cache_key] = with_gpu_node_pool(resources_for_keys(spec, keys))
        return self._resolved[cache_key]

    def _get_container_context(self, step_handler_context: StepHandlerContext) -> K8sContainerContext:
        context = super()._get_container_context(step_handler_context)
        resources = self.step_resources(step_handler_context)
        if resources is None:
            return context
        # Merged last, so the policy wins over executor-wide `step_k8s_config` for the keys it sets.
        return context.merge(
            K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(resources.k8s_config()))
        )

    def launch_step(self, step_handler_context: StepHandlerContext) -> Iterator[DagsterEvent]:
        resources = self.step_resources(step_handler_context)
        if resources is not None:
            step_key = self._get_step_key(step_handler_context)
            yield DagsterEvent.engine_event(
                step_handler_context.get_step_context(step_key),
                message=(
                    f"Resource policy for {step_key} over partitions {', '.join(resources.partitions) or '(none)'}: "
                    f"{resources.gpus} GPU(s), cpu {resources.cpu or 'default'}, memory {resources.memory or 'default'}"
                    + (f", node selector {resources.node_selector}" if resources.node_selector else "")
                ),
                event_specific_data=EngineEventData(),
            )
        yield from super().launch_step(step_handler_context)


def batch_k8s_executor(specs: Sequence[PipelineSpec]) -> dg.ExecutorDefinition:
    """`k8s_job_executor` with per-partition infer resources for these pipelines (and any other pipeline built in
    this process, e.g. by a Dagster Component). Same run config as upstream."""
    by_name = {spec.name: spec for spec in specs}

    @dg.executor(
        name="batch_k8s",
        config_schema=_K8S_EXECUTOR_CONFIG_SCHEMA,
        requirements=multiple_process_executor_requirements(),
    )
    def _batch_k8s_executor(init_context: InitExecutorContext) -> Executor:
        # Mirrors dagster_k8s.executor.k8s_job_executor (0.29) so every upstream knob keeps its meaning.
        launcher = init_context.instance.run_launcher
        run_launcher = launcher if isinstance(launcher, K8sRunLauncher) else None
        cfg = init_context.executor_config
        container_context = K8sContainerContext(
            image_pull_policy=cfg.get("image_pull_policy"),  # type: ignore[arg-type]
            image_pull_secrets=cfg.get("image_pull_secrets"),  # type: ignore[arg-type]
            service_account_name=cfg.get("service_account_name"),  # type: ignore[arg-type]
            env_config_maps=cfg.get("env_config_maps"),  # type: ignore[arg-type]
            env_secrets=cfg.get("env_secrets"),  # type: ignore[arg-type]
            env_vars=cfg.get("env_vars"),  # type: ignore[arg-type]
            volume_mounts=cfg.get("volume_mounts"),  # type: ignore[arg-type]
            volumes=cfg.get("volumes"),  # type: ignore[arg-type]
            labels=cfg.get("labels"),  # type: ignore[arg-type]
            namespace=cfg.get("job_namespace"),  # type: ignore[arg-type]
            resources=cfg.get("resources"),  # type: ignore[arg-type]
            scheduler_name=cfg.get("scheduler_name"),  # type: ignore[arg-type]
            security_context=cfg.get("security_context"),  # type: ignore[arg-type]
            run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(cfg.get("step_k8s_config", {})),  # type: ignore[arg-type]
        )
        if "load_incluster_config" in cfg:
            load_incluster_config = cast(bool, cfg["load_incluster_config"])
        else:
            load_incluster_config = run_launcher.load_incluster_config if run_launcher else True
        if "kubeconfig_file" in cfg:
            kubeconfig_file = cast("str | None", cfg["kubeconfig_file"])
        else:
            kubeconfig_file = run_launcher.kubeconfig_file if run_launcher else None
        return StepDelegatingExecutor(
            PartitionAwareK8sStepHandler(
                by_name,
                image=cfg.get("job_image"),
                container_context=container_context,
                load_incluster_config=load_incluster_config,
                kubeconfig_file=kubeconfig_file,
                per_step_k8s_config=cfg.get("per_step_k8s_config", {}),
                enable_owner_references=bool(cfg.get("enable_owner_references", False)),
            ),
            retries=RetryMode.from_config(cfg["retries"]),  # type: ignore[arg-type]
            max_concurrent=check.opt_int_elem(cfg, "max_concurrent"),
            tag_concurrency_limits=check.opt_list_elem(cfg, "tag_concurrency_limits"),
            should_verify_step=True,
            step_dependency_config=StepDependencyConfig.from_config(cfg.get("step_dependency_config")),  # type: ignore[arg-type]
        )

    return _batch_k8s_executor
