"""The cluster stand-in (tests/k8s/stub.py) does to a Job what a cluster would, through the real kubernetes client:
it binds a pod only where it fits, builds the container's environment from the spec alone, refuses to start a
container whose Secret is missing, kills a container over its memory limit (OOMKilled) and can evict a pod."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_helpers import wait_for
from tests.k8s.stub import IMAGE_ENV, KubernetesJobsStub, Node

NS = "batch"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _client(stub: KubernetesJobsStub):
    from kubernetes import client, config

    api = config.new_client_from_config(str(stub.kubeconfig))
    return client.BatchV1Api(api), client.CoreV1Api(api)


def _job(name: str, script: str, resources: dict | None = None, pod: dict | None = None,
         container: dict | None = None) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", **(pod or {}),
                "containers": [{"name": "main", "image": "batch-assets:test", "command": [sys.executable, "-c", script],
                                "resources": resources or {}, **(container or {})}]}}}}


def _wait(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    return wait_for(what, check, None, timeout, interval=0.1)


def _pod(core, name: str):
    return core.list_namespaced_pod(NS, label_selector=f"job-name={name}").items[0]


def test_a_gpu_pod_waits_pending_until_a_node_fits(tmp_path: Path) -> None:
    nodes = [Node("cpu-1", cpu="8", memory="32Gi"),
             Node("t4-1", gpus=1, labels={"pool": "gpu"}, taints=[GPU_TAINT]),
             Node("a100-1", gpus=4, labels={"pool": "big"}, taints=[GPU_TAINT])]
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path, nodes=nodes).start()
    try:
        batch, core = _client(stub)
        gpu = {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
        toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        # 2 GPUs with the wrong selector: the cpu node lacks the label; the tainted nodes are not tolerated.
        batch.create_namespaced_job(NS, _job("wrong-pool", "pass", gpu, {"nodeSelector": {"pool": "gpu"}}))
        pod = _pod(core, "wrong-pool")
        assert pod.status.phase == "Pending"
        (cond,) = [c for c in pod.status.conditions if c.type == "PodScheduled"]
        assert (cond.status, cond.reason) == ("False", "Unschedulable")
        assert cond.message == ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                                "2 node(s) had untolerated taint {nvidia.com/gpu: present}.")
        events = core.list_namespaced_event(NS, field_selector="involvedObject.name=wrong-pool").items
        assert [e.reason for e in events] == ["FailedScheduling"]
        # tolerated and selected, but the 1-GPU node is too small
        batch.create_namespaced_job(NS, _job("too-big", "pass", gpu, {"nodeSelector": {"pool": "gpu"},
                                                                      "tolerations": toleration}))
        assert "1 Insufficient nvidia.com/gpu" in _pod(core, "too-big").status.conditions[0].message
        # two 3-GPU pods on the 4-GPU node: one runs, the other waits for it to end, then runs
        three = {"limits": {"nvidia.com/gpu": "3"}}  # requests default to limits
        hold = "import time; time.sleep(1.5)"
        for name in ("first", "second"):
            batch.create_namespaced_job(NS, _job(name, hold, three, {"tolerations": toleration}))
        assert _pod(core, "first").spec.node_name == "a100-1"
        assert _pod(core, "second").status.phase == "Pending"
        _wait("first to succeed", lambda: _pod(core, "first").status.phase == "Succeeded")
        _wait("second to run", lambda: _pod(core, "second").spec.node_name == "a100-1")
        assert batch.read_namespaced_job_status("wrong-pool", NS).status.active == 1  # still pending, still active
    finally:
        stub.stop()


def test_the_container_environment_comes_from_the_spec_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROCESS_ONLY", "must-not-leak")
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path).start()
    try:
        batch, core = _client(stub)
        stub.create_config_map("settings", {"BATCH_EXECUTOR": "k8s", "SHARED": "from-config-map"}, NS)
        stub.create_secret("creds", {"AWS_ACCESS_KEY_ID": "AKIA-test", "SHARED": "from-secret"}, NS)
        dump = "import json, os; print(json.dumps(dict(os.environ)))"
        container = {"envFrom": [{"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "creds"}}],
                     "env": [{"name": "LITERAL", "value": "1"},
                             {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                              "key": "AWS_ACCESS_KEY_ID"}}},
                             {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}
        batch.create_namespaced_job(NS, _job("env", dump, container=container))
        _wait("env to finish", lambda: _pod(core, "env").status.phase == "Succeeded")
        env = json.loads(stub.jobs[0].output())
        env.pop("LC_CTYPE", None)  # the interpreter may set it at start-up
        assert env == {**IMAGE_ENV, "BATCH_EXECUTOR": "k8s", "SHARED": "from-secret", "AWS_ACCESS_KEY_ID": "AKIA-test",
                       "LITERAL": "1", "TOKEN": "AKIA-test", "POD": "env"}

        # A Secret nobody created: the container is never started, and the pod says why, as the kubelet does.
        missing = {"envFrom": [{"secretRef": {"name": "batch-assets-hf"}}]}
        batch.create_namespaced_job(NS, _job("no-secret", "print('ran')", container=missing))
        time.sleep(0.5)
        state = _pod(core, "no-secret").status.container_statuses[0].state
        assert state.waiting.reason == "CreateContainerConfigError"
        assert state.waiting.message == 'secret "batch-assets-hf" not found'
        assert _pod(core, "no-secret").status.phase == "Pending" and stub.jobs[1].process is None
        stub.create_secret("batch-assets-hf", {"HF_TOKEN": "hf_test"}, NS)  # the kubelet retries
        _wait("the pod to start once the secret exists", lambda: _pod(core, "no-secret").status.phase == "Succeeded")
    finally:
        stub.stop()


def test_a_container_over_its_memory_limit_is_oom_killed(tmp_path: Path) -> None:
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path).start()
    try:
        batch, core = _client(stub)
        grow = "import time; b = bytearray(400 * 2**20); time.sleep(30)"
        batch.create_namespaced_job(NS, _job("hog", grow, {"limits": {"memory": "200Mi"}}))
        batch.create_namespaced_job(NS, _job("fits", grow.replace("30", "0.1"), {"limits": {"memory": "600Mi"}}))
        _wait("hog to be killed", lambda: _pod(core, "hog").status.phase == "Failed", timeout=20)
        terminated = _pod(core, "hog").status.container_statuses[0].state.terminated
        assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 137)
        assert batch.read_namespaced_job_status("hog", NS).status.failed == 1
        _wait("fits to succeed", lambda: _pod(core, "fits").status.phase == "Succeeded", timeout=20)
    finally:
        stub.stop()


def test_an_evicted_pod_fails_its_job_with_a_disruption_condition(tmp_path: Path) -> None:
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path).start()
    try:
        batch, core = _client(stub)
        batch.create_namespaced_job(NS, _job("spot", "import time; time.sleep(30)"))
        _wait("spot to run", lambda: _pod(core, "spot").status.phase == "Running")
        stub.evict(stub.jobs[0])
        pod = _pod(core, "spot")
        assert (pod.status.phase, pod.status.reason) == ("Failed", "Evicted")
        assert [(c.type, c.status) for c in pod.status.conditions if c.type == "DisruptionTarget"] == [
            ("DisruptionTarget", "True")]
        assert batch.read_namespaced_job_status("spot", NS).status.failed == 1
    finally:
        stub.stop()


def test_a_deleted_pod_gives_its_node_room_back(tmp_path: Path) -> None:
    """A pod deleted while it could not start (a missing Secret) no longer holds the node's GPU."""
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path, nodes=[Node("gpu-1", gpus=1)]).start()
    try:
        batch, core = _client(stub)
        gpu = {"limits": {"nvidia.com/gpu": "1"}}
        missing = {"envFrom": [{"secretRef": {"name": "nobody-made-it"}}]}
        batch.create_namespaced_job(NS, _job("stuck", "pass", gpu, container=missing))
        batch.create_namespaced_job(NS, _job("next", "pass", gpu))
        assert _pod(core, "next").status.phase == "Pending"  # the stuck pod holds the only GPU
        # the API's default for a Job is to orphan its pod: the Job goes, the stuck pod keeps the GPU
        batch.delete_namespaced_job("stuck", NS)
        time.sleep(0.5)
        assert _pod(core, "stuck").status.phase == "Pending" and _pod(core, "next").spec.node_name is None
        core.delete_namespaced_pod(_pod(core, "stuck").metadata.name, NS)
        _wait("next to run once the stuck pod is gone", lambda: _pod(core, "next").spec.node_name == "gpu-1")
    finally:
        stub.stop()


