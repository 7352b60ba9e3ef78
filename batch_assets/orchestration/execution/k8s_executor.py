"""The Kubernetes executor that sizes each infer step's pod by the partitions of its run.

Built on dagster-k8s's own `k8s_job_executor` machinery: the same config schema, the same `K8sStepHandler` building
and watching one Kubernetes Job per step. The only difference is `_get_container_context`: for an infer step it
merges the pipeline's compute policy (`runtime.resources`, batch_assets/orchestration/execution/pod_compute.py),
resolved for the run's partition keys, into the step's container config (GPU / CPU / memory, the BATCH_INFER_GPUS
env var) and pod spec (node selector, tolerations). It runs inside the run worker, so it sees every launch path's
partitions the same way: the `dagster/partition` tag (UI, CLI, multi-run backfill, schedule, sensor) or the
`dagster/asset_partition_range_start/end` tags (single-run backfill, `--partition-range`). Run-level
`dagster-k8s/config` tags do not reach step pods and backfills skip a job's PartitionedConfig, which is why the
policy is applied here.

Read / prepare / write steps get no policy (no GPU); the infer asset carries the op tags that name its pipeline.

Which nodes carry GPUs is the cluster's business, not each pipeline's: BATCH_GPU_NODE_SELECTOR (a JSON object) and
BATCH_GPU_TOLERATIONS (a JSON list of core/v1 tolerations), set on the code location (k8s/config.yaml), are given
to every infer step that asks for a GPU and whose spec names no node selector / tolerations of its own.

What upstream leaves to chance, and this executor does not:
- **Resources are the policy's, not inherited.** dagster-k8s deep-merges the code location's container context
  (with the Helm chart: the user deployment's `resources`) into every step pod; merged under the policy, a
  deployment's `limits.memory: 2Gi` would stay on a GPU step that names no memory and vLLM would be OOM-killed. An
  infer step's `resources` are replaced by the policy's (with GPU defaults, pod_compute.with_gpu_defaults).
- **A pod that cannot start fails its step.** Upstream's health check only sees a failed Job; a pod Pending forever
  (no node with that many GPUs, a wrong node selector, a missing toleration) would hang the run and hold its pool
  slot. A step pod unschedulable for BATCH_STEP_PENDING_TIMEOUT_SECONDS (default 900: a GPU node scaling up from
  zero fits), whose container cannot be configured (a missing Secret or ConfigMap: at once), or that is bound to a
  node but whose image does not pull (ErrImagePull / ImagePullBackOff) or whose volume does not mount (FailedMount),
  or whose pod the API server refuses to create (the Job's FailedCreate: PodSecurity, a missing service account, a
  quota) for BATCH_STEP_START_GRACE_SECONDS (default 300, counted from the first error), fails its step with what
  it asked for and why it never started, naming the image, volume or Secret; its Job is deleted, its pool slot
  freed, and it is not retried (retrying cannot make a node, an image or a volume appear). The run monitor does not
  cover step pods: it times only the run worker's start. A failed Job's message says whether its pod was OOMKilled
  or evicted; those are retried by the step's RetryPolicy, and an infer step resumes from its chunk checkpoints. A pod stopped gracefully (SIGTERM, then
  SIGKILL: a drain, a spot interruption handler) is retried the same way (tests/k8s/test_gpu_cluster.py).
- **Step pods carry no service-account token** (`automountServiceAccountToken: false`): only the run worker talks
  to the Kubernetes API (it creates the step Jobs).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

import dagster as dg
from dagster import _check as check
from dagster._core.definitions.executor_definition import multiple_process_executor_requirements
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.plan.objects import StepFailureData
from dagster._core.execution.retries import RetryMode
from dagster._core.execution.step_dependency_config import StepDependencyConfig
from dagster._core.executor.base import Executor
from dagster._core.executor.init import InitExecutorContext
from dagster._core.executor.step_delegating import CheckStepHealthResult, StepDelegatingExecutor, StepHandlerContext
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.executor import _K8S_EXECUTOR_CONFIG_SCHEMA, K8sStepHandler
from dagster_k8s.job import UserDefinedDagsterK8sConfig, get_user_defined_k8s_config
from dagster_k8s.launcher import K8sRunLauncher

from batch_assets.orchestration.execution.pod_compute import (
    GPU_RESOURCE,
    INFER_STAGE,
    PIPELINE_TAG,
    STAGE_TAG,
    StepResources,
    check_gpu_strategy,
    resources_for_keys,
    with_gpu_defaults,
)
from batch_assets.partitions import partitions_def_for
from batch_assets.spec import PipelineSpec, Toleration

GPU_NODE_SELECTOR_ENV = "BATCH_GPU_NODE_SELECTOR"
GPU_TOLERATIONS_ENV = "BATCH_GPU_TOLERATIONS"
PENDING_TIMEOUT_ENV = "BATCH_STEP_PENDING_TIMEOUT_SECONDS"
DEFAULT_PENDING_TIMEOUT_S = 900
# A pod bound to a node whose image will not pull or whose volume will not mount: the kubelet retries forever, and
# a registry hiccup or a slow volume attach can clear on its own, so the step fails only after this long in that
# state (counted from the first error, never from the pod's creation: a slow but healthy pull of a big image is not
# timed).
START_GRACE_ENV = "BATCH_STEP_START_GRACE_SECONDS"
DEFAULT_START_GRACE_S = 300
PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull")
# In a step failure's message: the pod never ran, so a retry would only wait again (not retried).
POD_NEVER_STARTED = "its pod never started"
# Container states that will not fix themselves (the kubelet retries them forever).
CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError", "InvalidImageName")


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {raw}")
    return value


def pending_timeout_s() -> float:
    return _seconds(PENDING_TIMEOUT_ENV, DEFAULT_PENDING_TIMEOUT_S)


def start_grace_s() -> float:
    return _seconds(START_GRACE_ENV, DEFAULT_START_GRACE_S)


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
        self._pending_since: dict[str, float] = {}  # step Job -> when its pod was first seen unschedulable
        self._failing_since: dict[str, float] = {}  # step Job -> when its bound pod first could not pull / mount
        self._warnings: dict[tuple[str, str], list[str]] = {}  # GPU layouts that waste GPUs, for the run log

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
            spec = self._specs.get(tags[PIPELINE_TAG])
            if spec is None:
                raise check.CheckError(
                    f"step {step_key} names pipeline {tags[PIPELINE_TAG]!r}, which this executor was not given "
                    f"(known: {sorted(self._specs)}): its infer step cannot be sized; build the pipeline with "
                    "batch_assets.orchestration.assets.factory in the code location whose definitions build the executor "
                    "(batch_assets/definitions.py)"
                )
            keys = run_partition_keys(spec, run.tags, step_handler_context.instance)
            resources = with_gpu_defaults(with_gpu_node_pool(resources_for_keys(spec, keys)))
            self._warnings[cache_key] = check_gpu_strategy(spec, resources)
            self._resolved[cache_key] = resources
        return self._resolved[cache_key]

    def _get_container_context(self, step_handler_context: StepHandlerContext) -> K8sContainerContext:
        step_key = self._get_step_key(step_handler_context)
        op_name = step_handler_context.get_step_context(step_key).step.op_name
        # set for this step alone (op tags, per_step_k8s_config): kept under the policy for the keys it does not set
        step_only = [get_user_defined_k8s_config(step_handler_context.step_tags[step_key]).container_config,
                     (self._per_step_k8s_config.get(op_name) or {}).get("container_config") or {}]
        return step_container_context(super()._get_container_context(step_handler_context),
                                      self.step_resources(step_handler_context),
                                      step_limits=_limits(*[c.get("resources") for c in step_only]))

    # -- pods that cannot start ----------------------------------------------------------------------------------
    def check_step_health(self, step_handler_context: StepHandlerContext) -> CheckStepHealthResult:
        result = super().check_step_health(step_handler_context)
        step_key = self._get_step_key(step_handler_context)
        job_name = self._get_k8s_step_job_name(step_handler_context)
        namespace = cast(str, self._get_container_context(step_handler_context).namespace)
        pod = self._step_pod(job_name, namespace)
        if not result.is_healthy:
            ended = _pod_end(pod)
            return CheckStepHealthResult.unhealthy(f"{result.unhealthy_reason}{ended}") if ended else result
        if pod is None:  # the Job exists, its pod does not: refused by admission (PodSecurity, quota, account)?
            return self._check_created(step_key, job_name, namespace, result)
        if pod.status is None or pod.status.phase != "Pending":
            self._pending_since.pop(job_name, None)
            self._failing_since.pop(job_name, None)
            return result
        waiting = _waiting(pod)
        if waiting is not None and waiting[0] in CONFIG_ERRORS:
            return self._never_started(step_key, job_name, namespace,
                                       f"its container cannot be created: {waiting[0]}: {waiting[1]}",
                                       "create the Secret / ConfigMap the pod names (docs/deployment.md, "
                                       "'Secrets'), or fix the image name")
        unschedulable = _unschedulable(pod)
        if unschedulable is None:  # bound to a node: its image must pull and its volumes mount
            return self._check_start(step_key, job_name, namespace, pod, waiting, result)
        since = self._pending_since.setdefault(job_name, time.monotonic())
        timeout = pending_timeout_s()
        if time.monotonic() - since < timeout:
            return result
        return self._never_started(
            step_key, job_name, namespace,
            f"no node could take it for {timeout:g} s ({PENDING_TIMEOUT_ENV}); the scheduler said: {unschedulable}",
            "add nodes with that many free GPUs (or let the autoscaler reach them), fix the node selector / "
            "tolerations in runtime.resources or BATCH_GPU_NODE_SELECTOR / BATCH_GPU_TOLERATIONS, or ask for fewer "
            "GPUs; raise the timeout if GPU nodes take longer to scale up",
        )

    def _check_start(self, step_key: str, job_name: str, namespace: str, pod: Any, waiting: tuple[str, str] | None,
                     healthy: CheckStepHealthResult) -> CheckStepHealthResult:
        """A bound pod whose image does not pull or whose volume does not mount fails its step after the grace
        period (the run monitor times only the run worker's start: nothing else would)."""
        problem, fix = None, ""
        if waiting is not None and waiting[0] in PULL_ERRORS:
            image = pod.spec.containers[0].image if pod.spec and pod.spec.containers else "?"
            pulled = self._pod_events(namespace, pod, "Failed", "Failed to pull image")
            problem = f"its image {image} cannot be pulled: {waiting[0]}: {pulled or waiting[1]}"
            fix = ("check the image name and tag; for a private registry, name its Secret in imagePullSecrets "
                   "(k8s/values.yaml) and create it in the namespace (docs/deployment.md, step 6)")
        elif waiting is None or waiting[0] == "ContainerCreating":  # volumes mount before the container is created
            mount = self._pod_events(namespace, pod, "FailedMount", "")
            if mount:
                problem = f"a volume never mounted: {mount}"
                fix = ("create the ConfigMap / Secret / PersistentVolumeClaim the volume names, or fix the claim "
                       "(a ReadWriteOnce claim attached to another node never mounts here: use ReadWriteMany)")
        if problem is None:
            self._failing_since.pop(job_name, None)
            return healthy
        since = self._failing_since.setdefault(job_name, time.monotonic())
        grace = start_grace_s()
        if time.monotonic() - since < grace:
            return healthy
        self._failing_since.pop(job_name, None)
        return self._never_started(step_key, job_name, namespace, f"{problem} (for {grace:g} s, {START_GRACE_ENV})",
                                   fix)

    def _check_created(self, step_key: str, job_name: str, namespace: str,
                       healthy: CheckStepHealthResult) -> CheckStepHealthResult:
        """A Job whose pod the API server refuses (FailedCreate: PodSecurity, a missing service account, a quota)
        has no pod to watch and no failure either: the Job controller retries forever."""
        refused = self._events(namespace, job_name, "Job", "FailedCreate", "")
        if not refused:
            self._failing_since.pop(job_name, None)
            return healthy
        since = self._failing_since.setdefault(job_name, time.monotonic())
        grace = start_grace_s()  # a quota can free up; PodSecurity and a missing account cannot
        if time.monotonic() - since < grace:
            return healthy
        self._failing_since.pop(job_name, None)
        return self._never_started(
            step_key, job_name, namespace, f"Kubernetes refused to create it (for {grace:g} s, {START_GRACE_ENV}): "
            f"{refused}", "make the pod acceptable to the namespace: a securityContext that passes its PodSecurity "
            "level (docs/deployment.md, PodSecurity restricted; `make k8s-check`), a service account that exists, "
            "or room in its ResourceQuota")

    def _pod_events(self, namespace: str, pod: Any, reason: str, prefix: str) -> str:
        """The newest message of the pod's events with this reason (and message prefix), or ''."""
        return self._events(namespace, pod.metadata.name, "Pod", reason, prefix)

    def _events(self, namespace: str, name: str, kind: str, reason: str, prefix: str) -> str:
        events = self._api_client.core_api.list_namespaced_event(
            namespace=namespace, field_selector=f"involvedObject.name={name}").items
        found = [e for e in events if e.reason == reason and (e.message or "").startswith(prefix)
                 and (e.involved_object is None or e.involved_object.kind in (None, kind))]
        return found[-1].message if found else ""

    def _step_pod(self, job_name: str, namespace: str) -> Any:
        pods = self._api_client.core_api.list_namespaced_pod(namespace=namespace, label_selector=f"job-name={job_name}")
        return pods.items[-1] if pods.items else None

    def _never_started(self, step_key: str, job_name: str, namespace: str, why: str, fix: str) -> CheckStepHealthResult:
        asked = self._asked(job_name, namespace)
        self._pending_since.pop(job_name, None)
        # Deleted so that a node appearing later cannot start a step the run already failed.
        self._api_client.delete_job(job_name=job_name, namespace=namespace)
        return CheckStepHealthResult.unhealthy(
            f"{POD_NEVER_STARTED}: Kubernetes job {job_name} for step {step_key} asked for {asked}; {why}. "
            f"The job was deleted and the step's pool slot freed; it is not retried. Fix: {fix}."
        )

    def _asked(self, job_name: str, namespace: str) -> str:
        """What the pod asked for, from the Job as the cluster holds it."""
        job = self._api_client.batch_api.read_namespaced_job(job_name, namespace=namespace)
        pod = job.spec.template.spec
        res = pod.containers[0].resources
        wants = {**((res.limits or {}) if res else {}), **((res.requests or {}) if res else {})}
        gpus = wants.get(GPU_RESOURCE, "0")
        tolerations = [f"{t.key or '*'}{'=' + t.value if t.value else ''}:{t.effect or '*'}"
                       for t in pod.tolerations or []]
        return (f"{gpus} GPU(s) ({GPU_RESOURCE}), cpu {wants.get('cpu', 'unset')}, memory {wants.get('memory', 'unset')}, "
                f"node selector {dict(pod.node_selector or {})}, tolerations {tolerations or 'none'}")

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
                    + "".join(f". Warning: {w}" for w in self._warnings.get(
                        (step_handler_context.dagster_run.run_id, step_key), []))
                ),
                event_specific_data=EngineEventData(),
            )
        yield from super().launch_step(step_handler_context)


