"""Launch claims: a schedule and a sensor evaluated at the same moment never both request one partition.

A schedule or sensor asks two questions before requesting a run of a partition: is another run making it (queued or
running, whoever launched it) and is its output already published from the same source and spec. Both answers come
from state that changes only once a run exists, and between an evaluation returning its RunRequest and the daemon
creating the run there is a window (the scheduler and the sensor daemon are separate threads, evaluating in the code
server at once) in which a second instigator sees neither and requests the same day: two runs of one partition, the
issue's "a schedule and a sensor on one pipeline both ran the same day".

A claim closes that window. Under the partition's claim lock (the stage locks' machinery: `flock` locally, an S3
lease on S3, so it holds across code servers sharing the storage root) the instigator reads the partition's claim
record; a claim by another launcher, for the same source version, that has not been consumed stops it (the caller
skips and looks again next tick). Otherwise it writes its own claim and requests the run. A claim is consumed when
its launcher's run for the partition has finished (success publishes the output, which the next tick adopts; a
failure leaves the day to whichever path comes next), or when no such run appeared within `CLAIM_TTL_S` (the request
was deduplicated by its run key, or the daemon died before creating it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from batch_assets.reliability.locks import partition_lock
from batch_assets.storage import ArrowStorage, atomic_output, filesystem_for, join, partition_file_name

CLAIM_TTL_S = 120.0
LAUNCHED_BY_TAG = "batch/launched_by"
_CLOCK_SLACK_S = 5.0  # a run's create time against the claim's, written by different processes


@dataclass(frozen=True)
class Claim:
    by: str
    at: float
    source_version: str | None

    def describe(self) -> str:
        return f"the {self.by} claimed it {max(0.0, time.time() - self.at):.0f} s ago and its run is being launched"


def claim_url(storage: ArrowStorage, pipeline: str, key: str) -> str:
    return join(storage.resolved_root(), pipeline, "_claims", partition_file_name(key, "json"))


def _read(url: str) -> Claim | None:
    fs, path = filesystem_for(url)
    try:
        with fs.open(path, "rb") as f:
            raw = json.loads(f.read())
        return Claim(str(raw["by"]), float(raw["at"]), raw.get("source_version"))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _utc(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, tz=timezone.utc)


def _consumed(claim: Claim, instance: Any, job: str, key: str, now: float) -> bool:
    """True when the claim no longer holds: its launcher's run of the partition finished, or none came in time."""
    import dagster as dg

    runs = instance.get_runs(dg.RunsFilter(job_name=job, tags={"dagster/partition": key, LAUNCHED_BY_TAG: claim.by},
                                           created_after=_utc(claim.at - _CLOCK_SLACK_S)), limit=5)
    if runs:
        return all(run.is_finished for run in runs)
    return now - claim.at > CLAIM_TTL_S


def claim(storage: ArrowStorage, instance: Any, pipeline: str, job: str, key: str, by: str,
          source_version: str | None) -> Claim | None:
    """Claim `key` for launcher `by` (sensor, schedule). Returns the other launcher's live claim (do not request),
    or None when the claim is now ours (request the run)."""
    url = claim_url(storage, pipeline, key)
    with partition_lock(storage.resolved_root(), pipeline, "_claims", key, on_wait=lambda _m: None):
        now = time.time()
        held = _read(url)
        if held is not None and held.by != by and held.source_version == source_version \
                and not _consumed(held, instance, job, key, now):
            return held
        fs, path = filesystem_for(url)
        with atomic_output(fs, path) as f:
            f.write(json.dumps({"by": by, "at": now, "source_version": source_version}).encode("utf-8"))
    return None