def test_deleting_a_pod_sends_sigterm_waits_its_grace_period_then_kills(tmp_path: Path) -> None:
    """As the kubelet: SIGTERM, the pod's terminationGracePeriodSeconds, then SIGKILL; the pod is listed as
    terminating until its container ended. dagster-k8s's delete_job (Job, then pods) answers True, as against a
    cluster (the run launcher reports "termination failed" otherwise)."""
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path).start()
    try:
        batch, core = _client(stub)
        polite = ("import signal, sys, time, pathlib\n"
                  "def bye(*_):\n    pathlib.Path('polite.txt').write_text('SIGTERM'); sys.exit(0)\n"
                  "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(600)\n")
        stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: open('stubborn.txt', 'w')"
                    ".write('ignored'))\nprint('ready', flush=True)\ntime.sleep(600)\n")
        batch.create_namespaced_job(NS, _job("polite", polite, pod={"terminationGracePeriodSeconds": 30}))
        batch.create_namespaced_job(NS, _job("stubborn", stubborn, pod={"terminationGracePeriodSeconds": 2}))
        jobs = {j.name: j for j in stub.jobs}
        _wait("both containers to run", lambda: all("ready" in j.output() for j in jobs.values()))
        api = config_client(stub)
        assert api.delete_job("polite", NS) is True
        _wait("the polite container to exit on SIGTERM", lambda: jobs["polite"].process.poll() is not None)
        assert (tmp_path / "polite.txt").read_text() == "SIGTERM" and jobs["polite"].process.returncode == 0
        assert api.delete_job("stubborn", NS) is True
        pod = _pod(core, "stubborn")  # still listed while its grace period runs
        assert pod.metadata.deletion_timestamp is not None and pod.metadata.deletion_grace_period_seconds == 2
        _wait("the stubborn container to be killed after its grace period",
              lambda: jobs["stubborn"].process.poll() is not None, timeout=30)
        assert (tmp_path / "stubborn.txt").read_text() == "ignored" and jobs["stubborn"].process.returncode == -9
        _wait("both pods to be gone", lambda: not core.list_namespaced_pod(NS).items)
    finally:
        stub.stop()


