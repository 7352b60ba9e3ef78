"""The batch ledger keeps each submission's steps durable on a local folder and on S3 (moto), beside the checkpoint
fingerprints, and outlives a change of setup that drops the old fingerprint's chunks."""

from __future__ import annotations

import pytest

from batch_assets.reliability.batches import BatchLedger, ledger_url
from batch_assets.reliability.checkpoint import ChunkCheckpoint, staging_url
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage

SPEC = {
    "name": "ledgered",
    "source": {"format": "jsonl", "path": "/nowhere/{partition}.jsonl", "columns": ["doc_id", "text"]},
    "partitioning": {"kind": "static", "keys": ["a"]},
    "prepare": {"id_column": "doc_id", "template": "Say {text}"},
    "task": {"kind": "generate"},
    "model": {"provider": "openai", "config": {"model": "m", "base_url": "http://127.0.0.1:9/v1", "batch_api": True}},
}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_submissions_are_durable_step_by_step_and_survive_a_new_fingerprint(tmp_path, where, request):
    root = f"{request.getfixturevalue('s3_bucket')}/store" if where == "s3" else str(tmp_path / "store")
    storage = ArrowStorage(root=root)
    spec = parse_spec(SPEC)
    ledger = BatchLedger(ledger_url(staging_url(storage, spec.name, "a")))
    assert ledger.submissions() == []

    sub = ledger.new(["r-1", "r-2"], session="s1", family="openai")
    ledger.save(sub)  # intent: before the upload
    assert [(s.token, s.file_id, s.batch_id) for s in ledger.submissions()] == [(sub.token, None, None)]
    assert sub.token in sub.file_name
    sub.file_id = "file-1"
    ledger.save(sub)
    sub.batch_id = "batch_1"
    ledger.save(sub)
    [back] = BatchLedger(ledger.url).submissions()
    assert (back.file_id, back.batch_id, back.custom_ids) == ("file-1", "batch_1", ["r-1", "r-2"])

    # another setup's checkpoint drops the old fingerprint folders of the partition, never the ledger
    ChunkCheckpoint(storage, spec, "a", "old-fingerprint").open()
    ChunkCheckpoint(storage, spec, "a", "new-fingerprint").open()
    assert [s.batch_id for s in ledger.submissions()] == ["batch_1"]

    other = ledger.new(["r-3"], session="s1", family="openai")
    ledger.save(other)
    ledger.forget(other)  # never reached the provider
    assert [s.token for s in ledger.submissions()] == [sub.token]
    ledger.remove()
    assert ledger.submissions() == []
