"""What the product asks of a provider beyond its capability methods is declared on ModelResource with a default
(resources/base.py), and providers override what does not fit: no product module probes a provider with getattr /
hasattr for a hook or a config field, so a hook's name and meaning live in one place."""

from __future__ import annotations

import ast
from pathlib import Path

from batch_assets.reliability.cache import ResponseCache, cached
from batch_assets.resources.base import ModelResource
from batch_assets.resources.registry import PROVIDERS, provider_class

PACKAGE = Path(__file__).resolve().parents[2] / "batch_assets"
# Every public name ModelResource declares, and every config field of a shipped provider.
PROVIDER_NAMES = {n for n in vars(ModelResource) if not n.startswith("_")} | {
    field for name in PROVIDERS for field in provider_class(name).model_fields}


def provider_probes(source: str) -> list[tuple[int, str]]:
    """(line, code) of every getattr / hasattr whose attribute is a constant naming a provider hook or field."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in PROVIDER_NAMES:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_product_module_probes_a_provider() -> None:
    found = {str(path.relative_to(PACKAGE.parent)): probes for path in sorted(PACKAGE.rglob("*.py"))
             if (probes := provider_probes(path.read_text()))}
    assert not found, f"declare the hook on ModelResource with its default and call it (resources/base.py): {found}"


def test_the_detector_sees_the_probes_it_forbids() -> None:
    assert provider_probes('decide = getattr(provider, "chunks_in_flight", None)')
    assert provider_probes('if getattr(task.provider, "batch_api", False) is True: pass')
    assert provider_probes('device = getattr(provider, "device", None)')
    assert provider_probes('ok = hasattr(self._inner, "stopped_at")')
    assert not provider_probes("call = getattr(self.provider, self.method)")  # a capability, named by the task
    assert not provider_probes("storage = getattr(context.resources, STORAGE_KEY)")


def test_the_defaults_are_an_in_process_models() -> None:
    """A provider that overrides nothing: one call at a time, one partition at a time, no tokenizer, no fixed
    vector size, one runtime, no user code, nothing to stop or cancel."""

    class Bare(ModelResource):
        def embed(self, texts):
            return []

    bare = Bare()
    assert (bare.chunks_in_flight(64), bare.partition_window_rows(64)) == (1, 0)
    assert (bare.input_tokenizer(), bare.max_input_tokens(None), bare.vector_dimensions()) == (None, None, None)
    assert (bare.backend_used, bare.configured_device(), bare.user_code_files()) == (None, None, [])
    assert (bare.stopped_at, bare.cancel_batches(), bare.choose_for_partition(lambda: [])) == (None, [], {})
    assert bare.unwrapped is bare and not bare.answers_each_row


def test_the_hooks_reach_the_provider_through_the_response_cache(tmp_path: Path) -> None:
    openai = provider_class("openai")(model="m", max_concurrency=64, dimensions=256)
    wrapped = cached(openai, ResponseCache(str(tmp_path)))
    assert wrapped.unwrapped is openai
    assert wrapped.chunks_in_flight(16) == openai.chunks_in_flight(16) > 1  # requests queue on one shared gate
    assert wrapped.partition_window_rows(16) > 0 and wrapped.vector_dimensions() == 256
    embedder = provider_class("sentence_transformers")(device="cpu")
    assert embedder.configured_device() == "cpu" and openai.configured_device() is None