def _limits(*resources: Mapping[str, Any] | None) -> dict[str, str]:
    merged: dict[str, str] = {}
    for r in resources:
        merged.update((r or {}).get("limits") or {})
    return merged


def step_container_context(context: K8sContainerContext, resources: StepResources | None,
                           step_limits: Mapping[str, str] | None = None) -> K8sContainerContext:
    """A step pod's container context: what dagster-k8s merged (launcher, code location, executor, op tags), with
    no service-account token and, for an infer step, the policy merged last, resources by key:
    - requests: everything inherited (the code location's, op tags, per_step_k8s_config), the policy's keys over
      them; a CPU infer step with no `runtime.resources` keeps the deployment's requests (not BestEffort, which
      is evicted first under memory pressure);
    - limits: only those set for this step (op tags, per_step_k8s_config: `step_limits`), the policy's over them.
      A limit inherited from the deployment is sized for read/prepare/write pods: kept on an infer step it
      OOM-killed vLLM on a GPU step that names no memory (issue 13).
    An inherited request above a limit set here is dropped, so the API server defaults it to the limit (a request
    above its limit is refused)."""
    no_token = K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(
        {"pod_spec_config": {"automount_service_account_token": False}}))
    context = context.merge(no_token)
    if resources is None:
        return context
    policy = resources.k8s_config()
    inherited = context.run_k8s_config.container_config.get("resources") or {}
    wanted = policy["container_config"].get("resources") or {}
    limits = {**(step_limits or {}), **(wanted.get("limits") or {})}
    own = wanted.get("requests") or {}
    requests = {k: v for k, v in {**(inherited.get("requests") or {}), **own}.items()
                if k in own or _fits(v, limits.get(k))}
    merged = context.merge(K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(policy)))
    config = merged.run_k8s_config.to_dict()
    config["container_config"]["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return K8sContainerContext(
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(config),
        server_k8s_config=merged.server_k8s_config,
        namespace=merged.namespace,
        server_replica_count=merged.server_replica_count,
    )


