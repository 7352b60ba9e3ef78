"""Launch claims (batch_assets/orchestration/launch/claims.py) expire: a claim whose run never appeared (the daemon died
between the tick and creating the run, or the request was deduplicated) stops the other launcher only for
CLAIM_TTL_S; after that the partition is launched by whoever comes next, instead of never. A claim whose run has
finished frees the partition at once.

Shown red once: with `_consumed` returning False when no run is found (claims that never expire), the expiry test
failed (the schedule was still refused by a sensor claim 121 s old) while tests/orchestration/launch/test_exactly_once.py
stayed green.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from batch_assets.orchestration.launch import claims
from batch_assets.storage import ArrowStorage

PIPELINE, JOB, DAY = "daily_docs", "daily_docs_job", "2026-11-20"


def _age_claim(storage: ArrowStorage, seconds: float) -> None:
    """Make the stored claim `seconds` older, as if it had been written that long ago."""
    path = Path(claims.claim_url(storage, PIPELINE, DAY))
    raw = json.loads(path.read_text())
    raw["at"] -= seconds
    path.write_text(json.dumps(raw))


def test_a_claim_without_a_run_expires_after_its_ttl(tmp_path: Path) -> None:
    storage = ArrowStorage(root=str(tmp_path / "store"))
    with dg.instance_for_test() as instance:
        assert claims.claim(storage, instance, PIPELINE, JOB, DAY, "sensor", "v1") is None  # the sensor's now
        held = claims.claim(storage, instance, PIPELINE, JOB, DAY, "schedule", "v1")
        assert held is not None and held.by == "sensor"  # the schedule skips this tick

        _age_claim(storage, claims.CLAIM_TTL_S - 10)  # no run yet, but still within the TTL: still held
        assert claims.claim(storage, instance, PIPELINE, JOB, DAY, "schedule", "v1") is not None

        _age_claim(storage, 11)  # now CLAIM_TTL_S + 1 s old and no run ever appeared: expired
        assert claims.claim(storage, instance, PIPELINE, JOB, DAY, "schedule", "v1") is None
        # ... and the claim is the schedule's now: the sensor is the one that waits
        held = claims.claim(storage, instance, PIPELINE, JOB, DAY, "sensor", "v1")
        assert held is not None and held.by == "schedule"


def test_a_claim_whose_run_finished_frees_the_partition(tmp_path: Path) -> None:
    storage = ArrowStorage(root=str(tmp_path / "store"))
    with dg.instance_for_test() as instance:
        assert claims.claim(storage, instance, PIPELINE, JOB, DAY, "sensor", "v1") is None
        tags = {"dagster/partition": DAY, claims.LAUNCHED_BY_TAG: "sensor"}
        run = instance.create_run_for_job(dg.GraphDefinition("noop").to_job(name=JOB), tags=tags)
        assert claims.claim(storage, instance, PIPELINE, JOB, DAY, "schedule", "v1") is not None  # run not started
        instance.report_run_failed(run)
        assert claims.claim(storage, instance, PIPELINE, JOB, DAY, "schedule", "v1") is None
