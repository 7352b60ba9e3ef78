"""Stop means stop: Terminate in the UI (GraphQL `terminateRun`), SIGTERM (a deleted pod, the run worker's
termination) and Ctrl-C end a run promptly, as CANCELED, and nothing brings it back.

Dagster delivers each of them to the step as an interrupt (KeyboardInterrupt or DagsterExecutionInterruptedError;
its run worker maps SIGTERM to SIGINT), and its error boundary turns an interrupt into `RetryRequested` whenever the
step has a RetryPolicy (dagster/_core/execution/plan/utils.py, `op_execution_error_boundary`): the step was run
again after its backoff and kept calling the model, the run stayed CANCELING. Every stage's body therefore runs
under `stop_means_stop`, which on an interrupt:
- stops the model provider (no new request; requests in flight get `runtime.stop_grace_s`, then are abandoned;
  their answers are journaled, batch_assets/reliability/journal.py) and writes the journals out; a user's stop also
  cancels the provider batches the step waits on (batch mode: batch_assets/stages/infer_batch.py), a crash or a
  platform's stop does not (the rerun re-attaches to them);
- marks the run CANCELING when nobody did (a signal to a CLI run: Dagster would otherwise record an unexpected
  interruption as a failure) and tags it `dagster/max_retries: 0`, so `run_retries` never relaunches a run its
  user stopped, even one killed later while it stopped;
- raises `RunStopped`, an interrupt that is also a DagsterError: the boundary passes DagsterErrors through untouched
  (no retry), and the executor sees an interrupt, so the step is recorded as interrupted and the run ends CANCELED.
A crash (SIGKILL, OOM, a lost node) is not a stop: the run is marked failed and `run_retries` relaunch it as before.
Neither is a step pod signalled alone while its run goes on (a drain, a spot eviction): its
provider is stopped and its answers journaled the same way, then the interrupt goes on to Dagster, whose RetryPolicy
runs the step again, resuming from the journal and the chunks.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg

from batch_assets.reliability.journal import flush_open_journals
from batch_assets.spec import PipelineSpec
from batch_assets.stages.infer import is_stop, stop_provider

STOPPED_TAG = "batch_assets/stopped"
# When the first step process of the run stopped sending model requests (epoch seconds): a request the endpoint
# received after it was on its way already (tests/reliability/test_stop_and_crash_cli.py counts them)
STOP_RECEIVED_TAG = "batch_assets/stop_received_at"
MAX_RETRIES_TAG = "dagster/max_retries"  # Dagster's per-run override of run_retries.max_retries
# Executors that run each step in a pod of its own (batch_assets/orchestration/execution/k8s_executor.py, dagster-k8s's)
POD_EXECUTORS = frozenset({"batch_k8s", "k8s"})


class RunStopped(dg.DagsterExecutionInterruptedError, dg.DagsterError):
    """The run was stopped by its user: an interrupt Dagster's RetryPolicy handling cannot turn into a retry."""


def stoppable(spec: PipelineSpec, provider_key: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps an asset body (`fn(context)`) in `stop_means_stop`; `provider_key`: the model resource to stop."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def body(context: dg.AssetExecutionContext) -> Any:
            with stop_means_stop(context, spec, provider_key):
                return fn(context)

        return body

    return wrap


@contextmanager
def stop_means_stop(context: dg.AssetExecutionContext, spec: PipelineSpec, provider_key: str | None) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:
        if not is_stop(exc) or isinstance(exc, RunStopped):
            raise
        # A second Ctrl-C while the requests in flight get their grace ends the grace at once.
        provider = getattr(context.resources, provider_key, None) if provider_key is not None else None
        if provider is not None:
            stop_provider(provider, spec.runtime.stop_grace_s)
        flush_open_journals()
        if not _stopped_by_user(context):
            raise  # a platform stopping this step's pod alone (a drain, a spot eviction): retried like a lost node
        if provider is not None:  # batch mode: the user's stop cancels the partition's provider batches too
            provider.cancel_batches()
        _mark_stopped(context, type(exc).__name__, provider.stopped_at if provider is not None else None)
        context.log.warning(f"{spec.name}: the run was stopped ({type(exc).__name__}); no model call was started "
                            "after the stop, answers received so far are kept for the next run, and the run is not "
                            "retried")
        raise RunStopped(f"pipeline {spec.name!r}: the run was stopped by its user") from None


def _stopped_by_user(context: dg.AssetExecutionContext) -> bool:
    """A Terminate (the run is CANCELING), or a signal to a step on this machine (the in-process executor's run
    process, a multiprocess child: Ctrl-C reaches the whole group), is the user's. A step pod of its own (the
    Kubernetes executors) signalled while its run goes on is being moved by its platform (a drain, a spot eviction):
    the step's RetryPolicy runs it again."""
    try:
        run = context.instance.get_run_by_id(context.run_id)
    except Exception:
        run = None
    if run is not None and run.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED):
        return True
    return context.job_def.executor_def.name not in POD_EXECUTORS


def _mark_stopped(context: dg.AssetExecutionContext, why: str, stopped_at: float | None = None) -> None:
    instance, run_id = context.instance, context.run_id
    try:
        tags = {STOPPED_TAG: why, MAX_RETRIES_TAG: "0"}
        run = instance.get_run_by_id(run_id)  # read once: its tags (an earlier stop) and its status
        if stopped_at is not None:
            earlier = run.tags.get(STOP_RECEIVED_TAG) if run is not None else None
            tags[STOP_RECEIVED_TAG] = f"{min(stopped_at, float(earlier or stopped_at)):.3f}"
        instance.add_run_tags(run_id, tags)  # tags only: the status read above still holds
        if run is not None and run.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING):
            # Nobody asked through Dagster (a signal to the process): record the stop as a cancellation.
            instance.report_run_canceling(run, message=f"Stopping the run: received {_signal_name(why)}.")
    except Exception as exc:  # the instance is unreachable: the stop itself must still happen
        context.log.warning(f"could not mark the run as stopped in the instance: {exc}")


def _signal_name(why: str) -> str:
    return {"KeyboardInterrupt": f"{signal.Signals.SIGINT.name} or {signal.Signals.SIGTERM.name}",
            "DagsterExecutionInterruptedError": "a termination request"}.get(why, why)


__all__ = ["RunStopped", "STOPPED_TAG", "STOP_RECEIVED_TAG", "stop_means_stop", "stoppable"]
