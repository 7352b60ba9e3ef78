"""One run at a time per (pipeline, stage, partition) (batch_assets/reliability/locks.py): a second run of the same
partition waits for the first to finish the stage, across processes; a holder killed with SIGKILL frees the lock
(the kernel drops a flock; an S3 lease expires); a lock file or lease left behind by a dead holder never blocks a
later run; different partitions never wait on each other. The holders are real processes where it matters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from batch_assets.reliability import locks
from batch_assets.reliability.locks import lock_url, partition_lock

PIPELINE, STAGE = "docs", "inferred"
ROOT_DIR = Path(__file__).resolve().parents[2]


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Poll until `condition` holds; the deadline only keeps a broken lock from hanging the suite."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _holder(root: Path | str, key: str, held: Path, release: Path) -> subprocess.Popen:
    """Another process, as a second run would be: takes the partition's lock, says so, holds it until `release`
    exists (or until it is killed)."""
    code = textwrap.dedent(f"""
        import pathlib, time
        from batch_assets.reliability.locks import partition_lock
        with partition_lock({str(root)!r}, {PIPELINE!r}, {STAGE!r}, {key!r}):
            pathlib.Path({str(held)!r}).touch()
            while not pathlib.Path({str(release)!r}).exists():
                time.sleep(0.05)
    """)
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT_DIR)


class Contender:
    """This process asking for the lock on a thread: records the waiting message and when it got in."""

    def __init__(self, root: Path | str, key: str):
        self.waits: list[str] = []
        self.entered = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(str(root), key), daemon=True)
        self.thread.start()

    def _run(self, root: str, key: str) -> None:
        try:
            with partition_lock(root, PIPELINE, STAGE, key, on_wait=self.waits.append):
                self.entered.set()
        except BaseException as exc:  # shown by the test, not lost on the thread
            self.error = exc

    def finished(self) -> bool:
        self.thread.join(120)
        assert self.error is None, self.error
        return self.entered.is_set()


def test_a_second_process_waits_for_the_holder_then_runs(tmp_path: Path) -> None:
    held, release = tmp_path / "held", tmp_path / "release"
    holder = _holder(tmp_path, "2026-11-01", held, release)
    try:
        _wait_for(held.exists, "the holder to take the lock")
        contender = Contender(tmp_path, "2026-11-01")
        _wait_for(lambda: bool(contender.waits), "the contender to say it waits")
        assert not contender.entered.is_set(), "two runs of one partition inside the stage at once"
        path = lock_url(str(tmp_path), PIPELINE, STAGE, "2026-11-01")
        assert contender.waits == [f"another run holds {path}; waiting for it to finish this stage"]
        release.touch()
        assert holder.wait(120) == 0
        assert contender.finished(), "the waiting run never got the lock after the holder finished"
    finally:
        holder.kill()
        holder.wait()
    assert not Path(path).exists(), "the lock file is removed by its last holder"


def test_a_holder_killed_with_sigkill_frees_the_lock(tmp_path: Path) -> None:
    held, never = tmp_path / "held", tmp_path / "never"
    holder = _holder(tmp_path, "k", held, never)
    try:
        _wait_for(held.exists, "the holder to take the lock")
        contender = Contender(tmp_path, "k")
        _wait_for(lambda: bool(contender.waits), "the contender to say it waits")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert contender.finished(), "a killed holder's lock must not outlive it"
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_file_left_behind_by_a_dead_holder_does_not_block(tmp_path: Path) -> None:
    """A holder killed between taking the lock and removing its file leaves the file: only a live flock counts."""
    path = Path(lock_url(str(tmp_path), PIPELINE, STAGE, "k"))
    path.parent.mkdir(parents=True)
    path.write_text("")
    waits: list[str] = []
    with partition_lock(str(tmp_path), PIPELINE, STAGE, "k", on_wait=waits.append):
        pass
    assert waits == []


def test_partitions_whose_keys_differ_only_in_odd_characters_do_not_wait_on_each_other(tmp_path: Path) -> None:
    """Keys are quoted into file names: 'a/b' and 'a_b' (and a multi key 'app|day') are separate locks, all under
    the pipeline's _locks folder."""
    keys = ["a/b", "a_b", "a%2Fb", "android|2026-11-01", "../escape"]
    paths = {lock_url(str(tmp_path), PIPELINE, STAGE, k) for k in keys}
    assert len(paths) == len(keys)
    assert {os.path.dirname(p) for p in paths} == {str(tmp_path / PIPELINE / "_locks" / STAGE)}
    with partition_lock(str(tmp_path), PIPELINE, STAGE, keys[0]):
        others = [Contender(tmp_path, k) for k in keys[1:]]
        for other in others:
            assert other.finished() and other.waits == [], f"{keys} share a lock"


