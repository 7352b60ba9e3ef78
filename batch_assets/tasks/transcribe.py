"""transcribe: one audio file per row, named by the one `prepare.input_columns` column (a local path or an s3:// URL;
the `file_path` column of a `format: files` source, or any table column of paths), into `text`, `language`,
`duration_s` and `segments`.

The plan opens nothing: each row becomes an `AudioFile` whose `open` the provider calls when it reaches that file,
so a chunk of hour-long recordings is streamed one file at a time, never held at once. A file that is missing,
empty or does not decode is that row's error, naming the file; the partition goes on.
"""

from __future__ import annotations

from functools import partial
from typing import IO, Any

import numpy as np
import pyarrow as pa

from batch_assets.storage import open_input
from batch_assets.tasks.base import ChunkPlan, Problems, Spec, Task, note_row_errors, scatter
from batch_assets.resources.protocols import AudioFile

SEGMENT = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])
# s3fs reads ahead this much per request: enough to keep the decoder fed, small beside the audio of an hour.
_READ_BLOCK = 8 * 2**20


def open_audio(url: str) -> IO[bytes]:
    """A binary file object for a local path (relative ones resolve as source paths do) or an s3:// URL: the
    storage layer's `open_input` (its S3 client, a missing or refused file named), reading ahead in large blocks."""
    return open_input(url, block_size=_READ_BLOCK)


class TranscribeTask(Task):
    kind = "transcribe"
    default_output = "text"
    reads = "audio"
    extra_outputs = ("language", "duration_s", "segments")
    prepare_fields = frozenset({"input_columns"})

    @classmethod
    def spec_problems(cls, spec: Spec) -> Problems:
        problems = super().spec_problems(spec)
        if len(spec.prepare.input_columns or []) != 1:
            problems.append(("prepare.input_columns", "task 'transcribe' needs exactly one column: the one holding "
                             "each row's audio file path or s3:// URL (file_path for a `format: files` source)"))
        return problems

    @classmethod
    def source_columns(cls, spec: Spec) -> list[str]:
        return list(spec.prepare.input_columns or [])

    @classmethod
    def model_input(cls, spec: Spec) -> list[str]:
        return list(spec.prepare.input_columns or [])[:1]

    @classmethod
    def prediction_column(cls, spec: Spec) -> str | None:
        return None  # a transcript is free text: no label to score

    def _plan(self, batch: pa.RecordBatch, sent: np.ndarray, errors: list[str | None]) -> ChunkPlan:
        refs = batch.column(self.model_input(self.spec)[0]).take(pa.array(sent, pa.int64())).to_pylist()
        return ChunkPlan(sent, [AudioFile(str(ref), partial(open_audio, str(ref))) for ref in refs], errors)

    def _columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        results = results or []  # None: no row of the chunk was sent (every path empty or flagged)
        note_row_errors(results, plan.sent, plan.errors)
        segments = [None if r.error else [{"start": s.start, "end": s.end, "text": s.text} for s in r.segments]
                    for r in results]
        return [self.output_column, "language", "duration_s", "segments"], [
            pa.array(scatter([r.text for r in results], plan.sent, n), pa.string()),
            pa.array(scatter([r.language for r in results], plan.sent, n), pa.string()),
            pa.array(scatter([r.duration_s for r in results], plan.sent, n), pa.float64()),
            pa.array(scatter(segments, plan.sent, n), pa.list_(SEGMENT)),
        ]

    def _schema(self) -> dict[str, pa.DataType | None]:
        return {self.output_column: pa.string(), "language": pa.string(), "duration_s": pa.float64(),
                "segments": pa.list_(SEGMENT)}
