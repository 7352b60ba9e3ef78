"""The Dagster pool each pipeline's infer step runs in: one place names it, so caps stay consistent.

A pool caps how many steps holding it run at once across all runs of the deployment (`concurrency.pools` in
dagster.yaml sets the default limit; `dagster instance concurrency set <pool> <n>` sets one pool's). A step holds
one slot for its whole duration.

- External endpoints (the `openai` provider): one pool per endpoint, `endpoint:<host[:port]>`. With the pool's
  limit at 1, one infer step at a time talks to the endpoint, and that step's own limiter (`max_concurrency`,
  `requests_per_minute`, `tokens_per_minute`, Retry-After handling) keeps it under the endpoint's rate limit, so
  two runs never add up past it. We chose Dagster pools over a shared cross-process limiter (Redis, a database
  token bucket): pools are enforced by the instance the deployment already has, visible in the UI, adjustable
  live, and need no extra service; the cost is that a step waits for the slot instead of sharing the rate.
  An endpoint read from the environment ({env: NAME}) is not known at definition load, so its pool is named
  after the variable: every pipeline reading OPENAI_BASE_URL shares `endpoint:$OPENAI_BASE_URL`.
- GPU steps: the `gpu` pool, for every pipeline where any partition asks for a GPU (runtime.resources). A slot is
  one step whatever its GPU count; docs/deployment.md says how to size the pool to the GPU node pool.
"""

from __future__ import annotations

from urllib.parse import urlparse

from batch_assets.spec import PipelineSpec

GPU_POOL = "gpu"
ENDPOINT_PROVIDERS = {"openai": "api.openai.com"}  # provider -> host when base_url is not set


def endpoint_pool(spec: PipelineSpec) -> str | None:
    """`endpoint:<host[:port]>` for providers that call an external HTTP endpoint, else None."""
    default_host = ENDPOINT_PROVIDERS.get(spec.model.provider)
    if default_host is None:
        return None
    base_url = spec.model.config.get("base_url")
    if isinstance(base_url, dict) and set(base_url) == {"env"}:
        return f"endpoint:${base_url['env']}"
    if isinstance(base_url, str) and base_url:
        parsed = urlparse(base_url if "://" in base_url else f"http://{base_url}")
        return f"endpoint:{parsed.netloc or parsed.path}"
    return f"endpoint:{default_host}"


def infer_pool(spec: PipelineSpec) -> str | None:
    """The pool of the pipeline's infer step, or None when nothing caps it. `runtime.pool` overrides."""
    if spec.runtime.pool:
        return spec.runtime.pool
    pool = endpoint_pool(spec)
    if pool:
        return pool
    if spec.runtime.max_gpus() > 0:
        return GPU_POOL
    return None
