"""A stand-in for a Kubernetes cluster, as dagster-k8s sees it: the `batch/v1` Jobs API and the few core/v1 calls
dagster-k8s makes (pods, pod logs, events, config maps, secrets) on loopback HTTP, with a small scheduler and
kubelet behind it that run each Job's container command as a local process.

No kube-apiserver, kubelet or container engine can run on the CI machines, so this is the narrowest seam: the real
kubernetes Python client, the real `K8sRunLauncher` and the real batch executor (built on `k8s_job_executor`) talk
HTTP to it through a kubeconfig, exactly as they would to a cluster. It is meant to be as strict as a cluster where
a deployment can go wrong:

- **Scheduling.** The cluster has nodes (`Node`: allocatable cpu, memory, `nvidia.com/gpu`, labels, taints). A Job's
  pod is bound to a node only where its requests fit beside the pods already running there, its `nodeSelector`
  matches the node's labels and its tolerations tolerate every NoSchedule/NoExecute taint, checked in kube-scheduler's
  filter order (taints, then node selector, then resources). Otherwise the pod stays `Pending` with the condition
  `PodScheduled=False, reason Unschedulable` and a `FailedScheduling` event whose message is kube-scheduler's
  ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {...}."). A pending pod
  is bound when a pod ends and frees room. Requests default to limits, as the API server defaults them.
- **Environment.** A container's environment is built only from its spec, as the kubelet builds it: the image's
  own environment (`IMAGE_ENV`, what a Dockerfile's ENV would give), then `envFrom` (ConfigMaps and Secrets that the
  test created with `create_config_map` / `create_secret`), then `env` (literal values, `valueFrom` secretKeyRef /
  configMapKeyRef / fieldRef). Never the test process's environment. A missing ConfigMap, Secret or key (not marked
  optional) leaves the container waiting with reason `CreateContainerConfigError` and the kubelet's message
  (`secret "x" not found`), as on a cluster: the pod never starts.
- **Memory limit.** A running container whose processes' resident memory exceeds `limits.memory` is SIGKILLed and
  reported as terminated with reason `OOMKilled`, exit code 137 (the kernel's cgroup OOM killer, approximated by
  watching RSS every 100 ms).
- **Images.** With `images` given (image -> the pull Secret its registry needs, or None for a public one), a
  container whose image is not there, or whose registry's Secret the pod does not name in `imagePullSecrets` (or that
  does not exist), never starts: the container waits with `ErrImagePull`, then `ImagePullBackOff`, with the kubelet's
  message and `Failed` / `BackOff` events, forever (the kubelet retries pulls). Without `images`, every image pulls.
- **Volumes.** A configMap or secret volume whose object is missing (not optional) never mounts: the pod is bound,
  its container stays `ContainerCreating`, and a `FailedMount` event says which volume and object. A
  persistentVolumeClaim volume: with `claims` given (`create_claim`), a claim that does not exist keeps the pod
  unschedulable (`persistentvolumeclaim "x" not found`, as kube-scheduler says), one created with `mount_error`
  (a Multi-Attach error, an unreachable NFS server) never mounts (`FailedMount`).
- **Validation.** A Job whose name is not a lowercase RFC 1123 name of at most 63 characters, or whose labels (its
  own or its pod template's) are not valid label names and values, is refused with 422 `Invalid`, as the API
  server refuses it (a partition key such as `android|2026-11-01` in a name or label would be).
- **Admission.** With `pod_security="restricted"` (the namespace label `pod-security.kubernetes.io/enforce`) a pod
  that breaks the profile (batch_assets/pod_security.py) is refused, and with `service_accounts` given a pod naming
  another service account is refused: the Job exists, its pod never does, and the Job's `FailedCreate` event says
  why (`pods "x" is forbidden: violates PodSecurity "restricted:latest": ...`), as the Job controller reports it.
- **Deletion.** Deleting a Job leaves its pod (the API's default for Jobs is to orphan it); deleting a pod delivers
  SIGTERM to its container, waits the pod's `terminationGracePeriodSeconds` (default 30), then SIGKILLs, as the
  kubelet does; the pod is listed, with a `deletionTimestamp`, until its container has ended. dagster-k8s's
  `delete_job` (Job, then its pods) therefore answers True, as against a cluster.
- **Disruption.** `evict(job)` kills a running pod as a spot-node reclaim or a drain past its grace period does:
  the process is SIGKILLed, the pod is `Failed` with reason `Evicted` and a `DisruptionTarget` condition, and the Job
  (backoffLimit 0, as dagster-k8s creates them) is failed.

What it does not do: pull images (every container runs this checkout with this interpreter), mount volumes (paths
are local paths; the instance ConfigMap is not mounted, DAGSTER_HOME points at the test's), enforce CPU limits,
network policies, RBAC, quotas or priorities. Tests assert on the Job specs it recorded (what a cluster would have
been asked for), on pod phases and on the outputs the commands produced.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

_JOBS = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?(?P<status>/status)?$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?(?P<log>/log)?$")
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")
_OBJECTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|secrets)(?:/(?P<name>[^/]+))?$")

GPU = "nvidia.com/gpu"
# The stand-in image's own environment (a Dockerfile's ENV): where the interpreter is, and no more.
IMAGE_ENV = {
    "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
}


def quantity(value: str | int | None) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity

    return Decimal(0) if value in (None, "") else parse_quantity(value)


@dataclass
class Node:
    """A node's allocatable resources, labels and taints (`{"key", "value", "effect"}`)."""

    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)

    def allocatable(self) -> dict[str, Decimal]:
        return {"cpu": quantity(self.cpu), "memory": quantity(self.memory), GPU: Decimal(self.gpus)}