def _fits(request: str, limit: str | None) -> bool:
    from kubernetes.utils.quantity import parse_quantity

    return limit is None or parse_quantity(request) <= parse_quantity(limit)


def _waiting(pod: Any) -> tuple[str, str] | None:
    for status in pod.status.container_statuses or []:
        if status.state is not None and status.state.waiting is not None and status.state.waiting.reason:
            return status.state.waiting.reason, status.state.waiting.message or ""
    return None


def _unschedulable(pod: Any) -> str | None:
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
            return condition.message or "unschedulable"
    return None


def _pod_end(pod: Any) -> str:
    """Why a failed step pod ended, when Kubernetes says (OOMKilled, evicted), for the step failure message."""
    if pod is None or pod.status is None:
        return ""
    for condition in pod.status.conditions or []:
        if condition.type == "DisruptionTarget" and condition.status == "True":
            return (f" Its pod was disrupted ({condition.reason}: node drained, preempted or reclaimed); the step is "
                    "retried and resumes from its committed chunks.")
    if pod.status.reason == "Evicted":
        return f" Its pod was evicted: {pod.status.message or ''}"
    for status in pod.status.container_statuses or []:
        terminated = status.state.terminated if status.state else None
        if terminated is not None and terminated.reason == "OOMKilled":
            return (" Its container was OOMKilled: it went over its memory limit; raise `memory` in runtime.resources"
                    " (docs/deployment.md).")
    return ""


class BatchStepDelegatingExecutor(StepDelegatingExecutor):
    """Upstream's step-delegating executor, except that a step whose pod never started is not retried."""

    def log_failure_or_retry_event_after_error(self, step_context, err_info, known_state) -> DagsterEvent:  # type: ignore[no-untyped-def]
        if err_info.message and POD_NEVER_STARTED in err_info.message:
            return DagsterEvent.step_failure_event(
                step_context=step_context, step_failure_data=StepFailureData(error=err_info, user_failure_data=None))
        return super().log_failure_or_retry_event_after_error(step_context, err_info, known_state)


def batch_k8s_executor(specs: Sequence[PipelineSpec]) -> dg.ExecutorDefinition:
    """`k8s_job_executor` with per-partition infer resources for these pipelines (definitions.py gives it every
    pipeline of the code location, spec files and Dagster Components alike). Same run config as upstream."""
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
        return BatchStepDelegatingExecutor(
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
