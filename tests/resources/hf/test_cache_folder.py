"""The shared build-once cache folder (resources/hf/cache_folder.py, under the ONNX export and GGUF caches): two
processes that find it missing at once build it once; a builder's leftovers and an invalid folder are never used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from batch_assets.resources.hf.cache_folder import discard, ensure_folder

ROOT = Path(__file__).resolve().parents[3]

BUILDER = """
import sys, time
from pathlib import Path
from batch_assets.resources.hf.cache_folder import ensure_folder
root, log = Path(sys.argv[1]), Path(sys.argv[2])
def build(out):
    with open(log, "a") as f:
        f.write("built\\n")
    time.sleep(1.5)  # long enough that the other process arrives while this one builds
    (out / "DONE").write_text("x")
print(ensure_folder(root, "k", lambda f: (f / "DONE").is_file(), build))
"""


def test_two_processes_build_once_and_both_use_it(tmp_path: Path) -> None:
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(root), str(log)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert log.read_text().splitlines() == ["built"]  # once: the second waited on the lock and used the first's
    assert {o[0].strip() for o in outs} == {str(root / "k")}
    assert sorted(p.name for p in root.iterdir()) == ["k", "k.lock"]


def test_leftovers_and_an_invalid_folder_are_rebuilt_never_used(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / ".build-k-dead1").mkdir(parents=True)  # a builder killed mid-way
    (root / "k").mkdir()  # a folder without its completion marker (torn, or another format)
    (root / "k" / "junk").write_text("half")
    builds = []

    def build(out: Path) -> None:
        builds.append(out)
        (out / "DONE").write_text("x")

    valid = lambda f: (f / "DONE").is_file()  # noqa: E731
    target = ensure_folder(root, "k", valid, build)
    assert len(builds) == 1 and sorted(p.name for p in target.iterdir()) == ["DONE"]
    assert not (root / ".build-k-dead1").exists()
    assert ensure_folder(root, "k", valid, build) == target and len(builds) == 1  # valid now: reused
    discard(root, "k")  # a caller found it would not load
    ensure_folder(root, "k", valid, build)
    assert len(builds) == 2


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"

    def build(out: Path) -> None:
        (out / "partial").write_text("x")
        raise OSError("disk full")

    try:
        ensure_folder(root, "k", lambda f: (f / "DONE").is_file(), build)
    except OSError as exc:
        assert "disk full" in str(exc)
    else:
        raise AssertionError("the build's failure was swallowed")
    assert sorted(p.name for p in root.iterdir()) == ["k.lock"]
