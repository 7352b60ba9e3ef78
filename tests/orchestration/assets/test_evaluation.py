"""Evaluation against a labelled column: the numbers match a hand count, and the label never reaches the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import dagster as dg
import pytest

from batch_assets.orchestration.assets.evaluation import NO_ANSWER, Confusion
from batch_assets.spec import SpecError
from tests.conftest import make_spec, read_output, run_pipeline, write_csv


class KeywordSpam:
    """A tiny rule 'model' for the tests: spam when the text mentions money. It records every batch it is handed."""

    seen: ClassVar[list[dict[str, list[Any]]]] = []

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        KeywordSpam.seen.append(batch)
        texts = batch["text"]
        return {"verdict": ["spam" if "$" in t or "win" in t else "ham" for t in texts]}


SPEC: dict[str, Any] = {
    "name": "mail",
    "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["mail_id", "text", "truth"]},
    "partitioning": {"kind": "static", "keys": ["p0", "p1"]},
    "prepare": {"id_column": "mail_id"},  # no input_columns: every source column but the label goes to the model
    "task": {"kind": "predict"},
    "model": {"provider": "custom", "config": {"class_path": "tests.orchestration.assets.test_evaluation:KeywordSpam"}},
    "runtime": {"chunk_rows": 2},
    "evaluation": {"label_column": "truth", "prediction_column": "verdict", "min_accuracy": 0.8},
}
# (id, text, true label). The rule gets m2 (spam without "$"/"win") and m5 (ham that says "win") wrong.
P0 = [("m0", "win $100 now", "spam"), ("m1", "lunch at noon?", "ham"), ("m2", "cheap pills", "spam")]
P1 = [("m3", "free $$$", "Spam"), ("m4", "minutes of the meeting", "ham"), ("m5", "did we win the match", "ham"),
      ("m6", "see you later", "")]  # no label: not scored


def _write(data: Path) -> None:
    for key, rows in (("p0", P0), ("p1", P1)):
        write_csv(data / f"{key}.csv", ["mail_id", "text", "truth"], [list(r) for r in rows])


def test_confusion_counts_by_hand() -> None:
    c = Confusion()
    c.add(["spam", "ham", "spam", "Spam", "ham", "ham", None, "ham"],
          ["spam", "ham", "ham", "spam", "ham", "spam", "spam", None])
    assert (c.labelled, c.correct, c.unlabelled) == (7, 4, 1)
    assert c.accuracy == pytest.approx(4 / 7)
    assert c.table() == {"spam": {"spam": 2, "ham": 1}, "ham": {"ham": 2, "spam": 1, NO_ANSWER: 1}}
    md = c.markdown().splitlines()
    assert md[0] == f"| true \\ predicted | ham | spam | {NO_ANSWER} | recall |"
    assert md[2] == "| ham | **2** | 1 | 1 | 50% |"
    assert md[3] == "| spam | 1 | **2** | 0 | 67% |"


def test_pipeline_reports_accuracy_and_confusion_and_never_shows_the_label(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write(data)
    spec = make_spec(SPEC, data)
    KeywordSpam.seen.clear()

    result = run_pipeline(spec, tmp_path / "store", ["p0", "p1"])

    assert result.success
    # The model saw the text (and the id), never the label column, although no input_columns were declared.
    assert KeywordSpam.seen and all(set(batch) == {"mail_id", "text"} for batch in KeywordSpam.seen)
    assert sorted(t for batch in KeywordSpam.seen for t in batch["text"]) == sorted(r[1] for r in P0 + P1)

    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "evaluation"]
    md = {k: v.value for k, v in check.metadata.items()}
    # Hand count: 6 labelled rows (m6 has none), 4 right (m0, m1, m3, m4), m2 and m5 wrong.
    assert (md["labelled_rows"], md["correct_rows"], md["unlabelled_rows"]) == (6, 4, 1)
    assert md["accuracy"] == pytest.approx(4 / 6, abs=1e-4)
    assert md["confusion"].splitlines()[2:] == ["| ham | **2** | 1 | 67% |", "| spam | 1 | **2** | 67% |"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN  # 67% < min_accuracy 80%

    by_partition = {e.event_specific_data.materialization.partition: e.event_specific_data.materialization.metadata
                    for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
                    and e.asset_key == dg.AssetKey(["mail", "inferred"])}
    assert by_partition["p0"]["eval_accuracy"].value == pytest.approx(2 / 3, abs=1e-4)
    assert by_partition["p1"]["eval_correct_rows"].value == 2 and by_partition["p1"]["eval_labelled_rows"].value == 3
    # The label is carried to the output beside the answer, for the user to read.
    out = {r["mail_id"]: r for r in read_output(spec, tmp_path / "store", "p0").to_pylist()}
    assert out["m2"]["truth"] == "spam" and out["m2"]["verdict"] == "ham"


def test_check_passes_at_the_bar_and_fails_without_labels(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write(data)
    spec = make_spec(SPEC, data, evaluation={"label_column": "truth", "prediction_column": "verdict",
                                             "min_accuracy": 0.6, "severity": "error"})
    result = run_pipeline(spec, tmp_path / "store", ["p0", "p1"])
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "evaluation"]
    assert check.passed and check.severity == dg.AssetCheckSeverity.ERROR

    write_csv(data / "p0.csv", ["mail_id", "text", "truth"], [[i, t, ""] for i, t, _ in P0])
    result = run_pipeline(spec, tmp_path / "store2", ["p0"])
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "evaluation"]
    assert not check.passed and "no row has a value in 'truth'" in check.metadata["why"].value


@pytest.mark.parametrize("prepare, field", [
    ({"template": "Is this spam? {text} (hint: {truth})"}, "prepare.template"),
    ({"text_column": "truth"}, "prepare.text_column"),
    ({"input_columns": ["text", "truth"]}, "prepare.input_columns"),
])
def test_spec_refuses_a_model_input_that_holds_the_label(tmp_path: Path, prepare: dict, field: str) -> None:
    task = {"generate": {"kind": "generate"}, "classify": {"kind": "classify", "labels": ["spam", "ham"]}}
    kind = "generate" if "template" in prepare else "classify" if "text_column" in prepare else None
    changes: dict[str, Any] = {"prepare": prepare}
    if kind:
        changes["task"] = task[kind]
        changes["model"] = {"provider": "transformers" if kind == "generate" else "zero_shot", "config": {}}
        changes["evaluation"] = {"label_column": "truth"}
    with pytest.raises(SpecError) as err:
        make_spec(SPEC, tmp_path, **changes)
    assert f"{field}: uses the evaluation label column 'truth': the model would see the answer" in str(err.value)


def test_spec_names_a_missing_label_column(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"evaluation.label_column: column 'gold' is not in source.columns"):
        make_spec(SPEC, tmp_path, evaluation={"label_column": "gold"})
