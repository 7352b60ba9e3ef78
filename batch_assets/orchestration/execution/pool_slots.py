"""The Dagster pool each pipeline's infer step runs in and the slots it holds there: one place names the pool, so caps
stay consistent, and frees the slots of a run that is gone (the command over them: batch_assets/commands/pools.py).

A pool caps how many steps holding it run at once across all runs of the deployment (`concurrency.pools` in
dagster.yaml sets the default limit; `dagster instance concurrency set <pool> <n>` sets one pool's). A step holds
one slot for its whole duration.

- External endpoints (the `openai` provider): one pool per endpoint, `endpoint:<host[:port]>`. With the pool's
  limit at 1, one infer step at a time talks to the endpoint, and that step's own limiter (`max_concurrency`,
  `requests_per_minute`, `tokens_per_minute`, Retry-After handling) keeps it under the endpoint's rate limit, so
  two runs never add up past it. We chose Dagster pools over a shared cross-process limiter (Redis, a database
  token bucket): pools are enforced by the instance the deployment already has, visible in the UI, adjustable
  live, and need no extra service; the cost is that a step waits for the slot instead of sharing the rate.
  An endpoint read from the environment ({env: NAME}) is not known at definition load, so its pool is named
  after the variable: every pipeline reading OPENAI_BASE_URL shares `endpoint:$OPENAI_BASE_URL`.
- GPU steps: the `gpu` pool, for every pipeline where any partition asks for a GPU (runtime.resources). A slot is
  one step whatever its GPU count; docs/deployment.md says how to size the pool to the GPU node pool.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlparse

from batch_assets.spec import PipelineSpec
from batch_assets.resources.registry import provider_class

GPU_POOL = "gpu"


def endpoint_pool(spec: PipelineSpec) -> str | None:
    """`endpoint:<host[:port]>` for providers that call an external HTTP endpoint (those declaring a
    `default_endpoint`, resources/base.py), else None."""
    cls = provider_class(spec.model.provider)
    default_host = cls.default_endpoint
    if default_host is None or cls.waits_on_batches(spec.model.config):
        # batch mode: the step waits hours for the provider's batches and sends nothing meanwhile; holding the
        # endpoint's slot that long would stall every online pipeline of the endpoint (docs/providers-openai.md)
        return None
    base_url = spec.model.config.get("base_url")
    if isinstance(base_url, dict) and set(base_url) == {"env"}:
        return f"endpoint:${base_url['env']}"
    if isinstance(base_url, str) and base_url:
        parsed = urlparse(base_url if "://" in base_url else f"http://{base_url}")
        return f"endpoint:{parsed.netloc or parsed.path}"
    return f"endpoint:{default_host}"


def infer_pool(spec: PipelineSpec) -> str | None:
    """The pool of the pipeline's infer step, or None when nothing caps it. `runtime.pool` overrides."""
    if spec.runtime.pool:
        return spec.runtime.pool
    pool = endpoint_pool(spec)
    if pool:
        return pool
    if spec.runtime.max_gpus() > 0:
        return GPU_POOL
    return None


# --- slots held by runs that are gone -------------------------------------------------------------------------
# A pool slot is a row in the instance's storage, claimed when the infer step starts and freed when it ends. A run
# killed with SIGKILL (an OOM kill, a closed laptop) never frees it, and Dagster's run monitoring frees slots only
# for runs the daemon launched and watches: a CLI run's slot would stay held for good, and every later run of the
# pool would wait at "Step blocked by limit for pool ..." (logged at DEBUG). So the infer step records where it
# runs (PROCESS_TAG: host, pid and the process's start time), and every run of a pooled pipeline, before its infer
# step asks for the slot (at its read and prepare steps), frees the slots of holders that are gone: a run that has
# finished, or a run on this host whose process no longer exists. Such a run is marked failed, with the reason.
# A holder that is alive, or on another host, is named in a warning with the command that frees its slot.

PROCESS_TAG = "batch/infer_process"
FREE_COMMAND = "python -m batch_assets.commands.pools free <run id>"


