"""`make demo`'s summary (batch_assets/commands/demo.py) as a user reads it after each run, on the instance the runs
went to: a first run gives the infer step's rate; a rerun on an instance that already holds the partitions says
they were skipped as already made, and gives no rate (not "0.0 rows/s"); a rerun that redoes some partitions gives
the rate of those only. The pipeline is a small one with a dependency-free model (the demo's own four load real
models: minutes)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from batch_assets.commands import demo
from batch_assets.spec import parse_spec
from tests.conftest import pipeline_definitions, run_pipeline
from tests.daemon_helpers import daily_spec, dagster_home, model_trace, write_day

DAYS = ["2026-11-01", "2026-11-02"]


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The demo reads the instance at $DAGSTER_HOME, as `make demo` does."""
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(tmp_path / "home")))
    with dg.DagsterInstance.get() as instance:
        yield instance


def _summary(spec, store: Path, capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    demo._summary(spec.name, 3.0, pipeline_definitions(spec, store))
    return capsys.readouterr().out


def test_a_rerun_on_an_instance_that_holds_the_partitions_says_they_were_skipped_and_gives_no_rate(
        tmp_path: Path, instance: dg.DagsterInstance, capsys: pytest.CaptureFixture) -> None:
    for day in DAYS:
        write_day(tmp_path / "days", day, rows=3)
    spec, store, log = parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log")), tmp_path / "store", \
        tmp_path / "model.log"

    first = run_pipeline(spec, store, DAYS, instance=instance)
    shown = _summary(spec, store, capsys)
    assert "6 rows" in shown and "rows/s in the infer step" in shown, shown
    assert "0.0 rows/s" not in shown and "skipped" not in shown, shown

    run_pipeline(spec, store, DAYS, instance=instance)  # `make demo` again: nothing to do
    assert len(model_trace(log)[1]) == 6, "the rerun inferred nothing"
    shown = _summary(spec, store, capsys)
    assert "rows/s" not in shown, f"a skipped partition has no rate: {shown}"
    assert "all 2 partitions were already made by run " + first.run_id[:8] in shown, shown
    assert "nothing inferred" in shown and "batch/rerun=force" in shown, shown
    assert "6 rows" in shown, "the published rows are still there and counted"

    write_day(tmp_path / "days", DAYS[1], rows=4)  # one day's file rewritten: that day is new input
    run_pipeline(spec, store, DAYS, instance=instance)
    assert len(model_trace(log)[1]) == 6 + 4
    shown = _summary(spec, store, capsys)
    assert f"1 of 2 partitions skipped (already made by run {first.run_id[:8]})" in shown, shown
    assert "rows/s in the infer step over the other 1" in shown and "0.0 rows/s" not in shown, shown


def test_a_rerun_of_one_partition_names_it_as_skipped(tmp_path: Path, instance: dg.DagsterInstance,
                                                       capsys: pytest.CaptureFixture) -> None:
    write_day(tmp_path / "days", DAYS[0], rows=2)
    spec, store = parse_spec(daily_spec(tmp_path / "days", tmp_path / "model.log")), tmp_path / "store"
    run_pipeline(spec, store, DAYS[:1], instance=instance)
    run_pipeline(spec, store, DAYS[:1], instance=instance)
    shown = _summary(spec, store, capsys)
    assert "infer skipped: the partition was already made by run " in shown and "rows/s" not in shown, shown


def test_the_demo_keeps_its_instance_where_dagster_home_says_with_the_tested_dagster_yaml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))
    home = demo._dagster_home()
    assert home == tmp_path / "elsewhere"
    assert (home / "dagster.yaml").read_text() == (demo.CHECKOUT / "dagster.yaml").read_text()
