"""The answer journal on its own (batch_assets/reliability/journal.py): an answer is readable by the next run once
its future completes, a refused or owed row is never kept, and segments stay bounded however long the partition
runs (answers of committed chunks leave; the rest are compacted), on a local folder and on S3 (moto_server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_assets.reliability.journal import MAX_SEGMENTS, AnswerJournal, row_keys
from batch_assets.storage import filesystem_for
from batch_assets.resources.protocols import Generation


def _segments(url: str) -> list[str]:
    fs, path = filesystem_for(f"{url}/answers")
    fs.invalidate_cache()  # s3fs caches listings
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:  # everything compacted away (no answer live): on S3 the folder is gone with it
        return []
    return [p for p in names if p.rstrip("/").rsplit("/", 1)[-1].startswith("segment-")]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_answers_survive_a_crash_and_segments_stay_bounded(tmp_path: Path, where: str, request) -> None:
    url = f"{request.getfixturevalue('s3_bucket')}/fp" if where == "s3" else str(tmp_path / "fp")
    journal = AnswerJournal(url).open()
    chunks = [row_keys([f"d{c}-{i}" for i in range(8)], [f"prompt {c}-{i}" for i in range(8)]) for c in range(40)]
    for c, keys in enumerate(chunks):
        futures = [journal.record(k, Generation(text=f"answer {k[:6]}")) for k in keys]
        for future in futures:
            future.result(timeout=30)  # durable: what the request's slot waits for
        assert journal.record(f"owed-{c}", Generation(text=None, error="HTTP 503 (gave up after 5 attempts)")) is None
        assert journal.record(f"refused-{c}", Generation(text=None, error="HTTP 400: refused")) is None
        if c < 38:
            journal.release(keys)  # committed in its chunk
        journal.flush()  # waits for a write (and compaction) the flusher may have under way
        assert len(_segments(url)) <= MAX_SEGMENTS + 1
    # a SIGKILL here: nothing closes the journal; the next run reads what is durable
    again = AnswerJournal(url).open()
    try:
        found = again.lookup([*chunks[38], *chunks[39], *chunks[0]])
        assert sorted(found) == list(range(16))  # the uncommitted chunks' answers, not the released ones
        assert found[0].text == f"answer {chunks[38][0][:6]}" and found[0].error is None
    finally:
        again.close()
        journal.close()
