"""Audio in, Whisper-sized clips out, streaming: a file is decoded a block at a time and cut into clips of at most
30 s (Whisper's window), so an hour of audio is never decoded into memory at once (faster-whisper's own
`decode_audio` holds the whole file twice: the s16 buffer and its float32 copy, ~350 MB for an hour).

Decoding is PyAV's (FFmpeg's libraries, bundled in its wheel: WAV, FLAC, MP3, OGG/Vorbis/Opus, M4A, ...), resampled
to 16 kHz mono as Whisper expects. A clip ends at the quietest 20 ms of its last `search_s` seconds, so a cut falls
between words rather than inside one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import numpy as np

SAMPLE_RATE = 16_000
# Whisper's window: the encoder always sees 30 s (shorter clips are padded), so a clip is at most this long.
WINDOW_S = 30.0
# How much is decoded and resampled at a time: the memory a file costs is about this plus one clip.
BLOCK_S = 10.0
_FRAME = SAMPLE_RATE // 50  # 20 ms: the unit the quietest cut point is looked for in


class AudioDecodeError(Exception):
    """The file could not be decoded as audio (not audio, damaged, no audio stream, empty)."""


def decoded_blocks(source: IO[bytes] | str, block_s: float = BLOCK_S) -> Iterator[np.ndarray]:
    """The file's audio as float32 mono 16 kHz arrays of about `block_s` seconds each, in order."""
    import av  # the `audio` extra (faster-whisper depends on it)

    block = int(block_s * SAMPLE_RATE)
    try:
        container = av.open(source, mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        raise AudioDecodeError(f"not a readable audio file ({_reason(exc)})") from None
    with container:
        if not container.streams.audio:
            raise AudioDecodeError("the file has no audio stream")
        resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        pending: list[np.ndarray] = []
        held = 0
        seconds = 0.0
        try:
            frames = container.decode(audio=0)
            for frame in _flushed(frames):
                if frame is not None:
                    frame.pts = None  # resample by sample count: damaged timestamps must not stop the resampler
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1)
                    pending.append(samples)
                    held += samples.size
                if held >= block:
                    seconds += held / SAMPLE_RATE
                    yield _to_float(pending)
                    pending, held = [], 0
        except av.error.FFmpegError as exc:
            at = seconds + held / SAMPLE_RATE
            raise AudioDecodeError(f"the audio is damaged at {at:.1f} s ({_reason(exc)})") from None
        if held:
            yield _to_float(pending)


def _flushed(frames: Iterator[Any]) -> Iterator[Any]:
    yield from frames
    yield None  # flushes the resampler's last samples


def _to_float(parts: list[np.ndarray]) -> np.ndarray:
    return (np.concatenate(parts) if len(parts) > 1 else parts[0]).astype(np.float32) / 32768.0


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc).strip() or type(exc).__name__


def clips(blocks: Iterator[np.ndarray], window_s: float = WINDOW_S, search_s: float = 5.0
          ) -> Iterator[tuple[float, np.ndarray]]:
    """(offset in seconds, samples) of consecutive clips of at most `window_s` covering every sample of `blocks`;
    each cut falls at the quietest 20 ms of the clip's last `search_s` seconds. Holds at most one clip and one
    block."""
    limit = int(window_s * SAMPLE_RATE)
    lo = limit - int(search_s * SAMPLE_RATE)
    held = np.empty(0, dtype=np.float32)
    offset = 0
    for block in blocks:
        held = np.concatenate((held, block)) if held.size else block
        while held.size > limit:
            cut = quietest_point(held, lo, limit)
            yield offset / SAMPLE_RATE, held[:cut]
            offset += cut
            held = held[cut:]
    if held.size:
        yield offset / SAMPLE_RATE, held


def quietest_point(samples: np.ndarray, lo: int, hi: int) -> int:
    """The middle of the 20 ms frame of least energy in samples[lo:hi] (a pause between words, if there is one)."""
    frames = (hi - lo) // _FRAME
    if frames <= 0:
        return hi
    energy = np.square(samples[lo : lo + frames * _FRAME].reshape(frames, _FRAME)).mean(axis=1)
    return lo + int(np.argmin(energy)) * _FRAME + _FRAME // 2
