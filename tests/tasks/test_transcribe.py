"""transcribe (batch_assets/tasks/transcribe.py): which rows are sent, what the provider gets (files it opens
itself, one at a time), and the four output columns in their declared types, whatever came back: answers, a file
that would not decode, or a chunk in which no row could be sent at all."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from batch_assets.resources.protocols import AudioFile, Transcription, TranscriptSegment
from batch_assets.tasks import ERROR_COLUMN, task_type
from batch_assets.tasks.transcribe import TranscribeTask
from tests.tasks.prepared import prepared, spec_for

SPEC = spec_for({"kind": "transcribe"}, {"input_columns": ["file_path"]}, ["file_path"])


def task() -> TranscribeTask:
    return TranscribeTask(SPEC, provider=None)


def test_rows_flagged_in_preparation_are_not_sent_and_files_are_opened_only_by_the_provider(tmp_path: Path):
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF....")
    batch = prepared({"file_path": [str(audio), None, str(tmp_path / "gone.wav")]},
                     [None, "empty input: column 'file_path' is empty", None])
    plan = task().plan(batch)
    assert plan.sent.tolist() == [0, 2]
    assert plan.errors == [None, "empty input: column 'file_path' is empty", None]
    assert all(isinstance(f, AudioFile) for f in plan.inputs)
    assert [f.name for f in plan.inputs] == [str(audio), str(tmp_path / "gone.wav")]
    with plan.inputs[0].open() as f:
        assert f.read() == b"RIFF...."
    with pytest.raises(FileNotFoundError, match="gone.wav"):  # the provider makes it that row's error, naming it
        plan.inputs[1].open()


def test_outputs_are_one_value_per_row_in_the_declared_types_and_a_failed_file_is_its_rows_error():
    batch = prepared({"file_path": ["a.wav", None, "b.wav", "c.wav"]}, [None, "empty input", None, None])
    t = task()
    plan = t.plan(batch)
    results = [
        Transcription("hello there", "en", 2.5, [TranscriptSegment(0.0, 1.0, "hello"), TranscriptSegment(1.0, 2.5,
                                                                                                        "there")]),
        Transcription(None, None, None, error="b.wav: not an audio file ffmpeg can decode"),
        Transcription("", "en", 0.4, []),  # silence: an empty transcript, not an error
    ]
    t.check(len(plan.sent), results)
    names, arrays = t.columns(plan, results, batch.num_rows)
    assert names == ["text", "language", "duration_s", "segments"]
    assert {n: a.type for n, a in zip(names, arrays)} == t.schema()
    columns = dict(zip(names, (a.to_pylist() for a in arrays)))
    assert columns["text"] == ["hello there", None, None, ""]
    assert columns["language"] == ["en", None, None, "en"]
    assert columns["duration_s"] == [2.5, None, None, 0.4]
    assert columns["segments"] == [[{"start": 0.0, "end": 1.0, "text": "hello"},
                                    {"start": 1.0, "end": 2.5, "text": "there"}], None, None, []]
    assert plan.errors == [None, "empty input", "b.wav: not an audio file ffmpeg can decode", None]


def test_a_chunk_with_no_row_to_send_gets_null_outputs_and_keeps_each_rows_reason():
    """Every path empty: nothing is sent, the infer loop hands the task no results (None), and the chunk is still
    written: one row out per row in, each with its reason (it used to fail the step with a TypeError)."""
    reasons = ["empty input: column 'file_path' is empty"] * 3
    batch = prepared({"file_path": [None, "", None]}, reasons)
    t = task()
    plan = t.plan(batch)
    assert len(plan.sent) == 0
    names, arrays = t.columns(plan, None, batch.num_rows)
    assert names == ["text", "language", "duration_s", "segments"]
    assert [len(a) for a in arrays] == [3, 3, 3, 3] and all(a.null_count == 3 for a in arrays)
    assert {n: a.type for n, a in zip(names, arrays)} == t.schema()
    assert plan.errors == reasons


def test_a_provider_that_answers_for_the_wrong_number_of_files_fails_before_anything_is_written():
    batch = prepared({"file_path": ["a.wav", "b.wav"]})
    t = task()
    plan = t.plan(batch)
    with pytest.raises(Exception, match=r"returned 1 results for 2 rows.*nothing was published"):
        t.check(len(plan.sent), [Transcription("only one")])


def test_the_spec_needs_exactly_one_column_of_audio_files():
    kind = task_type(SPEC)
    assert kind is TranscribeTask and kind.prediction_column(SPEC) is None  # free text: nothing to score
    with pytest.raises(Exception, match="exactly one column"):
        spec_for({"kind": "transcribe"}, {"input_columns": ["a", "b"]}, ["a", "b"])
    assert ERROR_COLUMN not in task().schema()  # the loop adds the error column; the task never declares it
    assert pa.list_(pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])) == \
        task().schema()["segments"]


def test_a_partition_whose_first_chunk_has_no_audio_is_published_with_every_row_and_its_reason(tmp_path: Path):
    """The same through a whole run (faster_whisper, Whisper tiny.en on CPU): a chunk of rows without a file, then a
    chunk with a file that does not exist: every row comes out once, each with its reason; nothing fails the step."""
    from tests.conftest import make_spec, read_output, run_pipeline, write_jsonl

    rows = [{"call_id": f"c{i}", "file_path": None} for i in range(3)] + \
           [{"call_id": "c3", "file_path": str(tmp_path / "no-such-call.wav")}]
    write_jsonl(tmp_path / "in" / "a.jsonl", rows)
    spec = make_spec({
        "name": "calls", "source": {"format": "jsonl", "path": "PLACEHOLDER/{partition}.jsonl",
                                    "columns": ["call_id", "file_path"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "call_id", "input_columns": ["file_path"]},
        "task": {"kind": "transcribe"}, "model": {"provider": "faster_whisper", "config": {}},
        "runtime": {"chunk_rows": 3, "max_error_fraction": 1.0},
    }, tmp_path / "in")
    run_pipeline(spec, tmp_path / "out", ["a"])
    out = read_output(spec, tmp_path / "out", "a").sort_by("call_id").to_pylist()
    assert [r["call_id"] for r in out] == ["c0", "c1", "c2", "c3"]
    assert all(r["text"] is None for r in out)
    assert all("empty" in r["error"] for r in out[:3]) and "no-such-call.wav" in out[3]["error"]
