"""The GGUF checkpoint is dequantized once and read from its converted copy afterwards (resources/hf/gguf_cache.py):
same answers as the GGUF itself, a damaged copy is converted again, an unwritable cache still loads the model."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from batch_assets.resources.hf import gguf_cache
from batch_assets.resources.hf.generator import TransformersGenerator
from batch_assets.resources.protocols import GenerationParams

pytestmark = pytest.mark.slow

CONVERSATIONS = [[{"role": "user", "content": f"Name a {w}."}] for w in ("fruit", "city", "colour", "planet")]
PARAMS = GenerationParams(max_new_tokens=10)


def _answers(generator: TransformersGenerator) -> list[str | None]:
    return [g.text for g in generator.generate(CONVERSATIONS, PARAMS)]


@pytest.fixture(scope="module")
def from_gguf(tmp_path_factory) -> list[str | None]:
    """The reference: answers of the model read from the GGUF file itself. The cache folder given cannot be created
    (a file is in the way), so this also shows that an unwritable cache still loads the model, from the GGUF."""
    blocker = tmp_path_factory.mktemp("blocked") / "not-a-folder"
    blocker.write_text("")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf_cache.CACHE_ENV, str(blocker / "models"))
        generator = TransformersGenerator(batch_size=4).load_for_tests()
    assert generator._source.endswith(".gguf")
    return _answers(generator)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One cache folder for the module: the second test damages the copy the first one converted."""
    return tmp_path_factory.mktemp("model-cache")


def test_converted_copy_answers_like_the_gguf_and_is_reused(from_gguf, cache_dir, monkeypatch) -> None:
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(cache_dir))
    first = TransformersGenerator(batch_size=4).load_for_tests()
    folder = Path(first._source)
    assert folder.parent == cache_dir and (folder / gguf_cache.COMPLETE).is_file()
    assert _answers(first) == from_gguf

    def no_conversion(*_args: object) -> None:
        raise AssertionError("converted again although a complete copy is cached")

    monkeypatch.setattr(gguf_cache, "_convert", no_conversion)
    again = TransformersGenerator(batch_size=4).load_for_tests()
    assert again._source == str(folder)
    assert _answers(again) == from_gguf
    # no temporary folder left behind (beside the copy only its lock file, which filelock keeps by design)
    assert sorted(p.name for p in cache_dir.iterdir()) == [folder.name, f"{folder.name}.lock"]


def test_damaged_copy_is_converted_again_never_used(from_gguf, cache_dir, monkeypatch, caplog) -> None:
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(cache_dir))
    folder = Path(TransformersGenerator(batch_size=4).load_for_tests()._source)  # converted by the test above
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:  # a copy cut short (disk full, a killed copy by hand)
        f.truncate(size // 2)
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        repaired = TransformersGenerator(batch_size=4).load_for_tests()
    assert "did not load" in caplog.text and "converting" in caplog.text
    assert repaired._source == str(folder) and weights.stat().st_size == size
    assert _answers(repaired) == from_gguf


def test_cache_off_and_key_follows_the_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(gguf_cache.CACHE_ENV, "off")
    assert gguf_cache.cache_root() is None
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"one")
    before = gguf_cache.converted_folder(str(tmp_path), "m.gguf")
    model.write_bytes(b"other file")  # a new file under the same name: converted again, into another folder
    assert gguf_cache.converted_folder(str(tmp_path), "m.gguf") != before
