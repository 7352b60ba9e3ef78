"""A trial run (`prepare.trial`): the prepare stage keeps a deterministic few rows of the partition, and everything
after it knows the partition is a trial, so a trial is never taken for the partition's full output.

- `sample`: a row is kept when a hash of its row id (the read stage's `_row_hash`) mixed with the seed falls under
  the fraction: the same rows on every run, whatever the batch size or executor, and no row read twice.
- `limit`: the first N rows kept (after `sample`), in read order; reading stops there.
- The kept rows' id fingerprint goes into the `prepared` file's footer: the blocking rows check and the write stage
  compare against it instead of the whole source.
- The write stage publishes under `<sink base>/_trial/` (dead letters likewise), never over a full output; the
  lineage records carry the spec's `prepare.trial` in their code version, so a run without `trial` redoes every
  stage from `prepared` on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from batch_assets.reliability.row_ids import row_hashes
from batch_assets.reliability.row_ids import FINGERPRINT_KEY, RowIdFingerprint
from batch_assets.storage import join, parquet_footer_metadata

TRIAL_KEY = b"batch_assets.trial"  # in the `prepared` footer: a JSON of rows kept and rows in the partition
TRIAL_DIR = "_trial"
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(h: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64's finaliser over the row hashes xor a seed: well spread, so `< fraction * 2**64` keeps a fair
    share of any ids, sequential ones included."""
    with np.errstate(over="ignore"):
        x = h ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class TrialSelection:
    """Filters a partition's raw batches to the trial's rows and fingerprints what it kept."""

    def __init__(self, trial):
        self.trial = trial
        self.kept = RowIdFingerprint()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        trial, left = self.trial, self.trial.limit
        for batch in batches:
            hashes = row_hashes(batch)
            if trial.sample is not None and trial.sample < 1.0:
                cut = np.uint64(min(int(trial.sample * 2.0**64), 2**64 - 1))
                keep = _mix(hashes, trial.seed) < cut
                batch, hashes = batch.filter(pa.array(keep)), hashes[keep]
            if left is not None:
                batch, hashes = batch.slice(0, left), hashes[:left]
                left -= batch.num_rows
            self.kept.add_hashes(hashes)
            yield batch
            if left == 0:
                return

    def footer(self, rows_in_partition: int) -> dict[str, str]:
        return {FINGERPRINT_KEY.decode(): self.kept.to_json(),
                TRIAL_KEY.decode(): json.dumps({"rows_kept": self.kept.count, "rows_in_partition": rows_in_partition})}


def trial_fingerprint(url: str) -> RowIdFingerprint | None:
    """The ids a trial kept, from the `prepared` or `inferred` footer; None for a full (non-trial) partition."""
    footer = parquet_footer_metadata(url)
    if TRIAL_KEY not in footer:
        return None
    return RowIdFingerprint.from_json(footer[FINGERPRINT_KEY])


def trial_footer(url: str) -> dict[str, str]:
    """The trial's footer entries of a `prepared` file (none for a full partition), for `inferred` to carry on."""
    footer = parquet_footer_metadata(url)
    if TRIAL_KEY not in footer:
        return {}
    return {TRIAL_KEY.decode(): footer[TRIAL_KEY].decode(), FINGERPRINT_KEY.decode(): footer[FINGERPRINT_KEY].decode()}


def trial_url(url: str) -> str:
    """Where a trial publishes: the `_trial` folder beside the partition's full output location."""
    base, _, name = url.rstrip("/").rpartition("/")
    return join(base, TRIAL_DIR, name)
