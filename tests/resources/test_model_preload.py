"""The model loads on a thread from the run's start (resources/base.py `preload`): read and prepare do not wait for
it, a load error fails the infer step with the provider's message, and a run that does not infer loads nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import EMBED_SPEC, docs_rows, make_spec, read_output, run_pipeline, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _step_events(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    return {e.step_key: e.event_type_value for e in result.all_events
            if e.step_key and e.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE")}


def test_load_error_fails_the_infer_step_not_read_or_prepare(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data" / "a.jsonl", docs_rows("a", 5))
    broken = tmp_path / "not-a-model"  # a folder without a model in it: sentence-transformers refuses it
    broken.mkdir()
    spec = make_spec(EMBED_SPEC, tmp_path / "data",
                     model={"provider": "sentence_transformers", "config": {"model": str(broken), "device": "cpu"}})

    result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)

    assert not result.success
    steps = _step_events(result)
    assert steps["docs__raw"] == "STEP_SUCCESS" and steps["docs__prepared"] == "STEP_SUCCESS"
    assert steps["docs__inferred"] == "STEP_FAILURE" and "docs__output" not in steps
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.event_specific_data.error.message
    assert f"SentenceTransformerEmbedder could not load model {str(broken)!r}" in message
    assert "model_type" in message  # the library's own reason, not a generic one
    with pytest.raises(FileNotFoundError):
        read_output(spec, tmp_path / "store", "a")  # nothing published


def test_a_run_that_does_not_infer_never_imports_torch(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data" / "a.jsonl", docs_rows("a", 5))
    script = textwrap.dedent(f"""
        import sys
        import dagster as dg
        from tests.conftest import EMBED_SPEC, make_spec, pipeline_definitions
        spec = make_spec(EMBED_SPEC, {str(tmp_path / "data")!r})
        job = pipeline_definitions(spec, {str(tmp_path / "store")!r}).resolve_job_def("docs_job")
        result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), partition_key="a",
                                        asset_selection=[dg.AssetKey(["docs", "raw"]), dg.AssetKey(["docs", "prepared"])])
        print("success", result.success)
        print("loaded", sorted(m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "success True" in out.stdout
    assert "loaded []" in out.stdout, out.stdout
