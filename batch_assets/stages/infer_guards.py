"""The infer loop's guards: a step stops, naming the cause and the fix, instead of paying for rows that cannot succeed.

- `fail_if_all_failed_alike`: every row of a chunk (at least SAME_FAILURE_MIN_ROWS sent) failed the same way: a
  setup or endpoint problem, not bad rows (retryable when the shared failure is an outage);
- `stop_if_unparseable`: the partition's first answers (`task.structured.stop_after_unparseable`), sent alone, all
  failed to parse the same way;
- `fail_on_unparseable`: `task.structured.on_unparseable: fail` and a chunk holds an answer that did not parse.
Every caller of the loop (the infer stage, the dead-letter retry) gets all three (batch_assets/stages/infer.py).
"""

from __future__ import annotations

import re
from typing import Any

from batch_assets.errors import PipelineError
from batch_assets.spec_sections import PipelineSections
from batch_assets.tasks import ChunkPlan
from batch_assets.resources.provider_errors import GAVE_UP
from batch_assets.resources.registry import provider_class
from batch_assets.resources.structured import is_unparseable, validate_output

# A chunk whose rows all failed the same way is a setup failure only when it has at least this many rows sent:
# two or three rows failing alike is plausibly bad rows.
SAME_FAILURE_MIN_ROWS = 4


def _raw_answers(ids: list[Any], texts: list[str | None], limit: int = 5) -> str:
    return "; ".join(f"row {rid!r}: {_clip(text)}" for rid, text in list(zip(ids, texts))[:limit])


def _clip(text: str | None, limit: int = 120) -> str:
    if text is None:
        return "(no text)"
    return repr(text if len(text) <= limit else text[:limit] + "...")


def unparseable_fix(spec: PipelineSections, provider: Any, failure: str) -> str:
    """What to do about answers that do not parse, by the likely cause."""
    hints = []
    if "cut off" in failure or "max_new_tokens" in failure:
        hints.append("raise task.params.max_new_tokens: the answers stop before the output is complete")
    hints.append(provider_class(spec.model.provider).unparseable_hint)  # the provider says what to check
    hints.append("say in the prompt (prepare.template / prepare.system) exactly what to answer")
    hints.append("to keep such answers as row errors (dead letters) within runtime.max_error_fraction instead, set "
                 "task.structured.on_unparseable: row_error and task.structured.stop_after_unparseable: 0")
    return "; ".join(hints)


def stop_if_unparseable(spec: PipelineSections, provider: Any, ids: list[Any], results: list[Any]) -> None:
    """Stop the step when every probed answer failed to parse the same way (`stop_after_unparseable`)."""
    structured = spec.task.structured
    problems = [r.error if r.error else validate_output(r.text, structured, getattr(r, "finish_reason", None))[1] for r in results]
    if not all(is_unparseable(p) for p in problems):
        return
    shared = same_failure(problems)  # type: ignore[arg-type]
    if shared is None:
        return
    raise PipelineError(
        f"the first {len(results)} answers of {type(provider).__name__} (model {provider.model_name()!r}) all failed "
        f"to parse as the structured output ({structured.kind}) the same way: {shared}. Raw answers: "
        f"{_raw_answers(ids, [r.text for r in results])}. The step stopped after these {len(results)} rows "
        "(task.structured.stop_after_unparseable) instead of sending the rest; nothing was published",
        fix=unparseable_fix(spec, provider, shared),
    )


def fail_on_unparseable(spec: PipelineSections, provider: Any, plan: ChunkPlan, ids: list[Any], index: int,
                        results: Any) -> None:
    """`on_unparseable: fail`: a chunk holding an answer that did not parse fails the step, showing the answers."""
    structured = spec.task.structured
    if structured is None or structured.on_unparseable != "fail" or results is None:
        return
    sent = plan.sent.tolist()
    bad = [(j, i) for j, i in enumerate(sent) if is_unparseable(plan.errors[i])]
    if not bad:
        return
    first = plan.errors[bad[0][1]]
    raise PipelineError(
        f"{len(bad)} of the {len(sent)} answers in chunk {index} did not parse as the structured output "
        f"({structured.kind}), and task.structured.on_unparseable is 'fail'; first: {first}. Raw answers: "
        f"{_raw_answers([ids[i] for _, i in bad], [results[j].text for j, _ in bad])}; nothing was published",
        row=ids[bad[0][1]],
        fix=unparseable_fix(spec, provider, first or ""),
    )


def fail_if_all_failed_alike(provider: Any, plan: ChunkPlan, index: int) -> None:
    sent = plan.sent.tolist()
    if len(sent) < SAME_FAILURE_MIN_ROWS:
        return
    failures = [plan.errors[i] for i in sent]
    if any(f is None for f in failures):
        return
    if any(is_unparseable(f) for f in failures):
        # answers came back (the endpoint is up): whether they parse is task.structured's policy, not a setup failure
        return
    shared = same_failure(failures)  # type: ignore[arg-type]
    if shared is not None:
        # Retries exhausted on every row alike (an outage: 5xx, timeouts, refused connections) may pass: the step's
        # RetryPolicy (spec `retries`) runs it again later, resuming after the committed chunks. Anything else that
        # fails every row alike (a 400 for every request) will not pass by waiting.
        transient = GAVE_UP in shared
        raise PipelineError(
            f"every one of the {len(sent)} rows sent to {type(provider).__name__} (model {provider.model_name()!r}) in "
            f"chunk {index} failed the same way: {shared}. This is a setup or endpoint problem, not bad rows: "
            "the step stopped and nothing was published"
            + ("; it looks transient, so the step is retried as the spec's `retries` say" if transient else ""),
            fix="check that the model/endpoint is up and configured (model, base_url, key, params); committed chunks "
            "are kept, so a rerun resumes where this one stopped",
            retryable=transient,
        )


def same_failure(messages: list[str]) -> str | None:
    """The shared failure when every message is the same once row-specific details (numbers, quoted text) are
    dropped: the mark of a setup problem (endpoint down, every request refused), not of bad rows."""
    if not messages:
        return None
    squash = {re.sub(r"'[^']*'|\"[^\"]*\"|\d+(\.\d+)?", "#", m)[:120] for m in messages}
    return messages[0] if len(squash) == 1 else None
