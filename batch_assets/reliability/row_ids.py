"""Row identity: the id's stable hash, and exactly-once bookkeeping for row ids in memory that does not hold them.

Two structures, both fed batch by batch while a stage streams:

- `RowIdFingerprint`: an order-independent fingerprint of a multiset of ids (count, the sum of the ids' 64-bit hashes
  and the sum of a bijective mix of them, mod 2**64) -- O(1) memory whatever the partition size. The read stage takes it of the rows it reads from the source
  and stores it in the `raw` file's Parquet metadata; the write stage takes it of the rows it publishes, and the two
  must be equal. Adding is commutative, so order and batching do not matter; a missing, repeated or foreign row
  changes the count or (with probability ~2**-64 per sum) the sums. Only when they differ does a second pass
  (`name_differences`) re-read both sides to name the culprits -- that pass alone holds 8 bytes a row.
- `UniqueIdChecker`: proves the ids of a partition are unique. It keeps one 64-bit hash per row in a numpy array
  (8 bytes a row, 16 while the array doubles; vs ~70-90 bytes a row for a Python set of ints) and sorts it once at
  the end; equal neighbours are then confirmed against the real ids by a second pass, so a hash collision never
  fails a good partition. Documented bound: 16 bytes a row at peak, e.g. 160 MB for 10 million rows.

Unique source ids (checked in prepare) + equal fingerprints of source and output = every source row exactly once.

One hash for every purpose: the id's stable 64-bit hash (`stable_hash64` below, the one hash shards are assigned by:
partitions.py).
The read stage computes it once and carries it (`_row_hash`); the fingerprint and the uniqueness check of the read
take the carried value, and only the places that must prove what they hold (the ids being published, the `inferred`
file under check) hash the ids they read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


def stable_hash64(values: list[str]) -> np.ndarray:
    """A hash of each row id that is the same in every process and Python version (unlike hash()).

    blake2b-64 of the UTF-8 id, read little-endian: shard assignment of existing data depends on these exact
    values, so the function never changes. Computed once per row, in the read stage (`ROW_HASH` column); the
    digests are joined and viewed as one uint64 array instead of converting each to a Python int."""
    blake = hashlib.blake2b
    digests = b"".join([blake(v.encode("utf-8"), digest_size=8).digest() for v in values])
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


ROW_HASH = "_row_hash"


def row_hashes(batch: pa.RecordBatch) -> np.ndarray:
    """The row ids' stable hashes: the `_row_hash` column the read stage carries (files written before it
    existed: computed from `row_id`)."""
    if ROW_HASH in batch.schema.names:
        return batch.column(ROW_HASH).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    return stable_hash64(batch.column("row_id").to_pylist())


MASK = (1 << 64) - 1
FINGERPRINT_KEY = b"batch_assets.row_id_fingerprint"


FINGERPRINT_HASH = "blake2b64+mix"  # stored with the fingerprint: one taken with another hash is not comparable
_MIX = np.uint64(0x9E3779B97F4A7C15)


def id_hashes(ids: list[str]) -> np.ndarray:
    """The ids' stable 64-bit hashes (the same in every process)."""
    return stable_hash64(ids)


def _mix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (h ^ (h >> np.uint64(31))) * _MIX


def _ids(batch: pa.RecordBatch | pa.Table) -> list[str]:
    return batch.column("row_id").to_pylist()


@dataclass
class RowIdFingerprint:
    count: int = 0
    sum1: int = 0
    sum2: int = 0

    def add_hashes(self, h: np.ndarray) -> None:
        """Add ids by their stable hashes (`id_hashes`, or the `_row_hash` the read stage computed)."""
        if not len(h):
            return
        # numpy uint64 sums wrap mod 2**64, which is what we want (and what Python ints are reduced to below).
        self.count += len(h)
        self.sum1 = (self.sum1 + int(h.sum(dtype=np.uint64))) & MASK
        self.sum2 = (self.sum2 + int(_mix(h).sum(dtype=np.uint64))) & MASK

    def add_ids(self, ids: list[str]) -> None:
        self.add_hashes(id_hashes(ids))

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add the batch's `row_id` values, hashed here: what is proven is the ids themselves."""
        self.add_ids(_ids(batch))

    def to_json(self) -> str:
        return json.dumps({"hash": FINGERPRINT_HASH, "count": self.count, "sum1": f"{self.sum1:016x}",
                           "sum2": f"{self.sum2:016x}"})

    @classmethod
    def from_json(cls, text: str | bytes) -> "RowIdFingerprint | None":
        """The stored fingerprint, or None when it was taken with another hash (a file from an older version)."""
        data = json.loads(text)
        if data.get("hash") != FINGERPRINT_HASH:
            return None
        return cls(int(data["count"]), int(data["sum1"], 16), int(data["sum2"], 16))


