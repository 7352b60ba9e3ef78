"""Speech to text: faster-whisper (Whisper in CTranslate2), the `audio` extra."""

from batch_assets.resources.whisper.provider import FasterWhisperTranscriber

__all__ = ["FasterWhisperTranscriber"]
