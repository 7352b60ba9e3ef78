"""`check_upstream_sources(defs)`: every pipeline's source.asset checked against the Definitions it is part of
(orchestration/assets/upstream.py says what is checked). Users import it from here in their own definitions.py
(docs/reading-data.md), so it keeps this path whatever moves inside orchestration/. Its own module so that a user's
project can call it without importing batch_assets.definitions, which builds the product's own code location; and
upstream.py, which the factory imports for the asset dependency, stays free of the factory."""

from __future__ import annotations

import logging
import warnings

import dagster as dg

from batch_assets.orchestration.assets.factory import pipeline_specs
from batch_assets.orchestration.assets.upstream import upstream_problems
from batch_assets.spec import SpecError

log = logging.getLogger(__name__)


class UpstreamAssetWarning(UserWarning):
    """A pipeline's source.asset is not an asset of this code location (it may be one of another location's)."""


def check_upstream_sources(defs: dg.Definitions) -> dg.Definitions:
    """`defs`, once every pipeline's source.asset is an asset of it whose partitions map onto the pipeline's;
    else a SpecError naming each pipeline, what does not fit and the fix. A key that is not an asset of `defs` is
    a warning (UpstreamAssetWarning): another code location of the workspace may define it."""
    problems, doubts = upstream_problems(defs, pipeline_specs(defs))
    for doubt in doubts:
        log.warning(doubt)
        warnings.warn(doubt, UpstreamAssetWarning, stacklevel=2)
    if problems:
        raise SpecError("upstream assets (source.asset) do not fit:\n" + "\n".join(f"- {p}" for p in problems))
    return defs
