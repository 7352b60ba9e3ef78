"""The one partition loop of every stage asset (batch_assets/orchestration/assets/partition_loop.py), driven by a
small asset of the read stage over real source files and real lineage records, run in process as Dagster runs it:
each partition of a range run is done in order under its lock and materialized with its own metadata; a partition
already made from the same source and spec is skipped with a note naming the run that made it (a forced rerun redoes
it); bad input in partition k records 1..k-1 as materialized, fails the step once (no retry can fix it) naming the
pipeline and partition, and a rerun does only what is left; a transient failure is retried; a group done together
is committed all or none."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_assets.errors import PipelineError
from batch_assets.orchestration.assets import lineage
from batch_assets.orchestration.assets.partition_loop import run_partitions
from batch_assets.reliability.locks import lock_url
from batch_assets.spec import parse_spec
from batch_assets.stage_names import READ
from batch_assets.stages.report import PartitionReport, run_totals
from batch_assets.storage import ArrowStorage
from tests.daemon_helpers import daily_spec, write_day

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]
PARTITIONS = dg.DailyPartitionsDefinition(start_date=DAYS[0], end_date="2026-11-04")


class Stage:
    """A read stage that writes each partition's file and notes what it was asked to do; `fail` decides, per call,
    whether a partition raises instead."""

    def __init__(self, tmp_path: Path, fail: Callable[[str, int], BaseException | None] = lambda key, n: None):
        self.spec = parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log"))
        self.storage = ArrowStorage(root=str(tmp_path / "store"))
        self.calls: list[str] = []
        self.fail = fail
        self.held_lock: dict[str, bool] = {}
        for day in DAYS:
            write_day(tmp_path / "days", day, rows=DAYS.index(day) + 1)

    def one(self, key: str) -> PartitionReport:
        self.calls.append(key)
        self.held_lock[key] = _locked_elsewhere(lock_url(self.storage.resolved_root(), self.spec.name, READ.asset, key))
        problem = self.fail(key, self.calls.count(key))
        if problem is not None:
            raise problem
        return self._write(key)

    def together(self, keys: list[str]) -> list[PartitionReport]:
        self.calls.append("+".join(keys))
        problem = self.fail("+".join(keys), 1)
        if problem is not None:
            raise problem
        return [self._write(key) for key in keys]

    def _write(self, key: str) -> PartitionReport:
        rows = DAYS.index(key) + 1
        path = Path(self.storage.stage_url(self.spec.name, READ.asset, key))
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"row_id": [f"{key}:{i}" for i in range(rows)]}), path)
        return PartitionReport(key, rows, rows, 0.5, str(path), {"made_here": True})

    def run(self, keys: list[str], instance: dg.DagsterInstance, together: bool = False,
            tags: dict[str, str] | None = None) -> dg.ExecuteInJobResult:
        stage = self

        @dg.asset(key=[self.spec.name, READ.asset], partitions_def=PARTITIONS,
                  retry_policy=dg.RetryPolicy(max_retries=2))
        def raw(context) -> dg.MaterializeResult:  # (an annotation would be a string here: __future__)
            reports = run_partitions(context, stage.spec, stage.storage, stage.one,
                                     together=stage.together if together else None)
            return dg.MaterializeResult(metadata=run_totals(reports))

        job = dg.Definitions(assets=[raw], jobs=[dg.define_asset_job("j", selection=[raw])]).resolve_job_def("j")
        rng = ({"dagster/partition": keys[0]} if len(keys) == 1 else
               {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
        return job.execute_in_process(instance=instance, tags={**rng, **(tags or {})}, raise_on_error=False)


def _locked_elsewhere(path: str) -> bool:
    """Whether another holder has the flock on `path` (this probe's own open file cannot get it then)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _materialized(instance: dg.DagsterInstance, result: dg.ExecuteInJobResult) -> dict[str, dict]:
    """{partition: metadata} of the run's materializations of the raw asset."""
    found = {}
    for record in instance.all_logs(result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        m = record.asset_materialization
        found[m.partition] = {"description": m.description,
                              **{k: getattr(v, "value", v) for k, v in m.metadata.items()}}
    return found


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_a_range_run_does_each_partition_in_order_under_its_lock_with_its_own_metadata(
        tmp_path: Path, instance: dg.DagsterInstance) -> None:
    stage = Stage(tmp_path)
    result = stage.run(DAYS, instance)
    assert result.success
    assert stage.calls == DAYS
    assert stage.held_lock == {day: True for day in DAYS}, "a stage ran without its partition's lock"
    made = _materialized(instance, result)
    assert {day: made[day]["rows_out"] for day in DAYS} == {"2026-11-01": 1, "2026-11-02": 2, "2026-11-03": 3}
    assert all(made[day]["made_here"] for day in DAYS) and not any("skipped" in made[d] for d in DAYS)


def test_a_partition_already_made_from_the_same_source_is_skipped_and_says_by_which_run(
        tmp_path: Path, instance: dg.DagsterInstance) -> None:
    stage = Stage(tmp_path)
    first = stage.run(DAYS, instance)
    stage.calls.clear()
    again = stage.run(DAYS[:2], instance)
    assert again.success and stage.calls == [], "a partition made from the same source was done again"
    made = _materialized(instance, again)
    for day in DAYS[:2]:
        assert made[day]["skipped"].startswith(f"skipped: this partition was already made by run {first.run_id[:8]}")
        assert "batch/rerun=force" in made[day]["skipped"] and made[day]["made_by_run"] == first.run_id
        assert made[day]["dagster/row_count"] == DAYS.index(day) + 1, "the published rows are still counted"

    write_day(tmp_path / "days", DAYS[1], rows=5)  # a new version of one day's file: only that day is redone
    assert stage.run(DAYS[:2], instance).success and stage.calls == [DAYS[1]]
    stage.calls.clear()
    assert stage.run(DAYS[:1], instance, tags={lineage.RERUN_TAG: lineage.FORCE}).success
    assert stage.calls == [DAYS[0]], "a forced rerun redoes the partition"


def test_bad_input_in_one_partition_records_the_ones_before_fails_once_naming_it_and_a_rerun_does_the_rest(
        tmp_path: Path, instance: dg.DagsterInstance) -> None:
    broken = {"on": True}

    def fail(key: str, n: int) -> BaseException | None:
        if key == DAYS[1] and broken["on"]:
            return PipelineError("value 'x' is not a number", file="days/2026-11-02.jsonl", column="price", row=7,
                                 fix="fix the row")
        return None

    stage = Stage(tmp_path, fail)
    result = stage.run(DAYS, instance)
    assert not result.success
    assert stage.calls == DAYS[:2], "bad input is not retried, and the partitions after it are not started"
    made = _materialized(instance, result)
    assert list(made) == [DAYS[0]], "the partition finished before the failure is recorded as materialized"
    assert made[DAYS[0]]["description"] == f"Finished in the same run as partition '{DAYS[1]}', which failed."
    assert made[DAYS[0]]["rows_out"] == 1
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.step_failure_data.user_failure_data.description
    assert message == ("value 'x' is not a number [pipeline 'daily_docs', partition '2026-11-02', file "
                       "'days/2026-11-02.jsonl', column 'price', row 7]. What to do: fix the row")
    assert failure.step_failure_data.user_failure_data.metadata["partition"].value == DAYS[1]

    broken["on"] = False
    stage.calls.clear()
    assert stage.run(DAYS, instance).success
    assert stage.calls == DAYS[1:], "the rerun redoes only what is left"


@pytest.mark.parametrize("transient", [ConnectionError("endpoint went away"),
                                       PipelineError("rate limited for 2 s", retryable=True)],
                         ids=["network", "retryable"])
def test_a_transient_failure_is_retried(tmp_path: Path, instance: dg.DagsterInstance,
                                        transient: BaseException) -> None:
    stage = Stage(tmp_path, lambda key, n: transient if key == DAYS[0] and n == 1 else None)
    result = stage.run(DAYS[:1], instance)
    assert result.success
    assert stage.calls == [DAYS[0], DAYS[0]], "the step's retry policy ran the partition again"


def test_a_group_done_together_is_committed_all_or_none(tmp_path: Path, instance: dg.DagsterInstance) -> None:
    broken = {"on": True}
    stage = Stage(tmp_path, lambda key, n: PipelineError("shard read failed") if broken["on"] else None)
    result = stage.run(DAYS, instance, together=True)
    assert not result.success and _materialized(instance, result) == {}
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failure.step_failure_data.user_failure_data.metadata["partitions"].value == ", ".join(DAYS)

    broken["on"] = False
    stage.calls.clear()
    result = stage.run(DAYS, instance, together=True)
    assert result.success and stage.calls == ["+".join(DAYS)], "one pass for the whole group"
    assert sorted(_materialized(instance, result)) == DAYS
    stage.calls.clear()
    result = stage.run(DAYS, instance, together=True)
    assert stage.calls == [] and all("skipped" in md for md in _materialized(instance, result).values())