def process_identity(pid: int | None = None) -> str:
    """`<host>:<pid>:<start time>` of a process (the start time tells a reused pid from the original)."""
    import os
    import socket

    import psutil

    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{psutil.Process(pid).create_time():.2f}"


def process_gone(identity: str) -> bool | None:
    """True when the process named by `process_identity` no longer exists, None when it ran on another host."""
    import socket

    import psutil

    host, _, rest = identity.partition(":")
    if host != socket.gethostname():
        return None
    pid, _, started = rest.partition(":")
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" != started
    except (psutil.NoSuchProcess, ValueError):
        return True


def record_infer_process(instance, run_id: str) -> None:
    instance.add_run_tags(run_id, {PROCESS_TAG: process_identity()})


def free_run_slots(instance, run_id: str, reason: str) -> None:
    """Free every slot the run holds and, if it still shows as running, mark it failed with the reason."""
    run = instance.get_run_by_id(run_id)
    if run is not None and not run.is_finished:
        instance.report_run_failed(run, reason)
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def _holders(instance, pool: str, exclude: str | None = None) -> list[tuple[str, str]]:
    info = instance.event_log_storage.get_concurrency_info(pool)
    return [(s.run_id, s.step_key) for s in info.claimed_slots if s.run_id != exclude]


def release_dead_slots(instance, pool: str, own_run_id: str | None = None, log=None) -> list[str]:
    """Free the pool's slots held by runs that are gone; warn about live holders (who, and how to free them).
    Returns the run ids whose slots were freed."""
    import logging

    say = log or logging.getLogger(__name__)
    freed: list[str] = []
    live: list[str] = []
    for run_id, step_key in _holders(instance, pool, exclude=own_run_id):
        run = instance.get_run_by_id(run_id)
        identity = run.tags.get(PROCESS_TAG, "") if run is not None else ""
        if run is None or run.is_finished:
            why = "its run has ended" if run is not None else "its run no longer exists"
        elif identity and process_gone(identity):
            why = f"its process ({identity.split(':')[1]} on {identity.split(':')[0]}) is gone"
        else:
            where = f"process {identity.split(':')[1]} on {identity.split(':')[0]}" if identity else "unknown process"
            job = run.job_name if run is not None else "?"
            live.append(f"run {run_id} ({job}, step {step_key}, {run.status.value.lower()}, {where})")
            continue
        free_run_slots(instance, run_id, f"Marked failed by batch_assets: it held a slot of pool {pool!r} but "
                                         f"{why} (killed?). Its slot was freed so other runs can go on.")
        say.warning(f"Freed the slot of pool {pool!r} held by run {run_id} ({step_key}): {why}; that run is "
                    "marked failed. Rerun it: it resumes from its committed chunks.")
        freed.append(run_id)
    limit = instance.event_log_storage.get_concurrency_info(pool).slot_count
    if live and len(live) >= max(limit, 1):
        say.warning(f"Pool {pool!r} ({limit} slot(s)) is held by {'; '.join(live)}: this run's infer step will "
                    f"wait until it finishes. If that run is gone (killed on another machine), free its slot with "
                    f"`{FREE_COMMAND}` (or the UI: Deployment > Concurrency > {pool}); to let steps share the "
                    f"endpoint, raise the pool: `dagster instance concurrency set '{pool}' 2`.")
    return freed


# Dagster claims a pool slot with `SELECT ... FOR UPDATE SKIP LOCKED` and then an UPDATE of that row with no guard
# that it is still free. PostgreSQL locks the row; SQLite (the embedded default) ignores FOR UPDATE, so two steps
# claiming within milliseconds can both get the last slot (seen with two launches 3 ms apart). Every process of a
# SQLite instance runs on one host (the database is a local file), so on SQLite the infer step also takes one of
# the pool's slots as an OS file lock under the instance's directory: at most `slot_count` infer steps of the pool
# run at once, whatever the database granted. A killed process's lock is released by the OS with it.
_LOCK_POLL_S = 0.5
HOST_SLOT_MESSAGE = "SQLite instance: this infer step holds host slot"
HOST_SLOT_RELEASED = "SQLite instance: this infer step released host slot"