# A CPU node for code servers, run workers and CPU steps; tests that place GPU steps add GPU nodes.
CPU_NODE = Node("cpu-1", cpu="16", memory="64Gi", labels={"kubernetes.io/os": "linux"})


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


@dataclass
class RecordedJob:
    """One Job as posted (the Kubernetes JSON body), its pod's state and the local process running its container."""

    namespace: str
    body: dict[str, Any]
    log_path: Path
    created: float = field(default_factory=time.time)
    process: subprocess.Popen | None = None
    node: str | None = None
    deleted: bool = False  # the Job object was deleted (its pod may live on: orphaned, or terminating)
    pod_deleted_at: float | None = None  # the pod's deletionTimestamp: SIGTERM sent, grace period running
    pod_gone: bool = False  # the pod object no longer exists
    waiting_since: float | None = None  # when the container first waited with an error (ErrImagePull, ...)
    pulls: int = 0  # failed image pulls so far (the second and later say ImagePullBackOff)
    mount_error: str | None = None  # the FailedMount event's message of a volume that never mounts
    create_error: str | None = None  # why admission refused the pod (the Job's FailedCreate event): no pod exists
    waiting: tuple[str, str] | None = None  # (reason, message) of a container that cannot start
    unschedulable: str | None = None  # the scheduler's message while the pod cannot be bound
    pull_message: str | None = None  # the kubelet's message of the last failed image pull
    terminated_reason: str | None = None  # OOMKilled, Evicted, ...
    pod_env: dict[str, str] | None = None  # the environment the container was started with
    disruption: str | None = None  # the DisruptionTarget reason of an evicted pod

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def labels(self) -> dict[str, str]:
        return self.body["metadata"].get("labels") or {}

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.body["spec"]["template"]["spec"]

    @property
    def pod_annotations(self) -> dict[str, str]:
        return self.body["spec"]["template"].get("metadata", {}).get("annotations") or {}

    @property
    def container(self) -> dict[str, Any]:
        return self.pod_spec["containers"][0]

    @property
    def resources(self) -> dict[str, dict[str, str]]:
        return self.container.get("resources") or {}

    @property
    def env(self) -> dict[str, str]:
        """The container's literal `env` entries (valueFrom entries map to None)."""
        return {e["name"]: e.get("value") for e in self.container.get("env") or []}

    @property
    def component(self) -> str | None:
        return self.labels.get("app.kubernetes.io/component")

    @property
    def step_key(self) -> str | None:
        return self.labels.get("dagster/op")

    def requests(self) -> dict[str, Decimal]:
        """What the scheduler reserves: requests, defaulted from limits as the API server does."""
        res = self.resources
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(merged.get(k)) for k in ("cpu", "memory", GPU)}

    def exit_code(self) -> int | None:
        if self.terminated_reason in ("OOMKilled", "Evicted"):
            return 137
        return None if self.process is None else self.process.poll()

    @property
    def grace_seconds(self) -> float:
        value = self.pod_spec.get("terminationGracePeriodSeconds")
        return 30.0 if value is None else float(value)

    @property
    def phase(self) -> str:
        if self.terminated_reason == "Evicted":
            return "Failed"
        code = self.exit_code()
        if self.process is None or code is None:
            return "Running" if self.process is not None else "Pending"
        return "Succeeded" if code == 0 else "Failed"

    def status(self) -> dict[str, Any]:
        if self.create_error:
            return {}  # no pod: neither active nor failed, as the Job controller leaves it
        phase = self.phase
        if phase in ("Pending", "Running"):
            return {"active": 1}
        return {"succeeded": 1} if phase == "Succeeded" else {"failed": 1}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class KubernetesJobsStub:
    """The stand-in cluster. `start()`, create ConfigMaps/Secrets the deployment expects, point clients at
    `kubeconfig`, read `jobs`; `stop()` kills what is still running."""

    def __init__(self, workdir: Path, cwd: Path, nodes: list[Node] | None = None,
                 images: dict[str, str | None] | None = None, claims: dict[str, str | None] | None = None,
                 pod_security: str | None = None, service_accounts: set[str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cwd = Path(cwd)
        self.nodes = list(nodes) if nodes is not None else [CPU_NODE]
        self.jobs: list[RecordedJob] = []
        self.config_maps: dict[tuple[str, str], dict[str, str]] = {}
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.images = images  # image -> pull Secret its registry needs (None: public); None: every image pulls
        self.claims = claims  # PVC name -> mount error (None: mounts); None: every claim exists and mounts
        self.pod_security = pod_security  # "restricted": the namespace enforces that PodSecurity level
        self.service_accounts = service_accounts  # names that exist; None: any
        self.unhandled: list[str] = []  # calls the stand-in does not implement (a test may assert there are none)
        self._lock = threading.RLock()
        self._stopping = False
        self._server: ThreadingHTTPServer | None = None
        self.kubeconfig = self.workdir / "kubeconfig.yaml"

    # -- objects a test creates (kubectl create configmap / secret) ---------------------------------------------
    def create_config_map(self, name: str, data: dict[str, str], namespace: str = "default") -> dict[str, str]:
        self.config_maps[(namespace, name)] = {k: str(v) for k, v in data.items()}
        return self.config_maps[(namespace, name)]

    def create_secret(self, name: str, data: dict[str, str], namespace: str = "default") -> None:
        self.secrets[(namespace, name)] = {k: str(v) for k, v in data.items()}

    def create_claim(self, name: str, mount_error: str | None = None) -> None:
        """A PersistentVolumeClaim (bound); with `mount_error`, one that never mounts on the node."""
        self.claims = {**(self.claims or {}), name: mount_error}

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> "KubernetesJobsStub":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output quiet
                pass

            def _reply(self, code: int, payload: Any, content_type: str = "application/json") -> None:
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                stub._dispatch(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                stub._dispatch(self, "POST")

            def do_DELETE(self) -> None:  # noqa: N802
                stub._dispatch(self, "DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "users": [{"name": "stub", "user": {"token": "stub-token"}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub", "namespace": "default"}}],
            "current-context": "stub",
        }))
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the stub first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._stopping = True
        for job in self.jobs:
            self._kill(job)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- what a test does to the cluster -----------------------------------------------------------------------
    def evict(self, job: RecordedJob, reason: str = "TerminationByKubelet", grace_seconds: float | None = None) -> None:
        """Disrupt a running pod: pod Failed/Evicted with a DisruptionTarget condition, the Job failed.
        `grace_seconds=None`: the node is gone (spot reclaim without notice), the container is SIGKILLed.
        Otherwise a graceful eviction (drain, spot interruption handler): SIGTERM, then SIGKILL after the grace
        period (terminationGracePeriodSeconds), as the kubelet does."""
        with self._lock:
            assert job.process is not None and job.process.poll() is None, f"{job.name} is not running"
            job.disruption = reason
            if grace_seconds is not None:
                os.killpg(job.process.pid, signal.SIGTERM)
                try:
                    job.process.wait(timeout=grace_seconds)
                except subprocess.TimeoutExpired:
                    pass
            job.terminated_reason = "Evicted"
            self._kill(job)
        self._schedule_pending()

    # -- queries for tests -------------------------------------------------------------------------------------
    def jobs_for_run(self, run_id: str) -> list[RecordedJob]:
        return [j for j in self.jobs if j.labels.get("dagster/run-id") == run_id]

    def step_jobs(self, run_id: str) -> dict[str, RecordedJob]:
        """The run's step Jobs by step key (the last attempt of each)."""
        return {j.step_key: j for j in self.jobs_for_run(run_id) if j.component == "step_worker" and j.step_key}

    def failures(self) -> str:
        """Output of every Job whose pod failed or could not start (for assertion messages)."""
        def why(j: RecordedJob) -> Any:
            return j.terminated_reason or j.waiting or j.unschedulable or j.create_error or j.mount_error

        return "\n\n".join(f"--- {j.name} ({j.phase}, exit {j.exit_code()}, {why(j)}) ---\n{j.output()[-3000:]}"
                             for j in self.jobs if j.phase == "Failed" or why(j))

    # -- the scheduler and the kubelet -------------------------------------------------------------------------
    def _bound(self, node: Node) -> list[RecordedJob]:
        return [j for j in self.jobs if j.node == node.name and not j.pod_gone and j.phase in ("Pending", "Running")]

    def _place(self, job: RecordedJob) -> tuple[Node | None, str]:
        """A node for the pod, or None and kube-scheduler's message (each node's first failing filter)."""
        reasons: dict[str, int] = {}
        selector = job.pod_spec.get("nodeSelector") or {}
        tolerations = job.pod_spec.get("tolerations") or []
        need = job.requests()
        if self.claims is not None:
            for volume in job.pod_spec.get("volumes") or []:
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim and claim not in self.claims:
                    return None, (f'0/{len(self.nodes)} nodes are available: persistentvolumeclaim "{claim}" not '
                                  "found. preemption: 0/{0} nodes are available: {0} Preemption is not helpful for "
                                  "scheduling.".format(len(self.nodes)))
        for node in self.nodes:
            untolerated = [t for t in node.taints if t.get("effect") in ("NoSchedule", "NoExecute")
                           and not _tolerates(tolerations, t)]
            if untolerated:
                t = untolerated[0]
                why = [f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"]
            elif any(node.labels.get(k) != v for k, v in selector.items()):
                why = ["node(s) didn't match Pod's node affinity/selector"]
            else:
                used = {k: sum((j.requests()[k] for j in self._bound(node)), Decimal(0)) for k in need}
                free = node.allocatable()
                why = [f"Insufficient {k}" for k in ("cpu", "memory", GPU) if need[k] and used[k] + need[k] > free[k]]
                if not why:
                    return node, ""
            for w in why:
                reasons[w] = reasons.get(w, 0) + 1
        detail = ", ".join(f"{n} {w}" for w, n in sorted(reasons.items()))
        return None, f"0/{len(self.nodes)} nodes are available: {detail}."

    def _schedule_pending(self) -> None:
        with self._lock:
            for job in self.jobs:
                if job.pod_gone or job.pod_deleted_at is not None or job.node is not None:
                    continue
                node, message = self._place(job)
                if node is None:
                    job.unschedulable = message
                    continue
                job.node, job.unschedulable = node.name, None
                self._start_container(job)

    def _lookup(self, kind: str, namespace: str, name: str, key: str | None, optional: bool) -> Any:
        store, singular = (self.config_maps, "configmap") if kind == "configmap" else (self.secrets, "secret")
        obj = store.get((namespace, name))
        if obj is None:
            if optional:
                return {} if key is None else None
            raise LookupError(f'{singular} "{name}" not found')
        if key is None:
            return obj
        if key not in obj:
            if optional:
                return None
            raise LookupError(f"couldn't find key {key} in {singular.capitalize()} {namespace}/{name}")
        return obj[key]

    def _container_env(self, job: RecordedJob) -> dict[str, str]:
        """The kubelet's environment for the container: image ENV, envFrom, then env. Raises LookupError."""
        env = dict(IMAGE_ENV)
        for source in self.container_env_from(job):
            if "configMapRef" in source:
                ref, kind = source["configMapRef"], "configmap"
            else:
                ref, kind = source["secretRef"], "secret"
            data = self._lookup(kind, job.namespace, ref["name"], None, bool(ref.get("optional")))
            env.update({f"{source.get('prefix', '')}{k}": v for k, v in data.items()})
        for entry in job.container.get("env") or []:
            if "value" in entry:
                env[entry["name"]] = entry["value"] or ""
                continue
            value_from = entry.get("valueFrom") or {}
            if "secretKeyRef" in value_from or "configMapKeyRef" in value_from:
                kind = "secret" if "secretKeyRef" in value_from else "configmap"
                ref = value_from.get("secretKeyRef") or value_from.get("configMapKeyRef")
                value = self._lookup(kind, job.namespace, ref["name"], ref["key"], bool(ref.get("optional")))
                if value is not None:
                    env[entry["name"]] = value
            elif "fieldRef" in value_from:
                path = value_from["fieldRef"]["fieldPath"]
                env[entry["name"]] = {"metadata.name": job.name, "metadata.namespace": job.namespace,
                                      "spec.nodeName": job.node or ""}.get(path, "")
            else:
                env[entry["name"]] = ""
        return env

    @staticmethod
    def container_env_from(job: RecordedJob) -> list[dict[str, Any]]:
        return job.container.get("envFrom") or []

    def _mount_error(self, job: RecordedJob) -> str | None:
        """The kubelet's FailedMount message for the first volume that cannot mount, or None."""
        for volume in job.pod_spec.get("volumes") or []:
            for kind, key in (("configMap", "name"), ("secret", "secretName")):
                source = volume.get(kind)
                if source is None or source.get("optional"):
                    continue
                store = self.config_maps if kind == "configMap" else self.secrets
                if (job.namespace, source.get(key)) not in store:
                    return (f'MountVolume.SetUp failed for volume "{volume["name"]}" : {kind.lower()} '
                            f'"{source.get(key)}" not found')
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and self.claims is not None and self.claims.get(claim):
                return (f'Unable to attach or mount volumes: unmounted volumes=[{volume["name"]}]: '
                        f"{self.claims[claim]}")
        return None

    def _pull_error(self, job: RecordedJob) -> str | None:
        """Why the kubelet cannot pull the container's image, or None."""
        if self.images is None:
            return None
        image = job.container.get("image") or ""
        if image not in self.images:
            return (f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack '
                    f'image "{image}": not found')
        secret = self.images[image]
        named = [s.get("name") for s in job.pod_spec.get("imagePullSecrets") or []]
        if secret and (secret not in named or (job.namespace, secret) not in self.secrets):
            return (f'Failed to pull image "{image}": rpc error: code = Unknown desc = failed to pull and unpack image '
                    f'"{image}": failed to resolve reference "{image}": pull access denied, repository does not exist '
                    "or may require authorization: authorization failed: no basic auth credentials")
        return None

    def _start_container(self, job: RecordedJob) -> None:
        job.mount_error = self._mount_error(job)
        if job.mount_error:  # stays ContainerCreating: the kubelet retries the mount every 2 minutes, forever
            return
        pull = self._pull_error(job)
        if pull:
            job.pulls += 1
            job.waiting = ("ErrImagePull", pull) if job.pulls == 1 else (
                "ImagePullBackOff", f'Back-off pulling image "{job.container.get("image")}"')
            job.pull_message = pull
            return
        try:
            env = self._container_env(job)
        except LookupError as exc:
            job.waiting = ("CreateContainerConfigError", str(exc))
            return
        job.pod_env = env
        container = job.container
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if argv and argv[0] == "dagster":
            argv[0] = str(Path(sys.executable).with_name("dagster"))
        with open(job.log_path, "w") as log:
            job.process = subprocess.Popen(argv, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        job.waiting = None

    def _terminate(self, job: RecordedJob) -> None:
        """Pod deletion, as the kubelet carries it out: SIGTERM, the grace period, SIGKILL; then the pod is gone."""
        if job.pod_deleted_at is not None or job.pod_gone:
            return
        job.pod_deleted_at = time.time()
        if job.process is None or job.process.poll() is not None:
            job.pod_gone = True
            self._schedule_pending()
            return

        def carry_out() -> None:
            assert job.process is not None
            try:
                os.killpg(job.process.pid, signal.SIGTERM)
                job.process.wait(timeout=job.grace_seconds)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            self._kill(job)
            job.pod_gone = True
            self._schedule_pending()

        threading.Thread(target=carry_out, daemon=True).start()

    def _kill(self, job: RecordedJob) -> None:
        if job.process is not None and job.process.poll() is None:
            try:
                os.killpg(job.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.process.wait(timeout=30)

    def _watch(self) -> None:
        """The kubelet's loop: enforce memory limits, bind pending pods when a pod ends, retry config errors."""
        import psutil

        ended: set[str] = set()
        while not self._stopping:
            time.sleep(0.1)
            changed = False
            with self._lock:
                jobs = list(self.jobs)
            for job in jobs:
                # the kubelet retries: a Secret created later starts the pod
                if (job.waiting or job.mount_error) and not job.pod_gone and job.pod_deleted_at is None:
                    self._start_container(job)
                if job.process is None or job.name in ended:
                    continue
                if job.process.poll() is not None:
                    ended.add(job.name)
                    changed = True
                    continue
                limit = quantity((job.resources.get("limits") or {}).get("memory"))
                if limit:
                    try:
                        root = psutil.Process(job.process.pid)
                        rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                    except psutil.Error:
                        continue
                    if rss > limit:
                        job.terminated_reason = "OOMKilled"
                        self._kill(job)
            if changed:
                self._schedule_pending()

    # -- the API -----------------------------------------------------------------------------------------------
    def _find(self, namespace: str, name: str) -> RecordedJob | None:
        with self._lock:
            return next((j for j in reversed(self.jobs) if j.namespace == namespace and j.name == name
                         and not j.deleted), None)

    def _dispatch(self, req: BaseHTTPRequestHandler, method: str) -> None:
        reply = req._reply  # type: ignore[attr-defined]
        url = urlparse(req.path)
        query = parse_qs(url.query)
        jobs, pods, events, objects = (_JOBS.match(url.path), _PODS.match(url.path), _EVENTS.match(url.path),
                                       _OBJECTS.match(url.path))
        if jobs and method == "POST" and not jobs["name"]:
            body = req._body()  # type: ignore[attr-defined]
            if self._find(jobs["ns"], body["metadata"]["name"]) is not None:
                return reply(409, _status(409, "AlreadyExists", f"job {body['metadata']['name']} exists"))
            invalid = invalid_names(body)
            if invalid:  # the API server validates names and labels before anything is stored
                return reply(422, _status(422, "Invalid", f'Job.batch "{body["metadata"]["name"]}" is invalid: '
                                          + "; ".join(invalid)))
            job = self._create(jobs["ns"], body)
            return reply(201, job.body)
        if jobs and jobs["name"]:
            job = self._find(jobs["ns"], jobs["name"])
            if job is None:
                return reply(404, _status(404, "NotFound", f'jobs.batch "{jobs["name"]}" not found'))
            if method == "GET":
                return reply(200, {**job.body, "status": job.status()})
            if method == "DELETE":
                # the Job goes; its pod is orphaned (the API's default for Jobs) unless asked to propagate
                job.deleted = True
                policy = req._body().get("propagationPolicy")  # type: ignore[attr-defined]
                if policy in ("Background", "Foreground"):
                    self._terminate(job)
                return reply(200, _status(200, "", "deleted", success=True))
        if pods and method == "GET":
            if pods["name"] is None:
                wanted = _selector(query.get("labelSelector", [""])[0])
                items = [self._pod(j) for j in self.jobs if not j.pod_gone and j.namespace == pods["ns"]
                         and _matches(j, wanted)]
                return reply(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
            job = next((j for j in reversed(self.jobs) if self._pod_name(j) == pods["name"] and not j.pod_gone), None)
            if job is None:
                return reply(404, _status(404, "NotFound", f'pods "{pods["name"]}" not found'))
            if pods["log"]:
                return reply(200, job.output(), "text/plain")
            return reply(200, self._pod(job))
        if pods and method == "DELETE" and pods["name"]:
            job = next((j for j in self.jobs if self._pod_name(j) == pods["name"] and not j.pod_gone), None)
            if job is None:
                return reply(404, _status(404, "NotFound", f'pods "{pods["name"]}" not found'))
            self._terminate(job)
            return reply(200, self._pod(job))
        if events and method == "GET":
            fields = _selector(query.get("fieldSelector", [""])[0])
            items = [e for j in self.jobs if j.namespace == events["ns"] for e in self._events(j)
                     if all(_get(e, k) == v for k, v in fields.items())]
            return reply(200, {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items})
        if objects and method == "GET" and objects["name"]:
            store = self.config_maps if objects["kind"] == "configmaps" else self.secrets
            data = store.get((objects["ns"], objects["name"]))
            if data is None:
                return reply(404, _status(404, "NotFound", f'{objects["kind"]} "{objects["name"]}" not found'))
            kind = "ConfigMap" if objects["kind"] == "configmaps" else "Secret"
            return reply(200, {"apiVersion": "v1", "kind": kind, "metadata": {"name": objects["name"]}, "data": data})
        self.unhandled.append(f"{method} {req.path}")
        reply(404, _status(404, "NotFound", f"the Kubernetes stand-in does not implement {method} {url.path}"))

    def _admission(self, job: RecordedJob) -> str | None:
        """Why the API server refuses the Job's pod, in its words, or None."""
        from batch_assets.pod_security import restricted_violations

        prefix = f'Error creating: pods "{job.name}" is forbidden:'
        account = job.pod_spec.get("serviceAccountName") or "default"
        if self.service_accounts is not None and account not in self.service_accounts:
            return (f"{prefix} error looking up service account {job.namespace}/{account}: serviceaccount "
                    f'"{account}" not found')
        if self.pod_security == "restricted":
            broken = restricted_violations(job.pod_spec)
            if broken:
                return f'{prefix} violates PodSecurity "restricted:latest": {"; ".join(broken)}'
        return None

    def _create(self, namespace: str, body: dict[str, Any]) -> RecordedJob:
        job = RecordedJob(namespace, body, self.workdir / f"{body['metadata']['name']}.log")
        job.create_error = self._admission(job)
        if job.create_error:
            job.pod_gone = True  # the pod was never created: nothing to schedule, list or delete
        with self._lock:
            self.jobs.append(job)
        self._schedule_pending()
        return job

    @staticmethod
    def _pod_name(job: RecordedJob) -> str:
        return job.name  # one pod per Job (backoffLimit 0), named after it

    def _events(self, job: RecordedJob) -> list[dict[str, Any]]:
        involved = {"kind": "Pod", "name": self._pod_name(job), "namespace": job.namespace}
        found = []
        if job.create_error:
            return [{"type": "Warning", "reason": "FailedCreate", "message": job.create_error,
                     "involvedObject": {"kind": "Job", "name": job.name, "namespace": job.namespace},
                     "metadata": {"name": f"{job.name}.create"}}]
        if job.unschedulable:
            found.append({"type": "Warning", "reason": "FailedScheduling", "message": job.unschedulable,
                          "involvedObject": involved, "metadata": {"name": f"{job.name}.scheduling"}})
        if job.mount_error:
            found.append({"type": "Warning", "reason": "FailedMount", "message": job.mount_error,
                          "involvedObject": involved, "metadata": {"name": f"{job.name}.mount"}})
        if job.pull_message:
            found.append({"type": "Warning", "reason": "Failed", "message": job.pull_message,
                          "involvedObject": involved, "metadata": {"name": f"{job.name}.pull"}})
            error = job.waiting[0] if job.waiting else "ErrImagePull"
            found.append({"type": "Warning", "reason": "Failed", "message": f"Error: {error}",
                          "involvedObject": involved, "metadata": {"name": f"{job.name}.pull-error"}})
        elif job.waiting:
            found.append({"type": "Warning", "reason": "Failed", "message": f"Error: {job.waiting[1]}",
                          "involvedObject": involved, "metadata": {"name": f"{job.name}.config"}})
        return found

    def _pod(self, job: RecordedJob) -> dict[str, Any]:
        phase, code = job.phase, job.exit_code()
        conditions: list[dict[str, Any]] = []
        if job.node is None:
            conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                               "message": job.unschedulable or ""})
        else:
            conditions.append({"type": "PodScheduled", "status": "True"})
        if job.terminated_reason == "Evicted":
            conditions.append({"type": "DisruptionTarget", "status": "True",
                               "reason": job.disruption,
                               "message": "the pod was disrupted (the stand-in's evict())"})
        state: dict[str, Any]
        if job.waiting:
            state = {"waiting": {"reason": job.waiting[0], "message": job.waiting[1]}}
        elif job.process is None:
            state = {"waiting": {"reason": "ContainerCreating"}} if job.node else {}
        elif code is None:
            state = {"running": {}}
        else:
            reason = job.terminated_reason or ("Completed" if code == 0 else "Error")
            state = {"terminated": {"exitCode": code, "reason": reason}}
        name = job.container.get("name", "dagster")
        status: dict[str, Any] = {"phase": phase, "conditions": conditions}
        if state:
            status["containerStatuses"] = [{"name": name, "image": job.container.get("image") or "",
                                            "imageID": "", "ready": state.get("running") is not None,
                                            "restartCount": 0, "state": state}]
        if job.terminated_reason == "Evicted":
            status["reason"] = "Evicted"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self._pod_name(job), "namespace": job.namespace,
                         "labels": {**job.labels, "job-name": job.name},
                         **({"deletionTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(job.pod_deleted_at)),
                             "deletionGracePeriodSeconds": int(job.grace_seconds)}
                            if job.pod_deleted_at is not None else {})},
            "spec": {"nodeName": job.node, "containers": [{"name": name, "image": job.container.get("image")}]},
            "status": status,
        }