def test_the_same_partition_of_another_stage_or_pipeline_does_not_wait(tmp_path: Path) -> None:
    with partition_lock(str(tmp_path), PIPELINE, STAGE, "k"):
        for pipeline, stage in ((PIPELINE, "output"), ("other", STAGE)):
            waits: list[str] = []
            done = threading.Event()

            def other() -> None:
                with partition_lock(str(tmp_path), pipeline, stage, "k", on_wait=waits.append):
                    done.set()

            thread = threading.Thread(target=other, daemon=True)
            thread.start()
            thread.join(120)
            assert done.is_set() and waits == [], (pipeline, stage)


WORKER = """
import os, sys, time
from pathlib import Path
from batch_assets.reliability.locks import partition_lock
root, inside, counter, rounds = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
for _ in range(rounds):
    with partition_lock(root, "docs", "inferred", "k"):
        try:  # nobody else may be inside now
            os.close(os.open(inside, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            print("OVERLAP", flush=True)
        n = int(counter.read_text())
        time.sleep(0.002)
        counter.write_text(str(n + 1))
        inside.unlink(missing_ok=True)
"""


def test_many_processes_take_turns_and_none_is_inside_with_another(tmp_path: Path) -> None:
    """Each holder unlinks the lock file on release, so a waiter may wake up holding a file that is gone while a
    newcomer locks a fresh one at the path: the lock must still admit one at a time (no lost update)."""
    counter, inside = tmp_path / "counter", tmp_path / "inside"
    counter.write_text("0")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), str(inside), str(counter), "25"],
                              cwd=ROOT_DIR, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert "OVERLAP" not in "".join(outputs), "two processes held one partition's lock at once"
    assert counter.read_text() == str(4 * 25), "an update was lost: two holders at once"


# --- S3: a lease object (moto's S3 server on loopback) ----------------------------------------------------------


def _lease_key(bucket: str, key: str) -> tuple[str, str]:
    name, _, obj = lock_url(bucket, PIPELINE, STAGE, key).removeprefix("s3://").partition("/")
    return name, obj


def _client():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def test_on_s3_a_second_run_waits_for_the_lease_naming_its_holder_and_gets_it_on_release(s3_bucket: str) -> None:
    release = threading.Event()
    holding = threading.Event()

    def hold() -> None:
        with partition_lock(s3_bucket, PIPELINE, STAGE, "k"):
            holding.set()
            release.wait(120)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert holding.wait(120)
    bucket, key = _lease_key(s3_bucket, "k")
    lease = json.loads(_client().get_object(Bucket=bucket, Key=key)["Body"].read())
    contender = Contender(s3_bucket, "k")
    _wait_for(lambda: bool(contender.waits), "the contender to say it waits")
    assert not contender.entered.is_set()
    assert lease["owner"] in contender.waits[0] and lock_url(s3_bucket, PIPELINE, STAGE, "k") in contender.waits[0]
    release.set()
    holder.join(120)
    assert contender.finished()
    assert _client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0, "released leases are deleted"


def test_on_s3_the_lease_of_a_dead_holder_is_taken_over_once_it_expired(s3_bucket: str) -> None:
    bucket, key = _lease_key(s3_bucket, "k")
    _client().put_object(Bucket=bucket, Key=key, Body=json.dumps(
        {"owner": "gone-host:4242:deadbeef", "expires_at": time.time() - 1}).encode())
    contender = Contender(s3_bucket, "k")
    assert contender.finished(), "an expired lease kept the partition locked"
    assert contender.waits == []


def test_on_s3_a_live_holder_keeps_its_lease_past_its_first_expiry(s3_bucket: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat renews the lease: a long stage is never taken over by a second run while its holder lives."""
    monkeypatch.setattr(locks, "LEASE_S", 6.0)  # renewed every 2 s: slack for a loaded machine
    bucket, key = _lease_key(s3_bucket, "k")
    with partition_lock(s3_bucket, PIPELINE, STAGE, "k"):
        first = json.loads(_client().get_object(Bucket=bucket, Key=key)["Body"].read())
        _wait_for(lambda: time.time() > first["expires_at"] + 1.0, "the first lease term to pass")
        contender = Contender(s3_bucket, "k")
        _wait_for(lambda: bool(contender.waits), "the contender to say it waits")
        assert not contender.entered.is_set(), "a live holder's lease was taken over"
        renewed = json.loads(_client().get_object(Bucket=bucket, Key=key)["Body"].read())
        assert renewed["owner"] == first["owner"] and renewed["expires_at"] > first["expires_at"]
    assert contender.finished()