def _sqlite_lock_dir(instance) -> "str | None":
    from dagster._core.storage.event_log.sqlite.consolidated_sqlite_event_log import (
        ConsolidatedSqliteEventLogStorage,
    )
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    # both SQLite event logs (per-run files, and the consolidated one a dagster.yaml can choose) claim slots alike
    storage = instance.event_log_storage
    if not isinstance(storage, (SqliteEventLogStorage, ConsolidatedSqliteEventLogStorage)):
        return None
    import os

    return os.path.join(instance.root_directory, "batch_pool_locks")


@contextlib.contextmanager
def host_pool_slot(instance, pool: str, log=None):
    """Hold one of `pool`'s slots as a host file lock for the block when the instance stores runs in SQLite (see
    above); does nothing on PostgreSQL, whose slot claim is already exclusive."""
    import os
    import time

    import filelock

    lock_dir = _sqlite_lock_dir(instance)
    if lock_dir is None:
        yield
        return
    os.makedirs(lock_dir, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in pool)
    said = False
    while True:
        slots = max(1, instance.event_log_storage.get_concurrency_info(pool).slot_count or 1)
        for i in range(slots):
            lock = filelock.FileLock(os.path.join(lock_dir, f"{safe}.{i}.lock"))
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                continue
            if log is not None:
                log.debug(f"{HOST_SLOT_MESSAGE} {i + 1} of {slots} of pool {pool!r}")
            try:
                yield
            finally:
                lock.release()
                if log is not None:
                    log.debug(f"{HOST_SLOT_RELEASED} {i + 1} of pool {pool!r}")
            return
        if not said and log is not None:
            log.warning(f"Pool {pool!r}: the SQLite instance granted this step a slot that another infer step on "
                        f"this host still holds (Dagster's slot claim is not exclusive on SQLite); waiting for it "
                        f"to finish (batch_assets/orchestration/execution/pool_slots.py)")
            said = True
        time.sleep(_LOCK_POLL_S)


# --- one step per slot, even when two steps claim it at the same moment -------------------------------------------
# Dagster's SQL storages claim a pool slot in two statements on an autocommit connection: SELECT a free slot row
# (FOR UPDATE SKIP LOCKED, whose lock ends with the statement), then UPDATE that row by id alone. Two run workers
# claiming within the same few milliseconds (two partitions launched together reach their infer steps together)
# both select the one free row and both update it: both steps run, a pool of limit 1 runs two (measured on
# dagster 1.13.27 with PostgreSQL: 4 claimers at once, 18 of 40 rounds let more than one in;
# tests/orchestration/execution/test_pool_slots.py). The claim below is the same query with the UPDATE made a
# compare-and-set (`AND step_key IS NULL`): of two updates of one row, the second finds it taken and the step waits,
# as Dagster already handles for a BLOCKED slot (it asks again after its sleep interval).

SLOT_CLAIM_ATTEMPTS = 3  # another free row may exist when a claim loses one (a pool of limit > 1)


def _claim_slot_compare_and_set(self, concurrency_key: str, run_id: str, step_key: str):
    import sqlalchemy as db
    from dagster._core.storage.event_log.schema import ConcurrencySlotsTable as slots
    from dagster._utils.concurrency import ConcurrencySlotStatus

    free = (slots.c.concurrency_key == concurrency_key) & (slots.c.step_key == None) & (  # noqa: E711
        slots.c.deleted == False)  # noqa: E712
    for _ in range(SLOT_CLAIM_ATTEMPTS):
        with self.index_connection() as conn:
            row = conn.execute(db.select(slots.c.id).where(free).limit(1)).fetchone()
            if row is None:
                return ConcurrencySlotStatus.BLOCKED
            taken = conn.execute(slots.update().values(run_id=run_id, step_key=step_key)
                                 .where((slots.c.id == row[0]) & (slots.c.step_key == None))).rowcount  # noqa: E711
            if taken:
                return ConcurrencySlotStatus.CLAIMED
    return ConcurrencySlotStatus.BLOCKED


