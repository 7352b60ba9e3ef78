"""One run at a time per (pipeline, stage, partition), across processes and machines sharing the storage root.

Every stage already commits its partition atomically (storage.atomic_output), so two runs of the same partition can
never leave a torn file. The lock adds what atomic files alone cannot: the two runs do not interleave *inside* a
stage (infer checkpoints, the output file and its dead letters, the response cache of one partition), so the
result is exactly what one run produces. The second run waits, then does the stage again over the same inputs.

- Local storage: `fcntl.flock` on a lock file beside the data. The kernel drops it when the holder dies (SIGKILL
  included), so a crash never leaves a stale lock. The file is unlinked by its holder on release; an acquirer checks
  it locked the file that is still at the path (the classic unlink-safe flock pattern).
- S3: a lease object created with `If-None-Match: *` (S3 conditional writes: exactly one creator wins), renewed by a
  heartbeat thread with `If-Match` on its ETag, deleted on release. A holder that died stops renewing; after
  `LEASE_S` another run takes the lease over.
Dagster-level: dagster.yaml's run queue also limits runs per `dagster/partition` tag; this lock covers what bypasses
the queue (CLI `dagster asset materialize`, `execute_in_process`, two deployments).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.storage import (credentials_refused, filesystem_for, is_remote, join, partition_file_name,
                                  s3_options_from_env, storage_access_refused)

LEASE_S = 60.0
log = logging.getLogger(__name__)


def lock_url(root: str, pipeline: str, stage: str, partition: str) -> str:
    return join(root, pipeline, "_locks", stage, partition_file_name(partition, "lock"))


@contextmanager
def partition_lock(root: str, pipeline: str, stage: str, partition: str,
                   on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    url = lock_url(root, pipeline, stage, partition)
    say = on_wait or log.info
    if url.startswith("s3://"):
        with _s3_lease(url, say):
            yield
    elif is_remote(url):
        yield  # other object stores: atomic files only (documented in docs/RELIABILITY.md)
    else:
        with _local_flock(filesystem_for(url)[1], say):
            yield


@contextmanager
def _local_flock(path: str, say: Callable[[str], None]) -> Iterator[None]:
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    waited = False
    while True:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not waited:
                say(f"another run holds {path}; waiting for it to finish this stage")
                waited = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder unlinked it while we waited: lock the current file instead
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)  # closing drops the flock


def _s3_client():
    try:
        import boto3
    except ImportError as exc:
        raise MissingExtraError("boto3", "s3", "locking a partition on S3") from exc

    # a session of its own: boto3's default session keeps the first credentials it resolved for the process's
    # life, so a changed AWS_ACCESS_KEY_ID (fixed key, new code server environment, tests) would be ignored
    return boto3.session.Session().client("s3", **s3_options_from_env()["client_kwargs"])


def _precondition_failed(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict")


@contextmanager
def _s3_lease(url: str, say: Callable[[str], None]) -> Iterator[None]:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    client = _s3_client()
    owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def body() -> bytes:
        return json.dumps({"owner": owner, "expires_at": time.time() + LEASE_S}).encode()

    waited = False
    while True:
        try:
            etag = client.put_object(Bucket=bucket, Key=key, Body=body(), IfNoneMatch="*")["ETag"]
            break
        except Exception as exc:
            if credentials_refused(exc):
                raise storage_access_refused(url, exc) from None
            if not _precondition_failed(exc):
                raise
        try:
            held = client.get_object(Bucket=bucket, Key=key)
            lease = json.loads(held["Body"].read())
            if lease.get("expires_at", 0) < time.time():  # its holder died: take the lease over
                client.delete_object(Bucket=bucket, Key=key, IfMatch=held["ETag"])
                continue
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") not in ("NoSuchKey", "404") \
                    and not _precondition_failed(exc):
                raise
            continue
        if not waited:
            say(f"another run ({lease.get('owner')}) holds {url}; waiting for it to finish this stage")
            waited = True
        time.sleep(1.0)

    stop = threading.Event()
    state = {"etag": etag}

    def heartbeat() -> None:
        while not stop.wait(LEASE_S / 3):
            try:
                state["etag"] = client.put_object(Bucket=bucket, Key=key, Body=body(), IfMatch=state["etag"])["ETag"]
            except Exception as exc:  # the run goes on; a lost lease is logged, the commit stays atomic
                log.warning(f"could not renew the lease {url}: {exc}")

    thread = threading.Thread(target=heartbeat, name="partition-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        try:
            client.delete_object(Bucket=bucket, Key=key, IfMatch=state["etag"])
        except Exception as exc:
            log.warning(f"could not release the lease {url} (it expires in {LEASE_S:.0f}s): {exc}")
