"""Errors raised by model providers."""


class MissingExtraError(ImportError):
    """An optional backend's package is not installed; the message names the extra to install (pyproject.toml's
    optional-dependencies). `extra=None`: a core dependency, missing only from a broken environment."""

    def __init__(self, package: str, extra: str | None, purpose: str):
        target = f"batch-assets[{extra}]" if extra else "batch-assets"
        super().__init__(
            f"{purpose} needs the '{package}' package, which is not installed. "
            f'Install it with: pip install "{target}"'
        )
        self.package = package
        self.extra = extra


class ModelLoadError(RuntimeError):
    """A model could not be loaded; raised from setup so the run fails loudly instead of producing empty output."""


# How a provider's row error says it failed only after every retry of a transient failure ("... (gave up after 4
# attempts)"): the infer loop reads it to tell an outage, worth a step retry, from a refusal.
GAVE_UP = "gave up after"


class ProviderSetupError(RuntimeError):
    """The provider cannot serve ANY row as configured (rejected key, no permission, unknown model, exhausted quota,
    a model that fails to load): retrying or going on would only turn every row into the same error, so the step
    fails at once. `what` says what the endpoint or library answered, `fix` what to change."""

    def __init__(self, what: str, fix: str, *, status: int | None = None):
        self.what, self.fix, self.status = what, fix, status
        super().__init__(f"{what}. What to do: {fix}")


# How each outcome of a provider call is treated by the infer loop (see docs/RELIABILITY.md):
#   transient  -> retried by the provider, then a row error if it never succeeds
#   row        -> a row error at once (bad output or a request the endpoint refused for this row only)
#   setup      -> ProviderSetupError: the step fails, nothing is published
ERROR_CLASSES = ("transient", "row", "setup")


class BatchNotIdentified(RuntimeError):
    """A batch submission whose create answer was lost cannot be told apart from other batches of the account (a
    provider whose batches carry no token: Anthropic's). Submitting again could pay for the rows twice, so the
    partition stops; the batch machinery names the partition and its ledger entry (batch_assets/stages/
    infer_batch.py). `candidates`: the batch ids that could be it."""

    def __init__(self, what: str, candidates: list[str]):
        self.candidates = candidates
        super().__init__(what)