_claim_slot_compare_and_set.batch_assets_guard = True


# The second race, PostgreSQL only: a pool without a limit of its own gets `concurrency.pools.default_limit` from
# the first process that needs it (Dagster's `initialize_concurrency_limit_to_default`): INSERT the limit row in a
# transaction and, on a duplicate key, UPDATE it. On PostgreSQL the duplicate key aborts the whole transaction, so
# the UPDATE fails ("current transaction is aborted"), and the run worker's claim with it: measured on dagster
# 1.13.27, 3 of 4 run workers reaching a new pool together failed, and after `default_limit` was changed (values.yaml
# `concurrency.pools.defaultLimit` raised from 1 to 2), every run worker of every pool still on the default failed.
# The INSERT below runs in a SAVEPOINT, so the duplicate key undoes only the INSERT, and the UPDATE and the slot
# rows follow in the same transaction (the fix upstream proposes: dagster-io/dagster#33599).

_DAGSTER_INITIALIZE_DEFAULT = None


def _initialize_default_limit_in_savepoint(self, concurrency_key: str) -> bool:
    import sqlalchemy.exc as db_exc
    from dagster._core.storage.event_log.schema import ConcurrencyLimitsTable as limits

    if not (self.has_concurrency_limits_table and self.has_instance and self.has_default_pool_limit_col
            and self._instance.global_op_concurrency_default_limit is not None):
        return _DAGSTER_INITIALIZE_DEFAULT(self, concurrency_key)  # the branches without the duplicate-key UPDATE
    self._reconcile_concurrency_limits_from_slots()
    default_limit = self._instance.global_op_concurrency_default_limit
    with self.index_transaction() as conn:
        try:
            with conn.begin_nested():
                conn.execute(limits.insert().values(concurrency_key=concurrency_key, limit=default_limit,
                                                    using_default_limit=True))
        except db_exc.IntegrityError:
            conn.execute(limits.update().values(limit=default_limit)
                         .where((limits.c.concurrency_key == concurrency_key) & (limits.c.limit != default_limit)))
        self._allocate_concurrency_slots(conn, concurrency_key, default_limit)
    return True


_initialize_default_limit_in_savepoint.batch_assets_guard = True


def _guard_default_limits() -> None:
    global _DAGSTER_INITIALIZE_DEFAULT
    try:
        from dagster_postgres.event_log.event_log import PostgresEventLogStorage
    except ImportError:  # no PostgreSQL storage in this install: nothing to guard
        return
    current = PostgresEventLogStorage.initialize_concurrency_limit_to_default
    if getattr(current, "batch_assets_guard", False):
        return
    _DAGSTER_INITIALIZE_DEFAULT = current
    PostgresEventLogStorage.initialize_concurrency_limit_to_default = _initialize_default_limit_in_savepoint


def guard_slot_claims() -> None:
    """Make this process's slot claims compare-and-set and its default-limit set-up safe on PostgreSQL (above).
    Called wherever pipelines are defined, so every process that runs an executor over them (run worker, `dagster
    asset materialize`, a test) claims this way; the daemon and webserver claim no step slots (the daemon's queue
    also sets default limits: when that fails it logs it and lets the run go, and the run worker sets it). Idempotent."""
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    _guard_default_limits()

    current = getattr(SqlEventLogStorage, "_claim_concurrency_slot", None)
    if current is None:
        import warnings

        warnings.warn("dagster's SqlEventLogStorage has no _claim_concurrency_slot any more: pool slots are claimed "
                      "as this dagster claims them, without batch_assets' compare-and-set guard (batch_assets/"
                      "orchestration/execution/pool_slots.py); check that two steps never share a slot", stacklevel=2)
        return
    if not getattr(current, "batch_assets_guard", False):
        SqlEventLogStorage._claim_concurrency_slot = _claim_slot_compare_and_set