@dataclass
class IdDifferences:
    missing: list[str]  # in the source, not in the output
    repeated: list[str]  # more often in the output than in the source
    unexpected: list[str]  # in the output, not in the source
    missing_count: int = 0
    repeated_count: int = 0
    unexpected_count: int = 0


def _sorted_hashes(batches: Iterator[pa.RecordBatch]) -> np.ndarray:
    parts = [id_hashes(_ids(b)) for b in batches]
    out = np.concatenate(parts) if parts else np.empty(0, np.uint64)
    out.sort()
    return out


def name_differences(source: Callable[[], Iterator[pa.RecordBatch]],
                     output: Callable[[], Iterator[pa.RecordBatch]], limit: int = 5) -> IdDifferences:
    """Error path only: which ids are missing, repeated or unexpected (a few of each by name, all counted)."""
    src, out = _sorted_hashes(source()), _sorted_hashes(output())
    s_vals, s_counts = np.unique(src, return_counts=True)
    o_vals, o_counts = np.unique(out, return_counts=True)
    missing_h = np.setdiff1d(s_vals, o_vals, assume_unique=True)
    unexpected_h = np.setdiff1d(o_vals, s_vals, assume_unique=True)
    common, si, oi = np.intersect1d(s_vals, o_vals, assume_unique=True, return_indices=True)
    repeated_h = common[o_counts[oi] > s_counts[si]]

    def names(hashes: np.ndarray, batches: Callable[[], Iterator[pa.RecordBatch]]) -> list[str]:
        if not len(hashes):
            return []
        wanted = set(hashes[:limit].tolist())
        found: list[str] = []
        for batch in batches():
            ids = _ids(batch)
            for rid, h in zip(ids, id_hashes(ids).tolist()):
                if h in wanted and rid not in found:
                    found.append(rid)
            if len(found) >= len(wanted):
                break
        return found

    return IdDifferences(names(missing_h, source), names(repeated_h, output), names(unexpected_h, output),
                         len(missing_h), len(repeated_h), len(unexpected_h))


class UniqueIdChecker:
    """Collects one 64-bit hash per row id; `duplicates()` sorts them once and names the truly repeated ids."""

    def __init__(self, initial_rows: int = 1 << 16) -> None:
        self._hashes = np.empty(initial_rows, dtype=np.uint64)
        self._n = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Add a batch's ids, by the `_row_hash` it carries (hashed here when it has none)."""
        self.add_hashes(row_hashes(batch))

    def add_hashes(self, h: np.ndarray) -> None:
        need = self._n + len(h)
        if need > len(self._hashes):
            grown = np.empty(max(need, 2 * len(self._hashes)), dtype=np.uint64)
            grown[: self._n] = self._hashes[: self._n]
            self._hashes = grown
        self._hashes[self._n : need] = h
        self._n = need

    def __len__(self) -> int:
        return self._n

    def distinct(self) -> np.ndarray:
        """The distinct hashes added (sorted)."""
        return np.unique(self._hashes[: self._n])

    @property
    def nbytes(self) -> int:
        """Memory held for the partition's ids (the bound the memory test asserts)."""
        return int(self._hashes.nbytes)

    def duplicates(self, rescan: Callable[[], Iterator[pa.RecordBatch]],
                   limit: int | None = 5) -> list[tuple[str, list[tuple[str, int]]]]:
        """[(row id, [(file, row), ...] in read order), ...] for ids that occur more than once (at most `limit`,
        None: all of them -- memory then grows with the duplicates, never with the partition)."""
        hashes = self._hashes[: self._n]
        hashes.sort()
        suspects = np.unique(hashes[1:][hashes[1:] == hashes[:-1]])
        if not len(suspects):
            return []
        wanted = set(suspects.tolist())
        places: dict[str, list[tuple[str, int]]] = {}
        for batch in rescan():
            ids = _ids(batch)
            files = batch.column("_source_file").to_pylist()
            rows = batch.column("_source_row").to_pylist()
            for i, h in enumerate(id_hashes(ids).tolist()):
                if h in wanted:
                    places.setdefault(ids[i], []).append((files[i], rows[i]))
        # equal hashes of different ids are collisions, not duplicates
        repeated = [(rid, where) for rid, where in places.items() if len(where) > 1]
        return repeated if limit is None else repeated[:limit]