def config_client(stub: KubernetesJobsStub):
    from dagster_k8s.client import DagsterKubernetesClient
    from kubernetes import client, config

    api = config.new_client_from_config(str(stub.kubeconfig))
    return DagsterKubernetesClient(client.BatchV1Api(api), client.CoreV1Api(api), logger=print, sleeper=time.sleep,
                                   timer=time.time)


def test_a_pod_whose_image_or_volume_never_comes_is_bound_but_never_starts(tmp_path: Path) -> None:
    """The states of a pod bound to a node whose container never starts, as the kubelet reports them: an image
    that is not in the registry or needs a pull Secret the pod lacks (ErrImagePull, then ImagePullBackOff), a
    ConfigMap volume whose object is missing or a claim that cannot mount (ContainerCreating, FailedMount event);
    a claim that does not exist keeps the pod unschedulable."""
    private = "registry.example.com/batch-assets:1"
    stub = KubernetesJobsStub(tmp_path, cwd=tmp_path, images={private: "regcred", "busybox:1": None},
                              claims={"stuck-claim": "Multi-Attach error for volume \"pvc-1\": Volume is already "
                                                     "exclusively attached to one node"}).start()
    try:
        batch, core = _client(stub)
        stub.create_secret("regcred", {".dockerconfigjson": "{}"}, namespace=NS)

        def job(name: str, image: str, pod: dict | None = None) -> None:
            body = _job(name, "print('ran')", pod=pod)
            body["spec"]["template"]["spec"]["containers"][0]["image"] = image
            batch.create_namespaced_job(NS, body)

        job("typo", "registry.example.com/batch-assets:2")
        job("no-creds", private)
        job("with-creds", private, {"imagePullSecrets": [{"name": "regcred"}]})
        job("no-map", "busybox:1", {"volumes": [{"name": "cfg", "configMap": {"name": "nowhere"}}]})
        job("stuck-claim", "busybox:1",
            {"volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "stuck-claim"}}]})
        job("no-claim", "busybox:1", {"volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "nope"}}]})
        _wait("the pod with credentials to run", lambda: _pod(core, "with-creds").status.phase == "Succeeded")

        def waiting(name: str) -> tuple[str, str] | None:
            state = _pod(core, name).status.container_statuses[0].state
            return state.waiting and (state.waiting.reason, state.waiting.message)

        _wait("image pulls to back off", lambda: waiting("typo")[0] == "ImagePullBackOff"
              and waiting("no-creds")[0] == "ImagePullBackOff")
        for name in ("typo", "no-creds", "no-map", "stuck-claim"):
            pod = _pod(core, name)
            assert pod.status.phase == "Pending" and pod.spec.node_name == "cpu-1", name  # bound, never started
        events = {e.involved_object.name: e.message for e in core.list_namespaced_event(NS).items
                  if e.reason == "Failed" and "Failed to pull" in e.message}
        assert 'Failed to pull image "registry.example.com/batch-assets:2"' in events["typo"]
        assert "no basic auth credentials" in events["no-creds"]
        mounts = {e.involved_object.name: e.message for e in core.list_namespaced_event(NS).items
                  if e.reason == "FailedMount"}
        assert mounts["no-map"] == 'MountVolume.SetUp failed for volume "cfg" : configmap "nowhere" not found'
        assert "unmounted volumes=[cache]" in mounts["stuck-claim"] and "Multi-Attach" in mounts["stuck-claim"]
        assert waiting("no-map") == ("ContainerCreating", None)
        unbound = _pod(core, "no-claim")
        assert unbound.spec.node_name is None
        assert 'persistentvolumeclaim "nope" not found' in unbound.status.conditions[0].message
        assert all(j.process is None for j in stub.jobs if j.name != "with-creds")
    finally:
        stub.stop()
