"""What the source formats share: the declared-columns check, the bad-UTF-8 row finder, the size rules of a format
without row counts in its metadata."""

from __future__ import annotations

from batch_assets.errors import PipelineError, Problems
from batch_assets.spec_sections import PipelineSections
from batch_assets.storage import filesystem_for

# The `source` fields only some formats read; each format's module lists those it reads in its OPTIONS.
FORMAT_OPTIONS = ("encoding", "block_size", "types", "sample")


def option_problems(spec: PipelineSections, options: frozenset[str], why: str | None = None) -> Problems:
    """A source option the format does not read, set to anything but its default: refused rather than ignored
    (a parquet source's `encoding` would otherwise change nothing, without a word). `why`: what the format reads
    instead."""
    source, fields = spec.source, type(spec.source).model_fields
    because = f" ({why})" if why else ""
    return [(f"source.{name}", f"does not apply to a {source.format} source{because}: remove it")
            for name in FORMAT_OPTIONS
            if name not in options and getattr(source, name) != fields[name].get_default(call_default_factory=True)]


def no_row_count_problems(spec: PipelineSections) -> Problems:
    """A format whose files do not say how many rows they hold (only Parquet's footers do): runtime.resources
    by_size rules can size a partition by its bytes only."""
    if any(r.min_rows is not None for r in spec.runtime.resources.by_size):
        return [("runtime.resources.by_size", "min_rows is read from Parquet footers: for a "
                 f"{spec.source.format} source use min_bytes")]
    return []


def missing_columns(spec: PipelineSections, found: list[str]) -> None:
    missing = [c for c in spec.source.columns if c not in found]
    if missing:
        raise PipelineError(
            f"input column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} not found; the file has "
            f"columns: {', '.join(found) or '(none)'}",
            column=missing[0],
            fix="fix source.columns (and the template) in the spec, or the file's header",
        )


def first_bad_utf8_row(url: str, encoding: str = "utf-8") -> int | None:
    """Error path only: find the data row (1-based, after the header) holding the first byte that is not valid
    `encoding` (UTF-8 unless the spec declares another)."""
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        for line_no, line in enumerate(f):
            try:
                line.decode(encoding)
            except UnicodeDecodeError:
                return line_no  # line 0 is the header, so line N is data row N
    return None
