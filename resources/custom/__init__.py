"""User model classes and ready-made classifiers.

- `CustomModelProvider`: any class with a batch method, by import path (the `@daft.cls` pattern).
- `ZeroShotEmbeddingClassifier`: text classification by embedding similarity to label descriptions (MiniLM).
- `HFPipelineProvider`: a transformers `pipeline` (text / zero-shot classification) over a local model folder.

Heavy libraries (torch, sentence-transformers, transformers) are imported only when a model loads.
"""

from batch_assets.resources.custom.hf_pipeline import HFPipelineProvider
from batch_assets.resources.custom.batch_returns import BatchAlignmentError, BatchOutputTypeError
from batch_assets.resources.custom.provider import BatchPredictionError, CustomModelProvider
from batch_assets.resources.custom.zero_shot import ZeroShotEmbeddingClassifier

__all__ = [
    "BatchAlignmentError",
    "BatchOutputTypeError",
    "BatchPredictionError",
    "CustomModelProvider",
    "HFPipelineProvider",
    "ZeroShotEmbeddingClassifier",
]
