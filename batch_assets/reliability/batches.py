"""Never submitted twice: a partition's provider batches, durable in the storage root before anything waits.

A batch is paid for when it is submitted, and it runs for up to 24 hours: a rerun (a crash at any status, a step
retry, a run retry, the same partition launched from another launch path) must find the batches already submitted
and re-attach to them, never submit the same rows again. So every submission is written down, step by step, each
step durable before the next call to the provider:

    <root>/<pipeline>/_staging/inferred-batches/<partition>/submission-<token>.json

1. intent: a fresh token, the input file's name (which contains the token) and the custom_ids it holds (written
   before the upload);
2. + the uploaded file's id (written before the batch is created);
3. + the batch's id (written right after `create` answered; the batch carries the token in its metadata, so a crash
   or a lost answer between `create` and this write is healed by looking the token up: batch_assets/stages/
   infer_batch.py `_reattach`).
A submission whose batch cannot be found by its token was never created: its rows are submitted again, once.

Why one object per submission and not one ledger file: S3 has no append and no compare-and-swap, and a partition is
inferred by one step at a time (its lock, batch_assets/reliability/locks.py), so whole-object writes (temp file +
fsync + rename on a local folder, one PUT on S3) of small documents are atomic and need no merge. The folder sits
beside the checkpoint fingerprints, not under one: a changed setup (which drops old chunks and answers) must not
forget batches that are still running and paid for; their answers are used where the rows and the request are the
same (custom_id covers both), and ignored otherwise. The folder is removed once the partition's rows are all
committed (the answers then live in the chunks).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from batch_assets.storage import atomic_output, filesystem_for, is_remote

PREFIX = "submission-"


@dataclass
class Submission:
    token: str
    file_name: str
    custom_ids: list[str]
    created: float  # epoch seconds of the intent (a lookup by token need not look further back)
    session: str  # the process that submitted it: transient failures count against attempts of this run only
    family: str = "openai"
    file_id: str | None = None
    batch_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def ledger_url(partition_checkpoint_url: str) -> str:
    """The ledger folder of a partition, from its checkpoint folder (…/_staging/<stage>/<partition>)."""
    parent, _, partition = partition_checkpoint_url.rstrip("/").rpartition("/")
    return f"{parent}-batches/{partition}"


class BatchLedger:
    """The submissions of one partition."""

    def __init__(self, url: str):
        self.url = url
        self.fs, self.path = filesystem_for(url)
        self._local = not is_remote(url)

    def new(self, custom_ids: list[str], session: str, family: str) -> Submission:
        token = uuid.uuid4().hex
        return Submission(token=token, file_name=f"batch-assets-{token}.jsonl", custom_ids=custom_ids,
                          created=time.time(), session=session, family=family)

    def save(self, submission: Submission) -> None:
        path = f"{self.path}/{PREFIX}{submission.token}.json"
        body = json.dumps(asdict(submission), separators=(",", ":")).encode()
        if self._local:
            with atomic_output(self.fs, path) as f:
                f.write(body)
        else:
            self.fs.pipe_file(path, body)  # one PUT: whole or not at all

    def forget(self, submission: Submission) -> None:
        """A submission that never reached the provider (its batch is not found by its token)."""
        try:
            self.fs.rm(f"{self.path}/{PREFIX}{submission.token}.json")
        except FileNotFoundError:
            pass

    def submissions(self) -> list[Submission]:
        if not self.fs.exists(self.path):
            return []
        out = []
        for entry in self.fs.ls(self.path, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(PREFIX) and name.endswith(".json"):
                out.append(Submission(**json.loads(self.fs.cat_file(entry))))
        return sorted(out, key=lambda s: s.created)

    def remove(self) -> None:
        if self.fs.exists(self.path):
            self.fs.rm(self.path, recursive=True)
