"""Errors that say what failed, where (pipeline, partition, file, column, row) and what to do."""

from __future__ import annotations

import re

# What a plug-in's spec check returns (a source format, sink, partition kind, task kind): (spec field, what is
# wrong) pairs, which spec.PipelineSpec's check gathers and raises as one SpecError. Declared here, at the bottom.
Problems = list[tuple[str, str]]


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


# What waiting may fix: an S3 or endpoint 5xx, a timeout, a dropped connection, throttling.
_TRANSIENT = re.compile(r"(status|http|code)\D{0,12}5\d\d\b|\b50[0234]\b|\b(timed? ?out|timeout|throttl\w*|slow ?down|connection|connect|temporar\w*|"
                        r"unavailable|internal ?error|broken pipe|reset by peer)\b", re.I)
# What never changes on a retry: the data or the schema is wrong, or access is refused, or the bucket is not there
# (s3fs words S3's NoSuchBucket as "The specified bucket does not exist").
_DETERMINISTIC = re.compile(r"invalid|schema|vector|does not match|not compatible|cannot cast|type mismatch|"
                            r"access ?denied|forbidden|\b40[03]\b|no such bucket|nosuchbucket|bucket does not exist", re.I)


def transient_failure(exc: BaseException) -> bool | None:
    """Whether a retry may fix this failure of an external system (a sink's write, a store): True for outages and
    timeouts, False for errors that a retry repeats word for word (a bad value or vector, a schema mismatch, access
    denied), None when it cannot tell (the step's RetryPolicy then decides, as for any other exception)."""
    if isinstance(exc, (ConnectionError, TimeoutError)) or _TRANSIENT.search(str(exc)):
        return True
    if isinstance(exc, (ValueError, TypeError, KeyError, NotImplementedError, PermissionError)) \
            or _DETERMINISTIC.search(str(exc)):
        return False
    return None
