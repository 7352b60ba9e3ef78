"""Pay only for what was in flight: every answer of a provider billed per request is durable about a second after
it arrives, so a crash (SIGKILL, a lost node) followed by a rerun asks the model only for rows it never answered.

Chunk checkpoints (checkpoint.py) alone lose every answer since the last committed chunk; for an in-process model
that costs a little compute, for a paid API it is paid twice. The journal sits beside the chunks, under the same
fingerprint folder (so a changed setup never reuses it, and it goes with the checkpoints after publish):

    <root>/<pipeline>/_staging/inferred/<partition>/<fingerprint>/answers/segment-<seq>-<uuid>.jsonl

Why segments and not one appended file: S3 has no append. A flusher thread writes the answers that arrived since its
last write as one new segment as soon as there are any (one atomic PUT, or temp file + fsync + rename on a local
folder: a half-written segment is never visible); answers arriving during a write go together into the next one, so
an answer is durable one write (milliseconds locally, tens of them on S3) after it arrived. The request that brought
it keeps its slot of the provider's gate until then (resources/openai_api/retry.py `settle`): requests sent plus
answers not yet durable never exceed `max_concurrency`, which is all a SIGKILL at any moment can cost. Answers of a chunk are dropped from memory once the chunk is committed, and
when more than `MAX_SEGMENTS` segments exist they are compacted: the answers not yet in a committed chunk are
written as one segment, then the older segments are deleted (a crash in between leaves duplicates of the same
answers, which read back the same). Object count and memory stay bounded by the chunks in flight.

Entry key: the row id and a digest of the row's model input, so a row whose input changed is asked again. What is
kept: answers, never a row error. A row that ran out of attempts on a transient failure must be asked again; a
refused row (a 400) is asked again too, because a retry of dead letters exists to ask it again: after a crash a
refused row costs one more request.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from batch_assets.reliability.cache import plain
from batch_assets.storage import atomic_output, filesystem_for, is_remote, join
from batch_assets.resources.protocols import Classification, Generation

log = logging.getLogger(__name__)

FOLDER = "answers"
FLUSH_S = 1.0  # an answer is durable at most about this long after it arrived
MAX_SEGMENTS = 16  # more than this and the live answers are compacted into one segment


def row_keys(row_ids: Sequence[Any], inputs: Sequence[Any]) -> list[str]:
    """One key per sent row: its id and a digest of the input the model is asked with."""
    keys = []
    for row_id, row in zip(row_ids, inputs):
        doc = json.dumps(plain(row), sort_keys=True, separators=(",", ":"), default=repr)
        keys.append(f"{row_id}\x1f{hashlib.blake2b(doc.encode(), digest_size=12).hexdigest()}")
    return keys


def encode(result: Any) -> dict[str, Any] | None:
    """A provider's result for one row as a journal entry; None for what must be asked again."""
    if isinstance(result, Generation):
        if result.error is not None:
            return None
        return {"g": [result.text, result.prompt_tokens, result.completion_tokens, result.error, result.parsed,
                      result.finish_reason]}
    if isinstance(result, Classification):
        if result.error is not None:
            return None
        return {"c": [result.label, result.score, result.error]}
    vector = np.asarray(result, dtype=np.float32)
    return {"v": base64.b64encode(vector.tobytes()).decode("ascii")}


def decode(entry: dict[str, Any]) -> Any:
    if "g" in entry:
        text, prompt_tokens, completion_tokens, error, parsed, finish_reason = entry["g"]
        return Generation(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, error=error,
                          parsed=parsed, finish_reason=finish_reason)
    if "c" in entry:
        label, score, error = entry["c"]
        return Classification(label=label, score=score, error=error)
    return np.frombuffer(base64.b64decode(entry["v"]), dtype=np.float32)