def _selector(raw: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in raw.split(",") if "=" in kv)


def _get(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def _matches(job: RecordedJob, wanted: dict[str, str]) -> bool:
    labels = {**job.labels, "job-name": job.name}
    return all(labels.get(k) == v for k, v in wanted.items())


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def invalid_names(body: dict[str, Any]) -> list[str]:
    """What the API server refuses in a Job's name and its and its pod template's labels (apimachinery's
    IsDNS1123Subdomain, IsQualifiedName, IsValidLabelValue). A Job name is also its pods' `job-name` label value,
    hence 63 characters at most."""
    problems = []
    name = body["metadata"].get("name") or ""
    if len(name) > 63 or not _DNS_SUBDOMAIN.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain of at most 63 "
                        "characters")
    template = (body.get("spec") or {}).get("template") or {}
    for where, labels in (("metadata.labels", body["metadata"].get("labels") or {}),
                          ("spec.template.metadata.labels", (template.get("metadata") or {}).get("labels") or {})):
        for key, value in labels.items():
            prefix, _, local = key.rpartition("/")
            if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or len(local) > 63 \
                    or not _LABEL_PART.match(local):
                problems.append(f"{where}: Invalid value: {key!r}: not a qualified label name")
            if value and (len(value) > 63 or not _LABEL_PART.match(str(value))):
                problems.append(f"{where}: Invalid value: {value!r} (label {key}): a valid label value must be 63 "
                                "characters or less, alphanumeric, '-', '_' or '.', starting and ending with an "
                                "alphanumeric character")
    return problems


def _status(code: int, reason: str, message: str, success: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success" if success else "Failure",
            "message": message, "reason": reason, "code": code}


def instance_yaml(stub: KubernetesJobsStub, dagster_home: Path, namespace: str = "batch",
                  extra: dict[str, Any] | None = None, env_config_maps: list[str] | None = None) -> str:
    """A dagster.yaml whose run launcher is the real K8sRunLauncher talking to the stand-in. Run and step pods get
    their environment from `env_config_maps` (create them in the stand-in, in `namespace`)."""
    config: dict[str, Any] = {
        "telemetry": {"enabled": False},
        "run_launcher": {
            "module": "dagster_k8s",
            "class": "K8sRunLauncher",
            "config": {
                "service_account_name": "dagster",
                "instance_config_map": "dagster-instance",
                "dagster_home": str(dagster_home),
                "job_image": "batch-assets:test",
                "job_namespace": namespace,
                "load_incluster_config": False,
                "kubeconfig_file": str(stub.kubeconfig),
                "env_config_maps": env_config_maps or [],
            },
        },
    }
    config.update(extra or {})
    return yaml.safe_dump(config)
