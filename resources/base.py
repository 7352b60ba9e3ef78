"""The shared shape of every model provider: a Dagster resource that loads its model once per process.

`setup_for_execution` runs once per run in the in-process executor and once per step process under the
multiprocess and Kubernetes executors; only steps that require the resource (the infer assets) pay for the load.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import dagster as dg
from pydantic import PrivateAttr

from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.resources.fields import Role, chosen_settings, role
from batch_assets.resources.secrets import env_secret_values, resolve_env_refs, scrub

# How many times each provider class loaded a model in this process. Tests read it; the run log says the same.
LOAD_COUNTS: Counter[str] = Counter()


# The batch Kubernetes executor sets this on the infer container to the GPUs the step's pod was given
# (batch_assets/orchestration/execution/pod_compute.py); unset outside Kubernetes.
INFER_GPUS_ENV = "BATCH_INFER_GPUS"
# ... and, when it has several GPUs, how to use them: 'tensor_parallel' (one model over all) or 'replicas' (one
# model copy per GPU; providers that run replicas read it at load).
GPU_STRATEGY_ENV = "BATCH_GPU_STRATEGY"


def granted_gpus() -> int | None:
    """GPUs the executor gave this step, or None when no executor said (local runs)."""
    value = os.environ.get(INFER_GPUS_ENV, "").strip()
    return int(value) if value else None


def resolve_device(device: str) -> str:
    """'auto' follows the step's GPU grant (BATCH_INFER_GPUS: 0 -> CPU), else picks CUDA when this process can
    see a GPU, else Apple MPS, else CPU. An explicit device is used as given."""
    if device != "auto":
        return device
    granted = granted_gpus()
    if granted == 0:
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if granted:
        raise ModelLoadError(
            f"this step was given {granted} GPU(s) ({INFER_GPUS_ENV}={granted}) but torch sees no CUDA device: "
            "run the CUDA user-code image (k8s/Dockerfile) on a node with the NVIDIA device plugin, or set the "
            "partition's gpus to 0 in runtime.resources"
        )
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


class ModelResource(dg.ConfigurableResource):
    """Base class for providers. Subclasses implement `load()` and one or more capability methods."""

    _model: Any = PrivateAttr(default=None)
    _load_seconds: float = PrivateAttr(default=0.0)
    _preload: Any = PrivateAttr(default=None)  # _Preload while the model loads on its thread

    # -- what orchestration needs to know, declared by the provider (no table of provider names elsewhere) -------
    # Dagster kinds shown on the pipeline's infer asset (its tags and icons in the UI).
    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"python"})
    # A hosted HTTP API: the host its calls go to when the config sets no `base_url`. Every infer step calling one
    # endpoint holds the Dagster pool `endpoint:<host>` (batch_assets/orchestration/execution/pool_slots.py), and the infer
    # asset's metadata says the model ran remotely. None: the model runs in the step's own process.
    default_endpoint: ClassVar[str | None] = None
    # Several GPUs in one step (runtime.resources gpu_strategy): one model copy per GPU (`replicas`), or one model
    # sharded over all of them (`tensor_parallel`). A provider that does neither runs its model on one GPU.
    runs_replicas: ClassVar[bool] = False
    runs_tensor_parallel: ClassVar[bool] = False
    # Load on a thread from the moment the run's process sets the resource up, so the steps before infer (read,
    # prepare) run while the model loads; the first use of the model (the infer step) waits for it and fails with
    # the load's error. Only for providers whose model loads in this process and is not tied to the thread that
    # loaded it (an HTTP client's event loop is): they opt in.
    preload: ClassVar[bool] = False
    # Billed per request and answering row by row (an HTTP API): the capability methods take `on_answer(position,
    # result)` and call it as each row's answer arrives, so the infer loop journals every answer within about a
    # second (batch_assets/reliability/journal.py) and a crash costs only the requests in flight.
    answers_each_row: ClassVar[bool] = False
    # Takes documents as file parts of a chat message (`{"type": "file", "file": {"filename", "file_data"}}`, OpenAI's
    # form for PDFs): `prepare.file_columns` is refused for a provider that does not declare it.
    accepts_file_parts: ClassVar[bool] = False
    # What to check when the model's answers ignore the output constraint (the fix of the error that stops a run
    # whose structured answers do not parse).
    unparseable_hint: ClassVar[str] = ("the model's answers ignore the constraint: check the provider supports "
                                       "structured output (docs/structured-outputs.md)")

    @classmethod
    def replicas_config_problem(cls, config: dict[str, Any]) -> str | None:
        """Why this `model.config` cannot run `gpu_strategy: replicas` (asked only when `runs_replicas`), or None."""
        return None

    @property
    def stopped_at(self) -> float | None:
        """When `stop` stopped new calls (wall clock), where the provider has calls it can hold back; else None."""
        return None

    @classmethod
    def waits_on_batches(cls, config: dict[str, Any]) -> bool:
        """Whether this `model.config` sends rows through the provider's batch API (answers come hours later; the
        infer step waits for them without holding the endpoint's pool: batch_assets/orchestration/execution/pool_slots.py)."""
        return False

    # The task methods (`generate`, `embed`) whose rows this provider can send through its batch API.
    batch_methods: ClassVar[frozenset[str]] = frozenset()

    def batch_session(self, params: Any, method: str = "generate") -> Any:
        """The provider's batch API for one partition's calls of `method` (resources/openai_api/batch.py's shape),
        or None when rows are sent online. Asked by the infer loop (batch_assets/stages/infer_batch.py)."""
        return None

    def cancel_batches(self) -> list[str]:
        """The run was stopped by its user: cancel every provider batch this process waits on; returns their
        ids. A crash cancels nothing (a rerun re-attaches instead)."""
        return []

    def choose_for_partition(self, inputs: Callable[[], list[Any]]) -> dict[str, Any]:
        """Settle, from one partition's own model inputs (`inputs()` reads them: every non-empty row's), anything the
        provider decides per partition, before the infer stage takes the partition's checkpoint fingerprint (so
        a choice here is part of it and a partition is never computed half one way, half another); returns the
        partition's metadata about it. Called one partition at a time. Only the embedder's `precision: fast` decides
        anything (resources/hf/precision.py)."""
        return {}

    def stop(self, grace_s: float) -> None:
        """The run is stopping (Terminate, SIGTERM, Ctrl-C): send nothing new from now on, let calls in flight
        answer for up to `grace_s`, then abandon them. An in-process model's call cannot be cut short: the infer
        loop stops waiting for it instead (its thread is a daemon), which is what this default leaves to it."""

    # -- optional hooks the infer stage asks every provider; the defaults are an in-process model's ---------------
    def chunks_in_flight(self, chunk_rows: int) -> int:
        """Chunk calls the infer loop may run at once on this one model (batch_assets/stages/infer_streams.py): 1,
        one model, one call at a time (the loop still overlaps reading and writing with it)."""
        return 1

    def partition_window_rows(self, chunk_rows: int) -> int:
        """Rows the infer stage may have queued across the partitions of one run (batch_assets/orchestration/
        overlap.py); 0: one partition at a time."""
        return 0

    def input_tokenizer(self) -> Any:
        """For `prepare.max_input_tokens`: the tokenizer that counts this model's input tokens (a Hugging Face
        tokenizer), or None: the provider has none and the spec's limit is refused with the fix."""
        return None

    def max_input_tokens(self, params: Any, system: str | None = None) -> int | None:
        """The longest input the model takes, in tokens of the text alone (`prepare.max_input_tokens: model`), or
        None when unknown."""
        return None

    @property
    def backend_used(self) -> str | None:
        """The runtime that computes the answers when the config leaves the choice to the provider (the embedder's
        `backend: auto`: torch, onnx, openvino), once loaded: part of the checkpoint fingerprint, so chunks of two
        runtimes are never mixed. None: one runtime."""
        return None

    def vector_dimensions(self) -> int | None:
        """The size of every vector the provider returns, when the config fixes it before any call (the output
        column's type is then known up front); None: as the model returns them."""
        return None

    @property
    def unwrapped(self) -> ModelResource:
        """The provider itself; a wrapper (the response cache's CachedProvider) answers with the provider it wraps:
        its class and code are what computed the rows."""
        return self

    def user_code_files(self) -> list[str]:
        """Source files of the user's own code this provider runs (a custom model class): part of the checkpoints'
        code version, so editing that code recomputes what the old code committed."""
        return []

    def configured_device(self) -> str | None:
        """The device the config asks for ('auto', 'cpu', 'cuda:1'), for the infer asset's metadata: the `device`
        field of a provider whose model runs in this process; None for one without (an HTTP API)."""
        value = getattr(self, "device") if "device" in type(self).model_fields else None
        return value if isinstance(value, str) else None

    # -- to implement ---------------------------------------------------------------------------------------------
    def load(self) -> Any:
        raise NotImplementedError

    def model_name(self) -> str:
        """A human-readable model name for logs and metadata (never a secret)."""
        return str(getattr(self, "model", type(self).__name__))

    def secret_values(self) -> list[str]:
        """Values that must never appear in an error or a log line: fields declared `secret` (resources/fields.py)
        and every variable a nested `{env: NAME}` refers to."""
        values: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name, None)
            if role(type(self), name) is Role.SECRET and isinstance(value, str):
                values.append(value)
            elif isinstance(value, (dict, list)):
                values += env_secret_values(value)
        return values

    def config_value(self, name: str) -> Any:
        """A dict/list field with its nested `{env: NAME}` references read from the environment (at load time, in
        the run's process: the value never reaches the config Dagster stores and shows)."""
        return resolve_env_refs(getattr(self, name), f"model.config.{name}")

    def describe(self) -> dict[str, Any]:
        """Metadata recorded on the infer asset: safe, non-secret settings. `settings`: those of the config, away
        from their defaults, that can change an answer (the fields declared `semantic`, resources/fields.py)."""
        self.wait_for_preload()  # what the load decides (device, replicas) is known only once it is done
        out: dict[str, Any] = {"provider": type(self).__name__, "model": self.model_name(),
                               "settings": chosen_settings(self)}
        if getattr(self, "batch_size", None) is not None:  # None: the provider decides at load (its describe says)
            out["batch_size"] = int(self.batch_size)
        return out

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if self.preload:
            self._preload = _Preload(self, context.log)
            return
        self._model = self._load_model()
        self._log_loaded(context.log)

    def _load_model(self) -> Any:
        start = time.perf_counter()
        try:
            model = self.load()
        except ImportError:
            raise
        except Exception as exc:  # re-raised with the model named (and secrets masked): a failed load fails the step
            message = scrub(f"{type(self).__name__} could not load model {self.model_name()!r}: {exc}",
                            self.secret_values())
            raise ModelLoadError(message) from None
        self._load_seconds = time.perf_counter() - start
        LOAD_COUNTS[type(self).__name__] += 1
        return model

    def _log_loaded(self, log: Any, waited: float | None = None) -> None:
        if log is not None:
            how = "" if waited is None else f" on a thread from the run's start (the first use waited {waited:.1f}s)"
            log.info(f"Loaded model {self.model_name()} ({type(self).__name__}) in {self._load_seconds:.1f}s"
                     f"{how} in process {os.getpid()}")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.wait_for_preload(errors=False)  # a run that ended before its infer step: the load ends, is dropped
        self._model = None
        gc.collect()
        # Only a provider that already imported torch can hold GPU memory; importing it here would cost an API-only
        # run (openai provider) seconds at teardown for nothing (seen in the API path's profile, docs/BENCHMARKS.md).
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wait_for_preload(self, errors: bool = True) -> None:
        """Wait for a model loading on its thread (nothing to wait for otherwise); its error is raised here unless
        `errors` is False (teardown: the run has already failed or never needed the model)."""
        preload = self._preload
        if preload is None:
            return
        if not errors:
            preload.thread.join()
            self._preload = None
            if preload.error is None and self._model is None:
                self._model = preload.model  # teardown_after_execution of the provider releases what it holds
            return
        preload.finish(self)

    @property
    def loaded(self) -> Any:
        if self._model is None:
            self.wait_for_preload()
        if self._model is None:
            raise RuntimeError(
                f"{type(self).__name__} used before its model was loaded: use it as a Dagster resource "
                "(setup_for_execution loads it) or call load_for_tests() in a test."
            )
        return self._model

    def load_for_tests(self) -> "ModelResource":
        """Load outside Dagster (unit tests, benchmarks)."""
        self.setup_for_execution(dg.build_init_resource_context())
        _ = self.loaded  # a preloading provider: wait here, so the test sees the load and its error
        return self


class _Preload:
    """One model load on its own thread; `finish` (from `loaded`) waits for it, once, and hands the model or the
    load's error to the resource."""

    def __init__(self, resource: ModelResource, log: Any) -> None:
        self.log = log
        self.model: Any = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, args=(resource,), daemon=True,
                                       name=f"preload-{type(resource).__name__}")
        self.thread.start()

    def _run(self, resource: ModelResource) -> None:
        try:
            self.model = resource._load_model()
        except BaseException as exc:  # kept for the first use of the model: the infer step fails with it
            self.error = exc

    def finish(self, resource: ModelResource) -> None:
        with self.lock:
            if resource._model is not None:  # another thread of the step finished it
                return
            waited = time.perf_counter()
            self.thread.join()
            if self.error is not None:
                raise self.error  # every use raises it again: the step fails, never with a half-loaded model
            resource._model = self.model
            resource._preload = None
            resource._log_loaded(self.log, time.perf_counter() - waited)
