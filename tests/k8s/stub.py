"""A stand-in for a Kubernetes API server: the `batch/v1` Jobs API (and the few core/v1 pod calls dagster-k8s
makes), on loopback HTTP, that records every Job and runs its container command as a local process.

No kube-apiserver can run on the CI machines (no container engine), so this is the narrowest seam: the real
kubernetes Python client, the real `K8sRunLauncher` and the real (batch) `k8s_job_executor` talk HTTP to it through
a kubeconfig, exactly as they would to a cluster. What it does NOT do: schedule onto nodes, honour resources, node
selectors or tolerations, pull images, mount volumes or resolve `envFrom` secrets. Tests assert on the Job
specs it recorded (what a cluster would have been asked for) and on the outputs the commands produced.

A Job's container runs `args` (or `command` + `args`) with the stub's base environment overlaid by the
container's literal `env` values, in the stub's working directory; `dagster` resolves to this interpreter's CLI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

_JOBS = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?(?P<status>/status)?$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?(?P<log>/log)?$")


@dataclass
class RecordedJob:
    """One Job as posted (the Kubernetes JSON body), and the local process running its container."""

    namespace: str
    body: dict[str, Any]
    log_path: Path
    process: subprocess.Popen | None = None
    deleted: bool = False

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
    def container(self) -> dict[str, Any]:
        return self.pod_spec["containers"][0]

    @property
    def resources(self) -> dict[str, dict[str, str]]:
        return self.container.get("resources") or {}

    @property
    def env(self) -> dict[str, str]:
        return {e["name"]: e.get("value") for e in self.container.get("env") or []}

    @property
    def component(self) -> str | None:
        return self.labels.get("app.kubernetes.io/component")

    @property
    def step_key(self) -> str | None:
        return self.labels.get("dagster/op")

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def status(self) -> dict[str, Any]:
        code = self.exit_code()
        if code is None:
            return {"active": 1}
        return {"succeeded": 1} if code == 0 else {"failed": 1}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class KubernetesJobsStub:
    """Start with `start()`, point clients at `kubeconfig`, read `jobs`, `stop()` kills what is still running."""

    def __init__(self, workdir: Path, base_env: dict[str, str], cwd: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.base_env = dict(base_env)
        self.cwd = Path(cwd)
        self.jobs: list[RecordedJob] = []
        self.unhandled: list[str] = []  # calls the stub does not implement (a test may assert there are none)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.kubeconfig = self.workdir / "kubeconfig.yaml"

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
        for job in self.jobs:
            if job.process is not None and job.process.poll() is None:
                job.process.kill()
                job.process.wait(timeout=30)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- queries for tests -------------------------------------------------------------------------------------
    def jobs_for_run(self, run_id: str) -> list[RecordedJob]:
        return [j for j in self.jobs if j.labels.get("dagster/run-id") == run_id]

    def step_jobs(self, run_id: str) -> dict[str, RecordedJob]:
        """The run's step Jobs by step key (the last attempt of each)."""
        return {j.step_key: j for j in self.jobs_for_run(run_id) if j.component == "step_worker" and j.step_key}

    def failures(self) -> str:
        """Output of every Job whose command failed (for assertion messages)."""
        return "\n\n".join(f"--- {j.name} (exit {j.exit_code()}) ---\n{j.output()[-3000:]}"
                           for j in self.jobs if j.exit_code() not in (None, 0))

    # -- the API -----------------------------------------------------------------------------------------------
    def _find(self, namespace: str, name: str) -> RecordedJob | None:
        with self._lock:
            return next((j for j in reversed(self.jobs) if j.namespace == namespace and j.name == name
                         and not j.deleted), None)

    def _dispatch(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(req.path)
        jobs, pods = _JOBS.match(url.path), _PODS.match(url.path)
        if jobs and method == "POST" and not jobs["name"]:
            body = req._body()  # type: ignore[attr-defined]
            if self._find(jobs["ns"], body["metadata"]["name"]) is not None:
                return req._reply(409, _status(409, "AlreadyExists", f"job {body['metadata']['name']} exists"))  # type: ignore[attr-defined]
            job = self._create(jobs["ns"], body)
            return req._reply(201, job.body)  # type: ignore[attr-defined]
        if jobs and jobs["name"]:
            job = self._find(jobs["ns"], jobs["name"])
            if job is None:
                return req._reply(404, _status(404, "NotFound", f'jobs.batch "{jobs["name"]}" not found'))  # type: ignore[attr-defined]
            if method == "GET":
                return req._reply(200, {**job.body, "status": job.status()})  # type: ignore[attr-defined]
            if method == "DELETE":
                if job.process is not None and job.process.poll() is None:
                    job.process.terminate()
                job.deleted = True
                return req._reply(200, _status(200, "", "deleted", success=True))  # type: ignore[attr-defined]
        if pods and method == "GET":
            if pods["name"] is None:
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                wanted = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
                items = [self._pod(j) for j in self.jobs if not j.deleted and _matches(j, wanted)]
                return req._reply(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})  # type: ignore[attr-defined]
            job = next((j for j in self.jobs if j.name == pods["name"]), None)
            if job is None:
                return req._reply(404, _status(404, "NotFound", f'pods "{pods["name"]}" not found'))  # type: ignore[attr-defined]
            if pods["log"]:
                return req._reply(200, job.output(), "text/plain")  # type: ignore[attr-defined]
            return req._reply(200, self._pod(job))  # type: ignore[attr-defined]
        self.unhandled.append(f"{method} {req.path}")
        req._reply(404, _status(404, "NotFound", f"the Kubernetes stub does not implement {method} {url.path}"))  # type: ignore[attr-defined]

    def _create(self, namespace: str, body: dict[str, Any]) -> RecordedJob:
        name = body["metadata"]["name"]
        job = RecordedJob(namespace, body, self.workdir / f"{name}.log")
        container = job.container
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if argv and argv[0] == "dagster":
            argv[0] = str(Path(sys.executable).with_name("dagster"))
        env = {**self.base_env, **{k: v for k, v in job.env.items() if v is not None}}
        with self._lock:
            self.jobs.append(job)
        with open(job.log_path, "w") as log:
            job.process = subprocess.Popen(argv, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        return job

    def _pod(self, job: RecordedJob) -> dict[str, Any]:
        code = job.exit_code()
        phase = "Running" if code is None else ("Succeeded" if code == 0 else "Failed")
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": job.name, "namespace": job.namespace,
                         "labels": {**job.labels, "job-name": job.name}},
            "spec": {"containers": [{"name": job.container.get("name", "dagster"),
                                     "image": job.container.get("image")}]},
            "status": {"phase": phase},
        }


def _matches(job: RecordedJob, wanted: dict[str, str]) -> bool:
    labels = {**job.labels, "job-name": job.name}
    return all(labels.get(k) == v for k, v in wanted.items())


def _status(code: int, reason: str, message: str, success: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success" if success else "Failure",
            "message": message, "reason": reason, "code": code}


def instance_yaml(stub: KubernetesJobsStub, dagster_home: Path, namespace: str = "batch",
                  extra: dict[str, Any] | None = None) -> str:
    """A dagster.yaml whose run launcher is the real K8sRunLauncher talking to the stub."""
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
            },
        },
    }
    config.update(extra or {})
    return yaml.safe_dump(config)


def environment_for_jobs(**overrides: str) -> dict[str, str]:
    """The base environment of Job processes: this process's, without a stray BATCH_INFER_GPUS."""
    env = {k: v for k, v in os.environ.items() if k != "BATCH_INFER_GPUS"}
    env.update(overrides)
    return env
