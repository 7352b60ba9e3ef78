"""Errors that say what failed, where (pipeline, partition, file, column, row) and what to do."""

from __future__ import annotations


class PipelineError(Exception):
    """Bad input or a broken stage. Raised inside an asset; the step fails and no partial output is committed."""

    def __init__(
        self,
        what: str,
        *,
        pipeline: str | None = None,
        partition: str | None = None,
        file: str | None = None,
        column: str | None = None,
        row: int | str | None = None,
        fix: str | None = None,
        retryable: bool = False,
    ):
        self.what, self.pipeline, self.partition = what, pipeline, partition
        self.file, self.column, self.row, self.fix = file, column, row, fix
        # True when waiting may fix it (an endpoint outage): the step's RetryPolicy runs it again; bad input never is.
        self.retryable = retryable
        super().__init__(self._render())

    def _render(self) -> str:
        where = [
            f"{label} {value!r}" if label != "row" else f"row {value}"
            for label, value in (
                ("pipeline", self.pipeline),
                ("partition", self.partition),
                ("file", self.file),
                ("column", self.column),
                ("row", self.row),
            )
            if value is not None
        ]
        text = self.what
        if where:
            text += " [" + ", ".join(where) + "]"
        if self.fix:
            text += f". What to do: {self.fix}"
        return text

    def located(self, **where: str | None) -> "PipelineError":
        """The same error with more location filled in (fields already set are kept)."""
        fields = {k: getattr(self, k) for k in ("pipeline", "partition", "file", "column", "row", "fix", "retryable")}
        for key, value in where.items():
            if fields.get(key) is None:
                fields[key] = value
        return PipelineError(self.what, **fields)