class AnswerJournal:
    """The answered rows of one partition's inference, under one checkpoint fingerprint folder."""

    def __init__(self, checkpoint_url: str, flush_s: float = FLUSH_S, max_segments: int = MAX_SEGMENTS):
        self.url = join(checkpoint_url, FOLDER)
        self.fs, self.path = filesystem_for(self.url)
        self.flush_s, self.max_segments = flush_s, max_segments
        self._local = not is_remote(self.url)
        self._found: dict[str, dict[str, Any]] = {}  # read back from an earlier run's segments
        self._live: dict[str, dict[str, Any]] = {}  # answered, not yet in a committed chunk
        self._pending: list[tuple[str, dict[str, Any]]] = []  # answered since the last flush
        self._durable = concurrent.futures.Future()  # completes when the pending answers are written
        self._segments: list[str] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # the flusher thread and a stop's flush never write at once
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.reused = 0  # answers this run took from the journal instead of asking the model
        # Results decided elsewhere in this run and never written (the batch path's row errors and owed rows,
        # stages/infer_batch.py): `lookup` hands them out as it does answers, so the chunk loop sends nothing for them.
        self._settled: dict[str, Any] = {}

    def open(self) -> AnswerJournal:
        if self.fs.exists(self.path):
            for entry in sorted(self.fs.ls(self.path, detail=False)):
                name = entry.rstrip("/").rsplit("/", 1)[-1]
                if not name.startswith("segment-"):
                    continue  # a temp file of a local write that never finished
                self._segments.append(entry)
                self._seq = max(self._seq, int(name.split("-")[1]) + 1)
                for line in self.fs.cat_file(entry).splitlines():
                    try:
                        key, value = json.loads(line)
                    except ValueError:
                        continue  # cannot happen with atomic writes; a damaged line is only a row asked again
                    self._found[key] = value
        self._thread = threading.Thread(target=self._flush_loop, name="answer-journal", daemon=True)
        self._thread.start()
        _OPEN.add(self)
        return self

    def answered(self, key: str) -> bool:
        """Whether the row has an answer here (no side effect: `lookup` is what counts a reuse)."""
        with self._lock:
            return key in self._found or key in self._live

    def settle(self, key: str, result: Any) -> None:
        """A row's result that is not an answer to keep (a row error, an owed row), for `lookup` in this run only."""
        with self._lock:
            self._settled[key] = result

    def lookup(self, keys: Sequence[str]) -> dict[int, Any]:
        """Positions (in `keys`) answered by an earlier run (or settled in this one), with their results."""
        out = {}
        with self._lock:
            for i, key in enumerate(keys):
                entry = self._found.get(key) or self._live.get(key)
                if entry is not None:
                    out[i] = decode(entry)
                    self._live.setdefault(key, entry)  # stays until its chunk is committed (compaction keeps it)
                elif key in self._settled:
                    out[i] = self._settled[key]
        self.reused += len(out)
        return out

    def record(self, key: str, result: Any) -> concurrent.futures.Future | None:
        """One answer as it arrives (any thread, the provider's event loop included): cheap, no I/O here. Returns a
        future that completes once the answer is durable (None: nothing to keep), and wakes the flusher."""
        entry = encode(result)
        if entry is None:
            return None
        with self._lock:
            self._live[key] = entry
            self._pending.append((key, entry))
            durable = self._durable
        self._wake.set()
        return durable

    def release(self, keys: Sequence[str]) -> None:
        """The chunk holding these rows is committed: their answers need not stay in the journal."""
        with self._lock:
            for key in keys:
                self._live.pop(key, None)
                self._found.pop(key, None)

    def flush(self) -> None:
        with self._flush_lock:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            durable, self._durable = self._durable, concurrent.futures.Future()
            live = dict(self._live) if len(self._segments) >= self.max_segments else None
        try:
            if pending:
                self._segments.append(self._write(pending))
        except BaseException:
            with self._lock:  # not written: kept for the next flush, whose future also stands for these
                self._pending[:0] = pending
                self._durable.add_done_callback(lambda _: durable.set_result(None))
            raise
        durable.set_result(None)
        if live is not None:
            self._compact(live)

    def close(self) -> None:
        """Last flush (answers that arrived during a stop's grace included), then the flusher ends."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()
        _OPEN.discard(self)

    def _write(self, entries: list[tuple[str, dict[str, Any]]]) -> str:
        path = f"{self.path}/segment-{self._seq:08d}-{uuid.uuid4().hex[:8]}.jsonl"
        self._seq += 1
        body = "".join(json.dumps([k, v], separators=(",", ":")) + "\n" for k, v in entries).encode()
        if self._local:
            with atomic_output(self.fs, path) as f:
                f.write(body)
        else:
            self.fs.pipe_file(path, body)  # one PUT: an object appears whole or not at all
        return path

    def _compact(self, live: dict[str, dict[str, Any]]) -> None:
        old, self._segments = self._segments, []
        if live:
            self._segments.append(self._write(list(live.items())))
        for path in old:
            try:
                self.fs.rm(path)
            except FileNotFoundError:
                pass

    def _flush_loop(self) -> None:
        while not self._closing:
            # Writes as soon as answers wait (those arriving during a write go together into the next one), so an
            # answer is durable one write after it arrived; the answer's request keeps its slot until then.
            self._wake.wait(self.flush_s)
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # storage hiccup: the answers stay pending and the next flush tries again
                log.warning("could not write answers to %s (%s); trying again", self.url, exc)


_OPEN: weakref.WeakSet[AnswerJournal] = weakref.WeakSet()


def flush_open_journals() -> None:
    """Write out every open journal's pending answers now (a stop: the process is about to exit)."""
    for journal in list(_OPEN):
        try:
            journal.flush()
        except Exception as exc:
            log.warning("could not write answers to %s: %s", journal.url, exc)
