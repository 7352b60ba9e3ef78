"""The four stages of every pipeline, each named once: what the stage does (`read`: its `run_read` function, the
docs' word) and the asset it materializes (`raw`: the asset key `<pipeline>/raw` and the folder under the storage
root that holds its partitions).

The asset names are the identity of published data: asset keys in the user's Dagster instance (materializations,
the Partitions tab, lineage), storage folders, lock and lineage records, checkpoint folders. Renaming one would make
every published partition look missing and be paid for again: they stay as they are, and code names them through
this table, never as string literals (tests/test_stage_names.py holds both to that).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    verb: str  # read, prepare, infer, write: the stage's function (stages/<verb>.py `run_<verb>`)
    asset: str  # raw, prepared, inferred, output: the asset key's last part and the storage folder


READ = Stage("read", "raw")
PREPARE = Stage("prepare", "prepared")
INFER = Stage("infer", "inferred")
WRITE = Stage("write", "output")

STAGES: tuple[Stage, ...] = (READ, PREPARE, INFER, WRITE)
ASSET_NAMES: tuple[str, ...] = tuple(stage.asset for stage in STAGES)


def upstream_of(asset: str) -> Stage | None:
    """The stage whose asset `asset` reads (None for the first: it reads the source)."""
    i = ASSET_NAMES.index(asset)
    return STAGES[i - 1] if i else None
