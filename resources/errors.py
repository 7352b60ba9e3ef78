"""Errors raised by model providers."""


class MissingExtraError(ImportError):
    """An optional backend's package is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'batch-assets[{extra}]'"
        )
        self.package = package
        self.extra = extra


class ModelLoadError(RuntimeError):
    """A model could not be loaded; raised from setup so the run fails loudly instead of producing empty output."""
